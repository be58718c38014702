"""The real drafters against the oracle (Pankratov & Alistarh 2026, §2 and Fig. 2 in kind).

* :func:`drafter_values_at` — the one computation: exact E[X | drafted tree] at one context, every
  P ≤ P_max, for the engine's dynamic tree drafter (running sums of p_target(v) in best-first order)
  and its sampled-chain drafter (acceptance coins integrated out);
* :func:`drafter_values` — that at the oracle's positions, journalled (the studies);
* :func:`dynamic_tree_values` — the dynamic tree's mean value, level widths and draft reads at given
  contexts, and :func:`greedy_tree_rounds` — the same per round along greedy texts (``specbound advise``);
* :func:`chain_verification_values` — exact accepted tokens of sampled chains under token-wise and
  block verification, and :func:`sampled_shape_values` — of sampled trees and M-draft batches under
  recursive rejection, with their draft reads (``specbound advise`` at T > 0);
* :func:`drafter_runs` — τ(P), tokens per target call, of tree SD with a real drafter, through
  :func:`~specbound.decoding.speculative_decode`;
* :func:`measure_target_costs` — t(k), seconds of a target pass over k new tokens.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from ..decoding import DynamicTreeDrafter, SampledTreeDrafter, SamplingConfig, make_generator, speculative_decode
from ..decoding.drafters.batch import BatchDrafter
from ..decoding.costs import measure_forward_costs
from ..seeds import derive_seed
from ..theory.speedup import CostProfile
from ..theory.rejections import sampled_tree_value
from ..theory.verification import block_accepted_by_length
from .journal import PartialResults, no_journal
from .llm import PromptContext, tree_laws
from .moments import MomentSample
from .oracle import contexts_at
from .records import Stage

__all__ = ["ChainVerificationValues", "DrafterExact", "DrafterRun", "DrafterRuns", "DrafterValues", "ExactAt",
           "TreeValues", "accepted_along", "chain_verification_values", "drafter_runs", "drafter_values",
           "drafter_values_at", "dynamic_tree_values", "greedy_tree_rounds", "measure_target_costs",
           "SampledShape", "ShapeValues", "sampled_shape_values"]

EXACT_KINDS = ("dynamic", "chain", "chain_block")     # chain_block: the same sampled chain under block verification


@dataclass
class ExactAt:
    """One drafter at one context: E[X | its tree restricted to n nodes] for n = 1..P_max."""

    running: list[float]
    draft_seconds: float
    draft_calls: int
    depths: list[int] = field(default_factory=list)     # depth of each node, same order as ``running``
    reads: list[int] = field(default_factory=list)      # tokens read by each draft call of the proposal


def drafter_values_at(target, draft, context: list[int], capacity: int, config: SamplingConfig,
                      generator: torch.Generator, kinds=EXACT_KINDS,
                      rank: SamplingConfig | None = None) -> dict[str, ExactAt]:
    """Exact conditional expected accepted lengths of the real drafters at one context, for every
    P ≤ ``capacity`` (both caches must hold a prefix of ``context``; their lengths are restored).

    * dynamic tree (deterministic): the drafter's exact best-first top-P tree is nested (its first n
      nodes in best-first order are its tree for capacity n), so E[X | T_dyn(n)] = running sums of
      p_target(v) in that order (Pankratov & Alistarh 2026, §2 tree value); ≤ E[X | T*(n)] always.
    * chain (sampled, rejection-verified): one chain of ``capacity`` tokens sampled from the draft; its
      first n tokens are a chain of length n, expected to accept Σ_{k≤n} Π_{i≤k} min(1,
      target_i(x_i)/draft_i(x_i)) given the drafted tokens (Leviathan et al. 2023).
    * chain_block: the SAME sampled chain verified jointly (block verification, Sun et al. 2025,
      :func:`~specbound.theory.verification.block_accepted_by_length`): the verifier's difference alone.

    ``kinds`` picks the drafters (a subset of :data:`EXACT_KINDS`); ``rank`` is the sampling the
    dynamic tree is built with (default ``config``; the target's laws always use ``config``).
    """
    out = {}
    before = draft.cache_length
    if "dynamic" in kinds:
        out["dynamic"] = _dynamic_at(target, draft, context, capacity, config, generator, rank or config, before)
    if "chain" in kinds or "chain_block" in kinds:
        token, block = _chain_at(target, draft, context, capacity, config, generator, before)
        out.update({k: v for k, v in (("chain", token), ("chain_block", block)) if k in kinds})
    return out


def _propose_once(drafter, draft, context, max_depth, generator, before):
    """One proposal at ``context`` (depth ≤ ``max_depth``), its seconds and the tokens read by each of
    its draft calls; the draft's cache is left as it was found (at length ``before``)."""
    t0 = time.perf_counter()
    try:
        tree = drafter.propose(context, max_depth, generator)
        reads = [int(k) for k, _ in drafter.cache.reads]
    finally:
        drafter.abandon()
        draft.crop(min(before, draft.cache_length))
    return tree, time.perf_counter() - t0, reads


def _dynamic_at(target, draft, context, capacity, config, generator, rank, before) -> ExactAt:
    dyn = DynamicTreeDrafter(draft, rank, capacity)
    tree, seconds, reads = _propose_once(dyn, draft, context, capacity, generator, before)
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    laws = tree_laws(target, context, tokens, parents, config)
    probs: list[float] = []
    for tok, parent in zip(tokens, parents):
        probs.append((1.0 if parent < 0 else probs[parent]) * float(laws[parent + 1][tok]))
    depths = tree.depths.tolist()
    order = sorted(range(len(tokens)), key=lambda i: (-float(tree.scores[i]), depths[i], i))   # best-first
    return ExactAt(np.cumsum([probs[i] for i in order]).tolist(), seconds, tree.draft_calls,
                   [depths[i] for i in order], reads)


def _sampled_chain(target, draft, context, capacity, config, generator, before):
    """One chain of ``capacity`` tokens sampled from the draft at ``context``: its tokens, the target's
    and the draft's processed laws along it (float64 [n+1, V]; the law before token i is row i, the
    root's row 0), the drafting seconds and draft calls."""
    chain = SampledTreeDrafter(draft, config, capacity, branching=(1,))
    drafted, seconds, _ = _propose_once(chain, draft, context, capacity, generator, before)
    tokens = drafted.tokens.tolist()
    laws = tree_laws(target, context, tokens, drafted.parents.tolist(), config)
    return tokens, laws, drafted.draft_probs.to(torch.float64).numpy(), seconds, drafted.draft_calls


def _token_wise_running(tokens, laws, q) -> np.ndarray:
    """E[accepted | the chain's first n tokens] for n = 1..len(tokens) under token-wise verification:
    Σ_{k≤n} Π_{i≤k} min(1, target_i(x_i)/draft_i(x_i)) (Leviathan et al. 2023; Yin et al. 2024, Alg. 1)."""
    ratio = [min(1.0, float(laws[i][tok]) / float(q[i][tok])) if q[i][tok] > 0 else 0.0 for i, tok in enumerate(tokens)]
    return np.cumsum(np.cumprod(ratio))


def _chain_at(target, draft, context, capacity, config, generator, before) -> tuple[ExactAt, ExactAt]:
    """One sampled chain scored under token-wise and under block verification, for every length n."""
    tokens, laws, q, seconds, calls = _sampled_chain(target, draft, context, capacity, config, generator, before)
    depths = list(range(1, len(tokens) + 1))
    block = block_accepted_by_length(target=laws, draft=q[:len(tokens)], tokens=tokens) if tokens else np.zeros(0)
    return (ExactAt(_token_wise_running(tokens, laws, q).tolist(), seconds, calls, depths),
            ExactAt(block.tolist(), seconds, calls, list(depths)))


class TreeValues(NamedTuple):
    """Per capacity P (index j of ``capacities``): ``values[j]`` — mean E[X | T_dyn(P)] (greedy along
    texts: mean accepted drafted tokens per round); ``widths[j][d]`` — mean nodes at depth d of the
    tree; ``reads[j][k]`` — mean draft calls reading k tokens per proposal (the root re-read included),
    which is what drafting the tree costs: Σ_k reads[j][k] · d(k); ``whole[j]`` — the share of rounds
    whose accepted path ends at the tree's deepest level, whose nodes the drafter did not read (the
    level-by-level expansion stops before reading its last level): the next round's first draft read then
    takes two tokens (that node and the bonus token), as after a chain accepted whole
    (``theory.speedup.chain_draft_seconds``). A deepest node that was read — its own children all fell
    out of the top P — counts too, so this share is an upper bound (exact for chains and P = 1)."""

    values: np.ndarray
    widths: list[np.ndarray]
    reads: list[np.ndarray]
    whole: np.ndarray | None = None


def _read_counts(reads: list[int], size: int) -> np.ndarray:
    counts = np.zeros(size + 1)
    for k in reads:
        counts[min(k, size)] += 1
    return counts


def _propose_dynamic(draft, context: list[int], capacity: int, rank: SamplingConfig, generator, max_depth: int):
    """One dynamic-tree proposal of capacity P at ``context`` (the draft's cache at a prefix of it):
    the tree and the tokens read by each draft call; the cache is left as it was found."""
    tree, _, reads = _propose_once(DynamicTreeDrafter(draft, rank, capacity), draft, context, max_depth, generator,
                                   draft.cache_length)
    return tree, reads


def dynamic_tree_values(target, draft, contexts: list[list[int]], capacities, sampling: SamplingConfig,
                        seed: int = 0) -> TreeValues:
    """Mean exact E[X | T_dyn(P)] over ``contexts`` for every P in ``capacities``, the mean level
    widths of T_dyn(P) and the draft reads of the drafter of capacity P (:class:`TreeValues`), by
    :func:`drafter_values_at` at each context (context c draws from ``derive_seed(seed, "dynamic tree
    values", c)``). The best-first tree is nested, so one tree of the largest P gives every value
    and its reads; the reads differ per P (the drafter reads the nodes of each depth that rank among
    ITS P best), so every smaller P proposes once more, draft only. At greedy the tree is ranked by the draft's temperature-1
    law (a one-hot law ranks no alternatives) while the target's laws stay greedy."""
    caps = [int(c) for c in capacities]
    pmax = max(caps)
    values = np.zeros((len(contexts), len(caps)))
    whole = np.zeros((len(contexts), len(caps)))
    widths = [np.zeros(pmax + 1) for _ in caps]
    reads = [np.zeros(pmax + 1) for _ in caps]
    t_ctx, d_ctx = PromptContext(target), PromptContext(draft)
    rank = _rank_config(sampling)
    for c, context in enumerate(contexts):
        t_ctx.set(context)
        d_ctx.set(context)
        generator = make_generator(derive_seed(seed, "dynamic tree values", c))
        at = drafter_values_at(target, draft, context, pmax, sampling, generator, kinds=("dynamic",),
                               rank=rank)["dynamic"]
        for j, P in enumerate(caps):
            n = min(P, len(at.running))
            values[c, j] = at.running[n - 1] if n else 0.0
            if n:                    # P(the accepted path ends at the deepest level): its nodes' path probabilities
                path = np.diff(np.concatenate([[0.0], np.asarray(at.running[:n], dtype=np.float64)]))
                deepest = max(at.depths[:n])
                whole[c, j] = float(sum(p for p, d in zip(path, at.depths[:n]) if d == deepest))
            for d in at.depths[:n]:
                widths[j][d] += 1
            read = at.reads if P == pmax else _propose_dynamic(draft, context, P, rank, generator, P)[1]
            reads[j] += _read_counts(read, pmax)
    target.reset()
    draft.reset()
    n = max(len(contexts), 1)
    return TreeValues(values.mean(axis=0), [w / n for w in widths], [r / n for r in reads], whole.mean(axis=0))


def _rank_config(sampling: SamplingConfig) -> SamplingConfig:
    return SamplingConfig(1.0, sampling.top_k, sampling.top_p) if sampling.greedy else sampling


def accepted_along(tree, text: list[int]) -> int:
    """Drafted tokens a greedy target accepts from ``tree`` when its next tokens are ``text``: the
    depth of the deepest root path of the tree that spells a prefix of ``text``."""
    children = tree.children()
    tokens = tree.tokens.tolist()
    node, depth = -1, 0
    while depth < len(text):
        nxt = next((i for i in children[node + 1] if tokens[i] == text[depth]), None)
        if nxt is None:
            break
        node, depth = nxt, depth + 1
    return depth


def greedy_tree_rounds(draft, texts: list[tuple[list[int], list[int]]], capacities,
                       sampling: SamplingConfig) -> TreeValues:
    """Dynamic-tree SD at greedy along the target's own greedy texts, rounds where they really start
    (renewal-reward, as :func:`specbound.theory.speedup.greedy_chain_rounds` for chains): a greedy
    target is deterministic, so a round starting at position j accepts the depth of the tree's path
    that spells the text from j (:func:`accepted_along`), and the next round starts after it plus
    one recovered or bonus token. Averaging over rounds, not over positions, counts bursty
    acceptance as a real run does (rounds start more often where acceptance is low). Returns, per P,
    mean accepted drafted tokens per round (``values``: tokens per round − 1), the mean tree widths and
    the mean draft reads per round. Draft only: no target forward."""
    caps = [int(c) for c in capacities]
    pmax = max(caps)
    rank = _rank_config(sampling)
    values = np.zeros(len(caps))
    whole = np.zeros(len(caps))
    widths = [np.zeros(pmax + 1) for _ in caps]
    reads = [np.zeros(pmax + 1) for _ in caps]
    generator = make_generator(0)            # unused: the dynamic tree draws nothing
    d_ctx = PromptContext(draft)
    for j, P in enumerate(caps):
        rounds = tokens = 0
        for prompt, text in texts:
            pos = 0
            while pos < len(text):
                context = list(prompt) + list(text[:pos])
                d_ctx.set(context)
                tree, read = _propose_dynamic(draft, context, P, rank, generator, len(text) - pos)
                accepted = accepted_along(tree, text[pos:])
                depths = tree.depths.tolist()
                whole[j] += bool(depths) and accepted == max(depths)
                for d in depths:
                    widths[j][d] += 1
                reads[j] += _read_counts(read, pmax)
                pos += accepted + 1
                rounds += 1
            tokens += len(text)
        values[j] = tokens / max(rounds, 1) - 1.0
        whole[j] /= max(rounds, 1)
        widths[j] /= max(rounds, 1)
        reads[j] /= max(rounds, 1)
    draft.reset()
    return TreeValues(values, widths, reads, whole)


class ChainVerificationValues(NamedTuple):
    """Per chain length γ (index j of ``gammas``): exact mean accepted drafted tokens per round under
    token-wise (``token``) and block verification (``block``) of the SAME sampled chains, with
    standard errors across contexts."""

    gammas: list[int]
    token: np.ndarray
    block: np.ndarray
    token_se: np.ndarray
    block_se: np.ndarray


def chain_verification_values(target, draft, contexts: list[list[int]], gammas, sampling: SamplingConfig,
                              seed: int = 0) -> ChainVerificationValues:
    """Exact E[accepted | drafted chain] of token-wise verification (Yin et al. 2024, Alg. 1:
    Σ_k Π_{i≤k} min(1, target_i/draft_i)) and of block verification (Sun et al. 2025, Alg. 2:
    Σ_i i·P(τ = i | block), every γ from one chain: :func:`specbound.theory.verification.block_accepted_by_length`)
    for the first γ tokens of one chain sampled from the draft at each context (context c draws from
    ``derive_seed(seed, "chain verification values", c)``); both rules score the same chains, so
    their difference is the verifier's alone. Laws are the processed ones (T, top-k, top-p)."""
    gs = [int(g) for g in gammas]
    gmax = max(gs)
    token, block = np.zeros((len(contexts), len(gs))), np.zeros((len(contexts), len(gs)))
    t_ctx, d_ctx = PromptContext(target), PromptContext(draft)
    for c, context in enumerate(contexts):
        t_ctx.set(context)
        d_ctx.set(context)
        generator = make_generator(derive_seed(seed, "chain verification values", c))
        tokens, laws, q, _, _ = _sampled_chain(target, draft, context, gmax, sampling, generator, draft.cache_length)
        if not tokens:
            continue
        running = _token_wise_running(tokens, laws, q)
        running_block = block_accepted_by_length(target=laws, draft=q[:len(tokens)], tokens=tokens)
        for j, g in enumerate(gs):
            n = min(g, len(tokens))
            token[c, j], block[c, j] = running[n - 1], running_block[n - 1]
    target.reset()
    draft.reset()
    n = len(contexts)

    def se(a):
        return a.std(axis=0, ddof=1) / math.sqrt(n) if n > 1 else np.full(len(gs), np.nan)

    return ChainVerificationValues(gs, token.mean(axis=0), block.mean(axis=0), se(token), se(block))


class SampledShape(NamedTuple):
    """A drafted shape verified by recursive rejection: ``kind`` "sampled" (the engine's sampled tree of
    capacity ``size``, default branching: ``--tree P --tree-drafter sampled``) or "drafts" (``size`` = M
    i.i.d. draft sequences of ``gamma`` tokens, batch design B: ``--drafts M --gamma γ``)."""

    kind: str
    size: int
    gamma: int | None = None

    def drafter(self, draft, sampling: SamplingConfig):
        if self.kind == "sampled":
            return SampledTreeDrafter(draft, sampling, self.size)
        if self.kind == "drafts":
            return BatchDrafter(draft, sampling, self.size, self.gamma)
        raise ValueError(f"unknown sampled shape {self.kind!r}")

    def max_depth(self) -> int:
        return self.size if self.kind == "sampled" else int(self.gamma)


class ShapeValues(NamedTuple):
    """Per shape (index j): mean exact E[X | drafted tree] over the contexts (``values``) with its
    standard error, mean drafted nodes (the target verifies them and the pending token), and
    ``reads[j][k]`` — mean draft calls reading k tokens per proposal (priced by d(k))."""

    shapes: list[SampledShape]
    values: np.ndarray
    se: np.ndarray
    nodes: np.ndarray
    reads: list[np.ndarray]


def sampled_shape_values(target, draft, contexts: list[list[int]], shapes, sampling: SamplingConfig,
                         seed: int = 0) -> ShapeValues:
    """Exact E[accepted drafted tokens | drafted tree] (:func:`specbound.theory.sampled_tree_value`:
    recursive rejection over siblings, coins integrated out) of one tree drafted by the engine's own
    drafter of each shape at each context (context c, shape j draws from ``derive_seed(seed, "sampled
    shape values", c, j)``), scored with the target's processed laws at every node (one tree read)."""
    shapes = [s if isinstance(s, SampledShape) else SampledShape(*s) for s in shapes]
    values = np.zeros((len(contexts), len(shapes)))
    nodes = np.zeros(len(shapes))
    size = max([1] + [s.size * (s.gamma or 1) for s in shapes])
    reads = [np.zeros(size + 1) for _ in shapes]
    t_ctx, d_ctx = PromptContext(target), PromptContext(draft)
    for c, context in enumerate(contexts):
        t_ctx.set(context)
        d_ctx.set(context)
        for j, shape in enumerate(shapes):
            generator = make_generator(derive_seed(seed, "sampled shape values", c, j))
            tree, _, read = _propose_once(shape.drafter(draft, sampling), draft, context, shape.max_depth(), generator,
                                          draft.cache_length)
            tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
            laws = tree_laws(target, context, tokens, parents, sampling)
            q = tree.draft_probs.to(torch.float64).numpy()
            values[c, j] = sampled_tree_value(parents=parents, tokens=tokens, target=laws, draft=q)
            nodes[j] += len(tokens)
            reads[j] += _read_counts(read, size)
    target.reset()
    draft.reset()
    n = max(len(contexts), 1)
    se = values.std(axis=0, ddof=1) / math.sqrt(n) if n > 1 else np.full(len(shapes), np.nan)
    return ShapeValues(shapes, values.mean(axis=0), se, nodes / n, [r / n for r in reads])


@dataclass
class DrafterExact:
    mean: list[float]
    se: list[float]
    per_position: list[list[float]]
    draft_seconds_pmax: float


@dataclass
class DrafterValues:
    capacities: list[int]
    n_positions: int
    note: str
    dynamic: DrafterExact
    chain: DrafterExact
    oracle_indices: list[int] = field(default_factory=list)   # which oracle positions (rows of its per_position)
    chain_block: DrafterExact | None = None   # the chain's drafts under block verification (None: not measured)

    def of(self, kind: str) -> DrafterExact | None:
        return getattr(self, kind, None) if kind in EXACT_KINDS else None


def _summary(rows: list[list[float]], seconds: list[float], width: int) -> DrafterExact:
    a = np.asarray(rows, dtype=np.float64).reshape(-1, width)
    n = a.shape[0]
    return DrafterExact(mean=a.mean(axis=0).tolist() if n else [],
                        se=(a.std(axis=0, ddof=1) / math.sqrt(n)).tolist() if n > 1 else [],
                        per_position=a.tolist(), draft_seconds_pmax=float(np.mean(seconds)) if n else float("nan"))


def drafter_values(target, draft, samples: list[MomentSample], positions: list[tuple[int, int]], capacities,
                   temperature: float = 1.0, seed: int = 0, progress=None, journal: PartialResults | None = None,
                   key: str = "drafter_exact") -> DrafterValues:
    """Exact E[X | drafted tree] of the dynamic and chain drafters at ``positions`` (the oracle's),
    for every P in ``capacities`` (see :func:`drafter_values_at`); one journal unit per position (sample i,
    position j), drawing from its own stream ``derive_seed(seed, key, i, j)``."""
    journal = journal if journal is not None else no_journal()
    caps = [int(c) for c in capacities]
    pmax = max(caps)
    config = SamplingConfig(float(temperature))
    stage = Stage(progress, f"drafter trees at positions (P ≤ {pmax})", len(positions))
    t_ctx, d_ctx = PromptContext(target), PromptContext(draft)

    def measure(i: int, j: int) -> dict[str, ExactAt]:
        context = contexts_at(samples, [(i, j)])[0]
        t_ctx.set(context)
        d_ctx.set(context)
        return drafter_values_at(target, draft, context, pmax, config, make_generator(derive_seed(seed, key, i, j)))

    rows: dict[str, list] = {kind: [] for kind in EXACT_KINDS}
    seconds: dict[str, list] = {kind: [] for kind in EXACT_KINDS}
    for i, j in positions:
        values = journal.unit(f"{key}/{i}/{j}/P{pmax}", dict[str, ExactAt], lambda i=i, j=j: measure(i, j))
        for kind in EXACT_KINDS:
            if kind not in values:           # a journal written before chain_block existed
                continue
            run = np.asarray(values[kind].running, dtype=np.float64)
            rows[kind].append([float(run[min(c, run.size) - 1]) if run.size else 0.0 for c in caps])
            seconds[kind].append(values[kind].draft_seconds)
        stage.advance()
    target.reset()
    draft.reset()
    summary = {kind: _summary(rows[kind], seconds[kind], len(caps)) for kind in EXACT_KINDS
               if len(rows[kind]) == len(positions)}
    return DrafterValues(caps, len(positions), "per-position exact E[X | drafted tree] (chain: acceptance coins "
                         "integrated out; chain_block: the same chains under block verification), same positions "
                         "as the oracle; draft seconds are for the largest P",
                         summary["dynamic"], summary["chain"], chain_block=summary.get("chain_block"))


# ---------------------------------------------------------------------------------------------------
# τ(P) of tree SD with a real drafter
# ---------------------------------------------------------------------------------------------------
@dataclass
class DrafterRun:
    """Totals of one SD run (or a sum of runs) with one drafter at one capacity."""

    tokens: int = 0
    calls: int = 0
    accepted: int = 0
    rounds: int = 0
    draft_time: float = 0.0
    target_time: float = 0.0
    draft_calls: int = 0
    nodes: int = 0

    def __add__(self, other: "DrafterRun") -> "DrafterRun":
        return DrafterRun(*(getattr(self, f) + getattr(other, f) for f in self.__dataclass_fields__))

    @property
    def tau(self) -> float:
        return self.tokens / self.calls if self.calls else float("nan")


@dataclass
class DrafterRow:
    tau: float
    mean_accepted: float
    draft_seconds_per_round: float
    target_seconds_per_round: float
    draft_calls_per_round: float
    nodes_per_round: float
    rounds: int
    tokens: int


@dataclass
class DrafterRuns:
    kind: str
    capacities: list[int]
    prompts: int
    tokens_per_prompt: int
    by_capacity: dict[int, DrafterRow] = field(default_factory=dict)


def drafter_runs(target, draft, prompt_ids: list[list[int]], capacities, kind: str, n_prompts: int, tokens: int,
                 temperature: float = 1.0, seed: int = 0, progress=None, journal: PartialResults | None = None,
                 key: str = "drafter") -> DrafterRuns:
    """τ(P) = tokens per target call of tree SD with a real drafter — ``"chain"`` (a sampled chain of
    P tokens: standard SD with γ = P), ``"dynamic"`` (best-first tree of P nodes) or ``"sampled"`` —
    plus the measured draft and target seconds per round; one journal unit per (P, prompt). Prompt k at
    capacity P decodes with ``derive_seed(seed, key, P, k)`` whatever the drafter kind: the kinds are
    compared on common random numbers."""
    journal = journal if journal is not None else no_journal()
    prompts = prompt_ids[:n_prompts]
    caps = [int(c) for c in capacities]
    stage = Stage(progress, f"{kind} drafter", len(caps) * len(prompts))

    def run(P: int, k: int, ids: list[int]) -> DrafterRun:
        res = speculative_decode(target, draft, ids, tokens, tree=P, tree_drafter=kind, temperature=temperature,
                                 seed=derive_seed(seed, key, P, k))
        m = res.metrics
        return DrafterRun(tokens=m.new_tokens, calls=m.target_calls, accepted=sum(m.accepted_per_step),
                          rounds=len(m.accepted_per_step), draft_time=m.draft_time, target_time=m.target_time,
                          draft_calls=m.draft_calls, nodes=sum(m.drafted_per_step))

    out = DrafterRuns(kind, caps, len(prompts), int(tokens))
    for P in caps:
        total = DrafterRun()
        for k, ids in enumerate(prompts):
            total = total + journal.unit(f"{key}/{kind}/P{P}/{k}", DrafterRun, lambda P=P, k=k, ids=ids: run(P, k, ids))
            stage.advance()
        rounds = max(total.rounds, 1)
        out.by_capacity[P] = DrafterRow(tau=total.tau, mean_accepted=total.accepted / rounds,
                                        draft_seconds_per_round=total.draft_time / rounds,
                                        target_seconds_per_round=total.target_time / rounds,
                                        draft_calls_per_round=total.draft_calls / rounds,
                                        nodes_per_round=total.nodes / rounds, rounds=total.rounds, tokens=total.tokens)
    target.reset()
    draft.reset()
    return out


def measure_target_costs(target, prompt_ids: list[int], capacities, repeats: int = 3) -> CostProfile:
    """t(k): median seconds of a target pass over k new tokens after a real prompt, k = 1 and P + 1."""
    ks = sorted({1} | {int(P) + 1 for P in capacities})
    target.reset()
    if len(prompt_ids) > 1:
        target.forward(torch.tensor([prompt_ids[:-1]], dtype=torch.long))
    measure_forward_costs(target, ks=(1, ks[-1]), repeats=1)        # warm-up (page faults, allocator)
    costs, _ = measure_forward_costs(target, ks=ks, repeats=max(1, repeats))
    target.reset()
    return costs
