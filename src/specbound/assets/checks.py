"""Cheap structural checks of a Hugging Face model directory, and a content key for it.

These read only small files and the headers of the weight files, so they take milliseconds even
for a 7 GB checkpoint. They catch what an interrupted copy, a full disk or a stray edit leaves
behind — a truncated ``model.safetensors``, an unparsable ``config.json``, a missing
``tokenizer.json`` — before transformers turns it into a deep traceback or, worse, loads a
tokenizer with two tokens. Each problem is one line naming the file and what is wrong.
"""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

__all__ = [
    "TOKENIZER_VOCAB_FILES",
    "config_problems",
    "content_key",
    "json_problems",
    "safetensors_problems",
    "structure_problems",
    "weight_files",
]

#: Files of which a tokenizer needs at least one (the vocabulary); tokenizer_config.json alone
#: makes transformers build a tokenizer with only the special tokens.
TOKENIZER_VOCAB_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                                          "spiece.model", "sentencepiece.bpe.model")
_SAFETENSORS_INDEX = "model.safetensors.index.json"
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit on the JSON header
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
                "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _read_safetensors_header(path: Path) -> tuple[int, dict, bytes]:
    """(header length, parsed header, raw header bytes) of a safetensors file; ValueError if malformed."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError(f"file has {size} bytes, too short for a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > _MAX_HEADER or 8 + length > size:
            raise ValueError(f"header length field says {length:,} bytes but the file has {size:,} "
                             "(truncated, or not a safetensors file)")
        raw = fh.read(length)
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return length, header, raw


def safetensors_problems(path: Path) -> list[str]:
    """Problems of one safetensors file: the header must parse, each tensor's byte range must fit
    its dtype and shape, and the file size must equal 8 + header length + end of the last tensor."""
    name = path.name
    try:
        length, header, _ = _read_safetensors_header(path)
    except OSError as exc:
        return [f"{name}: unreadable ({exc.strerror or exc})"]
    except ValueError as exc:
        return [f"{name}: {exc}"]
    end = 0
    for tensor, meta in header.items():
        if tensor == "__metadata__":
            continue
        try:
            begin, stop = (int(v) for v in meta["data_offsets"])
            dtype, shape = meta["dtype"], [int(d) for d in meta["shape"]]
        except (KeyError, TypeError, ValueError):
            return [f"{name}: header entry {tensor!r} has no valid dtype/shape/data_offsets"]
        count = 1
        for d in shape:
            count *= d
        if dtype in _DTYPE_BYTES and stop - begin != count * _DTYPE_BYTES[dtype]:
            return [f"{name}: tensor {tensor!r} spans {stop - begin:,} bytes, its {dtype} shape {shape} "
                    f"needs {count * _DTYPE_BYTES[dtype]:,}"]
        end = max(end, stop)
    expected, found = 8 + length + end, path.stat().st_size
    if found != expected:
        return [f"{name}: expected {expected:,} bytes (8 + {length:,} header + {end:,} tensor data), "
                f"found {found:,} (truncated or padded)"]
    return []


def json_problems(path: Path) -> list[str]:
    """``[]`` if ``path`` holds valid JSON, else one problem naming the file."""
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return [f"{path.name}: unreadable ({exc.strerror or exc})"]
    except ValueError as exc:
        return [f"{path.name}: not valid JSON ({exc})"]
    return []


def config_problems(directory: Path) -> list[str]:
    """config.json must exist and be a JSON object with a ``model_type``."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return ["config.json: missing"]
    problems = json_problems(path)
    if problems:
        return problems
    config = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict) or "model_type" not in config:
        return ["config.json: no 'model_type' (not a transformers model config)"]
    return []


def weight_files(directory: Path) -> list[Path]:
    """The weight files of a model directory (safetensors first, else PyTorch ``.bin`` files)."""
    directory = Path(directory)
    found = sorted(directory.glob("*.safetensors"))
    return found or sorted(directory.glob("pytorch_model*.bin"))


def _weight_problems(directory: Path) -> list[str]:
    """Weights must exist; a sharded index must parse and name existing shards; every safetensors
    file must be internally consistent."""
    problems = []
    index = directory / _SAFETENSORS_INDEX
    if index.exists():
        problems += json_problems(index)
        if not problems:
            shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
            problems += [f"{s}: missing (named in {_SAFETENSORS_INDEX})" for s in sorted(shards)
                         if not (directory / s).is_file()]
    files = weight_files(directory)
    if not files and not problems:
        problems.append("model.safetensors: missing (no *.safetensors or pytorch_model*.bin weights)")
    for path in files:
        if path.suffix == ".safetensors":
            problems += safetensors_problems(path)
    return problems


def _tokenizer_problems(directory: Path) -> list[str]:
    """A vocabulary file must exist; the tokenizer's JSON files must parse."""
    present = [n for n in TOKENIZER_VOCAB_FILES if (directory / n).is_file()]
    if not present:
        return [f"tokenizer.json: missing (no tokenizer vocabulary: none of {', '.join(TOKENIZER_VOCAB_FILES)})"]
    problems = []
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json"):
        if (directory / name).is_file():
            problems += json_problems(directory / name)
    return problems


def structure_problems(directory: Path, *, tokenizer: bool = True) -> list[str]:
    """Every cheap structural problem of a model directory (config, weights, and with
    ``tokenizer`` the tokenizer files); an empty list when it looks loadable."""
    directory = Path(directory)
    problems = config_problems(directory) + _weight_problems(directory)
    if tokenizer:
        problems += _tokenizer_problems(directory)
    return problems


def content_key(directory: Path) -> str:
    """A sha256 naming a model directory by content, computed cheaply.

    It covers the parsed config.json (canonical JSON) and, per weight file, its name, size and
    (for safetensors) its header — which lists every tensor's dtype, shape and byte range — but
    not the tensor bytes. Two directories with the same key hold the same architecture and layout;
    retraining in place without changing the header is not detected (use the manifest for that).
    """
    directory = Path(directory)
    digest = hashlib.sha256()
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    config.pop("_name_or_path", None)
    digest.update(json.dumps(config, sort_keys=True).encode())
    for path in weight_files(directory):
        digest.update(f"\0{path.name}\0{path.stat().st_size}\0".encode())
        if path.suffix == ".safetensors":
            try:
                digest.update(_read_safetensors_header(path)[2])
            except (OSError, ValueError):
                digest.update(b"<unreadable header>")
    return digest.hexdigest()
