"""Load a target/draft pair of Hugging Face models (packaged names or local directories)."""
from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

from ..assets.models import (
    DEFAULT_DRAFT, DEFAULT_TARGET, is_packaged_name, load_hf_model, model_identity, resolve_model,
)
from ..errors import SpecboundError
from .fast import prepack_linears
from .kquant import fuse_kquant_inputs, load_gguf_kquant, load_kernel
from .hf import HFModel
from .static import StaticCacheHFModel, wrap_hf_model
from .calibration import calibration_batches
from .int8 import (
    activation_absmax, activation_bits, fuse_shared_inputs, load_int8, make_batch_invariant, quantize_int8,
    read_int8_description,
    save_int8,
)
from ..options import (
    DEFAULT_DRAFT_QUANT, DEFAULT_TARGET_PRECISION, DRAFT_ENGINES, FALLBACK_TARGET_PRECISION, TARGET_PRECISIONS,
    check_draft_engine,
    check_draft_quant, check_precision, resolve_compile, resolve_draft_engine,
)

__all__ = ["DEFAULT_DRAFT", "DEFAULT_TARGET", "DRAFT_ENGINES", "DEFAULT_TARGET_PRECISION", "INT8_RECIPE", "TARGET_PRECISIONS", "build_int8", "int8_kernels", "kquant_kernels", "reads_gguf", "resolve_target_precision",
           "check_draft_engine", "check_precision", "check_same_tokenizer", "load_engine_pair", "load_gguf_model",
           "load_model", "load_pair"]

#: Input channels of largest calibrated activation read in a group of their own, per layer
#: (docs/results/fidelity: of 4, 8 and 16, 16 came closest to fp32; all three within about 1 SE).
INT8_OUTLIERS = 16
#: How the cached int8 weights were made (the int8 cache's recipe: another recipe rebuilds the cache).
INT8_RECIPE = f"int8-fbgemm (per-channel weights, per-token activations, {INT8_OUTLIERS} outlier channels apart)"


def kquant_kernels() -> str:
    """Kernel name of K-quant targets (part of the cost-cache key and of every report)."""
    from .kquant import kernel_path

    return f"kquant (GGUF Q4_K/Q6_K weights as stored, int8 activations per 32 inputs, {kernel_path()} path)"


def reads_gguf(target) -> bool:
    """Whether a target argument names a GGUF file: the packaged default or name, or a ``.gguf`` path."""
    return target is None or str(target).endswith(".gguf") or is_packaged_name(target)


def resolve_target_precision(precision: str | None, target: str | None = None, warn=None) -> str:
    """``--target-precision`` as given, or (None) the default: "kquant" when the target is a GGUF file
    (a packaged name or a ``.gguf`` path) and the K-quant kernel builds here, else "int8" — then
    ``warn`` (a callable taking a message) is told why, so a report never names a target it did not run."""
    if precision is not None:
        return check_precision(precision)
    if not reads_gguf(target):
        return FALLBACK_TARGET_PRECISION
    try:
        load_kernel()
    except SpecboundError as exc:
        if warn is not None:
            warn(f"{exc}; the target is the int8 one instead (--target-precision int8)")
        return FALLBACK_TARGET_PRECISION
    return DEFAULT_TARGET_PRECISION


def _kquant_file(name_or_path, progress: bool) -> Path:
    """The GGUF file a K-quant target reads: a packaged model's, or a ``.gguf`` path."""
    from ..assets.gguf import gguf_path

    if is_packaged_name(name_or_path):
        return gguf_path(str(name_or_path), progress=progress)
    path = Path(name_or_path)
    if path.suffix != ".gguf" or not path.is_file():
        raise SpecboundError(f"--target-precision kquant reads a GGUF file (Q4_K/Q6_K tensors): {name_or_path} "
                             "is neither a packaged model nor a .gguf file")
    return path


def _kquant_cache_dir(name_or_path, source: Path) -> Path:
    """Where the unpacked K-quant copy of a GGUF file is kept: ``<cache>/models/<name>@kquant`` for a
    packaged model, ``<cache>/kquant/<hash of the file's path>`` for another file."""
    import hashlib

    from ..assets.cache import cache_root

    if is_packaged_name(name_or_path):
        return cache_root() / "models" / f"{name_or_path}@kquant"
    return cache_root() / "kquant" / hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:16]


def int8_kernels() -> str:
    """Kernel name of int8 models at run time (part of the cost-cache key and of every report): the
    recipe's weights, the outlier channels' products exact in float32
    (:meth:`Int8Linear._exact_outliers`) and this CPU's activation precision (:func:`activation_bits`:
    8 bits where its kernels do not saturate, else 7 — a different target, so it is named)."""
    return (f"int8-fbgemm (per-channel weights, per-token {activation_bits()}-bit activations, {INT8_OUTLIERS} "
            "outlier channels apart, exact)")


def quantize_target(model, tokenizer):
    """Quantise a float model in place the way specbound's int8 targets are: activation statistics
    from the built-in calibration texts, then :func:`~specbound.models.int8.quantize_int8` with the
    :data:`INT8_OUTLIERS` largest channels of every layer apart (none without a tokenizer)."""
    absmax = activation_absmax(model, calibration_batches(tokenizer)) if tokenizer is not None else None
    return quantize_int8(model, absmax=absmax, outliers=INT8_OUTLIERS if absmax else 0)


def build_int8(model, tokenizer, directory) -> dict:
    """Quantise a float model (:func:`quantize_target`) and write it into ``directory``; the builder
    the int8 model cache uses. Returns what the cache marker records."""
    quantize_target(model, tokenizer)
    save_int8(model, tokenizer, directory, info={"kernels": INT8_RECIPE})
    return {"kernels": INT8_RECIPE}


def _int8_directory(name, progress: bool):
    """The cached int8 model of a packaged name, rebuilt when it was made by another recipe."""
    directory = resolve_model(name, progress=progress, precision="int8", builder=build_int8)
    try:
        recipe = read_int8_description(directory).get("kernels")
    except SpecboundError:
        recipe = None
    if recipe != INT8_RECIPE:
        from ..assets.convert import convert_packaged_model

        if progress:
            print(f"{name}: the cached int8 model was made by another recipe ({recipe}); rebuilding it",
                  file=sys.stderr)
        directory = convert_packaged_model(str(name), force=True, progress=progress, precision="int8",
                                           builder=build_int8)
    return directory


def load_model(name_or_path, progress: bool = True, prepack: bool = True, int8: bool = False,
               precision: str | None = None, invariant: bool = True, compiled: bool = False) -> HFModel:
    """A packaged model name (see ``specbound models``) or a local model directory, as an HFModel.

    ``precision="fp32"`` (or ``int8=False``): the float model, with ``prepack`` swapping the linear
    layers for oneDNN-prepacked ones (exact in fp32, see :mod:`specbound.models.fast`).
    ``precision="int8"`` (or ``int8=True``): int8 weights and activations (:mod:`.int8`) — a
    different model from the fp32 one; speculative decoding is lossless with respect to it. A
    packaged model is quantised once and cached (``<cache>/models/<name>@int8``; the fp32 copy is
    never written for it); a local directory is quantised at load. ``invariant`` (int8) also makes
    the float parts batch-invariant (:func:`~specbound.models.int8.make_batch_invariant`, ~5% of a
    forward): what a target needs so that verifying k tokens equals reading them one by one; a draft
    only proposes and can skip it. ``compiled`` runs a static-cache model's single-row reads through
    ``torch.compile`` (:func:`~specbound.models.static.compiled_layer_step`): the same logits bit for
    bit, each layer's small operations fused; the graphs are built here, before the model is returned.
    """
    precision = check_precision("int8" if int8 else (precision or "fp32"))
    if compiled:
        resolve_compile(True, precision)         # quantised targets only: refused before anything loads
    t0 = time.perf_counter()
    if precision == "int8" and is_packaged_name(name_or_path):
        model, tokenizer = load_int8(_int8_directory(name_or_path, progress))
        fuse_shared_inputs(model)
        if invariant:
            make_batch_invariant(model)
        kernels = int8_kernels()
    elif precision == "kquant":
        source = _kquant_file(name_or_path, progress)
        model, tokenizer = load_gguf_kquant(source, cache_dir=_kquant_cache_dir(name_or_path, source))
        fuse_kquant_inputs(model)
        if invariant:
            make_batch_invariant(model)
        kernels = kquant_kernels()
    elif precision == "int8":
        model, tokenizer = load_hf_model(name_or_path, progress=progress)
        quantize_target(model, tokenizer)
        fuse_shared_inputs(model)
        if invariant:
            make_batch_invariant(model)
        kernels = int8_kernels()
    else:
        model, tokenizer = load_hf_model(name_or_path, progress=progress)
        kernels = "onednn-prepacked" if prepack and prepack_linears(model) else "eager"
    wrapped = wrap_hf_model(model, tokenizer, name=str(name_or_path))
    if isinstance(wrapped, StaticCacheHFModel):
        kernels += ", static KV cache"
        if compiled:
            wrapped.compiled = True
            if wrapped.compile_now() is not None:      # in the load time: no timed read pays for compiling
                kernels += ", torch.compile"
    # identity: content key for cost caches (None for temporary directories: never cached globally)
    wrapped.info = replace(wrapped.info, kernels=kernels, identity=model_identity(name_or_path),
                           load_seconds=time.perf_counter() - t0)
    return wrapped


def gguf_file(name_or_path, progress: bool = True, quant: str = "file") -> Path:
    """The GGUF file llama.cpp reads for ``name_or_path``: a packaged model's file (assembled and
    verified once) or the given path, re-quantised to ``quant`` unless "file" (built once, cached;
    :mod:`specbound.models.requant`). Cheap once made: a check of the cached copies' sizes."""
    from ..assets.gguf import gguf_path

    check_draft_quant(quant)
    path = gguf_path(str(name_or_path), progress=progress) if is_packaged_name(name_or_path) else name_or_path
    if quant != "file":
        from .requant import requantized_gguf

        path = requantized_gguf(path, quant, progress=progress)
    return Path(path)


def load_gguf_model(name_or_path, progress: bool = True, quant: str = "file", role: str = "target"):
    """A packaged model's GGUF file (assembled and verified once) or a ``.gguf`` path, on llama.cpp.
    ``quant`` other than "file" loads the file re-quantised (drafts only: :mod:`specbound.models.requant`).
    ``role="draft"`` opens it with :data:`~specbound.models.llamacpp.DRAFT_CONTEXT` (less memory; a
    draft's numerics never change the output law); a target keeps the batch-invariant defaults."""
    from .llamacpp import DRAFT_CONTEXT, LlamaCppModel

    if role not in ("target", "draft"):
        raise SpecboundError(f"role must be 'target' or 'draft', got {role!r}")
    path = gguf_file(name_or_path, progress, quant)
    settings = DRAFT_CONTEXT if role == "draft" else {}
    return LlamaCppModel(path, name=str(name_or_path) if quant == "file" else f"{name_or_path}@{quant}", **settings)


def check_same_tokenizer(target_model, draft_model) -> None:
    """Refuse a pair whose vocabularies or token ids differ (before any decoding)."""
    if target_model.vocab_size != draft_model.vocab_size:
        raise SpecboundError(
            f"vocabulary mismatch: target {target_model.name} has {target_model.vocab_size} logits, "
            f"draft {draft_model.name} has {draft_model.vocab_size}; pick a draft with the target's tokenizer"
        )
    t_tok, d_tok = target_model.tokenizer, draft_model.tokenizer
    if t_tok is None or d_tok is None:
        return
    if type(t_tok) is type(d_tok):
        same = t_tok.get_vocab() == d_tok.get_vocab()
    else:          # two engines' tokenizers (e.g. Hugging Face and llama.cpp): compare what they produce
        probe = "def f(x):\n    return x * 2  # héllo, wörld! 12345 \t<tab> 中文"
        same = [int(i) for i in t_tok(probe, add_special_tokens=False)["input_ids"]] == \
            [int(i) for i in d_tok(probe, add_special_tokens=False)["input_ids"]]
    if not same:
        raise SpecboundError(
            f"tokenizer mismatch: {target_model.name} and {draft_model.name} map tokens to different ids"
        )


def load_pair(target=None, draft=None, progress: bool = True, prepack: bool = True,
              draft_int8: bool = False, target_precision: str = "fp32", draft_engine: str = "torch",
              draft_quant: str = DEFAULT_DRAFT_QUANT, compiled: bool = False, draft_head=None):
    """Target and draft (defaults: the embedded Qwen2.5-Coder 1.5B / 0.5B pair), checked to share
    one vocabulary and tokenizer before any decoding starts. ``target_precision`` picks the target
    the user runs (fp32, prepacked; or int8 — lossless SD is with respect to that target);
    ``draft_int8`` quantises a torch draft (lossy for the draft, harmless for the output law);
    ``draft_engine="llamacpp"`` runs the draft's GGUF file on llama.cpp instead (mixed backends:
    the draft only proposes, so its engine never changes the output law); such a draft's weights are
    ``draft_quant`` ("q4_0": re-quantised once for llama.cpp's fastest CPU kernels; "file": as shipped).
    ``compiled``: the target's reads through torch.compile (:func:`load_model`); ``draft_head`` K: a
    llama.cpp draft proposing from its K most frequent tokens (:mod:`specbound.models.trimmed`)."""
    from .trimmed import check_draft_head

    check_precision(target_precision)
    check_draft_quant(draft_quant)
    draft_engine = resolve_draft_engine(draft_engine)
    head = check_draft_head(draft_head)
    if head is not None and draft_engine != "llamacpp":
        raise SpecboundError("a trimmed draft head needs the draft on llama.cpp (draft_engine='llamacpp')")
    if draft_engine == "llamacpp":         # make the draft's file first (a first run re-quantises it: ~0.4 GB
        gguf_file(draft or DEFAULT_DRAFT, progress, draft_quant)     # of work buffers, not beside the target)
    target_model = load_model(target or DEFAULT_TARGET, progress, prepack=prepack, precision=target_precision,
                              compiled=compiled)
    if draft_engine == "llamacpp" and head is not None:
        draft_model = _trimmed_draft(draft or DEFAULT_DRAFT, target_model, head, draft_quant, progress)
    elif draft_engine == "llamacpp":
        draft_model = load_gguf_model(draft or DEFAULT_DRAFT, progress=progress, quant=draft_quant, role="draft")
    else:
        draft_model = load_model(draft or DEFAULT_DRAFT, progress, prepack=prepack, int8=draft_int8, invariant=False)
    check_same_tokenizer(target_model, draft_model)
    return target_model, draft_model


def _trimmed_draft(draft, target_model, head: int, quant: str, progress: bool):
    from .llamacpp import DRAFT_CONTEXT
    from .trimmed import load_trimmed_draft

    if target_model.tokenizer is None:
        raise SpecboundError("a trimmed draft head counts tokens with the target's tokenizer; this target has none")
    identity = f"{target_model.info.identity or target_model.name}|{len(target_model.tokenizer)}"
    return load_trimmed_draft(gguf_file(draft, progress, quant), head=head, tokenizer=target_model.tokenizer,
                              vocab_size=target_model.vocab_size, identity=identity, progress=progress,
                              name=str(draft) if quant == "file" else f"{draft}@{quant}", **DRAFT_CONTEXT)


def load_engine_pair(engine: str, target=None, draft=None, progress: bool = True, target_precision: str = "fp32",
                     draft_engine: str | None = None, draft_quant: str = DEFAULT_DRAFT_QUANT, compiled: bool = False):
    """Target and draft on ``engine`` — "torch" (oneDNN-prepacked fp32 or int8 target; int8 draft,
    or the draft's GGUF on llama.cpp with ``draft_engine="llamacpp"``) or "llamacpp" (both GGUF
    files, read directly) — plus the model paths a serving engine would load. A draft on llama.cpp
    reads ``draft_quant`` weights (see :func:`load_pair`)."""
    if engine == "torch":
        target_model, draft_model = load_pair(target, draft, progress, draft_int8=True,
                                              target_precision=target_precision, draft_engine=draft_engine or "torch",
                                              draft_quant=draft_quant, compiled=compiled)
        if target_precision == "kquant":
            paths = {"target": str(_kquant_file(target or DEFAULT_TARGET, progress=False))}
        else:
            paths = {"target": str(resolve_model(target or DEFAULT_TARGET, progress=False, precision=target_precision,
                                                 builder=build_int8))}
        if resolve_draft_engine(draft_engine or "torch") == "torch":
            paths["draft"] = str(resolve_model(draft or DEFAULT_DRAFT, progress=False, precision="int8",
                                               builder=build_int8))
        paths.update(_packaged_gguf_paths(target or DEFAULT_TARGET, draft or DEFAULT_DRAFT))
        paths.setdefault("draft", str(getattr(draft_model, "path", None) or paths.get("draft_gguf")
                                      or draft or DEFAULT_DRAFT))
        return target_model, draft_model, paths
    if engine == "llamacpp":
        return load_gguf_pair(target or DEFAULT_TARGET, draft or DEFAULT_DRAFT, progress=progress,
                              draft_quant=draft_quant)
    raise SpecboundError(f"engine must be 'torch' or 'llamacpp', got {engine!r}")


def _packaged_gguf_paths(target, draft) -> dict:
    """``{"target_gguf", "draft_gguf"}`` when both are packaged models whose GGUF files are installed
    (llama.cpp's server loads GGUF files, not the converted directories); else ``{}``."""
    from ..assets.gguf import gguf_path

    try:
        return {"target_gguf": str(gguf_path(str(target), progress=False)),
                "draft_gguf": str(gguf_path(str(draft), progress=False))}
    except SpecboundError:
        return {}


def load_gguf_pair(target, draft, progress: bool = True, draft_quant: str = "file"):
    """A target/draft pair of GGUF files on llama.cpp (:func:`load_gguf_model`: the draft's weights
    ``draft_quant``), checked to share one vocabulary. Returns (target, draft, paths) — the paths a
    llama.cpp server would load."""
    target_model = load_gguf_model(target, progress)
    draft_model = load_gguf_model(draft, progress, quant=draft_quant, role="draft")
    if target_model.vocab_size != draft_model.vocab_size:
        raise SpecboundError(
            f"vocabulary mismatch: target {target} has {target_model.vocab_size} tokens, draft {draft} has "
            f"{draft_model.vocab_size}; pick a draft with the target's tokenizer"
        )
    return target_model, draft_model, {"target": str(target_model.path), "draft": str(draft_model.path)}
