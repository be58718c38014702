"""A draft that proposes from the K most frequent tokens only: its output layer trimmed to K rows.

A 0.5B draft's output layer (151,936 × 896 for the packaged one) is a quarter of its weights, read for
every drafted token. FR-Spec (Zhao et al., 2025) restricts the draft's head to the most frequent tokens:
the draft only proposes, so the output law stays the target's (at T > 0 the proposal law is the
trimmed one, which verification reads), and a drafted token costs less. Here:

* :func:`token_frequencies` counts the target tokenizer's tokens over text that ships with Python (the
  standard library's source and its documentation topics), never over the prompts benchmarks use;
* :func:`trimmed_gguf` writes a llama.cpp GGUF whose embedding/output rows are the K most frequent
  tokens (plus every special token), in that order, with no tokenizer (``tokenizer.ggml.model = none``:
  the draft is fed ids), cached like the re-quantised draft and checked by a sha256 manifest;
* :class:`TrimmedHeadModel` wraps the model read from it behind the full vocabulary: ids in are mapped
  to their row (a token outside the K reads as :attr:`fallback`: only the draft's view of the context
  changes), logits out are scattered back, every other token at −inf.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

from ..assets.cache import cache_root, changed_file_problems, mark_verified, read_manifest, write_manifest
from ..errors import SpecboundError
from .base import LanguageModel, ModelInfo

__all__ = ["TrimmedHeadModel", "check_draft_head", "kept_tokens", "load_trimmed_draft", "token_frequencies",
           "trimmed_gguf"]

FREQUENCY_VERSION = 1
#: the text counted: Python's standard library source (these packages and top-level modules, sorted, up to
#: this many bytes) and its documentation topics (pydoc_data), the same on every CPython 3.11+
SOURCE_BYTES = 6_000_000


def _shipped_text() -> list[str]:
    import sysconfig

    lib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    topics = lib / "pydoc_data" / "topics.py"
    if topics.is_file():
        texts.append(topics.read_text(encoding="utf-8", errors="replace"))
    for path in sorted(lib.glob("*.py")) + sorted(lib.glob("*/*.py")):
        if "test" in path.parts[-2] or path.name.startswith("test") or "idlelib" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total > SOURCE_BYTES:
            break
    return texts


def token_frequencies(tokenizer, *, identity: str, progress: bool = True) -> np.ndarray:
    """Counts of every token id of ``tokenizer`` over the shipped text (cached per tokenizer
    ``identity`` and Python version; a bad cache file is counted again)."""
    vocab = len(tokenizer)
    key = hashlib.sha256(f"{identity}|{sys.version_info[:2]}|{SOURCE_BYTES}|{FREQUENCY_VERSION}".encode()).hexdigest()[:16]
    path = cache_root() / "frequencies" / f"{key}.npy"
    if path.is_file():
        try:
            counts = np.load(path)
            if counts.shape == (vocab,) and counts.dtype == np.int64:
                return counts
        except (OSError, ValueError):
            pass
    if progress:
        print("counting token frequencies over the Python standard library (once)", file=sys.stderr, flush=True)
    counts = np.zeros(vocab, dtype=np.int64)
    for text in _shipped_text():
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        np.add.at(counts, np.asarray(ids, dtype=np.int64), 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path.with_suffix(".tmp.npy"), counts)
    path.with_suffix(".tmp.npy").replace(path)
    return counts


def kept_tokens(counts: np.ndarray, k: int, always=()) -> np.ndarray:
    """The ids of the ``k`` most frequent tokens (ties by id) plus ``always`` (special tokens), as rows
    of the trimmed head in that order."""
    if not 1 <= k <= len(counts):
        raise SpecboundError(f"the trimmed head must keep 1..{len(counts)} tokens, got {k}")
    order = np.lexsort((np.arange(len(counts)), -counts))
    extra = [int(t) for t in always if 0 <= int(t) < len(counts)]
    chosen = [int(t) for t in order[:k] if int(t) not in set(extra)]
    return np.asarray(chosen[:k - len(extra)] + extra, dtype=np.int64)


def _copy_metadata(reader, writer, vocab: int) -> None:
    import gguf

    arch = writer.arch
    for name, field in reader.fields.items():
        if name.startswith(("GGUF.", "tokenizer.")) or name in ("general.architecture", f"{arch}.vocab_size"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    writer.add_key_value(f"{arch}.vocab_size", vocab, gguf.GGUFValueType.UINT32)
    writer.add_key_value("tokenizer.ggml.model", "none", gguf.GGUFValueType.STRING)


def trimmed_gguf(source, kept: np.ndarray, progress: bool = True) -> Path:
    """``source`` (a llama.cpp GGUF) with its token embedding (and output layer, if untied) cut to the rows
    ``kept``, built once into ``<cache>/gguf/<stem>@top<K>-<hash>/model.gguf``."""
    import shutil

    import gguf

    source = Path(source)
    kept = np.asarray(kept, dtype=np.int64)
    digest = hashlib.sha256(kept.tobytes() + str(source.stat().st_size).encode()).hexdigest()[:12]
    directory = cache_root() / "gguf" / f"{source.stem}@top{len(kept)}-{digest}"
    if directory.is_dir():
        manifest = read_manifest(directory)
        if manifest is not None and not changed_file_problems(directory, manifest):
            return directory / "model.gguf"
        print(f"{directory}: the trimmed draft is damaged; building it again", file=sys.stderr)
    tmp = directory.with_name(directory.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if progress:
        print(f"writing {source.name} with its head trimmed to {len(kept)} tokens (once)", file=sys.stderr, flush=True)
    reader = gguf.GGUFReader(str(source))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    writer = gguf.GGUFWriter(str(tmp / "model.gguf"), arch)
    _copy_metadata(reader, writer, len(kept))
    for t in reader.tensors:
        data = np.asarray(t.data)
        if t.name in ("token_embd.weight", "output.weight"):
            data = np.ascontiguousarray(data[kept])
        writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tmp / "kept.json").write_text(json.dumps({"source": str(source.resolve()), "kept": kept.tolist()}))
    manifest = write_manifest(tmp, info={"source": str(source.resolve()), "kept": len(kept)})
    mark_verified(tmp, manifest["files"])
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory / "model.gguf"


class TrimmedHeadModel(LanguageModel):
    """``inner`` (a model over the ``kept`` rows) seen through the full vocabulary of ``vocab_size`` ids."""

    def __init__(self, inner: LanguageModel, kept, vocab_size: int, *, name: str | None = None,
                 tokenizer=None):
        kept = torch.as_tensor(np.asarray(kept), dtype=torch.long)
        if kept.numel() != inner.vocab_size:
            raise SpecboundError(f"{inner.name} has {inner.vocab_size} rows but {kept.numel()} kept tokens")
        self.inner, self.kept, self.vocab_size = inner, kept, int(vocab_size)
        self.fallback = 0                                    # row read for a token outside the kept ones
        self.rows = torch.full((self.vocab_size,), self.fallback, dtype=torch.long)
        self.rows[kept] = torch.arange(kept.numel())
        self.name = name or f"{inner.name} (head {kept.numel()})"
        self.tokenizer = tokenizer
        self.info = ModelInfo(backend=inner.info.backend, kernels=f"{inner.info.kernels}, head of {kept.numel()} "
                                                                   "most frequent tokens",
                              identity=inner.info.identity, load_seconds=inner.info.load_seconds,
                              max_positions=inner.info.max_positions)
        self.max_tree_nodes = inner.max_tree_nodes
        self.rows_share_passes = inner.rows_share_passes

    def _logits(self, inner: torch.Tensor) -> torch.Tensor:
        out = inner.new_full((*inner.shape[:-1], self.vocab_size), float("-inf"))   # [..., V]
        out[..., self.kept] = inner
        return out

    def reset(self) -> None:
        self.inner.reset()

    @property
    def cache_length(self) -> int:
        return self.inner.cache_length

    @property
    def committed_length(self) -> int:
        return self.inner.committed_length

    def forward(self, tokens: torch.Tensor, keep_logits: int | None = None) -> torch.Tensor:
        return self._logits(self.inner.forward(self.rows[torch.as_tensor(tokens)], keep_logits=keep_logits))

    def forward_tree(self, tokens: torch.Tensor, parents) -> torch.Tensor:
        return self._logits(self.inner.forward_tree(self.rows[torch.as_tensor(tokens)], parents))

    def crop(self, length: int) -> None:
        self.inner.crop(length)

    def keep_path(self, base_length: int, path) -> None:
        self.inner.keep_path(base_length, path)

    @property
    def supports_trees(self) -> bool:
        return self.inner.supports_trees

    def fork(self) -> "TrimmedHeadModel":
        return self._wrap(self.inner.fork())

    def fork_rows(self, n: int) -> list["TrimmedHeadModel"]:
        return [self._wrap(row) for row in self.inner.fork_rows(n)]

    def _wrap(self, inner) -> "TrimmedHeadModel":
        return TrimmedHeadModel(inner, self.kept, self.vocab_size, name=self.name, tokenizer=self.tokenizer)

    def cache_bytes_per_slot(self) -> int:
        return self.inner.cache_bytes_per_slot()

    @property
    def supports_batches(self) -> bool:
        return self.inner.supports_batches


def check_draft_head(head) -> int | None:
    """``head``: None / "full" (the draft's whole output layer) or K ≥ 1 (its K most frequent tokens)."""
    if head is None or head == "full":
        return None
    try:
        k = int(head)
    except (TypeError, ValueError):
        raise SpecboundError(f"the draft head must be 'full' or a number of tokens K, got {head!r}") from None
    if k < 1:
        raise SpecboundError(f"the draft head must keep at least 1 token, got {k}")
    return k


def load_trimmed_draft(source, *, head: int, tokenizer, vocab_size: int, identity: str, name: str,
                       progress: bool = True, **llamacpp_options) -> TrimmedHeadModel:
    """The llama.cpp draft ``source`` (a GGUF file) proposing from the ``head`` tokens of ``tokenizer`` most
    frequent over the shipped text (plus its special tokens), behind the full ``vocab_size`` logits."""
    from .llamacpp import LlamaCppModel

    counts = token_frequencies(tokenizer, identity=identity, progress=progress)
    if head > len(counts):
        raise SpecboundError(f"the draft head can keep at most the tokenizer's {len(counts)} tokens, got {head}")
    kept = kept_tokens(counts, head, always=getattr(tokenizer, "all_special_ids", ()))
    path = trimmed_gguf(source, kept, progress=progress)
    inner = LlamaCppModel(path, name=f"{name}@top{head}", seed_tokenizer=False, **llamacpp_options)
    return TrimmedHeadModel(inner, kept, vocab_size, name=f"{name} (head {head})", tokenizer=tokenizer)
