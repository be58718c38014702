"""Sampling transforms, the verification core and the decoding engines."""
from .engine import ChainSpeculator, autoregressive_decode, speculative_decode
from .result import DecodeMetrics, DecodeResult
from .sampling import SamplingConfig, logits_to_probs
from .verify import acceptance_probability, residual_distribution, verify_chain

__all__ = [
    "ChainSpeculator", "DecodeMetrics", "DecodeResult", "SamplingConfig", "acceptance_probability",
    "autoregressive_decode", "logits_to_probs", "residual_distribution", "speculative_decode", "verify_chain",
]
