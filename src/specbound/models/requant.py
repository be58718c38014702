"""A draft's GGUF file re-quantised for speed, once, into the cache.

The draft only proposes tokens; the target decides (Yin et al. 2024, Thm 1: the output law is the
target's whatever the draft). So a draft may be quantised harder than its file ships if that makes
drafting cheaper than it lowers acceptance: the packaged Qwen2.5-Coder 0.5B "Q4_K_M" file is mostly
q5_0 (its 896-wide rows do not split into K-quant super-blocks), a type without llama.cpp's repacked CPU
kernels, and the same weights in q4_0 read in about half the time per drafted token while greedy
acceptance on code falls by a few percent (docs/quantised-targets.md, "A faster draft file").
:func:`requantized_gguf` writes ``<cache>/gguf/<stem>@<quant>-<sha16 of the source>/model.gguf`` with
llama.cpp's own quantiser, through a staging directory renamed into place, and a manifest of its size
and sha256. A cached copy is checked on every read (size, source hash, quant; its sha256 again whenever
the file changed since it last matched) and rebuilt when it is wrong.
"""
from __future__ import annotations

import ctypes
import shutil
import sys
import time
from pathlib import Path

from ..assets.cache import (
    CacheCorrupt,
    cache_root,
    changed_file_problems,
    is_write_error,
    make_readable,
    make_staging_dir,
    mark_verified,
    not_writable,
    read_manifest,
    remove_stale_staging,
    swap_into_place,
    writable_dir,
    write_manifest,
)
from ..errors import SpecboundError
from ..options import DRAFT_QUANTS, check_draft_quant
from .llamacpp import gguf_sha256, load_llama_cpp

__all__ = ["DRAFT_QUANTS", "check_requantized", "requantized_dir", "requantized_gguf"]

#: llama.cpp's file-type code per quant name (``enum llama_ftype``) and the ggml type of the tied
#: embedding / output head (``enum ggml_type``): the head is a third of a 0.5B model's weights.
_FTYPES = {"q4_0": (2, 2)}
FILE_NAME = "model.gguf"


def requantized_dir(source: Path, quant: str) -> Path:
    """Where the ``quant`` copy of ``source`` lives in the cache (keyed by the source's sha256)."""
    source = Path(source)
    return cache_root() / "gguf" / f"{source.stem}@{quant}-{gguf_sha256(source)[:16]}"


def _usable(directory: Path, source_sha: str, quant: str) -> list[str]:
    """Problems of a cached copy (empty list: usable)."""
    try:
        manifest = read_manifest(directory)
    except CacheCorrupt as exc:
        return [str(exc)]
    if manifest is None:
        return ["no manifest"]
    info = manifest.get("info") or {}
    if info.get("source_sha256") != source_sha or info.get("quant") != quant:
        return [f"made from {info.get('source_sha256', '?')[:16]} as {info.get('quant')!r}"]
    if FILE_NAME not in manifest["files"]:
        return [f"the manifest records no {FILE_NAME}"]
    return changed_file_problems(directory, manifest)


def check_requantized(source, quant: str = "q4_0", *, full: bool = False) -> tuple[str, list[str]]:
    """State of the ``quant`` copy of ``source`` as ``assets list`` shows it ("missing" | "ok" | "verified" |
    "damaged", problems); ``full`` recomputes its sha256."""
    from ..assets.cache import manifest_problems

    directory = requantized_dir(Path(source), quant)
    if not directory.is_dir():
        return "missing", []
    problems = _usable(directory, gguf_sha256(source), quant)
    if full and not problems:
        problems = manifest_problems(directory, read_manifest(directory), full=True)
        if not problems:
            mark_verified(directory, read_manifest(directory)["files"])
    return ("damaged" if problems else "verified" if full else "ok"), problems


def requantized_gguf(source, quant: str = "q4_0", progress: bool = True) -> Path:
    """The GGUF file ``source`` re-quantised to ``quant`` ("file": ``source`` itself), built once."""
    check_draft_quant(quant)
    source = Path(source)
    if quant == "file":
        return source
    if not source.is_file():
        raise SpecboundError(f"no GGUF file at {str(source)!r}")
    lib = load_llama_cpp()
    source_sha = gguf_sha256(source)
    directory = requantized_dir(source, quant)
    if directory.is_dir():
        problems = _usable(directory, source_sha, quant)
        if not problems:
            return directory / FILE_NAME
        print(f"{directory}: cached {quant} draft is damaged ({'; '.join(problems)}); building it again",
              file=sys.stderr)
    parent = writable_dir(directory.parent)
    remove_stale_staging(parent, directory.name)
    staging = make_staging_dir(parent, directory.name)
    try:
        if progress:
            print(f"re-quantising {source.name} to {quant} for drafting (once; cached in {directory})",
                  file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        ftype, head_type = _FTYPES[quant]
        params = lib.llama_model_quantize_default_params()
        params.ftype = ftype
        params.allow_requantize = True
        params.token_embedding_type = head_type
        params.output_tensor_type = head_type
        params.nthread = 0
        rc = lib.llama_model_quantize(str(source).encode(), str(staging / FILE_NAME).encode(), ctypes.byref(params))
        if rc != 0 or not (staging / FILE_NAME).is_file():
            raise SpecboundError(f"llama.cpp could not re-quantise {str(source)!r} to {quant} (return code {rc})")
        manifest = write_manifest(staging, info={"source": str(source), "source_sha256": source_sha, "quant": quant,
                                                 "seconds": round(time.perf_counter() - t0, 1)})
        mark_verified(staging, manifest["files"])
        make_readable(staging)
        swap_into_place(staging, directory)
    except OSError as exc:
        if is_write_error(exc):
            raise not_writable(parent, exc) from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory / FILE_NAME
