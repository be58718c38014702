"""Draft-tree proposers built from a draft model (Pankratov & Alistarh 2026, §1–§2).

* :class:`DynamicTreeDrafter` — a deterministic tree: the P continuations with the largest draft path
  probability (EAGLE-2's dynamic tree; the draft's own version of the optimal tree T*(P)), expanded
  level by level: ONE draft call per depth reads every node of that depth that can still enter the
  tree, so a tree of depth d costs d draft calls. Verified by the deterministic-tree rule.
* :class:`SampledTreeDrafter` — children sampled i.i.d. from the draft law at their parent
  (SpecInfer-style), one draft call per level; verified by recursive rejection over siblings.
"""
from __future__ import annotations

import heapq
import math
import time

import numpy as np
import torch

from ...errors import SpecboundError, positive_int
from ...models.base import LanguageModel
from ..policy import DraftBudget
from ..sampling import SamplingConfig, logits_to_probs, sample_from
from ..tree import DraftTree
from .base import DraftCache, Drafter, RoundFeedback
from .chain import confidence_config

__all__ = ["DynamicTreeDrafter", "SampledTreeDrafter", "check_tree_capacity"]


def check_tree_capacity(capacity) -> int:
    """Capacity P (drafted tree nodes per round): an integer ≥ 1, bools rejected."""
    return positive_int(capacity, "tree (capacity P, drafted nodes per round)")


class _ModelTreeDrafter(Drafter):
    needs_tree_target = True

    def __init__(self, model: LanguageModel, sampling: SamplingConfig, capacity: int):
        super().__init__(sampling)
        if not isinstance(model, LanguageModel):
            raise SpecboundError(f"the {self.name} tree drafter needs a draft LanguageModel, got {type(model).__name__}")
        if not model.supports_trees:
            raise SpecboundError(f"{model.name} does not implement forward_tree/keep_path, which tree drafting needs")
        self.model, self.capacity = model, check_tree_capacity(capacity)
        self.cache = DraftCache(model)

    def observe(self, feedback: RoundFeedback) -> None:
        if len(feedback.tree):
            self.cache.keep(feedback.tree.cache_path(feedback.verdict.path))

    def describe(self) -> str:
        return f"{self.name} tree(P={self.capacity})"


class DynamicTreeDrafter(_ModelTreeDrafter):
    """Best-first draft tree by draft path probability q(v) = Π q(v_i | v_<i), level-batched.

    At depth d the nodes of depth d that rank among the P best nodes known so far are read in ONE
    draft call (at most ``width`` of them; ``width=None`` reads all, which reproduces the exact
    best-first top-P tree: a node outside the current top-P can never have a child inside the final
    one). The tree is a deterministic function of the draft's laws, so it is verified by the
    deterministic-tree rule and the output law is the target's. Ranking uses the draft's processed law;
    at temperature 0 the temperature-1 law with the same top-k/top-p, so the tree keeps alternatives.
    ``max_children`` caps children per node. With a :class:`~specbound.decoding.policy.DraftBudget`
    (``budget``) the size is chosen per round (at most ``capacity``): nodes are ranked by their calibrated
    value (the predicted probability that the target accepts the path), a level is expanded only where the
    expected gain pays for the draft read and the larger target pass, and the tree sent is the top-n
    prefix maximising the expected tokens per second.
    """

    name = "dynamic"

    def __init__(self, model: LanguageModel, sampling: SamplingConfig, capacity: int, width: int | None = None,
                 max_children: int | None = None, budget: DraftBudget | None = None):
        super().__init__(model, sampling, capacity)
        self.width = None if width is None else positive_int(width, "width (nodes expanded per draft call)")
        self.max_children = None if max_children is None else positive_int(max_children, "max_children")
        self.rank_config = confidence_config(sampling)
        self.budget, self.auto = budget, budget == "auto"
        if self.auto:
            self.budget = None

    def start(self, target, prompt):
        super().start(target, prompt)
        if self.auto and self.budget is None:
            self.budget = DraftBudget(self.calibrated_costs(target), max_nodes=self.capacity)

    def _children(self, logits: torch.Tensor, limit: int) -> tuple[list[float], list[int]]:
        probs = logits_to_probs(logits, self.rank_config, self.model.name)
        k = min(limit, probs.shape[-1])
        values, order = torch.topk(probs, k)
        keep = values > 0
        return values[keep].tolist(), order[keep].tolist()

    def propose(self, committed, max_depth, generator):
        t0 = time.perf_counter()
        b = self.budget
        if b is not None and not b.start(pending=1):
            return DraftTree.empty()
        cap = self.capacity
        limit = min(cap, self.max_children or (8 if b is not None else cap))
        # node records by creation id: token, parent, −ln q(v) (draft path), confidence, value (budget)
        tok, par, score, depth, conf, value = [], [], [], [], [], []

        def add_children(parent: int, logits: torch.Tensor) -> None:
            s = score[parent] if parent >= 0 else 0.0
            d = depth[parent] if parent >= 0 else 0
            v = value[parent] if parent >= 0 else 1.0
            probs, tokens = self._children(logits, limit)
            calibrated = b.calibration(probs) if b is not None else probs
            for p, t, c in zip(probs, tokens, calibrated):
                tok.append(t)
                par.append(parent)
                score.append(s - math.log(p))
                depth.append(d + 1)
                conf.append(p)
                value.append(v * float(c))

        def ranked() -> list[int]:
            if b is None:
                return heapq.nsmallest(cap, range(len(tok)), key=lambda i: (score[i], depth[i], i))
            return sorted(range(len(tok)), key=lambda i: (-value[i], depth[i], i))[:cap]

        add_children(-1, self.cache.start(committed))
        room = getattr(self.model, "max_tree_nodes", None)      # nodes the draft's cache can hold (llama.cpp)
        for d in range(1, min(max_depth, b.max_depth if b is not None else max_depth)):
            order = ranked()
            if b is not None:
                order = order[:b.best_prefix([value[i] for i in order], time.perf_counter() - t0, pending=1) or 1]
            level = [i for i in order if depth[i] == d]
            if self.width is not None:
                level = level[:self.width]
            if b is not None:
                level = level[:self._expansion_width(level, value, order, par, conf, t0)]
            if room is not None:         # read nodes can fall out of the top P later, so reads can outnumber P
                level = level[:max(room - self.model.cache_length + self.model.committed_length, 0)]
            if not level:
                break
            rows = self.cache.read(level, [tok[i] for i in level], [par[i] for i in level])
            for node, row in zip(level, rows):
                add_children(node, row)
        order = ranked()
        if b is not None:
            n = b.best_prefix([value[i] for i in order], time.perf_counter() - t0, pending=1)
            order = order[:max(n, b.probe_size()) if b.exploring else n]
        chosen = sorted(order, key=lambda i: (depth[i], score[i], i))
        index = {node: j for j, node in enumerate(chosen)}
        return DraftTree([tok[i] for i in chosen], [index[par[i]] if par[i] >= 0 else -1 for i in chosen],
                         draft_calls=self.cache.calls, scores=[math.exp(-score[i]) for i in chosen],
                         confidences=[conf[i] for i in chosen], cache_nodes=chosen)

    def _expansion_width(self, level: list[int], value: list[float], order: list[int], parents: list[int],
                         conf: list[float], t0: float) -> int:
        """How many of this level's best nodes to read (expand) in the next draft call.

        The best node of the level continues exactly as the chain drafter would continue its chain
        (same rule, same state: its path's values, the calibrated acceptance of its own token
        persisting over the next ``lookahead`` levels, one draft read per level), so the tree is never
        shallower than the chain. Each further node of the level is then added while its expected
        subtree pays for the wider read and the larger target pass."""
        b = self.budget
        if not level:
            return 0
        best = level[0]
        path = []
        node = best
        while node >= 0:
            path.append(value[node])
            node = parents[node]
        steps = b.lookahead
        r = float(b.calibration(conf[best]))
        spent = time.perf_counter() - t0
        if not b.worth_extending(sum(path), len(path), spent, 1, [value[best] * r ** j for j in range(1, steps + 1)],
                                 [b.costs.draft(1)] * steps):
            return 0
        current, n = sum(value[i] for i in order), len(order)
        future = sum(b.continuation ** j for j in range(1, steps + 1))
        width, gain = 1, value[best] * future
        for node in level[1:]:
            extra = value[node] * future
            wider = b.throughput(current + gain + extra, spent + steps * b.costs.draft(width + 1),
                                 1 + n + (width + 1) * steps)
            narrow = b.throughput(current + gain, spent + steps * b.costs.draft(width), 1 + n + width * steps)
            if wider <= narrow:
                break
            width, gain = width + 1, gain + extra
        return width

    def observe(self, feedback: RoundFeedback) -> None:
        super().observe(feedback)
        b, tree = self.budget, feedback.tree
        if b is None:
            return
        b.costs.observe_target(feedback.target_tokens, feedback.target_seconds)
        if not len(tree):
            return
        for k, seconds in self.cache.reads:
            b.costs.observe_draft(k, seconds)
        t = feedback.node_target_probs.numpy()            # deterministic tree: acceptance = target prob
        conf = tree.confidences.numpy()
        c = b.calibration(conf)
        roots = (tree.parents < 0).numpy()
        b.learn(conf, t, first_values=c[roots], best_children=c[~roots])


class SampledTreeDrafter(_ModelTreeDrafter):
    """Children sampled i.i.d. (with replacement) from the draft's processed law at their parent.

    Level by level: every node at depth d gets ``branching[d]`` children (the last entry repeats)
    until P nodes are drafted or the depth budget is reached; child counts never depend on the
    children's tokens, so recursive rejection over siblings keeps the output law the target's. One
    draft call per level. ``branching=(1,)`` is a sampled chain of P tokens (chain SD with γ = P).
    """

    name = "sampled"

    def __init__(self, model: LanguageModel, sampling: SamplingConfig, capacity: int, branching=(2, 2, 1)):
        super().__init__(model, sampling, capacity)
        if isinstance(branching, (int, np.integer)):
            branching = (branching,)
        try:
            branching = tuple(branching)
        except TypeError:
            raise SpecboundError(f"branching must be a sequence of integers >= 1, got {branching!r}") from None
        if not branching:
            raise SpecboundError("branching must list at least one child count")
        self.branching = tuple(positive_int(b, "each branching entry") for b in branching)
        if self.branching == (1,):
            self.name = "chain"

    def propose(self, committed, max_depth, generator):
        cap = self.capacity
        root = logits_to_probs(self.cache.start(committed), self.sampling, self.model.name)
        laws = {-1: root}
        tokens: list[int] = []
        parents: list[int] = []
        level, depth = [-1], 0
        while level and len(tokens) < cap and depth < max_depth:
            b = self.branching[min(depth, len(self.branching) - 1)]
            nxt: list[int] = []
            for u in level:
                k = min(b, cap - len(tokens))
                if k <= 0:
                    break
                for t in sample_from(laws[u], generator, k).tolist():
                    nxt.append(len(tokens))
                    tokens.append(int(t))
                    parents.append(u)
            depth += 1
            if not nxt or len(tokens) >= cap or depth >= max_depth:
                break
            rows = self.cache.read(nxt, [tokens[i] for i in nxt], [parents[i] for i in nxt])
            laws.update(zip(nxt, logits_to_probs(rows, self.sampling, self.model.name)))
            level = nxt
        draft_probs = root.new_zeros(len(tokens) + 1, root.shape[-1])
        for node, law in laws.items():
            draft_probs[node + 1] = law
        return DraftTree(tokens, parents, draft_probs, sampled=True, draft_calls=self.cache.calls)
