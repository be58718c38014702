"""`specbound analyze`: measure Pankratov & Alistarh's speed-of-light quantities on a real model pair.

For one prompt set (Pankratov & Alistarh 2026, §3–§4, measured in kind; all logs in nats):

(a) **moments**: continuations are sampled from the TARGET at the given temperature (no top-k/top-p)
    and, at every generated position, H = −Σ p ln p and m2 = Σ p ln² p of the target's law are
    computed from its logits (:func:`specbound.theory.estimate_moments`); μ = mean H,
    μ₂ = mean m2, E[H²], with standard errors (per position, and across prompts);
(b) **oracle** E[X*](P): at positions drawn from those continuations the optimal tree T*(P_max) is
    built with the target's own law (:func:`specbound.theory.optimal_tree`, the target read through
    ``forward_tree`` with batched, prefetching reads). The best-first order is nested, so the running
    sums of its path probabilities are E[X | T*(P)] for every P ≤ P_max. Empirically, tree SD with
    the oracle drafter (same T*(P), batched reads) is run and its mean accepted length per round is
    compared with the mean exact value of the trees it drafted;
(c) the **bound** curves of every form (:func:`specbound.theory.bound_all_forms`) at the measured μ, μ₂;
(d) the **real drafters**: tokens per target call τ(P) of the draft model as a chain of P tokens
    (γ = P, standard SD) and as a dynamic best-first tree of P nodes (EAGLE-2-like);
(e) **speed-ups**: under the paper's constant-time model the speed-up is τ itself (E[X] + 1 for the
    oracle and the bounds); the wall-clock estimate uses the measured target cost t(k) of a pass over
    k new tokens and the measured draft time per round:
    speed-up(P) = τ(P)·t(1) / (draft seconds per round + t(P + 1)).

X counts accepted draft tokens (the bonus/recovered token is not in X), τ = X + 1 per round on average.
Outputs (JSON, PNG, markdown, HTML) go to ``--out`` (default ``runs/analyze-<set>``).
"""
from __future__ import annotations

import heapq
import html
import json
import math
import re
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ..decoding.drafters import OracleTreeDrafter, TreeReader, drafted_from_optimal_tree
from ..decoding.engine import make_generator, speculative_decode
from ..decoding.sampling import SamplingConfig, logits_to_probs, sample_from
from ..decoding.tree import TreeSpeculator
from ..errors import SpecboundError
from ..theory.bounds import BOUND_FORMS, MomentEstimate, bound_all_forms, bound_is_valid, estimate_moments
from ..theory.speedup import CostProfile
from ..theory.trees import DraftTree, optimal_tree

__all__ = [
    "AnalyzeConfig",
    "TargetLaws",
    "BatchedOracleTreeDrafter",
    "encode_prompts",
    "sample_with_moments",
    "aggregate_moments",
    "measure_moments",
    "oracle_tree_at",
    "oracle_values",
    "oracle_sd",
    "drafter_runs",
    "measure_target_costs",
    "speedups",
    "analyze_set",
    "write_report",
    "markdown_to_html",
    "add_arguments",
    "run",
]

DEFAULT_CAPACITIES = (1, 2, 4, 8, 16, 32, 64)


# ---------------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------------
@dataclass
class AnalyzeConfig:
    """How much to measure per prompt set (numbers are written into every report)."""

    n_prompts: int = 6                    # (a) prompts sampled for the moments
    tokens: int = 48                      # (a) tokens sampled per prompt (stops early at EOS)
    capacities: tuple[int, ...] = DEFAULT_CAPACITIES
    temperature: float = 1.0
    oracle_positions: int = 10            # (b) positions (contexts) at which T*(P_max) is built
    oracle_width: int = 12                # (b) target nodes read per forward_tree call (prefetch)
    oracle_sd_capacities: tuple[int, ...] | None = (1, 4, 16, 64)   # (b) empirical oracle SD; None = all
    oracle_sd_prompts: int = 1
    oracle_sd_tokens: int = 40
    drafters: tuple[str, ...] = ("chain", "dynamic")
    drafter_prompts: int = 2              # (d) prompts per P and drafter
    drafter_tokens: int = 40              # (d) tokens per prompt
    cost_repeats: int = 3                 # (e) repeats of each t(k) measurement (median)
    seed: int = 0

    def __post_init__(self):
        caps = tuple(int(c) for c in self.capacities)
        if not caps or any(c < 1 for c in caps):
            raise SpecboundError(f"capacities must be integers >= 1, got {self.capacities!r}")
        self.capacities = tuple(sorted(set(caps)))
        if self.oracle_sd_capacities is not None:
            self.oracle_sd_capacities = tuple(sorted({int(c) for c in self.oracle_sd_capacities} & set(caps)))
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise SpecboundError("--temperature must be > 0: at T = 0 the entropy is 0 and the bounds are void")
        for name in ("n_prompts", "tokens", "oracle_positions", "oracle_width", "oracle_sd_prompts",
                     "oracle_sd_tokens", "drafter_prompts", "drafter_tokens", "cost_repeats"):
            if int(getattr(self, name)) < 0:
                raise SpecboundError(f"{name} must be >= 0")
        unknown = set(self.drafters) - {"chain", "dynamic", "sampled"}
        if unknown:
            raise SpecboundError(f"unknown drafters {sorted(unknown)}: use chain, dynamic, sampled")

    @classmethod
    def quick(cls, **overrides) -> "AnalyzeConfig":
        """A small configuration for smoke tests (about a minute per set on the default pair)."""
        base = dict(n_prompts=2, tokens=12, capacities=(1, 4, 16), oracle_positions=3,
                    oracle_sd_capacities=(1, 4), oracle_sd_tokens=10, drafter_prompts=1,
                    drafter_tokens=12, cost_repeats=2)
        base.update(overrides)
        return cls(**base)

    @property
    def sd_capacities(self) -> tuple[int, ...]:
        return self.capacities if self.oracle_sd_capacities is None else self.oracle_sd_capacities


# ---------------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------------
def _progress(enabled: bool):
    """A rich progress display on stderr (or a no-op)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), disable=not enabled, transient=False)


class _Stage:
    """One progress task; works without a Progress object."""

    def __init__(self, progress, description: str, total: int):
        self.progress = progress
        self.task = progress.add_task(description, total=total) if progress is not None else None

    def advance(self, n: int = 1) -> None:
        if self.progress is not None:
            self.progress.advance(self.task, n)


def _mean_se(values) -> tuple[float, float]:
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return float("nan"), float("nan")
    return float(x.mean()), (float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan"))


def stop_token_ids(model) -> set[int]:
    """EOS-like token ids of a model's tokenizer (end of sample)."""
    tok = getattr(model, "tokenizer", None)
    out: set[int] = set()
    if tok is None:
        return out
    if getattr(tok, "eos_token_id", None) is not None:
        out.add(int(tok.eos_token_id))
    unk = getattr(tok, "unk_token_id", None)
    for text in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        try:
            tid = tok.convert_tokens_to_ids(text)
        except Exception:  # noqa: BLE001 - tokenizers differ in how they report unknown tokens
            continue
        if isinstance(tid, int) and tid >= 0 and tid != unk:
            out.add(tid)
    return out


def encode_prompts(model, prompts) -> list[list[int]]:
    """Token ids of each prompt as the model would see it (chat template for chat/math sets)."""
    from ..assets.prompts import format_prompt

    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise SpecboundError(f"{model.name} has no tokenizer: pass token ids instead of prompts")
    out = []
    for p in prompts:
        ids = tok(format_prompt(tok, p), add_special_tokens=True)["input_ids"]
        if not ids:
            raise SpecboundError(f"prompt {p.id!r} encodes to no tokens")
        out.append([int(t) for t in ids])
    return out


class _Context:
    """Keeps ``model``'s cache at context[:-1] for a sequence of contexts, re-reading only what changed."""

    def __init__(self, model):
        self.model = model
        self.held: list[int] = []
        model.reset()

    def set(self, context: list[int]) -> None:
        want = list(context[:-1])
        k = 0
        held = self.held
        while k < min(len(held), len(want), self.model.cache_length) and held[k] == want[k]:
            k += 1
        self.model.crop(k)
        if len(want) > k:
            self.model.forward(torch.tensor([want[k:]], dtype=torch.long))
        self.held = want


# ---------------------------------------------------------------------------------------------------
# (a) moments
# ---------------------------------------------------------------------------------------------------
def sample_with_moments(model, prompt_ids: list[int], n_tokens: int, temperature: float,
                        generator: torch.Generator, stop_ids=()) -> dict:
    """Sample up to ``n_tokens`` from ``model`` at ``temperature`` (stop after an EOS token) and return
    the tokens with H and m2 of the model's tempered law at every generated position (Pankratov &
    Alistarh 2026, §3.4), each from :func:`estimate_moments` on that position's logits."""
    config = SamplingConfig(float(temperature))
    stops = set(int(t) for t in stop_ids)
    model.reset()
    tokens: list[int] = []
    H: list[float] = []
    m2: list[float] = []
    if n_tokens <= 0:
        return {"tokens": tokens, "H": H, "m2": m2}
    logits = model.forward(torch.tensor([prompt_ids], dtype=torch.long))[0, -1]
    for i in range(n_tokens):
        est = estimate_moments(logits.double().numpy()[None], temperature=temperature, from_logits=True)
        H.append(est.mu)
        m2.append(est.mu2)
        token = int(sample_from(logits_to_probs(logits[None], config, model.name), generator)[0])
        tokens.append(token)
        if token in stops or i == n_tokens - 1:
            break
        logits = model.forward(torch.tensor([[token]], dtype=torch.long))[0, -1]
    return {"tokens": tokens, "H": H, "m2": m2}


def aggregate_moments(H_per_prompt, m2_per_prompt) -> dict:
    """Pool per-position H, m2 into μ, μ₂, E[H²], Var(Y) (a :class:`MomentEstimate`, same formulas as
    :func:`estimate_moments` on the stacked rows) plus prompt-level standard errors.

    ``se_mu``/``se_mu2`` treat positions as independent; ``se_mu_prompt``/``se_mu2_prompt`` are the
    standard errors of the mean of per-prompt means (positions of one sample are correlated).
    """
    H = np.concatenate([np.asarray(h, dtype=np.float64) for h in H_per_prompt]) if H_per_prompt else np.zeros(0)
    m2 = np.concatenate([np.asarray(m, dtype=np.float64) for m in m2_per_prompt]) if m2_per_prompt else np.zeros(0)
    n = int(H.size)
    if n == 0:
        raise SpecboundError("no generated positions to estimate moments from")
    mu, mu2 = float(H.mean()), float(m2.mean())
    est = MomentEstimate(
        mu=mu, mu2=mu2, mean_H2=float((H * H).mean()), var_surprisal=mu2 - mu * mu, n=n,
        se_mu=float(H.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan"),
        se_mu2=float(m2.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan"),
    )
    prompt_mu = [float(np.mean(h)) for h in H_per_prompt if len(h)]
    prompt_mu2 = [float(np.mean(m)) for m in m2_per_prompt if len(m)]
    out = asdict(est)
    out.update(se_mu_prompt=_mean_se(prompt_mu)[1], se_mu2_prompt=_mean_se(prompt_mu2)[1],
               n_prompts=len(prompt_mu), std_H=float(H.std()), frac_H_below_0p1=float(np.mean(H < 0.1)))
    return out


def measure_moments(model, prompt_ids: list[list[int]], n_tokens: int, temperature: float, seed: int = 0,
                    progress=None, label: str = "moments") -> dict:
    """(a) μ, μ₂, E[H²] of ``model`` on its own samples at ``temperature`` (Pankratov & Alistarh 2026, §3.4)."""
    stage = _Stage(progress, f"{label}: sampling", len(prompt_ids))
    stops = stop_token_ids(model)
    samples = []
    t0 = time.perf_counter()
    for i, ids in enumerate(prompt_ids):
        s = sample_with_moments(model, ids, n_tokens, temperature, make_generator(seed + 1000 * i), stops)
        s["prompt"] = list(ids)
        samples.append(s)
        stage.advance()
    model.reset()
    est = aggregate_moments([s["H"] for s in samples], [s["m2"] for s in samples])
    est.update(model=model.name, temperature=temperature, seconds=time.perf_counter() - t0,
               tokens_per_prompt=n_tokens, prompts=len(prompt_ids))
    return {"estimate": est, "samples": samples}


# ---------------------------------------------------------------------------------------------------
# (b) oracle trees
# ---------------------------------------------------------------------------------------------------
class TargetLaws:
    """``next_probs(path)`` for :func:`optimal_tree`: the target's processed law after
    ``committed`` + ``path``, read through ``forward_tree`` in batches.

    A miss at ``path`` reads ``path`` together with up to ``width − 1`` prefetched nodes: the unread
    children of already-read nodes with the largest path probability p_target(v) (the order in which
    the best-first search of Pankratov & Alistarh 2026, §2 expands nodes). Prefetching never changes
    the laws, hence never the tree; it only saves target calls. Paths of length ≥ ``max_depth`` get
    a uniform placeholder law without a read (as in :class:`OracleTreeDrafter`: such nodes' children
    are dropped). :meth:`restore` crops the model back to the committed prefix.
    """

    def __init__(self, model, committed: list[int], config: SamplingConfig, width: int = 8,
                 max_depth: int | None = None):
        if width < 1:
            raise SpecboundError("width must be >= 1")
        self.model, self.config, self.width = model, config, int(width)
        self.max_depth = max_depth
        self.reader = TreeReader(model, committed)
        self.ids: dict[tuple[int, ...], int] = {(): -1}
        self.laws: dict[tuple[int, ...], np.ndarray] = {}
        self.path_prob: dict[tuple[int, ...], float] = {(): 1.0}
        self.frontier: list[tuple[float, tuple[int, ...]]] = []   # (−p(v), v): unread children
        self.reads = 0

    def _node(self, path: tuple[int, ...]) -> int:
        if path not in self.ids:
            self.ids[path] = self.reader.add(path[-1], self._node(path[:-1]))
        return self.ids[path]

    def _learn(self, path: tuple[int, ...], probs: np.ndarray) -> None:
        self.laws[path] = probs
        if self.max_depth is not None and len(path) + 1 >= self.max_depth:
            return                                   # children would not be read anyway
        k = min(self.width, probs.size)
        top = np.argpartition(-probs, k - 1)[:k]
        base = self.path_prob[path]
        for a in top.tolist():
            pa = float(probs[a])
            if pa > 0:
                child = path + (a,)
                self.path_prob[child] = base * pa
                heapq.heappush(self.frontier, (-base * pa, child))

    def __call__(self, path: tuple[int, ...]) -> np.ndarray:
        path = tuple(path)
        if self.max_depth is not None and len(path) >= self.max_depth:
            return np.full(self.model.vocab_size, 1.0 / self.model.vocab_size)
        if path not in self.laws:
            batch = [path]
            while self.frontier and len(batch) < self.width:
                _, cand = heapq.heappop(self.frontier)
                if cand not in self.laws and cand != path:
                    batch.append(cand)
            if path not in self.path_prob:           # requested out of best-first order
                parent = path[:-1]
                self.path_prob[path] = self.path_prob.get(parent, 0.0) * (
                    float(self.laws[parent][path[-1]]) if parent in self.laws else 0.0)
            logits = self.reader.read([self._node(p) for p in batch])
            self.reads += 1
            probs = logits_to_probs(logits, self.config, self.model.name).to(torch.float64)
            probs = (probs / probs.sum(-1, keepdim=True)).numpy()
            for p, row in zip(batch, probs):
                self._learn(p, row)
        return self.laws[path]

    def restore(self) -> None:
        self.reader.restore()


def oracle_tree_at(model, context: list[int], capacity: int, temperature: float = 1.0, width: int = 8,
                   config: SamplingConfig | None = None) -> tuple[DraftTree, dict]:
    """T*(P) of the target's law after ``context`` (Pankratov & Alistarh 2026, §2) with batched reads.

    The model's cache must hold ``context[:-1]`` (or any prefix of ``context``) and is restored to it.
    Returns the tree (its ``path_probs`` in best-first order: running sums = E[X|T*(n)], n ≤ P) and
    read statistics.
    """
    config = config or SamplingConfig(float(temperature))
    laws = TargetLaws(model, context, config, width=width)
    t0 = time.perf_counter()
    try:
        tree = optimal_tree(laws, capacity)
    finally:
        laws.restore()
    root = laws.laws[()]
    with np.errstate(divide="ignore", invalid="ignore"):
        root_H = float(-(root * np.where(root > 0, np.log(root), 0.0)).sum())
    return tree, {"reads": laws.reads, "laws": len(laws.laws), "seconds": time.perf_counter() - t0,
                  "root_entropy": root_H, "root_top": float(root.max()), "depth": tree.depth}


def choose_positions(samples: list[dict], n: int) -> list[tuple[int, int]]:
    """``n`` (sample index, generated position) pairs spread evenly over all generated positions."""
    flat = [(i, j) for i, s in enumerate(samples) for j in range(len(s["tokens"]))]
    if not flat or n <= 0:
        return []
    if n >= len(flat):
        return flat
    idx = np.unique(np.round(np.linspace(0, len(flat) - 1, n)).astype(int))
    return [flat[k] for k in idx]


def oracle_values(model, samples: list[dict], cfg: AnalyzeConfig, progress=None) -> dict:
    """(b) exact E[X | T*(P)] at ``cfg.oracle_positions`` positions of the target's own samples.

    One T*(P_max) per position; E[X|T*(P)] for smaller P are the running sums of its best-first path
    probabilities (nested optimal trees). Returns per-P mean and standard error over positions.
    """
    positions = choose_positions(samples, cfg.oracle_positions)
    caps = np.asarray(cfg.capacities)
    pmax = int(caps.max())
    stage = _Stage(progress, f"oracle T*({pmax}) at positions", len(positions))
    ctx = _Context(model)
    values, details = [], []
    config = SamplingConfig(float(cfg.temperature))
    for i, j in positions:
        s = samples[i]
        context = list(s["prompt"]) + list(s["tokens"][:j])
        ctx.set(context)
        tree, info = oracle_tree_at(model, context, pmax, width=cfg.oracle_width, config=config)
        run = np.cumsum(np.asarray(tree.path_probs, dtype=np.float64))
        row = np.array([run[min(c, run.size) - 1] if run.size else 0.0 for c in caps])
        values.append(row)
        info.update(sample=i, position=j, value_at_pmax=float(run[-1]) if run.size else 0.0,
                    entropy_at_position=float(s["H"][j]))
        details.append(info)
        stage.advance()
    model.reset()
    arr = np.asarray(values) if values else np.zeros((0, caps.size))
    mean = arr.mean(axis=0) if len(values) else np.full(caps.size, np.nan)
    se = arr.std(axis=0, ddof=1) / math.sqrt(len(values)) if len(values) > 1 else np.full(caps.size, np.nan)
    return {"capacities": caps.tolist(), "mean": mean.tolist(), "se": se.tolist(), "per_position": arr.tolist(),
            "positions": details, "n_positions": len(values), "width": cfg.oracle_width,
            "reads_total": int(sum(d["reads"] for d in details)),
            "seconds_total": float(sum(d["seconds"] for d in details))}


class BatchedOracleTreeDrafter(OracleTreeDrafter):
    """:class:`OracleTreeDrafter` (the target drafts its own T*(P), Pankratov & Alistarh 2026, §1–§2)
    with the batched, prefetching reads of :class:`TargetLaws`. Same trees, fewer target calls."""

    name = "oracle"

    def __init__(self, target, config: SamplingConfig, capacity: int, width: int = 8):
        super().__init__(target, config, capacity)
        self.width = int(width)

    def draft(self, committed, max_depth, generator):
        laws = TargetLaws(self.target, committed, self.config, width=self.width, max_depth=max_depth)
        try:
            tree = optimal_tree(laws, self.capacity)
        finally:
            laws.restore()
        return drafted_from_optimal_tree(tree, max_depth, laws.reader.calls)


def _target_tree_laws(target, context: list[int], tokens: list[int], parents: list[int],
                      config: SamplingConfig) -> np.ndarray:
    """Processed target laws [n+1, V] (float64) at the root (row 0) and after every node of a tree,
    from ONE ``forward_tree`` pass; the target's cache is restored to its committed prefix."""
    reader = TreeReader(target, context)
    ids = []
    for tok, parent in zip(tokens, parents):
        ids.append(reader.add(tok, -1 if parent < 0 else ids[parent]))
    try:
        logits = reader.read([-1] + ids)
    finally:
        reader.restore()
    probs = logits_to_probs(logits, config, target.name).to(torch.float64)
    return (probs / probs.sum(-1, keepdim=True)).numpy()


def drafter_values_at(target, draft, context: list[int], capacity: int, config: SamplingConfig,
                      generator: torch.Generator, width: int = 8) -> dict:
    """Exact conditional expected accepted lengths of the real drafters at one context, for every P ≤
    ``capacity`` (both caches must hold a prefix of ``context``; they are restored).

    * dynamic tree (deterministic): the drafter's best-first tree of ``capacity`` nodes is nested
      (its first n nodes are its tree for capacity n), so E[X | T_dyn(n)] = running sums of
      p_target(v) in node order (Pankratov & Alistarh 2026, §2 tree value); ≤ E[X | T*(n)] always.
    * chain (sampled, rejection-verified): one chain of ``capacity`` tokens is sampled from the draft;
      its first n tokens are a chain of length n, and given the drafted tokens the expected accepted
      length is Σ_{k≤n} Π_{i≤k} min(1, target_i(x_i)/draft_i(x_i)) (the acceptance coins integrated
      out: an unbiased, lower-variance estimate of E[X] for γ = n; Leviathan et al. 2023).
    """
    from ..decoding.drafters import DynamicTreeDrafter, SampledTreeDrafter

    out = {}
    dyn = DynamicTreeDrafter(draft, config, capacity, width=width)
    t0 = time.perf_counter()
    tree = dyn.draft(context, capacity, generator)
    dyn._reader.restore()
    dyn._reader = None
    t_draft = time.perf_counter() - t0
    laws = _target_tree_laws(target, context, tree.tokens, tree.parents, config)
    probs = []
    for i, (tok, parent) in enumerate(zip(tree.tokens, tree.parents)):
        probs.append((1.0 if parent < 0 else probs[parent]) * float(laws[0 if parent < 0 else parent + 1][tok]))
    out["dynamic"] = {"running": np.cumsum(probs).tolist(), "draft_seconds": t_draft,
                      "draft_calls": tree.draft_calls}
    chain = SampledTreeDrafter(draft, config, capacity, branching=(1,))
    t0 = time.perf_counter()
    drafted = chain.draft(context, capacity, generator)
    chain._reader.restore()
    chain._reader = None
    t_draft = time.perf_counter() - t0
    laws = _target_tree_laws(target, context, drafted.tokens, drafted.parents, config)
    q = drafted.draft_probs.to(torch.float64).numpy()
    ratio = [min(1.0, float(laws[i][tok]) / float(q[i][tok])) if q[i][tok] > 0 else 0.0
             for i, tok in enumerate(drafted.tokens)]          # node i's law is row i (root: 0)
    out["chain"] = {"running": np.cumsum(np.cumprod(ratio)).tolist(), "draft_seconds": t_draft,
                    "draft_calls": drafted.draft_calls}
    return out


def drafter_values(target, draft, samples: list[dict], positions: list[tuple[int, int]], cfg: AnalyzeConfig,
                   progress=None) -> dict:
    """(d, exact) E[X | drafted tree] of the dynamic and chain drafters at the oracle's positions, for
    every P in ``cfg.capacities`` (see :func:`drafter_values_at`), paired with the oracle's values."""
    caps = np.asarray(cfg.capacities)
    pmax = int(caps.max())
    config = SamplingConfig(float(cfg.temperature))
    stage = _Stage(progress, f"drafter trees at positions (P ≤ {pmax})", len(positions))
    t_ctx, d_ctx = _Context(target), _Context(draft)
    rows = {"dynamic": [], "chain": []}
    draft_seconds = {"dynamic": [], "chain": []}
    for k, (i, j) in enumerate(positions):
        s = samples[i]
        context = list(s["prompt"]) + list(s["tokens"][:j])
        t_ctx.set(context)
        d_ctx.set(context)
        vals = drafter_values_at(target, draft, context, pmax, config, make_generator(cfg.seed + 31 * k))
        for kind, v in vals.items():
            run = np.asarray(v["running"], dtype=np.float64)
            rows[kind].append([run[min(c, run.size) - 1] if run.size else 0.0 for c in caps])
            draft_seconds[kind].append(v["draft_seconds"])
        stage.advance()
    target.reset()
    draft.reset()
    out = {"capacities": caps.tolist(), "n_positions": len(positions),
           "note": "per-position exact E[X | drafted tree] (chain: acceptance coins integrated out), "
                   "same positions as the oracle; draft seconds are for the largest P"}
    for kind, arr in rows.items():
        a = np.asarray(arr) if arr else np.zeros((0, caps.size))
        out[kind] = {"mean": a.mean(axis=0).tolist() if len(arr) else [],
                     "se": (a.std(axis=0, ddof=1) / math.sqrt(len(arr))).tolist() if len(arr) > 1 else [],
                     "per_position": a.tolist(),
                     "draft_seconds_pmax": float(np.mean(draft_seconds[kind])) if arr else float("nan")}
    return out


def oracle_sd(model, prompt_ids: list[list[int]], cfg: AnalyzeConfig, progress=None) -> dict:
    """(b, empirical) tree SD with the oracle drafter: mean accepted X per round vs mean E[X|T] of the
    drafted trees (the difference is a martingale-difference mean: 0 up to noise)."""
    config = SamplingConfig(float(cfg.temperature))
    caps = cfg.sd_capacities
    prompts = prompt_ids[: cfg.oracle_sd_prompts]
    stage = _Stage(progress, "oracle tree SD", len(caps) * len(prompts))
    out = {}
    for P in caps:
        rounds, tokens, calls, t_draft, t_target = [], 0, 0, 0.0, 0.0
        for k, ids in enumerate(prompts):
            eng = TreeSpeculator(model, BatchedOracleTreeDrafter(model, config, P, cfg.oracle_width), config,
                                 make_generator(cfg.seed + 7919 * k + P))
            res = eng.run(ids, cfg.oracle_sd_tokens)
            rounds += eng.rounds
            tokens += res.metrics.new_tokens
            calls += res.metrics.target_calls
            t_draft += res.metrics.draft_time
            t_target += res.metrics.target_time
            stage.advance()
        x = np.array([r.accepted for r in rounds], dtype=np.float64)
        v = np.array([r.value for r in rounds], dtype=np.float64)
        full = np.array([r.size == P for r in rounds])
        diff_mean, diff_se = _mean_se(x - v)
        out[str(P)] = {
            "rounds": len(rounds), "full_rounds": int(full.sum()),
            "mean_X": float(x.mean()) if x.size else float("nan"),
            "mean_value": float(v.mean()) if v.size else float("nan"),
            "mean_X_full": float(x[full].mean()) if full.any() else float("nan"),
            "mean_value_full": float(v[full].mean()) if full.any() else float("nan"),
            "se_X_full": _mean_se(x[full])[1] if full.any() else float("nan"),
            "diff_mean": diff_mean, "diff_se": diff_se,
            "tau": tokens / calls if calls else float("nan"),
            "oracle_seconds_per_round": t_draft / max(len(rounds), 1),
            "target_seconds_per_round": t_target / max(len(rounds), 1),
        }
    model.reset()
    return {"capacities": list(caps), "prompts": len(prompts), "tokens_per_prompt": cfg.oracle_sd_tokens,
            "by_capacity": out}


# ---------------------------------------------------------------------------------------------------
# (d) real drafters
# ---------------------------------------------------------------------------------------------------
def drafter_runs(target, draft, prompt_ids: list[list[int]], cfg: AnalyzeConfig, kind: str,
                 progress=None) -> dict:
    """(d) τ(P) = tokens per target call of a real drafter: ``"chain"`` (a sampled chain of P tokens,
    i.e. standard SD with γ = P), ``"dynamic"`` (best-first tree of P nodes by draft path probability)
    or ``"sampled"``; plus the measured draft and target seconds per round."""
    prompts = prompt_ids[: cfg.drafter_prompts]
    stage = _Stage(progress, f"{kind} drafter", len(cfg.capacities) * len(prompts))
    out = {}
    for P in cfg.capacities:
        agg = dict(tokens=0, calls=0, accepted=0, rounds=0, draft_time=0.0, target_time=0.0, draft_calls=0,
                   nodes=0)
        for k, ids in enumerate(prompts):
            res = speculative_decode(target, draft, ids, cfg.drafter_tokens, tree=P, tree_drafter=kind,
                                     temperature=cfg.temperature, seed=cfg.seed + 104729 * k + P)
            m = res.metrics
            agg["tokens"] += m.new_tokens
            agg["calls"] += m.target_calls
            agg["accepted"] += sum(m.accepted_per_step)
            agg["rounds"] += len(m.accepted_per_step)
            agg["draft_time"] += m.draft_time
            agg["target_time"] += m.target_time
            agg["draft_calls"] += m.draft_calls
            agg["nodes"] += sum(m.drafted_per_step)
            stage.advance()
        rounds = max(agg["rounds"], 1)
        out[str(P)] = {
            "tau": agg["tokens"] / agg["calls"] if agg["calls"] else float("nan"),
            "mean_accepted": agg["accepted"] / rounds,
            "draft_seconds_per_round": agg["draft_time"] / rounds,
            "target_seconds_per_round": agg["target_time"] / rounds,
            "draft_calls_per_round": agg["draft_calls"] / rounds,
            "nodes_per_round": agg["nodes"] / rounds,
            "rounds": agg["rounds"], "tokens": agg["tokens"],
        }
    target.reset()
    draft.reset()
    return {"kind": kind, "capacities": list(cfg.capacities), "prompts": len(prompts),
            "tokens_per_prompt": cfg.drafter_tokens, "by_capacity": out}


# ---------------------------------------------------------------------------------------------------
# (e) costs and speed-ups
# ---------------------------------------------------------------------------------------------------
def measure_target_costs(target, prompt_ids: list[int], capacities, repeats: int = 3) -> CostProfile:
    """t(k): median seconds of a target pass over k new tokens after a real prompt, k = 1 and P + 1."""
    from ..decoding.policy import measure_forward_costs

    ks = sorted({1} | {int(P) + 1 for P in capacities})
    target.reset()
    if len(prompt_ids) > 1:
        target.forward(torch.tensor([prompt_ids[:-1]], dtype=torch.long))
    measure_forward_costs(target, ks=(1, ks[-1]), repeats=1)        # warm-up (page faults, allocator)
    costs = measure_forward_costs(target, ks=ks, repeats=max(1, repeats))
    target.reset()
    return costs


def speedups(result: dict) -> dict:
    """(e) per P: constant-time speed-ups (= τ; E[X] + 1 for the oracle and the bounds) and wall-clock
    estimates τ·t(1)/(draft s per round + t(P+1)); oracle and bounds with free drafting."""
    caps = [int(c) for c in result["config"]["capacities"]]
    costs = result.get("costs")
    prof = CostProfile(tuple(costs["ks"]), tuple(costs["seconds"])) if costs else None
    t1 = float(prof(1)) if prof else float("nan")
    bounds = result["bounds"]
    oracle = result.get("oracle")
    rows = []
    for i, P in enumerate(caps):
        tP = float(prof(P + 1)) if prof else float("nan")
        row = {"P": P, "t_P_plus_1": tP, "t_1": t1}
        for form in BOUND_FORMS:
            row[f"const_{form}"] = float(bounds[form][i]) + 1.0
        row["wall_renewal_free_drafting"] = (float(bounds["renewal"][i]) + 1.0) * t1 / tP
        if oracle:
            row["const_oracle"] = float(oracle["mean"][i]) + 1.0
            row["wall_oracle_free_drafting"] = row["const_oracle"] * t1 / tP
        exact = result.get("drafter_exact")
        for kind, d in result.get("drafters", {}).items():
            r = d["by_capacity"].get(str(P))
            if r is None:
                continue
            row[f"const_{kind}"] = r["tau"]
            row[f"wall_{kind}"] = r["tau"] * t1 / (r["draft_seconds_per_round"] + tP)
            if exact and kind in exact and exact[kind]["mean"]:
                tau_exact = float(exact[kind]["mean"][i]) + 1.0
                row[f"const_{kind}_exact"] = tau_exact
                row[f"wall_{kind}_exact"] = tau_exact * t1 / (r["draft_seconds_per_round"] + tP)
        sd = result.get("oracle_sd", {}).get("by_capacity", {}).get(str(P))
        if sd is not None:
            row["const_oracle_sd"] = sd["tau"]
        rows.append(row)
    return {"rows": rows, "t_1": t1}


# ---------------------------------------------------------------------------------------------------
# one prompt set
# ---------------------------------------------------------------------------------------------------
def analyze_set(target, draft, set_name: str, cfg: AnalyzeConfig, prompts=None, prompt_ids=None,
                progress: bool = True, log=print) -> dict:
    """Run (a)–(e) for one prompt set on a loaded target (and draft; None skips (d)). ``prompt_ids``
    (lists of token ids) may replace ``prompts`` (for tokenizer-less test models)."""
    if prompt_ids is None:
        if prompts is None:
            from ..assets.prompts import load_prompts

            prompts = load_prompts(set_name, cfg.n_prompts)
        prompt_ids = encode_prompts(target, prompts)
    prompt_ids = [list(map(int, p)) for p in prompt_ids]
    if not prompt_ids:
        raise SpecboundError(f"prompt set {set_name!r} gave no prompts")
    result: dict = {"set": set_name, "target": target.name, "draft": getattr(draft, "name", None),
                    "draft_backend": getattr(draft, "linear_backend", None),
                    "target_backend": getattr(target, "linear_backend", None),
                    "config": asdict(cfg), "prompt_ids_lengths": [len(p) for p in prompt_ids],
                    "prompt_names": [p.id for p in prompts] if prompts else None,
                    "torch_threads": torch.get_num_threads(), "timings": {}}
    timings = result["timings"]
    bar = _progress(progress)
    with bar if progress else nullcontext():
        pb = bar if progress else None
        t0 = time.perf_counter()
        mom = measure_moments(target, prompt_ids[: cfg.n_prompts], cfg.tokens, cfg.temperature, cfg.seed, pb,
                              label=f"{set_name} (a) target moments")
        timings["moments"] = time.perf_counter() - t0
        est = mom["estimate"]
        result["moments"] = est
        result["samples"] = [{"prompt_len": len(s["prompt"]), "tokens": s["tokens"], "H": s["H"], "m2": s["m2"]}
                             for s in mom["samples"]]
        log(f"[{set_name}] mu={est['mu']:.4f}±{est['se_mu']:.4f}  mu2={est['mu2']:.4f}±{est['se_mu2']:.4f}  "
            f"E[H^2]={est['mean_H2']:.4f}  n={est['n']}  ({timings['moments']:.0f}s)")
        b = bound_all_forms(est["mu"], est["mu2"], list(cfg.capacities))
        result["bounds"] = {k: np.asarray(v).tolist() for k, v in b.items()}

        if cfg.oracle_positions > 0:
            t0 = time.perf_counter()
            result["oracle"] = oracle_values(target, mom["samples"], cfg, pb)
            timings["oracle_exact"] = time.perf_counter() - t0
            log(f"[{set_name}] oracle E[X*]: " + ", ".join(
                f"P={c}: {m:.3f}" for c, m in zip(cfg.capacities, result["oracle"]["mean"]))
                + f"  ({result['oracle']['reads_total']} target reads, {timings['oracle_exact']:.0f}s)")
            if draft is not None:
                t0 = time.perf_counter()
                positions = [(d["sample"], d["position"]) for d in result["oracle"]["positions"]]
                result["drafter_exact"] = drafter_values(target, draft, mom["samples"], positions, cfg, pb)
                timings["drafter_exact"] = time.perf_counter() - t0
                log(f"[{set_name}] exact E[X|T] at the oracle positions: " + "; ".join(
                    f"{kind}: " + ", ".join(f"P={c}: {m:.2f}" for c, m in zip(cfg.capacities,
                                                                             result["drafter_exact"][kind]["mean"]))
                    for kind in ("dynamic", "chain")) + f"  ({timings['drafter_exact']:.0f}s)")
        if cfg.oracle_sd_prompts > 0 and cfg.oracle_sd_tokens > 0 and cfg.sd_capacities:
            t0 = time.perf_counter()
            result["oracle_sd"] = oracle_sd(target, prompt_ids, cfg, pb)
            timings["oracle_sd"] = time.perf_counter() - t0
            log(f"[{set_name}] oracle SD mean X / mean E[X|T]: " + ", ".join(
                f"P={c}: {r['mean_X']:.2f}/{r['mean_value']:.2f}"
                for c, r in result["oracle_sd"]["by_capacity"].items()) + f"  ({timings['oracle_sd']:.0f}s)")
        result["drafters"] = {}
        if draft is not None and cfg.drafter_prompts > 0 and cfg.drafter_tokens > 0:
            for kind in cfg.drafters:
                t0 = time.perf_counter()
                result["drafters"][kind] = drafter_runs(target, draft, prompt_ids, cfg, kind, pb)
                timings[f"drafter_{kind}"] = time.perf_counter() - t0
                log(f"[{set_name}] {kind} tau: " + ", ".join(
                    f"P={c}: {r['tau']:.2f}" for c, r in result["drafters"][kind]["by_capacity"].items())
                    + f"  ({timings[f'drafter_{kind}']:.0f}s)")
        t0 = time.perf_counter()
        costs = measure_target_costs(target, prompt_ids[0], cfg.capacities, cfg.cost_repeats)
        result["costs"] = {"ks": list(costs.ks), "seconds": list(costs.seconds)}
        timings["costs"] = time.perf_counter() - t0
    result["speedups"] = speedups(result)
    result["tightest_bound"] = tightest_bound(result)
    return result


def tightest_bound(result: dict) -> dict:
    """Which rigorous form (published, renewal, threshold) is smallest while staying above the oracle
    at each P ≥ 3, and how far the asymptotic approximation is from the measured oracle."""
    caps = result["config"]["capacities"]
    oracle = result.get("oracle")
    out = {}
    for i, P in enumerate(caps):
        # the published form is a bound only for P >= 3 (it loosens μ ln P + μ₂ ≤ (μ + μ₂) ln P);
        # the asymptotic form is never one
        valid = tuple(f for f in BOUND_FORMS if bound_is_valid(f, P))
        forms = {f: result["bounds"][f][i] for f in valid}
        best = min(forms, key=forms.get)
        entry = {"tightest": best, "value": forms[best]}
        if oracle:
            o = oracle["mean"][i]
            entry.update(oracle=o, gap=forms[best] - o, holds=bool(forms[best] >= o),
                         asymptotic_minus_oracle=result["bounds"]["asymptotic"][i] - o,
                         violated=[f for f, v in forms.items() if v < o])
        out[str(P)] = entry
    return out


# ---------------------------------------------------------------------------------------------------
# reports
# ---------------------------------------------------------------------------------------------------
def _clean(obj):
    """JSON-safe copy: NaN/inf → None, numpy → Python."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _clean(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        x = float(obj)
        return x if math.isfinite(x) else None
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    return obj


def write_json(obj, path: Path) -> None:
    path.write_text(json.dumps(_clean(obj), indent=1))


def _f(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def per_p_table(result: dict) -> str:
    """Markdown table of E[X] per P: oracle (exact, empirical), bound forms, drafters."""
    caps = result["config"]["capacities"]
    oracle = result.get("oracle")
    sd = result.get("oracle_sd", {}).get("by_capacity", {})
    drafters = result.get("drafters", {})
    header = ["P", "oracle E[X*] (exact)", "oracle SD: mean X / mean E[X|T] (rounds)"]
    header += [f"bound: {f}" if f != "asymptotic" else "asymptotic (approximation, not a bound)"
               for f in BOUND_FORMS]
    header += [f"{k}: E[X] (τ)" for k in drafters]
    exact = result.get("drafter_exact") or {}
    exact_kinds = [k for k in ("dynamic", "chain") if k in exact and exact[k]["mean"]]
    header += [f"{k}: exact E[X|T] at oracle positions" for k in exact_kinds]
    rows = []
    for i, P in enumerate(caps):
        row = [str(P), f"{_f(oracle['mean'][i])} ± {_f(oracle['se'][i])}" if oracle else "–"]
        s = sd.get(str(P))
        row.append(f"{_f(s['mean_X'], 2)} / {_f(s['mean_value'], 2)} ({s['rounds']})" if s else "–")
        row += [_f(result["bounds"][f][i]) + (" (not a bound, P < 3)" if f == "published" and
                                               not bound_is_valid(f, P) else "") for f in BOUND_FORMS]
        for k, d in drafters.items():
            r = d["by_capacity"].get(str(P))
            row.append(f"{_f(r['mean_accepted'], 2)} ({_f(r['tau'], 2)})" if r else "–")
        for k in exact_kinds:
            se = exact[k]["se"][i] if exact[k]["se"] else None
            row.append(f"{_f(exact[k]['mean'][i])} ± {_f(se)}")
        rows.append(row)
    return _table(header, rows)


def speedup_table(result: dict) -> str:
    rows_in = result["speedups"]["rows"]
    kinds = list(result.get("drafters", {}))
    ex = [k for k in kinds if f"const_{k}_exact" in rows_in[0]]
    header = ["P", "t(P+1)/t(1)", "const: renewal+1", "const: oracle E[X*]+1"] + [f"const: {k} τ (run)" for k in kinds]
    header += [f"const: {k} exact+1" for k in ex]
    header += ["wall: renewal (free draft)", "wall: oracle (free draft)"] + [f"wall: {k} (run τ)" for k in kinds]
    header += [f"wall: {k} (exact)" for k in ex]
    rows = []
    for r in rows_in:
        row = [str(r["P"]), _f(r["t_P_plus_1"] / r["t_1"], 2), _f(r["const_renewal"], 2), _f(r.get("const_oracle"), 2)]
        row += [_f(r.get(f"const_{k}"), 2) for k in kinds]
        row += [_f(r.get(f"const_{k}_exact"), 2) for k in ex]
        row += [_f(r["wall_renewal_free_drafting"], 2), _f(r.get("wall_oracle_free_drafting"), 2)]
        row += [_f(r.get(f"wall_{k}"), 2) for k in kinds]
        row += [_f(r.get(f"wall_{k}_exact"), 2) for k in ex]
        rows.append(row)
    return _table(header, rows)


def drafter_cost_table(result: dict) -> str:
    header = ["drafter", "P", "τ", "draft s/round", "target s/round", "draft calls/round", "rounds"]
    rows = []
    for kind, d in result.get("drafters", {}).items():
        for P, r in d["by_capacity"].items():
            rows.append([kind, P, _f(r["tau"], 2), _f(r["draft_seconds_per_round"], 3),
                         _f(r["target_seconds_per_round"], 3), _f(r["draft_calls_per_round"], 1), str(r["rounds"])])
    return _table(header, rows)


def set_report_markdown(result: dict, images: dict[str, str], title: str | None = None, level: int = 1) -> str:
    """Markdown section for one analysed prompt set; ``images`` maps captions to relative PNG paths."""
    h = "#" * level
    cfg = result["config"]
    m = result["moments"]
    lines = [f"{h} {title or 'specbound analyze: ' + result['set']}", ""]
    lines.append(f"Target `{result['target']}`, draft `{result['draft']}` ({result.get('draft_backend')}), "
                 f"temperature {cfg['temperature']:g}, {result['torch_threads']} torch threads. Nats throughout; "
                 "X = accepted draft tokens per round (bonus token not counted), τ = tokens per target call.")
    lines.append("")
    lines.append(f"{h}# Measurement sizes")
    lines.append("")
    sd = result.get("oracle_sd", {})
    lines += [
        f"- (a) moments: {m['n_prompts']} prompts × up to {cfg['tokens']} sampled tokens (stop at EOS) → "
        f"{m['n']} positions",
        f"- (b) oracle T*(P) exact: {result.get('oracle', {}).get('n_positions', 0)} positions spread over those "
        f"samples, one T*({max(cfg['capacities'])}) each (nested), {result.get('oracle', {}).get('reads_total', 0)} "
        f"batched target reads (width {cfg['oracle_width']})",
        f"- (b) oracle tree SD: P ∈ {sd.get('capacities', [])}, {sd.get('prompts', 0)} prompt(s) × "
        f"{sd.get('tokens_per_prompt', 0)} tokens",
        f"- (d) drafters {list(result.get('drafters', {}))}: P ∈ {cfg['capacities']}, {cfg['drafter_prompts']} "
        f"prompt(s) × {cfg['drafter_tokens']} tokens per P (measured τ; few rounds at large P, see the cost table)",
        f"- (d, exact) drafter trees at the oracle's {result.get('drafter_exact', {}).get('n_positions', 0)} "
        "positions: one dynamic tree and one sampled chain of P_max nodes per position (nested in P), scored by "
        "one target pass each; E[X|T] exact (chain: acceptance coins integrated out)",
        f"- (e) t(k): median of {cfg['cost_repeats']} target passes per k after the first prompt",
        "- timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in result["timings"].items()),
        "",
    ]
    lines.append(f"{h}# Moments of the target")
    lines.append("")
    lines.append(_table(["μ", "μ₂ = E[Σp ln²p]", "E[H²]", "Var(Y) = μ₂ − μ²", "SE μ (pos / prompt)",
                         "SE μ₂ (pos / prompt)", "positions", "share H < 0.1"],
                        [[_f(m["mu"], 4), _f(m["mu2"], 4), _f(m["mean_H2"], 4), _f(m["var_surprisal"], 4),
                          f"{_f(m['se_mu'], 4)} / {_f(m['se_mu_prompt'], 4)}",
                          f"{_f(m['se_mu2'], 4)} / {_f(m['se_mu2_prompt'], 4)}", str(m["n"]),
                          _f(m["frac_H_below_0p1"], 2)]]))
    lines.append("")
    lines.append(f"{h}# E[X] per capacity P")
    lines.append("")
    lines.append(per_p_table(result))
    lines.append("")
    tb = result.get("tightest_bound", {})
    if tb:
        viol = {P: e["violated"] for P, e in tb.items() if e.get("violated")}
        forms = sorted({e["tightest"] for e in tb.values()})
        lines.append(f"Tightest rigorous form at the measured μ, μ₂: {', '.join(forms)}"
                     + (f"; forms below the measured oracle (i.i.d. assumption violated on real text): {viol}"
                        if viol else "; every rigorous form stays above the measured oracle E[X*]."))
        lines.append("")
    lines.append(f"{h}# Speed-ups")
    lines.append("")
    lines.append("`const` = the paper's constant-time model (one target call costs the same for any P, drafting "
                 "free): speed-up = τ. `wall` = τ·t(1)/(draft s per round + t(P+1)) with the measured t(k); "
                 "oracle and bound with free drafting.")
    lines.append("")
    lines.append(speedup_table(result))
    lines.append("")
    lines.append(drafter_cost_table(result))
    lines.append("")
    for caption, rel in images.items():
        lines.append(f"![{caption}]({rel})")
        lines.append("")
    return "\n".join(lines)


_INLINE = [(re.compile(r"`([^`]+)`"), r"<code>\1</code>"), (re.compile(r"\*\*([^*]+)\*\*"), r"<b>\1</b>"),
           (re.compile(r"\[([^\]]+)\]\(([^)]+?)\.md\)"), r'<a href="\2.html">\1</a>'),
           (re.compile(r"\[([^\]]+)\]\(([^)]+)\)"), r'<a href="\2">\1</a>')]


def _inline(text: str) -> str:
    out = html.escape(text, quote=False)
    for pat, rep in _INLINE:
        out = pat.sub(rep, out)
    return out


def markdown_to_html(md: str, title: str = "specbound report") -> str:
    """The small markdown subset our reports use (headings, pipe tables, lists, images, paragraphs)."""
    body: list[str] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        img = re.fullmatch(r"!\[(.*)\]\((.+)\)", line.strip())
        if not line.strip():
            i += 1
        elif line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")), 6)
            body.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
            i += 1
        elif img:
            body.append(f'<figure><img src="{html.escape(img.group(2))}" alt="{html.escape(img.group(1))}" '
                        f'style="max-width:100%"><figcaption>{_inline(img.group(1))}</figcaption></figure>')
            i += 1
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                    rows.append(cells)
                i += 1
            out = ["<table>"]
            for k, cells in enumerate(rows):
                tag = "th" if k == 0 else "td"
                out.append("<tr>" + "".join(f"<{tag}>{_inline(c)}</{tag}>" for c in cells) + "</tr>")
            out.append("</table>")
            body.append("\n".join(out))
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            body.append("<ul>" + "".join(items) + "</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(("#", "|", "- ", "![")):
                para.append(lines[i])
                i += 1
            body.append(f"<p>{_inline(' '.join(para))}</p>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:3px 8px;"
             "text-align:right}th{background:#eee}code{background:#f4f4f4}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_report(result: dict, out_dir, name: str = "analyze") -> dict[str, Path]:
    """JSON + PNGs + markdown + HTML for one analysed set into ``out_dir``; returns the paths."""
    from . import plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{name}.json"}
    write_json(result, paths["json"])
    paths["expected_accepted"] = plots.plot_pankratov_expected_accepted(result, out / "expected_accepted.png")
    paths["speedup"] = plots.plot_pankratov_speedup(result, out / "speedup.png")
    images = {f"E[X] vs P ({result['set']})": "expected_accepted.png",
              f"speed-up vs P ({result['set']})": "speedup.png"}
    md = set_report_markdown(result, images)
    paths["markdown"] = out / "report.md"
    paths["markdown"].write_text(md)
    paths["html"] = out / "report.html"
    paths["html"].write_text(markdown_to_html(md, title=f"specbound analyze {result['set']}"))
    return paths


# ---------------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------------
def _int_list(text: str) -> list[int]:
    import argparse

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("expected integers >= 1")
    return values


def add_arguments(parser) -> None:
    parser.add_argument("--target", default=None, help="target model (packaged name or directory; default: "
                                                       "qwen2.5-coder-1.5b)")
    parser.add_argument("--draft", default=None, help="draft model (default: qwen2.5-coder-0.5b)")
    parser.add_argument("--draft-fp32", action="store_true", help="use the fp32 draft (default: int8, cheaper)")
    parser.add_argument("--prompts", required=True, help="prompt set: humaneval, mtbench, gsm8k or builtin")
    parser.add_argument("--n-prompts", type=int, default=None, help="prompts for the moments (default 6)")
    parser.add_argument("--capacities", type=_int_list, default=None, help="capacities P (default 1,2,4,...,64)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (> 0), default 1")
    parser.add_argument("--tokens", type=int, default=None, help="sampled tokens per prompt for the moments")
    parser.add_argument("--oracle-positions", type=int, default=None, help="positions for exact T*(P) (default 10)")
    parser.add_argument("--drafter-prompts", type=int, default=None)
    parser.add_argument("--drafter-tokens", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="output directory (default runs/analyze-<set>)")
    parser.add_argument("--quick", action="store_true", help="small numbers (smoke test)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's choice; 1 is far faster on a shared CPU)")


def config_from_args(args) -> AnalyzeConfig:
    cfg = AnalyzeConfig.quick() if args.quick else AnalyzeConfig()
    updates = {}
    for attr, key in (("n_prompts", "n_prompts"), ("tokens", "tokens"), ("oracle_positions", "oracle_positions"),
                      ("drafter_prompts", "drafter_prompts"), ("drafter_tokens", "drafter_tokens")):
        value = getattr(args, key, None)
        if value is not None:
            updates[attr] = value
    if getattr(args, "capacities", None):
        updates["capacities"] = tuple(args.capacities)
        if cfg.oracle_sd_capacities is not None:
            keep = sorted(set(cfg.oracle_sd_capacities) & set(args.capacities))
            updates["oracle_sd_capacities"] = tuple(keep or [min(args.capacities), max(args.capacities)])
    updates["temperature"] = args.temperature
    updates["seed"] = args.seed
    return replace(cfg, **updates)


def run(args) -> int:
    from ..models.loading import DEFAULT_DRAFT, DEFAULT_TARGET, load_model

    cfg = config_from_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    progress = not args.no_progress
    out = Path(args.out or f"runs/analyze-{args.prompts}")
    from ..assets.prompts import load_prompts

    prompts = load_prompts(args.prompts, cfg.n_prompts)
    target = load_model(args.target or DEFAULT_TARGET, progress=progress)
    draft = load_model(args.draft or DEFAULT_DRAFT, progress=progress, int8=not args.draft_fp32)
    if target.vocab_size != draft.vocab_size:
        raise SpecboundError(f"vocabulary mismatch: {target.name} {target.vocab_size} vs {draft.name} {draft.vocab_size}")
    result = analyze_set(target, draft, args.prompts, cfg, prompts=prompts, progress=progress)
    paths = write_report(result, out)
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0
