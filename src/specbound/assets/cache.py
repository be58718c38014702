"""specbound's on-disk cache: one root, atomic writes, and manifests of verified files.

The root is ``$SPECBOUND_CACHE`` when set, else ``~/.cache/specbound``. Everything specbound keeps
(converted models, assembled GGUF files, measured costs) lives below it. Files are written to a
temporary sibling and renamed into place, so a reader never sees half a file. A *manifest*
(``specbound-manifest.json``) records the size and sha256 of every file of a directory when it
is written; :func:`manifest_problems` later checks the sizes cheaply or the hashes in full.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import SpecboundError

__all__ = [
    "CACHE_ENV",
    "MANIFEST_FILE",
    "CacheCorrupt",
    "CacheNotWritable",
    "VERIFIED_FILE",
    "atomic_write_bytes",
    "changed_file_problems",
    "mark_verified",
    "atomic_write_json",
    "atomic_write_text",
    "cache_root",
    "is_temporary",
    "is_write_error",
    "make_readable",
    "make_staging_dir",
    "manifest_problems",
    "not_writable",
    "read_manifest",
    "remove_stale_staging",
    "sha256_file",
    "swap_into_place",
    "writable_dir",
    "write_manifest",
]

#: Environment variable that moves the cache root.
CACHE_ENV = "SPECBOUND_CACHE"
#: Name of the manifest written into a verified directory.
MANIFEST_FILE = "specbound-manifest.json"
MANIFEST_FORMAT = 1
#: Per directory: the (size, modification time) each file had when its sha256 last matched the manifest
VERIFIED_FILE = ".specbound-verified.json"
_CHUNK = 8 * 1024 * 1024


class CacheNotWritable(SpecboundError):
    """The cache directory cannot be created or written (read-only, no permission, disk full)."""


class CacheCorrupt(SpecboundError):
    """A cached file is missing, truncated or does not match what was recorded when it was written."""


def cache_root() -> Path:
    """Root of specbound's caches: ``$SPECBOUND_CACHE`` or ``~/.cache/specbound``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specbound"


def is_temporary(path: str | os.PathLike) -> bool:
    """Whether ``path`` lies inside the system temporary directory (e.g. a test's model)."""
    tmp = Path(tempfile.gettempdir()).resolve()
    return Path(path).expanduser().resolve().is_relative_to(tmp)


# --------------------------------------------------------------------------- writability


def is_write_error(exc: OSError) -> bool:
    """Whether ``exc`` means "cannot write here" (no permission, read-only file system, disk full)."""
    return exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


def not_writable(directory: Path, exc: OSError) -> CacheNotWritable:
    """The error to raise when writing below ``directory`` failed with ``exc``."""
    reason = exc.strerror or type(exc).__name__
    return CacheNotWritable(
        f"cannot write to the specbound cache directory {directory} ({reason}); make it writable, "
        f"free some space, or point the environment variable {CACHE_ENV} at a writable directory"
    )


def _probe(directory: Path) -> None:
    """Create and delete one file in ``directory`` (raises OSError when that is impossible)."""
    fd, name = tempfile.mkstemp(prefix=".write-probe-", dir=directory)
    os.close(fd)
    os.unlink(name)


def writable_dir(directory: Path) -> Path:
    """Create ``directory`` (and parents) if needed and check that files can be written in it.

    Raises :class:`CacheNotWritable` naming the directory and :data:`CACHE_ENV` otherwise.
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _probe(directory)
    except OSError as exc:
        raise not_writable(directory, exc) from None
    return directory


# --------------------------------------------------------------------------- atomic writes


def _file_mode(directory: Path) -> int:
    """Mode for new files in ``directory``: its own mode without execute bits (mkstemp uses 0600)."""
    return directory.stat().st_mode & 0o666


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary sibling, fsync, then rename into place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _file_mode(path.parent))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write_bytes` of UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj) -> None:
    """:func:`atomic_write_bytes` of ``obj`` as indented JSON."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- staging directories


def make_staging_dir(parent: Path, name: str) -> Path:
    """A fresh hidden directory ``parent/.NAME.tmp-PID-XXXX`` to build ``parent/NAME`` in."""
    return Path(tempfile.mkdtemp(prefix=f".{name}.tmp-{os.getpid()}-", dir=parent))


def make_readable(directory: Path) -> None:
    """Give a staging directory (created 0700 by mkdtemp) and its files the modes of its parent (umask-made)."""
    dir_mode = directory.parent.stat().st_mode & 0o777
    os.chmod(directory, dir_mode)
    for path in directory.iterdir():
        if path.is_file():
            os.chmod(path, dir_mode & 0o666)


def swap_into_place(staging: Path, final: Path) -> None:
    """Rename a finished staging directory to ``final``; an existing ``final`` is first renamed to a
    hidden sibling, then deleted (a reader never sees a half-removed directory under the final name)."""
    if final.exists():
        trash = make_staging_dir(final.parent, final.name)
        os.replace(final, trash / final.name)
        os.replace(staging, final)
        shutil.rmtree(trash, ignore_errors=True)
        return
    os.replace(staging, final)


def _pid_alive(pid: int) -> bool:
    """Whether a process with this id exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_staging(parent: Path, name: str) -> list[Path]:
    """Delete staging leftovers of ``name`` in ``parent`` whose creating process is gone.

    A killed process (SIGKILL, power loss) cannot clean up after itself; the PID in the staging
    name tells whether its owner still runs. Returns the removed paths.
    """
    removed = []
    prefix = f".{name}.tmp-"
    if not parent.is_dir():
        return removed
    for entry in parent.iterdir():
        if not entry.name.startswith(prefix):
            continue
        pid_text = entry.name[len(prefix):].split("-", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


# --------------------------------------------------------------------------- hashing + manifests


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    """sha256 hex digest of a file, read in 8 MB chunks (``on_bytes`` gets each chunk's size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return digest.hexdigest()


def write_manifest(
    directory: Path,
    *,
    info: dict | None = None,
    exclude: Iterable[str] = (),
    on_bytes: Callable[[int], None] | None = None,
) -> dict:
    """Record size and sha256 of every regular file of ``directory`` in its manifest; return it.

    ``info`` is stored alongside (e.g. where the files came from); files named in ``exclude`` and
    the manifest itself are not recorded. The manifest is written atomically.
    """
    directory = Path(directory)
    skip = {MANIFEST_FILE, *exclude}
    files = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name not in skip and not path.name.startswith("."):
            files[path.name] = {"size": path.stat().st_size, "sha256": sha256_file(path, on_bytes)}
    manifest = {
        "format": MANIFEST_FORMAT,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": files,
        **({"info": info} if info else {}),
    }
    atomic_write_json(directory / MANIFEST_FILE, manifest)
    return manifest


def read_manifest(directory: Path) -> dict | None:
    """The manifest of ``directory``; ``None`` when there is none.

    Raises :class:`CacheCorrupt` when it exists but cannot be read or has the wrong shape.
    """
    path = Path(directory) / MANIFEST_FILE
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CacheCorrupt(f"{path.name}: unreadable ({exc})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(r, dict) and isinstance(r.get("size"), int) and isinstance(r.get("sha256"), str)
        for r in files.values()
    ):
        raise CacheCorrupt(f"{path.name}: not a specbound manifest (no 'files' with size and sha256)")
    return manifest


def manifest_problems(
    directory: Path,
    manifest: dict,
    *,
    full: bool = False,
    on_bytes: Callable[[int], None] | None = None,
) -> list[str]:
    """What differs between ``directory`` and its manifest; an empty list when nothing does.

    Always checks that every recorded file exists with its recorded size (cheap); with ``full``
    also recomputes every sha256. Each problem names the file, the expected and the found value.
    """
    problems = []
    for name, record in manifest["files"].items():
        path = Path(directory) / name
        if not path.is_file():
            problems.append(f"{name}: missing (the manifest records {record['size']:,} bytes)")
            continue
        size = path.stat().st_size
        if size != record["size"]:
            problems.append(f"{name}: expected {record['size']:,} bytes, found {size:,}")
            continue
        if full:
            actual = sha256_file(path, on_bytes)
            if actual != record["sha256"]:
                problems.append(f"{name}: sha256 is {actual}, expected {record['sha256']} (same size, changed content)")
    return problems


def _stat_stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def mark_verified(directory: Path, names: Iterable[str]) -> None:
    """Record that the files ``names`` of ``directory`` match the manifest as they are now (their size and
    modification time), so that :func:`changed_file_problems` hashes them again only once they change.
    Best effort: a read-only directory is hashed on every read instead."""
    directory = Path(directory)
    stamps = _read_stamps(directory)
    stamps.update({name: _stat_stamp(directory / name) for name in names})
    try:
        atomic_write_json(directory / VERIFIED_FILE, stamps)
    except OSError:
        pass


def _read_stamps(directory: Path) -> dict:
    try:
        stamps = json.loads((Path(directory) / VERIFIED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return stamps if isinstance(stamps, dict) else {}


def changed_file_problems(directory: Path, manifest: dict, on_bytes: Callable[[int], None] | None = None) -> list[str]:
    """:func:`manifest_problems` (sizes, cheap), and the sha256 of every file changed since it last
    matched (:func:`mark_verified`): a copy damaged in place (same size, other bytes) is found on the
    first read after the damage, and an unchanged copy costs one stat per file."""
    problems = manifest_problems(directory, manifest)
    if problems:
        return problems
    directory = Path(directory)
    stamps = _read_stamps(directory)
    changed = [name for name in manifest["files"] if stamps.get(name) != _stat_stamp(directory / name)]
    for name in changed:
        actual = sha256_file(directory / name, on_bytes)
        if actual != manifest["files"][name]["sha256"]:
            problems.append(f"{name}: sha256 is {actual}, expected {manifest['files'][name]['sha256']} "
                            "(changed since it was written)")
    if changed and not problems:
        mark_verified(directory, changed)
    return problems
