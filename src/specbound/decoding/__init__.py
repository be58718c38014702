"""Decoding: sampling transforms, THE draft-tree type, THE verification core, drafters, ONE loop.

A token's way from prompt to output: a drafter (:mod:`.drafters`) proposes a :class:`DraftTree`
(:mod:`.tree`), the :class:`Speculator` (:mod:`.engine`) scores it with one target pass,
:func:`.verify.verify` keeps an accepted path plus a recovered or bonus token, the loop commits them.
"""
from .drafters import (
    BatchDrafter, ChainDrafter, DraftCache, Drafter, DynamicTreeDrafter, OracleTreeDrafter, RoundFeedback,
    SampledTreeDrafter, TargetLaws, make_tree_drafter,
)
from .batch import (
    BatchDecodeResult, BatchInterrupted, autoregressive_decode_batch, speculative_decode_batch,
)
from .engine import (
    DecodeInterrupted, DraftSpec, PlainDrafter, Speculator, autoregressive_decode, make_generator,
    speculative_decode,
)
from .result import DecodeMetrics, DecodeResult, RoundRecord
from .sampling import SamplingConfig, logits_to_probs
from .tree import DraftTree
from .verify import (
    STANDARD, AcceptanceRule, DecodingOPT, DecodingUNO, RelaxedAcceptance, Verdict, acceptance_probability,
    over_acceptance_probability, parse_relaxation, recursive_rejection_sampling, residual_distribution,
)

__all__ = [
    "BatchDecodeResult", "BatchInterrupted", "autoregressive_decode_batch", "speculative_decode_batch",
    "AcceptanceRule", "BatchDrafter", "ChainDrafter", "DecodeInterrupted", "DecodeMetrics", "DecodeResult",
    "DecodingOPT", "DecodingUNO", "DraftCache", "DraftTree", "Drafter", "DynamicTreeDrafter", "OracleTreeDrafter",
    "PlainDrafter", "RelaxedAcceptance", "RoundFeedback", "RoundRecord", "STANDARD", "SampledTreeDrafter", "SamplingConfig",
    "Speculator", "TargetLaws", "Verdict", "acceptance_probability", "autoregressive_decode", "logits_to_probs",
    "DraftSpec", "make_generator", "make_tree_drafter", "over_acceptance_probability", "parse_relaxation",
    "recursive_rejection_sampling", "residual_distribution", "speculative_decode",
]
