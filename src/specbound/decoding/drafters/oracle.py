"""The oracle drafter: the TARGET drafts its own optimal tree T*(P) (Pankratov & Alistarh 2026, §1–§2).

With perfect knowledge of the target, the best deterministic speculation strategy drafts the P
continuations of largest target path probability; verified by the deterministic-tree rule its mean
accepted length is E[X | T*] (stored in :attr:`DraftTree.value`). :class:`TargetLaws` feeds
:func:`specbound.theory.optimal_tree` with the target's processed laws, read through the target's
cache in batches: a miss reads the requested node with up to ``width − 1`` prefetched nodes (those the
best-first search expands next, skipped when they cannot enter T*(P)), and a ``guess`` (a path the
target is likely to take) is read in one call. Prefetching never changes the laws, hence never the
tree; it only saves target calls. The target's cache is restored to its committed prefix afterwards,
so verification is untouched; the oracle's target reads count as draft calls. In full: docs/notes.md.
"""
from __future__ import annotations

import heapq
import math

import numpy as np
import torch

from ...errors import SpecboundError, positive_int
from ...models.base import LanguageModel
from ...theory.trees import optimal_tree
from ..sampling import SamplingConfig, logits_to_probs
from ..tree import DraftTree
from .base import DraftCache, Drafter
from .trees import check_tree_capacity

__all__ = ["OracleTreeDrafter", "TargetLaws", "draft_tree_from_optimal"]


class TargetLaws:
    """``next_probs(path)`` for :func:`~specbound.theory.optimal_tree`: the target's processed law
    (float64) after the committed tokens + ``path``, read in batches of ``width``. Paths of length
    ≥ ``max_depth`` get a uniform placeholder law without a read (their nodes are dropped later).

    ``capacity`` (the P of the tree being searched) prunes prefetching: a candidate whose path
    probability is below the P-th largest known one is never prefetched. ``guess`` (tokens after the
    committed ones) is read as one chain right after the root. Neither changes any law."""

    def __init__(self, model: LanguageModel, committed: list[int], sampling: SamplingConfig, width: int = 8,
                 max_depth: int | None = None, capacity: int | None = None, guess=()):
        self.model, self.sampling = model, sampling
        self.width = positive_int(width, "width (target reads per oracle call)")
        self.max_depth = max_depth
        self.capacity = None if capacity is None else positive_int(capacity, "capacity P")
        self.cache = DraftCache(model)
        self.ids: dict[tuple[int, ...], int] = {(): -1}
        self.laws: dict[tuple[int, ...], np.ndarray] = {}
        self.path_prob: dict[tuple[int, ...], float] = {(): 1.0}
        self.frontier: list[tuple[float, tuple[int, ...]]] = []   # (−p(v), v): unread children
        self._largest: list[float] = []          # min-heap of the P largest known path probabilities
        self._learn((), self._probs(self.cache.start(committed)[None])[0])
        guess = [int(t) for t in guess][: None if max_depth is None else max(max_depth - 1, 0)]
        if guess:
            self._read([tuple(guess[:d]) for d in range(1, len(guess) + 1)])

    @property
    def reads(self) -> int:
        return self.cache.calls

    def _probs(self, logits: torch.Tensor) -> np.ndarray:
        probs = logits_to_probs(logits, self.sampling, self.model.name).to(torch.float64)
        return (probs / probs.sum(-1, keepdim=True)).numpy()

    def _know(self, path: tuple[int, ...], prob: float) -> None:
        """Record a node's path probability (once) and keep the P largest known ones."""
        if path in self.path_prob:
            return
        self.path_prob[path] = prob
        if self.capacity is not None:
            if len(self._largest) < self.capacity:
                heapq.heappush(self._largest, prob)
            elif prob > self._largest[0]:
                heapq.heapreplace(self._largest, prob)

    def _cannot_enter(self, path: tuple[int, ...]) -> bool:
        """P known nodes are more probable than ``path`` (their ancestors are more probable still), so
        ``path`` is not in T*(P)."""
        return (self.capacity is not None and len(self._largest) == self.capacity
                and self.path_prob[path] < self._largest[0])

    def _learn(self, path: tuple[int, ...], probs: np.ndarray) -> None:
        self.laws[path] = probs
        if self.max_depth is not None and len(path) + 1 >= self.max_depth:
            return                                   # children would not be read anyway
        k = min(self.width, probs.size)
        base = self.path_prob[path]
        for a in np.argpartition(-probs, k - 1)[:k].tolist():
            pa = float(probs[a])
            if pa > 0:
                child = path + (a,)
                self._know(child, base * pa)
                heapq.heappush(self.frontier, (-base * pa, child))

    def _read(self, batch: list[tuple[int, ...]]) -> None:
        """One target call for ``batch`` (each node's parent is read already or earlier in the batch)."""
        nodes = []
        for p in batch:
            self.ids[p] = len(self.ids)
            nodes.append(self.ids[p])
        rows = self.cache.read(nodes, [p[-1] for p in batch], [self.ids[p[:-1]] for p in batch])
        for p, row in zip(batch, self._probs(rows)):
            self._know(p, self.path_prob[p[:-1]] * float(self.laws[p[:-1]][p[-1]]))
            self._learn(p, row)

    def __call__(self, path) -> np.ndarray:
        path = tuple(path)
        if self.max_depth is not None and len(path) >= self.max_depth:
            return np.full(self.model.vocab_size, 1.0 / self.model.vocab_size)
        if path not in self.laws:
            if path[:-1] not in self.laws:
                raise SpecboundError("internal: oracle law requested before its parent's")
            batch = [path]
            while self.frontier and len(batch) < self.width:
                _, cand = heapq.heappop(self.frontier)
                if cand not in self.laws and cand != path and not self._cannot_enter(cand):
                    batch.append(cand)
            self._read(batch)
        return self.laws[path]

    def restore(self) -> None:
        self.cache.restore()


def draft_tree_from_optimal(tree, max_depth: int, draft_calls: int) -> DraftTree:
    """A :class:`~specbound.theory.PathTree` of paths → a deterministic :class:`DraftTree` (tokens +
    parent indices), dropping nodes deeper than ``max_depth``; ``value`` = E[X | T] of what is kept."""
    index: dict[tuple[int, ...], int] = {}
    tokens, parents, probs = [], [], []
    for path, prob in zip(tree.nodes, tree.path_probs):
        if len(path) > max_depth:
            continue
        index[path] = len(tokens)
        tokens.append(path[-1])
        parents.append(index[path[:-1]] if len(path) > 1 else -1)
        probs.append(prob)
    return DraftTree(tokens, parents, value=math.fsum(probs), draft_calls=draft_calls)


class OracleTreeDrafter(Drafter):
    """The target drafts T*(P) of its own processed law (perfect knowledge); see the module docstring."""

    name = "oracle"

    needs_tree_target = True

    def __init__(self, target: LanguageModel, sampling: SamplingConfig, capacity: int, width: int = 8):
        super().__init__(sampling)
        if not isinstance(target, LanguageModel):
            raise SpecboundError(f"the oracle tree drafter needs the target LanguageModel, got {type(target).__name__}")
        self.target, self.capacity = target, check_tree_capacity(capacity)
        self.width = positive_int(width, "width (target reads per oracle call)")

    def start(self, target, prompt):
        pass                         # the engine prefills the target; the oracle has no model of its own

    def propose(self, committed, max_depth, generator):
        laws = TargetLaws(self.target, committed, self.sampling, width=self.width, max_depth=max_depth,
                          capacity=self.capacity)
        try:
            tree = optimal_tree(laws, self.capacity)
        finally:
            laws.restore()
        return draft_tree_from_optimal(tree, max_depth, laws.reads)

    def describe(self) -> str:
        return f"oracle tree(P={self.capacity})"
