"""Small statistics shared by every study: means with standard errors, ratio estimators, binomial
intervals, running averages and log-slopes. NumPy only; NaN where a quantity is undefined."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["Z95", "cluster_bootstrap_interval", "cluster_mean_se", "fit_log_slope", "mean_se", "ratio_se",
           "running_checkpoints", "sign_test_p", "variance_split", "wilson_interval", "z_score"]


#: The two-sided 95% normal quantile.
Z95 = 1.959963984540054


def mean_se(values) -> tuple[float, float]:
    """(mean, standard error of the mean); SE is NaN for fewer than two values, both NaN for none."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size == 0:
        return float("nan"), float("nan")
    se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan")
    return float(x.mean()), se


def ratio_se(numerators, denominators) -> tuple[float, float]:
    """Pooled ratio Σa/Σb and its standard error (ratio estimator, the pairs (a, b) as units)."""
    a = np.asarray(numerators, dtype=np.float64)
    b = np.asarray(denominators, dtype=np.float64)
    if a.size == 0 or b.sum() == 0:
        return float("nan"), float("nan")
    ratio = a.sum() / b.sum()
    if a.size < 2:
        return float(ratio), float("nan")
    resid = a - ratio * b
    se = math.sqrt((resid ** 2).sum() / (a.size * (a.size - 1))) / b.mean()
    return float(ratio), float(se)


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (successes may be fractional: ties count ½)."""
    if n <= 0:
        return float("nan"), float("nan")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _cluster_rows(values, clusters) -> tuple[np.ndarray, np.ndarray, int]:
    """(values as floats, each value's cluster number in order of first appearance, number of clusters)."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    keys = list(clusters)
    if x.size != len(keys):
        raise ValueError(f"{x.size} values but {len(keys)} cluster labels")
    index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    return x, np.array([index[k] for k in keys], dtype=np.int64), len(index)


def _cluster_sums(values, clusters) -> tuple[np.ndarray, np.ndarray]:
    """(sum, size) of ``values`` per cluster label, in order of first appearance."""
    x, rows, k = _cluster_rows(values, clusters)
    return np.bincount(rows, weights=x, minlength=k), np.bincount(rows, minlength=k).astype(np.float64)


def cluster_bootstrap_interval(values, clusters, resamples: int = 4000, seed: int = 0,
                               level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean of ``values`` when whole clusters (e.g. the samples of one prompt,
    which share the prompt) are resampled with replacement; NaN for fewer than two clusters."""
    sums, sizes = _cluster_sums(values, clusters)
    if sums.size < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, sums.size, size=(int(resamples), sums.size))
    means = sums[picks].sum(axis=1) / sizes[picks].sum(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def cluster_mean_se(values, clusters) -> tuple[float, float]:
    """(mean, standard error) of ``values`` with the clusters as independent units (the ratio
    estimator Σ cluster sums / Σ cluster sizes, so correlated values within a cluster are not counted
    as independent); SE NaN for fewer than two clusters."""
    return ratio_se(*_cluster_sums(values, clusters))


def variance_split(values, clusters) -> tuple[float, float]:
    """(σ_b², σ_w²): the variance of ``values`` between clusters and within them, by the one-way
    random-effects analysis of variance (method of moments, unbalanced clusters: σ_w² = within mean
    square, σ_b² = (between mean square − σ_w²) / n₀ with n₀ = (N − Σ mᵢ²/N)/(k − 1), clipped at 0).

    It says how a cluster-robust SE falls with the design: with n clusters of m values each the SE of
    the mean is ≈ √(σ_b²/n + σ_w²/(n m)), so no number of values per cluster takes it below σ_b/√n.
    NaN where undefined (σ_w² needs a cluster with two values, σ_b² two clusters)."""
    x, rows, k = _cluster_rows(values, clusters)
    N = x.size
    if N == 0:
        return float("nan"), float("nan")
    sizes = np.bincount(rows, minlength=k).astype(np.float64)
    means = np.bincount(rows, weights=x, minlength=k) / sizes
    ss_within = float(((x - means[rows]) ** 2).sum())
    sigma_w2 = ss_within / (N - k) if N > k else float("nan")
    if k < 2 or not math.isfinite(sigma_w2):
        return float("nan"), sigma_w2
    ms_between = float((sizes * (means - x.mean()) ** 2).sum()) / (k - 1)
    n0 = (N - float((sizes ** 2).sum()) / N) / (k - 1)
    return max(0.0, (ms_between - sigma_w2) / n0), sigma_w2


def sign_test_p(wins: int, losses: int) -> float:
    """Two-sided exact sign test: the probability, with wins and losses equally likely, of a split at
    least as uneven as (wins, losses); ties are left out before calling. 1.0 when there is no pair."""
    n = int(wins) + int(losses)
    if n == 0:
        return 1.0
    k = min(int(wins), int(losses))
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return float(min(1.0, 2.0 * tail))


def z_score(mean: float, exact: float, se: float) -> float:
    """(mean − exact) / se, NaN when the standard error is not positive."""
    return (mean - exact) / se if se is not None and math.isfinite(se) and se > 0 else float("nan")


def running_checkpoints(samples, points: int = 60) -> tuple[list[int], list[float]]:
    """Running mean after ~``points`` geometrically spaced numbers of runs (for Fig. 2a/b-style plots)."""
    samples = np.asarray(samples, dtype=np.float64)
    n = len(samples)
    if n == 0:
        return [], []
    idx = np.unique(np.geomspace(1, n, points).astype(int))
    running = np.cumsum(samples) / np.arange(1, n + 1)
    return idx.tolist(), running[idx - 1].tolist()


def fit_log_slope(capacities, values) -> float:
    """Least-squares slope of ``values`` against ln(capacity)."""
    return float(np.polyfit(np.log(np.asarray(capacities, dtype=np.float64)), np.asarray(values), 1)[0])
