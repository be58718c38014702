"""Sampling transforms, the verification core and the decoding engines."""
from .engine import ChainSpeculator, autoregressive_decode, speculative_decode
from .result import DecodeMetrics, DecodeResult
from .sampling import SamplingConfig, logits_to_probs
from .verify import acceptance_probability, residual_distribution, verify_chain

__all__ = [
    "ChainSpeculator", "DecodeMetrics", "DecodeResult", "SamplingConfig", "acceptance_probability",
    "autoregressive_decode", "logits_to_probs", "residual_distribution", "speculative_decode", "verify_chain",
]

# draft trees (Pankratov & Alistarh 2026): tree engine, drafters, tree verification
from .drafters import (  # noqa: E402
    DraftedTree, DynamicTreeDrafter, OracleTreeDrafter, SampledTreeDrafter, TreeDrafter, chain_tree_drafter,
)
from .tree import TreeRound, TreeSpeculator, tree_speculative_decode  # noqa: E402
from .verify import TreeVerdict, verify_tree_deterministic, verify_tree_multidraft  # noqa: E402

__all__ += [
    "DraftedTree", "DynamicTreeDrafter", "OracleTreeDrafter", "SampledTreeDrafter", "TreeDrafter", "TreeRound",
    "TreeSpeculator", "TreeVerdict", "chain_tree_drafter", "tree_speculative_decode", "verify_tree_deterministic",
    "verify_tree_multidraft",
]

# batch speculative decoding and relaxed (biased) decoding (Yin et al. 2024, Alg. 4 / Thm 3; §5 Thm 4/5)
from .batch import BatchSpeculator, RelaxedChainSpeculator  # noqa: E402
from .verify import (  # noqa: E402
    DecodingOPT, DecodingUNO, RelaxedAcceptance, over_acceptance_probability, recursive_rejection_sampling,
)

__all__ += [
    "BatchSpeculator", "DecodingOPT", "DecodingUNO", "RelaxedAcceptance", "RelaxedChainSpeculator",
    "over_acceptance_probability", "recursive_rejection_sampling",
]
