"""Pure NumPy/SciPy theory: the single home of every formula of the two papers.

Argument order: every function taking a target and a draft takes them keyword-only, target first
(``expected_rejections(target=..., draft=..., horizon=...)``); only the symmetric ``tv(a, b)`` and
``overlap(a, b)`` are positional. Natural logs and float64 throughout.
"""
from .chains import MarkovChain
from .distributions import as_distribution, entropy, overlap, residual, surprisal_moments, tv
from .rejections import (
    check_rejection_based,
    expected_rejections,
    expected_target_calls,
    random_rejection_based_acceptance,
    rejection_based_expected_rejections,
    rejection_based_output,
    rejections_per_position,
    standard_acceptance,
)

__all__ = [
    "MarkovChain",
    "as_distribution",
    "check_rejection_based",
    "entropy",
    "expected_rejections",
    "expected_target_calls",
    "overlap",
    "random_rejection_based_acceptance",
    "rejection_based_expected_rejections",
    "rejection_based_output",
    "rejections_per_position",
    "residual",
    "standard_acceptance",
    "surprisal_moments",
    "tv",
]

# Pankratov & Alistarh 2026: draft trees and speed-of-light bounds
from .trees import (
    PathTree,
    brute_force_optimal_value,
    chain_value,
    enumerate_prefix_closed_trees,
    optimal_tree,
    sample_accepted_length,
    static_tree_from_acceptance,
    tree_value,
)
from .bounds import (
    BOUND_FORMS,
    MomentEstimate,
    bound_all_forms,
    bound_is_valid,
    entropy_moments,
    estimate_moments,
    pool_moments,
    speed_of_light,
)

__all__ += [
    "BOUND_FORMS",
    "PathTree",
    "MomentEstimate",
    "bound_all_forms",
    "bound_is_valid",
    "brute_force_optimal_value",
    "chain_value",
    "entropy_moments",
    "enumerate_prefix_closed_trees",
    "estimate_moments",
    "optimal_tree",
    "pool_moments",
    "sample_accepted_length",
    "speed_of_light",
    "static_tree_from_acceptance",
    "tree_value",
]

# Yin et al. 2024: batch speculative decoding (Thm 3, Prop. 1; design B, design A a derived variant) and the over-acceptance trade-off (Thm 4, 5)
from .rejections import (
    batch_expected_rejections,
    batch_expected_target_calls,
    batch_improvement,
    batch_rejections_limit,
    batch_rejections_per_position,
    batch_round_starts,
    batch_target_calls_limit,
    bernoulli_all_reject,
    bernoulli_batch_improvement,
    residual_chain,
    sampled_tree_value,
    simulate_batch_rejections,
    uniform_all_reject,
    uniform_batch_improvement,
)
from .tradeoff import (
    OVER_ACCEPTANCE_FORMS,
    ParetoFront,
    lp_minimal_bias,
    minimal_bias,
    optimal_residual,
    output_law,
    over_acceptance,
    pareto_front,
    tradeoff_point,
    tv_loss,
    uno_bias,
)

__all__ += [
    "OVER_ACCEPTANCE_FORMS",
    "ParetoFront",
    "batch_expected_rejections",
    "batch_expected_target_calls",
    "batch_improvement",
    "batch_rejections_limit",
    "batch_rejections_per_position",
    "batch_round_starts",
    "batch_target_calls_limit",
    "bernoulli_all_reject",
    "bernoulli_batch_improvement",
    "lp_minimal_bias",
    "minimal_bias",
    "optimal_residual",
    "output_law",
    "over_acceptance",
    "pareto_front",
    "residual_chain",
    "sampled_tree_value",
    "simulate_batch_rejections",
    "tradeoff_point",
    "tv_loss",
    "uniform_all_reject",
    "uniform_batch_improvement",
    "uno_bias",
]

from .speedup import (  # noqa: E402
    CostProfile, allocate_batch_nodes, batch_throughput, best_batch_gamma, best_gamma, expected_speedup,
    expected_tokens_per_step, round_speedup, rows_pass_seconds, speed_of_light_speedup,
)

__all__ += ["CostProfile", "allocate_batch_nodes", "batch_throughput", "best_batch_gamma", "best_gamma",
            "expected_speedup", "expected_tokens_per_step", "round_speedup", "rows_pass_seconds",
            "speed_of_light_speedup"]

# Sun et al. 2025: block verification of a drafted chain, next to token-wise verification
from .verification import (  # noqa: E402
    VERIFICATIONS, block_accepted_by_length, block_residual, block_stop_probabilities, block_weights, expected_accepted,
    token_stop_probabilities,
)

__all__ += ["VERIFICATIONS", "block_accepted_by_length", "block_residual", "block_stop_probabilities", "block_weights", "expected_accepted",
            "token_stop_probabilities"]
