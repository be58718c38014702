"""The oracle: the target drafts its own optimal tree T*(P) (Pankratov & Alistarh 2026, §1–§2).

* :func:`choose_positions`, :func:`contexts_at` — where to measure (evenly spaced or drawn at
  random over the generated positions of a set of texts) and the contexts there;
* :func:`oracle_values` — exact E[X | T*(P)] at positions of the target's own samples: one T*(P_max)
  per position built by :func:`specbound.theory.optimal_tree` over the target's laws read in
  batches (:class:`~specbound.decoding.TargetLaws`); the best-first order is nested, so the running
  sums of its path probabilities are E[X | T*(P)] for every P ≤ P_max.
* :func:`oracle_sd` — tree SD with the engine's :class:`~specbound.decoding.OracleTreeDrafter`: the
  mean accepted length per round against the mean E[X | T] of the drafted trees (``RoundRecord.value``);
  their difference is a mean of martingale differences, 0 up to noise.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..decoding import OracleTreeDrafter, SamplingConfig, Speculator, TargetLaws, make_generator
from ..seeds import derive_seed
from ..theory.trees import PathTree, optimal_tree
from .journal import PartialResults, no_journal
from .llm import PromptContext
from .moments import MomentSample
from .records import Stage
from .stats import cluster_mean_se, fit_log_slope, mean_se

__all__ = ["ORACLE_GUESS_TOKENS", "OraclePosition", "OracleSD", "OracleSDRow", "OracleValues", "SDRun", "TreeRead", "choose_positions",
           "contexts_at", "oracle_sd", "oracle_tree_at", "oracle_values"]


@dataclass
class TreeRead:
    """How T*(P) was read at one context: target reads, laws learnt, seconds, the root law's entropy
    and largest probability, the tree's depth."""

    reads: int
    laws: int
    seconds: float
    root_entropy: float
    root_top: float
    depth: int


@dataclass
class OraclePosition(TreeRead):
    """Where T*(P_max) was built: sample index, generated position, and ``cluster`` — the prompt the
    sample continues (texts of one prompt are one unit for standard errors; −1 in records written
    before a prompt could be sampled more than once: then the sample is its own unit)."""

    sample: int = 0
    position: int = 0
    value_at_pmax: float = float("nan")
    entropy_at_position: float = float("nan")
    cluster: int = -1

    @property
    def unit(self) -> int:
        return self.cluster if self.cluster >= 0 else -(self.sample + 1)


#: Tokens of the target's own sampled continuation read as one guessed chain before the oracle's
#: best-first search (:class:`~specbound.decoding.TargetLaws`): a deep, narrow T*(P) then costs one
#: read for the levels the sample shares with it instead of one read per level.
ORACLE_GUESS_TOKENS = 32


#: The oracle's growth E[X*] against ln P is fitted over the capacities from here up (P = 1, 2 are far
#: from the asymptotic regime ln P / μ of Pankratov & Alistarh 2026, §3.3).
SLOPE_FROM_P = 4


@dataclass
class OracleValues:
    """E[X | T*(P)] per position and capacity (``per_position[i][j]``: position i, ``capacities[j]``).

    Derived on construction: ``mean``; ``se`` over positions as if independent; ``se_by_sample`` with
    the positions of one prompt's sampled texts as one unit (positions of one text are correlated, and
    texts of one prompt too: it is the honest one); ``slope`` ± ``slope_se`` (by prompt) — the mean
    over positions of each position's
    least-squares slope of E[X | T*(P)] against ln P over ``slope_capacities`` (P ≥ :data:`SLOPE_FROM_P`),
    the quantity Pankratov & Alistarh's asymptotics put at 1/μ."""

    capacities: list[int]
    per_position: list[list[float]]
    positions: list[OraclePosition]
    width: int
    mean: list[float] = field(default_factory=list)
    se: list[float] = field(default_factory=list)
    se_by_sample: list[float] = field(default_factory=list)
    n_positions: int = 0
    n_samples: int = 0
    n_clusters: int = 0
    slope_capacities: list[int] = field(default_factory=list)
    slope: float = float("nan")
    slope_se: float = float("nan")
    reads_total: int = 0
    seconds_total: float = 0.0

    def table(self) -> np.ndarray:
        """``per_position`` as a (positions × capacities) float array."""
        return np.asarray(self.per_position, dtype=np.float64).reshape(-1, len(self.capacities))

    def __post_init__(self):
        caps = [int(c) for c in self.capacities]
        arr = self.table()
        n = arr.shape[0]
        nan = [float("nan")] * len(caps)
        samples = [p.unit for p in self.positions]
        self.n_positions = n
        self.n_samples = len({p.sample for p in self.positions})
        self.n_clusters = len(set(samples))
        self.mean = arr.mean(axis=0).tolist() if n else nan
        self.se = (arr.std(axis=0, ddof=1) / math.sqrt(n)).tolist() if n > 1 else nan
        self.se_by_sample = ([cluster_mean_se(arr[:, j], samples)[1] for j in range(len(caps))]
                             if n and len(samples) == n else nan)
        cols = [j for j, c in enumerate(caps) if c >= SLOPE_FROM_P]
        cols = cols if len(cols) >= 2 else list(range(len(caps)))
        self.slope_capacities = [caps[j] for j in cols]
        if n and len(cols) >= 2 and len(samples) == n:
            slopes = [fit_log_slope(self.slope_capacities, row) for row in arr[:, cols]]   # one per position
            self.slope, self.slope_se = cluster_mean_se(slopes, samples)
        self.reads_total = int(sum(p.reads for p in self.positions))
        self.seconds_total = float(sum(p.seconds for p in self.positions))


def oracle_tree_at(model, context: list[int], capacity: int, temperature: float = 1.0, width: int = 8,
                   config: SamplingConfig | None = None, guess=()) -> tuple[PathTree, TreeRead]:
    """T*(P) of the target's law after ``context`` (Pankratov & Alistarh 2026, §2) with batched reads
    (:class:`~specbound.decoding.TargetLaws`: prefetching pruned by P, ``guess`` read as one chain).

    The model's cache must hold a prefix of ``context``; its length is restored. The tree's
    ``path_probs`` are in best-first order: their running sums are E[X | T*(n)] for n ≤ P.
    """
    config = config or SamplingConfig(float(temperature))
    before = model.cache_length
    t0 = time.perf_counter()
    laws = TargetLaws(model, context, config, width=width, capacity=capacity, guess=guess)
    try:
        tree = optimal_tree(laws, capacity)
    finally:
        laws.restore()
        model.crop(min(before, model.cache_length))
    root = laws.laws[()]
    with np.errstate(divide="ignore", invalid="ignore"):
        root_H = float(-(root * np.where(root > 0, np.log(root), 0.0)).sum())
    return tree, TreeRead(reads=laws.reads, laws=len(laws.laws), seconds=time.perf_counter() - t0, root_entropy=root_H,
                          root_top=float(root.max()), depth=tree.depth)


def choose_positions(samples, n: int, spread: str = "even", seed: int = 0) -> list[tuple[int, int]]:
    """``n`` (sample index, generated position) pairs over all generated positions of ``samples``
    (anything with ``.tokens``: :class:`MomentSample`, the target's sampled or greedy texts), sorted.

    ``spread="even"``: evenly spaced (the oracle's positions, deterministic); ``spread="random"``:
    drawn uniformly without replacement with ``numpy.random.default_rng(seed)`` (``advise`` at greedy:
    tree values taken along the target's own greedy texts, where decoding goes).
    """
    if spread not in ("even", "random"):
        raise ValueError(f"spread must be 'even' or 'random', got {spread!r}")
    flat = [(i, j) for i, s in enumerate(samples) for j in range(len(s.tokens))]
    if not flat or n <= 0:
        return []
    if spread == "random":
        picks = np.random.default_rng(seed).choice(len(flat), size=min(n, len(flat)), replace=False)
        return [flat[k] for k in sorted(picks)]
    if n >= len(flat):
        return flat
    idx = np.unique(np.round(np.linspace(0, len(flat) - 1, n)).astype(int))
    return [flat[k] for k in idx]


def contexts_at(samples, positions: list[tuple[int, int]]) -> list[list[int]]:
    """The context before each (sample, position): the sample's prompt plus its tokens so far."""
    return [list(samples[i].prompt) + list(samples[i].tokens[:j]) for i, j in positions]


def _at_capacities(running: np.ndarray, capacities) -> list[float]:
    return [float(running[min(c, running.size) - 1]) if running.size else 0.0 for c in capacities]


def oracle_values(model, samples: list[MomentSample], capacities, positions_wanted: int, temperature: float = 1.0,
                  width: int = 12, progress=None, journal: PartialResults | None = None,
                  key: str = "oracle") -> OracleValues:
    """Exact E[X | T*(P)] at ``positions_wanted`` positions of the target's own samples, for every
    P in ``capacities`` (one nested T*(P_max) per position; one journal unit per position)."""
    journal = journal if journal is not None else no_journal()
    positions = choose_positions(samples, positions_wanted)
    caps = [int(c) for c in capacities]
    pmax = max(caps)
    stage = Stage(progress, f"oracle T*({pmax}) at positions", len(positions))
    ctx = PromptContext(model)
    config = SamplingConfig(float(temperature))

    def measure(i: int, j: int) -> _OracleUnit:
        s = samples[i]
        context = contexts_at(samples, [(i, j)])[0]
        ctx.set(context)
        tree, read = oracle_tree_at(model, context, pmax, width=width, config=config,
                                    guess=s.tokens[j:j + ORACLE_GUESS_TOKENS])
        running = np.cumsum(np.asarray(tree.path_probs, dtype=np.float64))
        position = OraclePosition(**vars(read), sample=i, position=j,
                                  value_at_pmax=float(running[-1]) if running.size else 0.0,
                                  entropy_at_position=float(s.H[j]), cluster=s.prompt_index)
        return _OracleUnit(position, _at_capacities(running, caps))

    rows, details = [], []
    for i, j in positions:
        unit = journal.unit(f"{key}/{i}/{j}/P{pmax}", _OracleUnit, lambda i=i, j=j: measure(i, j))
        rows.append(unit.values)
        details.append(unit.position)
        stage.advance()
    model.reset()
    return OracleValues(caps, rows, details, int(width))


@dataclass
class _OracleUnit:
    """Journal unit of :func:`oracle_values`: one position's read details and E[X | T*(P)] per capacity."""

    position: OraclePosition
    values: list[float]


# ---------------------------------------------------------------------------------------------------
# empirical oracle tree SD
# ---------------------------------------------------------------------------------------------------
@dataclass
class SDRun:
    """One prompt's oracle tree-SD run: per round X and E[X | T] and tree size; totals."""

    accepted: list[int]
    values: list[float]
    sizes: list[int]
    tokens: int
    target_calls: int
    draft_seconds: float
    target_seconds: float


@dataclass
class OracleSDRow:
    rounds: int
    full_rounds: int
    mean_X: float
    mean_value: float
    mean_X_full: float
    mean_value_full: float
    se_X_full: float
    diff_mean: float
    diff_se: float
    tau: float
    oracle_seconds_per_round: float
    target_seconds_per_round: float


@dataclass
class OracleSD:
    capacities: list[int]
    prompts: int
    tokens_per_prompt: int
    by_capacity: dict[int, OracleSDRow] = field(default_factory=dict)


def _sd_row(runs: list[SDRun], capacity: int) -> OracleSDRow:
    x = np.array([a for r in runs for a in r.accepted], dtype=np.float64)
    v = np.array([a for r in runs for a in r.values], dtype=np.float64)
    full = np.array([s == capacity for r in runs for s in r.sizes], dtype=bool)
    diff_mean, diff_se = mean_se(x - v)
    n = max(x.size, 1)
    calls = sum(r.target_calls for r in runs)
    nan = float("nan")
    return OracleSDRow(
        rounds=int(x.size), full_rounds=int(full.sum()),
        mean_X=float(x.mean()) if x.size else nan, mean_value=float(v.mean()) if v.size else nan,
        mean_X_full=float(x[full].mean()) if full.any() else nan,
        mean_value_full=float(v[full].mean()) if full.any() else nan,
        se_X_full=mean_se(x[full])[1] if full.any() else nan, diff_mean=diff_mean, diff_se=diff_se,
        tau=sum(r.tokens for r in runs) / calls if calls else nan,
        oracle_seconds_per_round=sum(r.draft_seconds for r in runs) / n,
        target_seconds_per_round=sum(r.target_seconds for r in runs) / n)


def oracle_sd(model, prompt_ids: list[list[int]], capacities, n_prompts: int, tokens: int,
              temperature: float = 1.0, width: int = 12, seed: int = 0, progress=None,
              journal: PartialResults | None = None, key: str = "oracle_sd") -> OracleSD:
    """Tree SD of ``model`` with the oracle drafter at every capacity P (Pankratov & Alistarh 2026,
    §1): per P, mean accepted X per round vs mean E[X | T] of the drafted trees. Prompt k at capacity P
    is one journal unit ``{key}/P{P}/{k}`` and one random stream ``derive_seed(seed, key, P, k)``."""
    journal = journal if journal is not None else no_journal()
    config = SamplingConfig(float(temperature))
    caps = [int(c) for c in capacities]
    prompts = prompt_ids[:n_prompts]
    stage = Stage(progress, "oracle tree SD", len(caps) * len(prompts))

    def run(P: int, k: int, ids: list[int]) -> SDRun:
        engine = Speculator(model, OracleTreeDrafter(model, config, P, width=width), config,
                            generator=make_generator(derive_seed(seed, key, P, k)))
        res = engine.run(ids, tokens)
        m = res.metrics
        return SDRun(accepted=[r.accepted for r in res.rounds], values=[r.value for r in res.rounds],
                     sizes=[r.size for r in res.rounds], tokens=m.new_tokens, target_calls=m.target_calls,
                     draft_seconds=m.draft_time, target_seconds=m.target_time)

    out = OracleSD(caps, len(prompts), int(tokens))
    for P in caps:
        runs = []
        for k, ids in enumerate(prompts):
            runs.append(journal.unit(f"{key}/P{P}/{k}", SDRun, lambda P=P, k=k, ids=ids: run(P, k, ids)))
            stage.advance()
        out.by_capacity[P] = _sd_row(runs, P)
    model.reset()
    return out
