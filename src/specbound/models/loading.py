"""Load a target/draft pair of Hugging Face models (packaged names or local directories)."""
from __future__ import annotations

import time
from dataclasses import replace

from ..assets.models import DEFAULT_DRAFT, DEFAULT_TARGET, load_hf_model, model_identity
from ..errors import SpecboundError
from .fast import prepack_linears, quantize_int8
from .hf import HFModel

__all__ = ["DEFAULT_DRAFT", "DEFAULT_TARGET", "load_engine_pair", "load_model", "load_pair"]


def load_model(name_or_path, progress: bool = True, prepack: bool = True, int8: bool = False) -> HFModel:
    """A packaged model name (see ``specbound models``) or a local model directory, as an HFModel.

    ``prepack`` swaps the linear layers for oneDNN-prepacked ones (exact in fp32, see
    :mod:`specbound.models.fast`); ``int8`` quantises them instead (lossy: for drafts only).
    """
    t0 = time.perf_counter()
    model, tokenizer = load_hf_model(name_or_path, progress=progress)
    if int8:
        quantize_int8(model)
        kernels = "int8-dynamic"
    elif prepack and prepack_linears(model):
        kernels = "onednn-prepacked"
    else:
        kernels = "eager"
    wrapped = HFModel(model, tokenizer, name=str(name_or_path))
    # identity: content key for cost caches (None for temporary directories: never cached globally)
    wrapped.info = replace(wrapped.info, kernels=kernels, identity=model_identity(name_or_path),
                           load_seconds=time.perf_counter() - t0)
    return wrapped


def load_pair(target=None, draft=None, progress: bool = True, prepack: bool = True,
              draft_int8: bool = False) -> tuple[HFModel, HFModel]:
    """Target and draft (defaults: the embedded Qwen2.5-Coder 1.5B / 0.5B pair), checked to share
    one vocabulary and tokenizer before any decoding starts. The target is only ever prepacked
    (exact); ``draft_int8`` quantises the draft (lossy for the draft, harmless for the output law)."""
    target_model = load_model(target or DEFAULT_TARGET, progress, prepack=prepack)
    draft_model = load_model(draft or DEFAULT_DRAFT, progress, prepack=prepack, int8=draft_int8)
    if target_model.vocab_size != draft_model.vocab_size:
        raise SpecboundError(
            f"vocabulary mismatch: target {target_model.name} has {target_model.vocab_size} logits, "
            f"draft {draft_model.name} has {draft_model.vocab_size}; pick a draft with the target's tokenizer"
        )
    t_tok, d_tok = target_model.tokenizer, draft_model.tokenizer
    if t_tok is not None and d_tok is not None and t_tok.get_vocab() != d_tok.get_vocab():
        raise SpecboundError(
            f"tokenizer mismatch: {target_model.name} and {draft_model.name} map tokens to different ids"
        )
    return target_model, draft_model


def load_engine_pair(engine: str, target=None, draft=None, progress: bool = True):
    """Target and draft on ``engine`` — "torch" (oneDNN-prepacked fp32 target, int8 draft) or
    "llamacpp" (the GGUF files, read directly) — plus the model paths a serving engine would load."""
    from ..assets.models import resolve_model

    if engine == "torch":
        target_model, draft_model = load_pair(target, draft, progress, draft_int8=True)
        paths = {"target": str(resolve_model(target or DEFAULT_TARGET, progress=False)),
                 "draft": str(resolve_model(draft or DEFAULT_DRAFT, progress=False))}
        paths.update(_packaged_gguf_paths(target or DEFAULT_TARGET, draft or DEFAULT_DRAFT))
        return target_model, draft_model, paths
    if engine == "llamacpp":
        from .llamacpp import load_gguf_pair

        return load_gguf_pair(target or DEFAULT_TARGET, draft or DEFAULT_DRAFT, progress=progress)
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
