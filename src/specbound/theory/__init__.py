"""Pure NumPy/SciPy theory: the single home of every formula of the two papers."""
from .chains import MarkovChain
from .distributions import as_distribution, entropy, overlap, residual, surprisal_moments, tv
from .rejections import (
    check_rejection_based,
    expected_rejections,
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
