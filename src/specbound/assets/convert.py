"""Converting a packaged GGUF model once into a verified Hugging Face directory, and checking it.

:func:`convert_packaged_model` takes the verified GGUF file (:func:`~specbound.assets.gguf.gguf_path`),
dequantizes it to fp32 with transformers, ``save_pretrained``-s model and tokenizer into a hidden
staging directory next to ``<cache>/models/<name>``, writes a marker (where it came from) and a
manifest (size + sha256 of every file), and renames the staging directory into place. Nothing
partial is ever visible under the final name: on any error or Ctrl-C the staging directory is
removed and the exception travels on.

:func:`check_converted` inspects a converted directory without changing it: cheaply (every file of
the manifest present with its size; safetensors headers consistent; config.json and tokenizer
files parse) or in full (sha256 of every file). Directories written by older specbound versions
have the marker but no manifest ("legacy"); :func:`upgrade_legacy` validates and completes them.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelNotAvailable, SpecboundError
from ..options import check_precision     # fp32 (a Hugging Face directory) or int8 (a builder's quantised model)
from .cache import (
    CacheCorrupt,
    atomic_write_json,
    cache_root,
    is_write_error,
    make_readable,
    make_staging_dir,
    manifest_problems,
    not_writable,
    read_manifest,
    remove_stale_staging,
    swap_into_place,
    writable_dir,
    write_manifest,
)
from .catalog import PackagedModel, get_packaged_model
from .checks import structure_problems
from .gguf import gguf_path, locate_files
from .packages import install_hint, module_available

__all__ = [
    "CONVERTER_PACKAGES",
    "MARKER_FILE",
    "CacheCheck",
    "check_converted",
    "convert_packaged_model",
    "converted_dir",
    "upgrade_legacy",
]

#: JSON file written into each converted directory: where its weights came from.
MARKER_FILE = "specbound-source.json"
#: Packages the GGUF -> fp32 conversion needs besides transformers (installed with their light deps).
#: transformers 5.x refuses ``from_pretrained(..., gguf_file=...)`` without accelerate.
CONVERTER_PACKAGES: tuple[str, ...] = ("gguf>=0.10.0", "accelerate>=1.0")


def converted_dir(name: str, precision: str = "fp32") -> Path:
    """Where the converted directory of packaged model ``name`` lives (``<name>`` for fp32,
    ``<name>@int8`` for the int8 model)."""
    check_precision(precision)
    return cache_root() / "models" / (name if precision == "fp32" else f"{name}@{precision}")


@dataclass(frozen=True)
class CacheCheck:
    """What :func:`check_converted` found for one packaged model.

    ``state`` is ``"missing"`` (never converted), ``"ok"`` (cheap checks passed), ``"verified"``
    (sha256 of every file matched its manifest), ``"legacy"`` (old cache without a manifest that
    passes the cheap checks) or ``"damaged"`` (``problems`` says what is wrong).
    """

    name: str
    directory: Path
    state: str
    problems: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        """Whether the directory can be loaded as it is."""
        return self.state in ("ok", "verified", "legacy")

    def describe(self) -> str:
        """One line for humans, e.g. ``"damaged: model.safetensors: expected ... found ..."``."""
        text = {"missing": "not converted", "ok": "ok (sizes and headers checked)",
                "verified": "verified (sha256 of every file)",
                "legacy": "ok, legacy cache without manifest (upgraded on next load or --verify)"}.get(self.state)
        return text or f"damaged: {'; '.join(self.problems)}"


def _read_marker(directory: Path) -> dict | None:
    """The marker JSON of a converted directory, or ``None`` if absent or unreadable."""
    try:
        marker = json.loads((directory / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def check_converted(name: str, *, full: bool = False, precision: str = "fp32") -> CacheCheck:
    """Inspect the converted directory of ``name`` without changing anything (see module doc)."""
    model = get_packaged_model(name)
    directory = converted_dir(name, precision)

    def result(state: str, problems=()) -> CacheCheck:
        return CacheCheck(name, directory, state, tuple(problems))

    if not directory.exists():
        return result("missing")
    marker = _read_marker(directory)
    if marker is None:
        return result("damaged", [f"{MARKER_FILE}: missing or unreadable (an incomplete or foreign directory)"])
    if marker.get("precision", "fp32") != precision:
        return result("damaged", [f"{MARKER_FILE}: holds a {marker.get('precision')} model, expected {precision}"])
    if marker.get("source_sha256") != model.sha256:
        return result("damaged", [f"{MARKER_FILE}: converted from a GGUF with sha256 "
                                  f"{marker.get('source_sha256')}, expected {model.sha256}"])
    try:
        manifest = read_manifest(directory)
    except CacheCorrupt as exc:
        return result("damaged", [str(exc)])
    if manifest is None and precision != "fp32":
        return result("damaged", ["manifest missing"])
    if manifest is None:
        problems = structure_problems(directory)
        return result("damaged" if problems else "legacy", problems)
    problems = manifest_problems(directory, manifest) or structure_problems(directory)
    if problems:
        return result("damaged", problems)
    if full:
        problems = manifest_problems(directory, manifest, full=True)
        return result("damaged" if problems else "verified", problems)
    return result("ok")


def _manifest_info(model: PackagedModel, origin: str) -> dict:
    """What a manifest of a converted directory records besides the files."""
    return {"name": model.name, "source_sha256": model.sha256, "origin": origin}


def upgrade_legacy(name: str, *, progress: bool = True) -> bool:
    """Write the manifest of a legacy cache that passed the cheap checks (hashes every file once).

    Returns ``False`` (with a note on stderr) when the cache is read-only: it is then used as is.
    """
    model = get_packaged_model(name)
    directory = converted_dir(name)
    _log(f"{name}: cache written by an older specbound has no manifest; recording sizes and sha256 once "
         f"({_directory_size(directory) / 1e9:.1f} GB to read)", progress)
    try:
        write_manifest(directory, info=_manifest_info(model, "legacy-upgrade"))
    except OSError as exc:
        if not is_write_error(exc):
            raise
        print(f"note: {not_writable(directory, exc)}; the legacy cache of {name} is used without a manifest",
              file=sys.stderr)
        return False
    return True


def _directory_size(path: Path) -> int:
    """Total bytes of the regular files directly in ``path``."""
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file()) if path.is_dir() else 0


def _check_converter_packages() -> None:
    """:class:`ModelNotAvailable` with the install command if gguf or accelerate is missing."""
    missing = [req for req in CONVERTER_PACKAGES if not module_available(req.split(">")[0].split("=")[0])]
    if missing:
        raise ModelNotAvailable(f"converting a packaged GGUF model needs {', '.join(missing)}; install with:\n  "
                                + install_hint(missing, no_deps=False))


def _load_from_gguf(directory: Path, gguf_name: str, dtype):
    """Load (model, tokenizer) from a GGUF file with transformers, dequantized to ``dtype``."""
    _check_converter_packages()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf_name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=gguf_name, dtype=dtype,
                                                 local_files_only=True)
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


def _write_marker(directory: Path, model: PackagedModel, seconds: float, precision: str = "fp32",
                  extra: dict | None = None) -> None:
    """Record where a converted directory came from."""
    import torch
    import transformers

    atomic_write_json(directory / MARKER_FILE, {
        "name": model.name, "source_gguf": model.gguf_name, "source_size": model.size,
        "source_sha256": model.sha256, "source_packages": model.requirements,
        "dtype": "float32" if precision == "fp32" else precision, "precision": precision, **(extra or {}),
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "conversion_seconds": round(seconds, 1), "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    })


def _move_into_place(staging: Path, final: Path, name: str, *, replace: bool, precision: str = "fp32") -> None:
    """Rename a finished staging directory to ``final``.

    A healthy conversion that another process finished meanwhile is kept unless ``replace``; an
    existing damaged or replaced one is swapped out (:func:`~specbound.assets.cache.swap_into_place`).
    """
    if final.exists() and not replace and check_converted(name, precision=precision).state == "ok":
        return
    swap_into_place(staging, final)


def convert_packaged_model(name: str, *, force: bool = False, progress: bool = True, precision: str = "fp32",
                           builder=None) -> Path:
    """Make sure ``converted_dir(name, precision)`` holds a healthy conversion of packaged model ``name``.

    A healthy cache is returned at once (a legacy one gets its manifest); a missing or damaged
    one is (re)built from the installed packages, as is any with ``force``. fp32: the GGUF is
    dequantized and saved (peak memory about 9 GB for the 1.5B model). Other precisions need a
    ``builder(model, tokenizer, directory) -> dict`` that writes the quantised files from the fp32
    model (read from the fp32 cache when it exists, else dequantized in memory: no fp32 copy is
    written); its dict is recorded in the marker. Raises :class:`ModelNotAvailable` naming the
    install command when packages are missing, :class:`~specbound.assets.cache.CacheNotWritable`
    naming the directory when the cache cannot be written; Ctrl-C leaves no partial directory.
    """
    check_precision(precision)
    if precision != "fp32" and builder is None:
        raise SpecboundError(f"converting {name} to {precision} needs a builder (specbound.models.loading)")
    model = get_packaged_model(name)
    final = converted_dir(name, precision)
    if not force:
        check = check_converted(name, precision=precision)
        if check.state == "ok":
            return final
        if check.state == "legacy":
            upgrade_legacy(name, progress=progress)
            return final
        if check.state == "damaged":
            _log(f"{name}: cached conversion in {final} is damaged ({'; '.join(check.problems)}); rebuilding it",
                 progress)
    fp32_cache = precision != "fp32" and check_converted(name).usable
    if not fp32_cache:
        locate_files(model)  # fail before any work when a package is missing
        _check_converter_packages()
    parent = writable_dir(final.parent)
    remove_stale_staging(parent, final.name)
    start = time.perf_counter()
    staging = make_staging_dir(parent, final.name)
    try:
        import torch

        if fp32_cache:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            source = converted_dir(name)
            _log(f"{name}: quantising the cached fp32 model to {precision}", progress)
            tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
            hf_model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32, local_files_only=True)
        else:
            gguf = gguf_path(name, verify=True, progress=progress)
            _log(f"{name}: GGUF checksum ok; dequantizing to float32 with transformers (1-2 minutes)", progress)
            hf_model, tokenizer = _load_from_gguf(gguf.parent, gguf.name, torch.float32)
        extra = None
        if precision == "fp32":
            _save_plain(hf_model, tokenizer, staging)
        else:
            _log(f"{name}: quantising to {precision}", progress)
            extra = builder(hf_model.eval(), tokenizer, staging)
        del hf_model
        _write_marker(staging, model, time.perf_counter() - start, precision, extra)
        problems = structure_problems(staging)
        if problems:
            raise SpecboundError(f"converting {name} produced an unusable directory: {'; '.join(problems)}")
        _log(f"{name}: recording sizes and sha256 of the converted files", progress)
        write_manifest(staging, info=_manifest_info(model, "conversion"))
        make_readable(staging)
        _move_into_place(staging, final, name, replace=force, precision=precision)
    except OSError as exc:
        if is_write_error(exc):
            raise not_writable(parent, exc) from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _log(f"{name}: converted to {precision} in {time.perf_counter() - start:.0f} s -> {final}", progress)
    return final


def _log(message: str, enabled: bool) -> None:
    """Progress message on stderr."""
    if enabled:
        print(message, file=sys.stderr)
