"""Model choices a command line validates before anything heavy is imported or loaded (no torch here)."""
from __future__ import annotations

from .errors import SpecboundError

__all__ = ["DEFAULT_DRAFT_ENGINE", "DEFAULT_DRAFT_QUANT", "DEFAULT_TARGET_PRECISION", "DRAFT_ENGINES", "DRAFT_QUANTS",
           "COMPILED_PRECISIONS", "FALLBACK_TARGET_PRECISION", "TARGET_PRECISIONS", "check_draft_engine", "check_draft_quant",
           "check_precision", "resolve_compile", "resolve_draft_engine"]

#: What ``--target-precision`` accepts: the fp32 model (oneDNN-prepacked), its int8 quantisation
#: (:mod:`specbound.models.int8`), or "kquant": the GGUF file's own Q4_K/Q6_K weights on specbound's
#: K-quant kernel (:mod:`specbound.models.kquant`). The quantised ones are different targets, with
#: respect to which decoding is lossless.
TARGET_PRECISIONS = ("fp32", "int8", "kquant")
#: Targets whose reads may go through torch.compile (static-cache models of quantised weights).
COMPILED_PRECISIONS = ("int8", "kquant")
#: The packaged pair's default target (README and docs/quantised-targets.md say why): the GGUF file's own
#: K-quant weights where the kernel builds and the target is a GGUF file (a packaged name or a .gguf
#: path), else int8 (:func:`resolve_target_precision`).
DEFAULT_TARGET_PRECISION = "kquant"
#: What a local Hugging Face directory (not a GGUF file) gets by default.
FALLBACK_TARGET_PRECISION = "int8"
#: Where the draft may run: PyTorch (int8 or fp32), llama.cpp (the packaged GGUF, weights per
#: ``DRAFT_QUANTS``), or "auto": llama.cpp when llama-cpp-python is installed (its q4_0 draft forward
#: is the cheapest here: docs/results/profile), else PyTorch.
DRAFT_ENGINES = ("auto", "torch", "llamacpp")
DEFAULT_DRAFT_ENGINE = "auto"
#: The weights of a draft run on llama.cpp: "q4_0" = its GGUF re-quantised once to q4_0 and cached
#: (llama.cpp's repacked CPU kernels: ~half the time per drafted token of the packaged q5_0-heavy file,
#: a few percent less acceptance; :mod:`specbound.models.requant`), "file" = the GGUF as it ships.
#: The draft only proposes, so neither changes the output law.
DRAFT_QUANTS = ("q4_0", "file")
DEFAULT_DRAFT_QUANT = "q4_0"


def _one_of(value: str, choices: tuple[str, ...], what: str) -> str:
    if value not in choices:
        raise SpecboundError(f"{what} must be one of {', '.join(choices)}, got {value!r}")
    return value


def check_precision(precision: str) -> str:
    """A model's precision (a target's, or a packaged model's cache): one of :data:`TARGET_PRECISIONS`."""
    return _one_of(precision, TARGET_PRECISIONS, "precision")


def check_draft_engine(engine: str) -> str:
    return _one_of(engine, DRAFT_ENGINES, "draft engine")


def check_draft_quant(quant: str) -> str:
    return _one_of(quant, DRAFT_QUANTS, "draft quantisation")


def resolve_draft_engine(engine: str) -> str:
    """"auto" → "llamacpp" when llama-cpp-python can be imported, else "torch"; others as given."""
    import importlib.util

    check_draft_engine(engine)
    if engine != "auto":
        return engine
    return "llamacpp" if importlib.util.find_spec("llama_cpp") is not None else "torch"


def resolve_compile(compile_: bool | None, precision: str) -> bool:
    """``--compile`` / ``--no-compile`` / neither (None): a quantised target's reads (int8, kquant) go
    through torch.compile unless told not to (same logits bit for bit, ~10% faster passes here:
    docs/quantised-targets.md); the fp32 target is never compiled, and asking for it is an error."""
    if compile_ and precision not in COMPILED_PRECISIONS:
        raise SpecboundError(f"--compile reads a quantised target through torch.compile: use --target-precision "
                             f"{' or '.join(COMPILED_PRECISIONS)} (got {precision})")
    return precision in COMPILED_PRECISIONS if compile_ is None else bool(compile_)
