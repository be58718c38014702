"""Draft-tree proposers for :class:`~specbound.decoding.tree.TreeSpeculator` (Pankratov & Alistarh 2026).

A drafter turns the committed tokens into a draft tree of at most P nodes (the capacity P of
Pankratov & Alistarh 2026, §1: the number of drafted tokens the target scores in one pass) and
says which verification rule makes it lossless:

* ``"deterministic"`` trees (:class:`DynamicTreeDrafter`, :class:`OracleTreeDrafter`) are a
  deterministic function of what the drafter knows and are verified by
  :func:`~specbound.decoding.verify.verify_tree_deterministic`;
* ``"multidraft"`` trees (:class:`SampledTreeDrafter`, and the chain as its one-child special case)
  have children sampled i.i.d. from the draft's processed law and are verified by
  :func:`~specbound.decoding.verify.verify_tree_multidraft`.

Every model read goes through :class:`TreeReader`, which only uses the model protocol
(``forward_tree``, ``keep_path``, ``crop``), so the drafters run on exact chains and on any backend
that implements tree forwards.
"""
from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import SpecboundError, positive_int
from ..models.base import LanguageModel
from ..theory.trees import optimal_tree
from .sampling import SamplingConfig, logits_to_probs

__all__ = [
    "DraftedTree", "TreeReader", "TreeDrafter", "DynamicTreeDrafter", "SampledTreeDrafter",
    "OracleTreeDrafter", "chain_tree_drafter", "check_tree_capacity", "make_tree_drafter", "TREE_DRAFTERS",
]

DETERMINISTIC = "deterministic"
MULTIDRAFT = "multidraft"


def check_tree_capacity(capacity) -> int:
    """Capacity P (number of drafted tree nodes per round): an integer ≥ 1, bools rejected."""
    return positive_int(capacity, "tree (capacity P, drafted nodes per round)")


@dataclass
class DraftedTree:
    """One round's draft tree: node i has token ``tokens[i]`` and parent ``parents[i]`` (−1 = child of
    the last committed token); parents precede children.

    ``draft_probs`` [n+1, V] (multi-draft trees only): the processed draft law the root's children
    (row 0) and node i's children (row i+1) were sampled from. ``value`` is E[X | T] under the
    target when the drafter knows it (the oracle), NaN otherwise. ``draft_calls`` counts the model
    passes the drafter made this round.
    """

    tokens: list[int]
    parents: list[int]
    verification: str
    draft_probs: torch.Tensor | None = None
    value: float = float("nan")
    draft_calls: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> list[int]:
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)


class TreeReader:
    """Reads nodes of a growing tree into ``model``'s cache above its committed prefix.

    The committed tokens the model has not read yet (``pending``) form a chain of "combined" nodes
    0..m−1; tree node i (parent −1 = child of the last committed token) is combined node m + i.
    :meth:`read` returns the logits after the requested nodes with ONE ``forward_tree`` call: it
    appends the missing nodes to the cache when the cache above ``base`` is a chain they all hang
    below (so a chain grows one token per call), and otherwise crops back to ``base`` and re-reads
    the ancestor closure of the requested nodes. :meth:`keep` leaves the committed prefix plus the
    longest cached prefix of an accepted path in the cache (``keep_path`` right after the call that
    read it, or ``crop``); :meth:`restore` crops back to ``base``.
    """

    def __init__(self, model: LanguageModel, committed: list[int]):
        base = model.cache_length
        if base > len(committed):
            raise SpecboundError(f"internal: {model.name} has read {base} tokens, only {len(committed)} are committed")
        if base == len(committed):       # everything read: re-read the last token to get the root law
            if base == 0:
                raise SpecboundError("internal: nothing committed to draft from")
            base -= 1
            model.crop(base)
        self.model, self.base = model, base
        pending = [int(t) for t in committed[base:]]
        self.m = len(pending)
        self.tokens: list[int] = pending
        self.parents: list[int] = [j - 1 for j in range(self.m)]
        self.cached: list[int] = []      # combined ids in cache order above base
        self._chain = True               # cached ids form a chain from the committed prefix
        self._last_offset = 0            # where the last forward_tree call starts inside ``cached``
        self._logits: dict[int, torch.Tensor] = {}
        self.calls = 0

    @property
    def pending(self) -> list[int]:
        return self.tokens[:self.m]

    def add(self, token: int, parent: int) -> int:
        """Add a tree node (``parent`` = tree index or −1); return its tree index. Nothing is read."""
        self.tokens.append(int(token))
        self.parents.append(self.m - 1 if parent < 0 else self.m + int(parent))
        return len(self.tokens) - 1 - self.m

    def _combined(self, node: int) -> int:
        return self.m - 1 if node < 0 else self.m + node

    def read(self, nodes: list[int]) -> torch.Tensor:
        """Next-token logits after each tree node in ``nodes`` (−1 = root) → [len(nodes), V]."""
        ids = [self._combined(v) for v in nodes]
        if any(c not in self._logits for c in ids):
            need: set[int] = set()
            for c in ids:
                while c >= 0 and c not in need:
                    need.add(c)
                    c = self.parents[c]
            cached = set(self.cached)
            new = sorted(need - cached)
            tail = self.cached[-1] if self.cached else -1
            new_set = set(new)
            if self._chain and all(self.parents[c] in new_set or self.parents[c] == tail for c in new):
                start, fed = len(self.cached), new
            else:
                self.model.crop(self.base)
                self.cached, start, fed, tail = [], 0, sorted(need), -1
            pos = {c: j for j, c in enumerate(fed)}
            parents = [pos[self.parents[c]] if self.parents[c] in pos else -1 for c in fed]
            logits = self.model.forward_tree(torch.tensor([[self.tokens[c] for c in fed]], dtype=torch.long),
                                             parents)[0]
            self.calls += 1
            chain = self._chain if start else True
            for c in fed:                    # is the cache (old part + fed) still one chain?
                chain = chain and self.parents[c] == tail
                tail = c
                self._logits[c] = logits[pos[c]]
            self._chain = chain
            self._last_offset = start
            self.cached.extend(fed)
        return torch.stack([self._logits[c] for c in ids])

    def keep(self, path: list[int]) -> int:
        """Keep the committed prefix + the longest cached prefix of (pending, ``path``); return how
        many tree nodes of ``path`` stay cached."""
        where = {c: j for j, c in enumerate(self.cached)}
        positions = []
        for c in list(range(self.m)) + [self.m + i for i in path]:
            if c not in where:
                break
            positions.append(where[c])
        off = self._last_offset
        outer = [p for p in positions if p < off]
        inner = [p - off for p in positions if p >= off]
        if outer != list(range(len(outer))) or (inner and len(outer) != off):
            raise SpecboundError("internal: kept path is not a chain of the cached tree")
        if inner:
            self.model.keep_path(self.base + off, inner)
        else:
            self.model.crop(self.base + len(outer))
        return max(0, len(positions) - self.m)

    def restore(self) -> None:
        """Crop the model back to the committed prefix it held before this reader."""
        self.model.crop(self.base)


class TreeDrafter(ABC):
    """Proposes one draft tree per round; see the module docstring for the two verification rules."""

    name: str = "tree"
    verification: str = DETERMINISTIC

    def __init__(self, capacity: int):
        self.capacity = check_tree_capacity(capacity)

    def prefill(self, prompt: list[int]) -> None:
        """Read the prompt (all but its last token) before the first round."""

    @abstractmethod
    def draft(self, committed: list[int], max_depth: int, generator: torch.Generator) -> DraftedTree:
        """Draft at most ``capacity`` nodes of depth ≤ ``max_depth`` after ``committed``."""

    def accept(self, path: list[int]) -> None:
        """Called after verification with the accepted node path: fix the drafter's model cache."""


class _ModelDrafter(TreeDrafter):
    """A drafter reading a separate draft model (cache kept at committed prefix + accepted nodes)."""

    def __init__(self, model: LanguageModel, config: SamplingConfig, capacity: int):
        super().__init__(capacity)
        if not isinstance(model, LanguageModel):
            raise SpecboundError(f"the {self.name} tree drafter needs a draft LanguageModel, got {type(model).__name__}")
        self.model, self.config = model, config
        self._reader: TreeReader | None = None

    def prefill(self, prompt: list[int]) -> None:
        self.model.reset()
        if len(prompt) > 1:
            self.model.forward(torch.tensor([prompt[:-1]], dtype=torch.long))

    def accept(self, path: list[int]) -> None:
        if self._reader is not None:
            self._reader.keep(path)
            self._reader = None


class DynamicTreeDrafter(_ModelDrafter):
    """Best-first draft tree by draft path probability (EAGLE-2-like dynamic tree, Li et al. 2024).

    The tree is the top-P set of continuations v ranked by the draft's path probability
    q(v) = Π q(v_i | v_<i) (ties: shallower first, then parent order, then child rank) — the draft's
    own version of the optimal tree T*(P) of Pankratov & Alistarh 2026, §2, computed with the same
    best-first search as :func:`specbound.theory.optimal_tree`. The draft law at a node is read only
    when the node's children could still enter the tree; such expansions are batched: up to
    ``width`` unexpanded nodes (best first) are read per draft ``forward_tree`` call. Extra
    expansions never change the tree (a node's children rank below it), only the number of calls.

    Deterministic (no sampling), so it is verified with the deterministic-tree rule. Ranking uses the
    draft's processed law; at temperature 0 (one-hot laws) it uses the temperature-1 law with the
    same top-k/top-p, so the tree keeps alternatives. ``max_children`` caps children per node.
    """

    name = "dynamic"
    verification = DETERMINISTIC

    def __init__(self, model: LanguageModel, config: SamplingConfig, capacity: int, width: int = 8,
                 max_children: int | None = None):
        super().__init__(model, config, capacity)
        self.width = positive_int(width, "width (expansions per draft call)")
        self.max_children = None if max_children is None else positive_int(max_children, "max_children")
        self.rank_config = SamplingConfig(1.0, config.top_k, config.top_p) if config.greedy else config

    def draft(self, committed, max_depth, generator):
        capacity = self.capacity
        reader = self._reader = TreeReader(self.model, committed)
        tokens: list[int] = []
        parents: list[int] = []
        self._rid: list[int | None] = []      # tree node -> reader node (None: not read)
        cand: list[tuple] = []        # (S, depth, parent, rank, token): a child not yet in the tree
        unexpanded: list[tuple] = []  # (S, depth, node): tree nodes whose draft law is unknown
        laws: dict[tuple[int, int], tuple[int, torch.Tensor]] = {}   # (parent, token) -> (reader id, logits)

        def rid(node: int) -> int:
            if node < 0:
                return -1
            if self._rid[node] is None:
                self._rid[node] = reader.add(tokens[node], rid(parents[node]))
            return self._rid[node]

        def push_children(parent: int, logits: torch.Tensor, s: float, depth: int) -> None:
            probs = logits_to_probs(logits, self.rank_config, self.model.name)
            k = min(capacity - len(tokens), probs.shape[-1], self.max_children or capacity)
            values, order = torch.sort(probs, descending=True, stable=True)
            for rank, (p, t) in enumerate(zip(values[:k].tolist(), order[:k].tolist())):
                if p <= 0:
                    break
                heapq.heappush(cand, (s - math.log(p), depth + 1, parent, rank, t))

        def expand_batch() -> None:
            """One draft call: the laws of the ``width`` best nodes that lack one — unexpanded tree
            nodes and (speculatively) frontier candidates that could still be expanded."""
            options = [(s, d, 0, node, None) for s, d, node in unexpanded]
            options += [(s, d, 1, parent, t) for s, d, parent, _, t in cand
                        if d < max_depth and (parent, t) not in laws]
            chosen = heapq.nsmallest(self.width, options)
            ids = []
            for _, _, kind, node, token in chosen:
                ids.append(rid(node) if kind == 0 else reader.add(token, rid(node)))
            rows = reader.read(ids)
            done = set()
            for (s, d, kind, node, token), reader_id, row in zip(chosen, ids, rows):
                if kind == 0:
                    done.add(node)
                    push_children(node, row, s, d)
                else:
                    laws[(node, token)] = (reader_id, row)
            unexpanded[:] = [e for e in unexpanded if e[2] not in done]
            heapq.heapify(unexpanded)

        push_children(-1, reader.read([-1])[0], 0.0, 0)
        while len(tokens) < capacity:
            if unexpanded and (not cand or (unexpanded[0][0], unexpanded[0][1] + 1) <= cand[0][:2]):
                expand_batch()
                continue
            if not cand:
                break
            s, depth, parent, _, token = heapq.heappop(cand)
            node = len(tokens)
            tokens.append(token)
            parents.append(parent)
            known = laws.pop((parent, token), None)
            self._rid.append(None if known is None else known[0])
            if known is not None:
                push_children(node, known[1], s, depth)
            elif depth < max_depth:
                heapq.heappush(unexpanded, (s, depth, node))
        return DraftedTree(tokens, parents, DETERMINISTIC, draft_calls=reader.calls)

    def accept(self, path: list[int]) -> None:
        if self._reader is not None:
            kept = []
            for node in path:
                if self._rid[node] is None:
                    break
                kept.append(self._rid[node])
            self._reader.keep(kept)
            self._reader = None


class SampledTreeDrafter(_ModelDrafter):
    """Draft tree whose children are sampled i.i.d. from the draft's processed law (SpecInfer-style).

    Level by level: every node at depth d gets ``branching[d]`` children (the last entry repeats),
    drawn with replacement from the draft law at that node, until P nodes are drafted or the depth
    budget is reached (the last level may be partly filled, in node order). Child counts never
    depend on the children's own tokens, so recursive rejection sampling
    (:func:`~specbound.decoding.verify.verify_tree_multidraft`) keeps the output law the target's.
    One draft ``forward_tree`` call per level. ``branching=(1,)`` is a sampled chain of P tokens,
    i.e. standard chain speculative decoding with γ = P (Leviathan et al. 2023; Yin et al. 2024, Alg. 1).
    """

    name = "sampled"
    verification = MULTIDRAFT

    def __init__(self, model: LanguageModel, config: SamplingConfig, capacity: int, branching=(2, 2, 1)):
        super().__init__(model, config, capacity)
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

    def draft(self, committed, max_depth, generator):
        capacity = self.capacity
        reader = self._reader = TreeReader(self.model, committed)
        laws = {-1: logits_to_probs(reader.read([-1])[0], self.config, self.model.name)}
        tokens: list[int] = []
        parents: list[int] = []
        level, depth = [-1], 0
        while level and len(tokens) < capacity and depth < max_depth:
            b = self.branching[min(depth, len(self.branching) - 1)]
            nxt: list[int] = []
            for u in level:
                k = min(b, capacity - len(tokens))
                if k <= 0:
                    break
                for t in torch.multinomial(laws[u], k, replacement=True, generator=generator).tolist():
                    nxt.append(reader.add(t, u))
                    tokens.append(int(t))
                    parents.append(u)
            depth += 1
            if not nxt or len(tokens) >= capacity or depth >= max_depth:
                break
            rows = logits_to_probs(reader.read(nxt), self.config, self.model.name)
            laws.update(zip(nxt, rows))
            level = nxt
        root = laws[-1]
        draft_probs = torch.zeros((len(tokens) + 1, root.shape[-1]), dtype=root.dtype)
        for node, law in laws.items():
            draft_probs[node + 1] = law
        return DraftedTree(tokens, parents, MULTIDRAFT, draft_probs=draft_probs, draft_calls=reader.calls)


def chain_tree_drafter(model: LanguageModel, config: SamplingConfig, capacity: int) -> SampledTreeDrafter:
    """A draft "tree" that is a single sampled chain of P tokens (for comparison with real trees)."""
    return SampledTreeDrafter(model, config, capacity, branching=(1,))


class OracleTreeDrafter(TreeDrafter):
    """The TARGET as drafter: the optimal tree T*(P) of its own processed law (perfect knowledge).

    Pankratov & Alistarh 2026, §1–§2: the best deterministic speculation strategy with perfect
    knowledge of the target drafts T*(P) = the P continuations of largest p_target(v), built here by
    :func:`specbound.theory.optimal_tree` with next_probs(path) = the target's processed law after
    the committed tokens and ``path``, read through the target's ``forward_tree`` (one read per
    expanded node, memoised; a chain is extended one token per read). The target's cache is
    cropped back to its committed prefix afterwards, so verification is untouched. Verified by the
    deterministic-tree rule, the mean accepted length per round is E[X | T*] (stored in
    :attr:`DraftedTree.value`). Target reads made here count as draft calls.

    Near the end of a generation budget nodes deeper than the remaining budget are dropped (they
    could not be emitted), so the last rounds may use fewer than P nodes.
    """

    name = "oracle"
    verification = DETERMINISTIC

    def __init__(self, target: LanguageModel, config: SamplingConfig, capacity: int):
        super().__init__(capacity)
        if not isinstance(target, LanguageModel):
            raise SpecboundError(f"the oracle tree drafter needs the target LanguageModel, got {type(target).__name__}")
        self.target, self.config = target, config

    def draft(self, committed, max_depth, generator):
        reader = TreeReader(self.target, committed)
        ids: dict[tuple[int, ...], int] = {(): -1}
        vocab = self.target.vocab_size

        def node_of(path: tuple[int, ...]) -> int:
            if path not in ids:
                ids[path] = reader.add(path[-1], node_of(path[:-1]))
            return ids[path]

        def next_probs(path: tuple[int, ...]) -> np.ndarray:
            if len(path) >= max_depth:        # beyond the budget: placeholder law, nodes dropped below
                return np.full(vocab, 1.0 / vocab)
            logits = reader.read([node_of(path)])[0]
            probs = logits_to_probs(logits, self.config, self.target.name).to(torch.float64)
            return (probs / probs.sum()).numpy()

        try:
            tree = optimal_tree(next_probs, self.capacity)
        finally:
            reader.restore()
        return drafted_from_optimal_tree(tree, max_depth, reader.calls)


def drafted_from_optimal_tree(tree, max_depth: int, draft_calls: int) -> DraftedTree:
    """Turn a :class:`~specbound.theory.DraftTree` (paths) into a deterministic :class:`DraftedTree`
    (tokens + parent indices), dropping nodes deeper than ``max_depth``; ``value`` = E[X | T] of what is kept."""
    index: dict[tuple[int, ...], int] = {}
    tokens, parents, probs = [], [], []
    for path, prob in zip(tree.nodes, tree.path_probs):
        if len(path) > max_depth:
            continue
        index[path] = len(tokens)
        tokens.append(path[-1])
        parents.append(index[path[:-1]] if len(path) > 1 else -1)
        probs.append(prob)
    return DraftedTree(tokens, parents, DETERMINISTIC, value=math.fsum(probs), draft_calls=draft_calls)


TREE_DRAFTERS = ("dynamic", "sampled", "chain", "oracle")


def make_tree_drafter(name, target: LanguageModel, draft: LanguageModel | None, config: SamplingConfig,
                      capacity) -> TreeDrafter:
    """Build the drafter called ``name`` (one of :data:`TREE_DRAFTERS`) with capacity P = ``capacity``."""
    capacity = check_tree_capacity(capacity)
    if not isinstance(name, str) or name not in TREE_DRAFTERS:
        raise SpecboundError(f"tree_drafter must be one of {', '.join(map(repr, TREE_DRAFTERS))}, got {name!r}")
    if name == "oracle":
        return OracleTreeDrafter(target, config, capacity)
    if draft is None:
        raise SpecboundError(f"tree_drafter={name!r} needs a draft model (only 'oracle' drafts with the target)")
    if target.vocab_size != draft.vocab_size:
        raise SpecboundError(
            f"vocabulary mismatch: target {target.name!r} has {target.vocab_size} tokens, "
            f"draft {draft.name!r} has {draft.vocab_size}; speculative decoding needs one vocabulary"
        )
    if name == "dynamic":
        return DynamicTreeDrafter(draft, config, capacity)
    if name == "sampled":
        return SampledTreeDrafter(draft, config, capacity)
    return chain_tree_drafter(draft, config, capacity)
