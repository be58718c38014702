"""Draft trees: value Σ p_target(v), the optimal tree T*(P), static tree shapes (NumPy only, nats).

Pankratov & Alistarh 2026, §1–§2 (model and optimal draft tree). One speculative iteration with a
prefix-closed draft tree T of |T| ≤ P non-root nodes accepts X = max{k : x_1..x_k ∈ T} tokens, where
x is sampled from the target; the verifier's bonus token is *not* counted in X (whether the paper
counts it is open, docs/paper-notes.md, Pankratov §6.4; tokens emitted per iteration are X + 1).
Section numbers "§N" cited below are those of docs/paper-notes.md (Pankratov part). Conventions:

* A node is a path: a tuple of token ids (v_1, …, v_k), the root is the empty path ``()`` and is
  not counted in |T|.
* ``next_probs(path) -> 1-D array`` is the *target's* next-token law after ``path`` (the paper's
  p = verifier = target). Every array it returns is checked to be finite and stochastic.
* p_target(v) = Π_i target(v_i | v_<i) and the cumulative surprisal S(v) = −ln p_target(v) (nats).
"""
from __future__ import annotations

import heapq
import math
import operator
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import SpecboundError, int_at_least, positive_int

__all__ = [
    "PathTree",
    "tree_value",
    "optimal_tree",
    "enumerate_prefix_closed_trees",
    "brute_force_optimal_value",
    "sample_accepted_length",
    "static_tree_from_acceptance",
    "chain_value",
]

Path = tuple[int, ...]
NextProbs = Callable[[Path], Sequence[float]]

_STOCHASTIC_ATOL = 1e-8


# ---------------------------------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------------------------------
def _check_capacity(capacity) -> int:
    """Capacity P: a Python/NumPy integer ≥ 1 (bools and floats are rejected)."""
    return positive_int(capacity, "capacity (number of draft-tree nodes)")


def _as_path(node) -> Path:
    try:
        path = tuple(operator.index(t) for t in node)
    except TypeError:
        raise SpecboundError(f"a tree node must be a tuple of integer token ids, got {node!r}") from None
    if any(t < 0 for t in path):
        raise SpecboundError(f"token ids must be >= 0, got node {path}")
    return path


class _Target:
    """``next_probs`` wrapped with a per-path cache and a check that each output is a distribution."""

    def __init__(self, next_probs: NextProbs):
        if not callable(next_probs):
            raise SpecboundError(
                f"next_probs must be a callable path -> next-token probabilities, got {type(next_probs).__name__}"
            )
        self._fn = next_probs
        self._cache: dict[Path, np.ndarray] = {}
        self._path_prob: dict[Path, float] = {(): 1.0}
        self.calls = 0

    def __call__(self, path: Path) -> np.ndarray:
        probs = self._cache.get(path)
        if probs is None:
            probs = self._validate(self._fn(path), path)
            self._cache[path] = probs
            self.calls += 1
        return probs

    @staticmethod
    def _validate(out, path: Path) -> np.ndarray:
        arr = np.asarray(out, dtype=np.float64)
        if arr.ndim != 1 or arr.size == 0:
            raise SpecboundError(
                f"next_probs{path} must return a non-empty 1-D probability vector, got shape {arr.shape}"
            )
        total = float(arr.sum())  # finite iff every entry is finite
        if not math.isfinite(total):
            raise SpecboundError(f"next_probs{path} returned NaN or inf")
        low = float(arr.min())
        if low < -_STOCHASTIC_ATOL:
            raise SpecboundError(f"next_probs{path} has negative entries (min {low:.3g})")
        if abs(total - 1.0) > max(_STOCHASTIC_ATOL, 1e-12 * arr.size):
            raise SpecboundError(
                f"next_probs{path} is not stochastic: it sums to {total:.12g} instead of 1 "
                "(pass probabilities, not logits)"
            )
        if low < 0:  # round-off negatives
            arr = np.maximum(arr, 0.0)
        return arr

    def path_prob(self, path: Path) -> float:
        """p_target(path) = Π target(v_i | v_<i), memoised over prefixes."""
        prob = self._path_prob.get(path)
        if prob is None:
            parent = path[:-1]
            probs = self(parent)
            token = path[-1]
            if token >= probs.size:
                raise SpecboundError(
                    f"token {token} of node {path} is outside the vocabulary of size {probs.size} "
                    f"returned by next_probs{parent}"
                )
            prob = self.path_prob(parent) * float(probs[token])
            self._path_prob[path] = prob
        return prob


# ---------------------------------------------------------------------------------------------------
# the tree object
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PathTree:
    """A draft tree as a set of token paths (the theory's view): ``nodes`` (paths, insertion order,
    root ``()`` excluded) and ``value`` = E[X | T]. The engine's flat form of one round's proposal
    (tokens + parent indices) is :class:`specbound.decoding.DraftTree`.

    ``value`` is NaN when the tree is built by hand (use :func:`tree_value`).
    ``path_probs`` optionally holds p_target(v) (or, for static trees, Π acceptance) per node in the
    same order; for :func:`optimal_tree` the running sums of ``path_probs`` are the values E[X|T*(n)]
    of the optimal trees of every smaller capacity n (best-first order is nested).
    Pankratov & Alistarh 2026, §2: E[X | T] = Σ_{v∈T} p_target(v) for prefix-closed T.
    """

    nodes: tuple[Path, ...]
    value: float = float("nan")
    path_probs: tuple[float, ...] = ()

    def __post_init__(self):
        nodes = tuple(_as_path(v) for v in self.nodes)
        if any(len(v) == 0 for v in nodes):
            raise SpecboundError("the root () is implicit and must not be listed among the tree nodes")
        if len(set(nodes)) != len(nodes):
            raise SpecboundError("draft-tree nodes must be distinct")
        if self.path_probs and len(self.path_probs) != len(nodes):
            raise SpecboundError(
                f"path_probs has {len(self.path_probs)} entries for {len(nodes)} nodes"
            )
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "value", float(self.value))
        object.__setattr__(self, "path_probs", tuple(float(x) for x in self.path_probs))

    @classmethod
    def _trusted(cls, nodes: tuple[Path, ...], value: float, path_probs: tuple[float, ...]) -> "PathTree":
        """Build without re-validating nodes (used by the search routines, which produce valid paths)."""
        tree = object.__new__(cls)
        object.__setattr__(tree, "nodes", nodes)
        object.__setattr__(tree, "value", float(value))
        object.__setattr__(tree, "path_probs", path_probs)
        return tree

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, path) -> bool:
        return tuple(path) in self._index

    @cached_property
    def _index(self) -> dict[Path, int]:
        return {v: i for i, v in enumerate(self.nodes)}

    @property
    def size(self) -> int:
        """|T|, the number of non-root nodes (what the capacity P counts)."""
        return len(self.nodes)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """Depth (path length) of each node; depth-1 nodes are children of the root."""
        return tuple(len(v) for v in self.nodes)

    @property
    def depth(self) -> int:
        """Depth of the deepest node (0 for the empty tree): the largest X this tree can accept."""
        return max(self.depths, default=0)

    @cached_property
    def is_prefix_closed(self) -> bool:
        """True iff every proper non-empty prefix of every node is itself a node."""
        index = self._index
        return all(v[:-1] in index for v in self.nodes if len(v) > 1)

    @cached_property
    def parents(self) -> tuple[int, ...]:
        """Index in ``nodes`` of each node's parent; −1 for children of the root.

        Raises SpecboundError if the tree is not prefix-closed (some parent is missing).
        """
        index = self._index
        out = []
        for v in self.nodes:
            if len(v) == 1:
                out.append(-1)
            elif v[:-1] in index:
                out.append(index[v[:-1]])
            else:
                raise SpecboundError(f"node {v} has no parent {v[:-1]} in the tree: it is not prefix-closed")
        return tuple(out)

    @cached_property
    def child_counts(self) -> dict[Path, int]:
        """Number of children of the root ``()`` and of every node (the tree's shape)."""
        counts = {(): 0, **{v: 0 for v in self.nodes}}
        for v in self.nodes:
            if v[:-1] in counts:
                counts[v[:-1]] += 1
        return counts


def _nodes_of(tree) -> tuple[Path, ...]:
    if isinstance(tree, PathTree):
        return tree.nodes
    if isinstance(tree, (str, bytes)):
        raise SpecboundError("a tree must be a PathTree or an iterable of token paths")
    return PathTree(tuple(tree)).nodes


# ---------------------------------------------------------------------------------------------------
# value of a tree
# ---------------------------------------------------------------------------------------------------
def tree_value(nodes, next_probs: NextProbs, check_prefix_closed: bool = True) -> float:
    """E[X | T] = Σ_{v∈T} p_target(v), with p_target(v) = Π_i target(v_i | v_<i).

    Pankratov & Alistarh 2026, §2 ("value of a tree"): X = Σ_{v∈T} 1[v is a prefix of x] for a
    prefix-closed T, so its mean under the target's sampling law is the sum of path probabilities.
    ``nodes`` is a :class:`PathTree` or an iterable of paths. ``next_probs`` is called at most once
    per distinct path (cached). The identity needs prefix closure, so by default a tree that is not
    prefix-closed is rejected; ``check_prefix_closed=False`` returns the plain sum anyway.
    """
    tree = nodes if isinstance(nodes, PathTree) else PathTree(_nodes_of(nodes))
    if check_prefix_closed and not tree.is_prefix_closed:
        raise SpecboundError(
            "tree is not prefix-closed, so Σ p(v) is not E[X|T]; pass check_prefix_closed=False "
            "to get the plain sum"
        )
    target = _Target(next_probs)
    return float(math.fsum(target.path_prob(v) for v in tree.nodes))


# ---------------------------------------------------------------------------------------------------
# best-first search (shared by optimal_tree and the static trees)
# ---------------------------------------------------------------------------------------------------
def _best_first(
    ranked_children: Callable[[Path, int], tuple[list[int], list[float]]],
    capacity: int,
) -> PathTree:
    """The ``capacity`` nodes of smallest cumulative surprisal, popped best-first with lazy siblings.

    ``ranked_children(path, k)`` returns lists (tokens, weights): at most k children of ``path`` with
    weight (conditional probability) > 0, sorted by weight descending. Heap keys are (S, depth, counter)
    with S = −ln Π weights in nats, so ties go ancestors-first and deterministic. Heap entries are (S,
    depth, counter, owner, rank): a child entry (rank ≥ 0: the rank-th best child of ``owner``, −1 = root)
    adds the child when popped and pushes its next sibling (lazy siblings) and the child's expand entry; an
    expand entry (rank −1, key (S(node), depth+1): a lower bound for all of the node's children) calls
    ``ranked_children`` only when it pops, so a node whose children cannot enter the tree before the budget
    runs out is never expanded. O(P) pushes/pops, O(P log P) heap work. Correctness: every node outside the
    heap's frontier has a frontier ancestor-or-elder-sibling entry with key ≤ its own, so nodes leave the heap
    in non-decreasing key order; the first P popped are the top-P set, which is prefix-closed (Pankratov &
    Alistarh 2026, §2: children never beat parents, ties ancestors-first).
    """
    nodes: list[Path] = []
    probs_out: list[float] = []
    children: dict[int, tuple[list[int], list[float], list[float]]] = {}
    push, pop, log = heapq.heappush, heapq.heappop, math.log
    counter = 0
    # entries: (S, depth, counter, owner, rank); rank −1 marks an expand entry; the root is owner −1
    heap: list[tuple] = [(0.0, 1, 0, -1, -1)]
    while heap and len(nodes) < capacity:
        s, depth, _, owner, rank = pop(heap)
        if rank < 0:  # expand entry: fetch and rank owner's children, push the best one
            tokens, weights = ranked_children(() if owner < 0 else nodes[owner], capacity - len(nodes))
            if len(tokens) == 0:
                continue
            child_s = [s - log(w) for w in weights]  # weights > 0: finite surprisals
            children[owner] = (tokens, weights, child_s)
            counter += 1
            push(heap, (child_s[0], depth, counter, owner, 0))
            continue
        tokens, weights, child_s = children[owner]
        if owner < 0:
            node, prob = (tokens[rank],), weights[rank]
        else:
            node, prob = nodes[owner] + (tokens[rank],), probs_out[owner] * weights[rank]
        nodes.append(node)
        probs_out.append(prob)
        if rank + 1 < len(tokens):
            counter += 1
            push(heap, (child_s[rank + 1], depth, counter, owner, rank + 1))
        counter += 1
        push(heap, (s, depth + 1, counter, len(nodes) - 1, -1))
    return PathTree._trusted(tuple(nodes), math.fsum(probs_out), tuple(probs_out))


def _top_k_desc(probs: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest positive entries, descending (ties: lower index first)."""
    n = probs.size
    if k < n and k * 4 < n:  # partial selection, then sort only the k survivors
        cand = np.argpartition(-probs, k - 1)[:k]
        order = cand[np.lexsort((cand, -probs[cand]))]
    else:
        order = np.argsort(-probs, kind="stable")[:k]
    if probs[order[-1]] > 0:
        return order
    return order[probs[order] > 0]


def optimal_tree(next_probs: NextProbs, capacity: int) -> PathTree:
    """The optimal draft tree T*(P) and its value E[X | T*] (best-first search, lazy siblings).

    Pankratov & Alistarh 2026, §2 ("optimal draft tree"): maximise Σ_{v∈T} p_target(v) over
    prefix-closed T with |T| ≤ P. Since p(va) ≤ p(v), the P prefixes of largest p_target(v) (ties
    broken ancestors-first) are prefix-closed and optimal, i.e. T* = {v : S(v) ≤ t*}: the first P
    particles born in the branching random walk with positions S(v) = −ln p_target(v) (§3.2). Heap keys
    are (S(v), depth) in nats, so nothing underflows and ties go ancestors-first; O(P log P) heap
    operations, each expanded node's children ranked by a descending sort (a partial ``argpartition`` top-k
    when the remaining budget is much smaller than the vocabulary); ``next_probs`` is called once per
    expanded node (at most P + 1 calls), and nodes whose children cannot enter the tree are never expanded.
    Zero-probability children are never added (a zero-entropy target gives a chain of P nodes, value P).

    Returns a :class:`PathTree` whose ``nodes`` are in pop order (non-decreasing surprisal) and
    whose ``value`` = E[X | T*] (accepted tokens, bonus token not counted).
    """
    capacity = _check_capacity(capacity)
    target = _Target(next_probs)

    def ranked(path: Path, k: int):
        probs = target(path)
        order = _top_k_desc(probs, k)
        return order.tolist(), probs[order].tolist()

    return _best_first(ranked, capacity)


# ---------------------------------------------------------------------------------------------------
# brute force (tests on tiny vocabularies)
# ---------------------------------------------------------------------------------------------------
def _search_trees(vocab: int, size: int, max_depth: int, weight, visit) -> None:
    """Call ``visit(chosen, total)`` for every prefix-closed tree of exactly ``size`` nodes.

    Each tree is generated once: candidate nodes are scanned in a queue (the children of an
    included node are appended to it), and each candidate is either included or skipped for good
    (skipping a node skips its whole subtree). ``weight(node)`` is summed into ``total``.
    """
    queue: list[tuple[Path, float]] = [((a,), weight((a,))) for a in range(vocab)] if max_depth >= 1 else []
    chosen: list[Path] = []

    def rec(idx: int, total: float) -> None:
        if len(chosen) == size:
            visit(chosen, total)
            return
        if idx >= len(queue):
            return
        node, w = queue[idx]
        chosen.append(node)
        added = 0
        if len(node) < max_depth:
            queue.extend((node + (a,), weight(node + (a,))) for a in range(vocab))
            added = vocab
        rec(idx + 1, total + w)                 # include node
        if added:
            del queue[-added:]
        chosen.pop()
        rec(idx + 1, total)                     # skip node and its subtree

    rec(0, 0.0)


def _check_size(size, max_depth):
    size = int_at_least(size, 0, "size")
    if max_depth is None:
        return size, size
    return size, int_at_least(max_depth, 0, "max_depth (or None)")


def enumerate_prefix_closed_trees(vocab: int, size: int, max_depth: int | None = None) -> Iterator[tuple[Path, ...]]:
    """Every prefix-closed tree with exactly ``size`` non-root nodes over tokens 0..vocab−1.

    Exhaustive enumeration for tests on tiny vocabularies (Pankratov & Alistarh 2026, §5 T2);
    each tree is produced once, as a tuple of paths with parents before children. Without a depth
    cap there are C(V(n+1), n+1) / ((V−1)(n+1) + 1) of them (V-ary Fuss–Catalan, n = size);
    ``max_depth`` caps the depth (default: no cap). The trees are collected before iteration, so
    keep V and size small.
    """
    vocab = _check_capacity(vocab)
    size, max_depth = _check_size(size, max_depth)
    out: list[tuple[Path, ...]] = []
    _search_trees(vocab, size, max_depth, lambda v: 0.0, lambda chosen, _: out.append(tuple(chosen)))
    return iter(out)


def brute_force_optimal_value(next_probs: NextProbs, vocab: int, capacity: int, max_depth: int | None = None) -> float:
    """max Σ_{v∈T} p_target(v) over ALL prefix-closed T with |T| = capacity and depth ≤ max_depth.

    Exhaustive enumeration (Pankratov & Alistarh 2026, §5 T2), independent of the heap search;
    only for tiny vocabularies and capacities. ``next_probs`` must return vectors of length
    ``vocab``. ``max_depth=None`` means no depth limit (a tree of P nodes has depth ≤ P anyway),
    which makes the result the exact optimum E[X | T*(P)].
    """
    vocab = _check_capacity(vocab)
    capacity = _check_capacity(capacity)
    capacity, max_depth = _check_size(capacity, max_depth)
    target = _Target(next_probs)
    probs_root = target(())
    if probs_root.size != vocab:
        raise SpecboundError(f"next_probs(()) has length {probs_root.size} but vocab = {vocab}")
    best = [-math.inf]

    def visit(_, total):
        if total > best[0]:
            best[0] = total

    _search_trees(vocab, capacity, max_depth, target.path_prob, visit)
    if best[0] == -math.inf:
        raise SpecboundError(f"no prefix-closed tree of {capacity} nodes has depth <= {max_depth}")
    return best[0]


# ---------------------------------------------------------------------------------------------------
# Monte Carlo
# ---------------------------------------------------------------------------------------------------
def sample_accepted_length(tree, next_probs: NextProbs, rng=None, size: int | None = None):
    """Sample X = max{k : x_1..x_k ∈ T} with x drawn token by token from the target.

    Pankratov & Alistarh 2026, §1 (one speculative iteration with lossless tree verification:
    the accepted path has the target's law). ``tree`` is a prefix-closed :class:`PathTree` or
    iterable of paths; ``rng`` a ``numpy.random.Generator`` or seed. With ``size=None`` returns
    one int; otherwise an int64 array of ``size`` i.i.d. draws (vectorised: all samples sitting at
    the same node draw their next token together by inverse CDF). E[X] = :func:`tree_value`.
    """
    tree = tree if isinstance(tree, PathTree) else PathTree(_nodes_of(tree))
    if not tree.is_prefix_closed:
        raise SpecboundError("sample_accepted_length needs a prefix-closed tree")
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    n = 1 if size is None else operator.index(size)
    if n < 0:
        raise SpecboundError(f"size must be >= 0, got {size}")
    target = _Target(next_probs)
    kids: dict[int, dict[int, int]] = {}
    for i, (v, par) in enumerate(zip(tree.nodes, tree.parents)):
        kids.setdefault(par, {})[v[-1]] = i
    lookup: dict[int, np.ndarray] = {}  # node -> (token -> child index or −1)

    depth = np.zeros(n, dtype=np.int64)
    where = np.full(n, -1, dtype=np.int64)  # current node index; −1 = root
    active = np.arange(n)
    while active.size:
        still = []
        for node in np.unique(where[active]):
            members = active[where[active] == node]
            path = () if node < 0 else tree.nodes[node]
            cdf = np.cumsum(target(path))
            u = rng.random(members.size) * cdf[-1]
            tokens = np.minimum(np.searchsorted(cdf, u, side="right"), cdf.size - 1)
            table = lookup.get(int(node))
            if table is None:
                table = np.full(cdf.size, -1, dtype=np.int64)
                for token, idx in kids.get(int(node), {}).items():
                    if token < cdf.size:
                        table[token] = idx
                lookup[int(node)] = table
            nxt = table[tokens]
            moved = nxt >= 0
            where[members[moved]] = nxt[moved]
            depth[members[moved]] += 1
            still.append(members[moved])
        active = np.concatenate(still) if still else np.empty(0, dtype=np.int64)
    return int(depth[0]) if size is None else depth


# ---------------------------------------------------------------------------------------------------
# static trees from a positional acceptance vector (Sequoia-style) and chains
# ---------------------------------------------------------------------------------------------------
def _check_acceptance(acceptance) -> np.ndarray:
    acc = np.asarray(acceptance, dtype=np.float64)
    if acc.ndim != 1 or acc.size == 0:
        raise SpecboundError(f"acceptance must be a non-empty 1-D vector, got shape {acc.shape}")
    if not np.all(np.isfinite(acc)) or np.any(acc < 0) or np.any(acc > 1):
        raise SpecboundError("acceptance entries must be probabilities in [0, 1]")
    if acc.sum() > 1 + 1e-9:
        raise SpecboundError(
            f"acceptance sums to {acc.sum():.6g} > 1: acceptance[i] must be the (unconditional) "
            "probability that the rank-i child is the accepted one, and these events are disjoint "
            "(conditional acceptance rates are a different vector)"
        )
    return acc


def _static_dp(acc: np.ndarray, capacity: int) -> PathTree:
    """Sequoia-style DP over tree shapes (children of every node are ranks 0..c−1).

    G[m] = best Σ over m descendants of a node (values relative to that node),
    H[i][m] = best over m nodes hung on ranks i, i+1, … (rank i used iff m > 0),
    H[i][m] = max_{1≤k≤m} acc[i]·(1 + G[k−1]) + H[i+1][m−k],  H[i][0] = 0,  H[K][m>0] = −∞,
    G[m] = H[0][m]. O(K·P) vector operations of length ≤ P.
    """
    ranks = min(acc.size, capacity)
    acc = acc[:ranks]
    H = np.full((ranks + 1, capacity + 1), -np.inf)
    H[:, 0] = 0.0
    choice = np.zeros((ranks, capacity + 1), dtype=np.int64)
    G = np.zeros(capacity + 1)
    for m in range(1, capacity + 1):
        for i in range(ranks - 1, -1, -1):
            # k = 1..m: child of rank i gets k nodes (itself + k−1 descendants)
            cand = acc[i] * (1.0 + G[:m]) + H[i + 1, m - 1::-1]
            k = int(np.argmax(cand))
            H[i, m] = cand[k]
            choice[i, m] = k + 1
        G[m] = H[0, m]
    nodes: list[Path] = []
    weights: list[float] = []

    def build(path: Path, weight: float, m: int) -> None:
        i = 0
        while m > 0:
            k = int(choice[i, m])
            node = path + (i,)
            nodes.append(node)
            weights.append(weight * acc[i])
            build(node, weight * acc[i], k - 1)
            m -= k
            i += 1

    build((), 1.0, capacity)
    # breadth-first order for readability (parents before children)
    order = sorted(range(len(nodes)), key=lambda j: (len(nodes[j]), nodes[j]))
    return PathTree(tuple(nodes[j] for j in order), float(G[capacity]), tuple(weights[j] for j in order))


def static_tree_from_acceptance(acceptance, capacity: int, method: str = "auto") -> PathTree:
    """Best static tree shape for a positional acceptance vector (Sequoia-style), |T| ≤ P.

    ``acceptance[i]`` is the probability that the rank-i child (rank 0 = the drafter's top choice) of any
    node is the accepted one (so Σ acceptance ≤ 1). A node whose path uses ranks (r_1, …, r_k) is reached
    with probability w(v) = Π_j acceptance[r_j], and a shape's expected accepted length is Σ_v w(v) — the
    tree-value identity of Pankratov & Alistarh 2026, §2, with the target's law replaced by the
    rank-acceptance law. Shapes are trees whose nodes have children of ranks 0..c−1; nodes are rank paths.

    Methods: ``"best_first"`` (needs acceptance non-increasing): the top-P rank paths by w; with ties broken
    by (depth, earlier rank) that set is closed under parents *and* elder siblings (w(child) ≤ w(parent),
    w(rank r+1 sibling) ≤ w(rank r)), so it is a valid shape, and it maximises Σ w over all P-subsets, hence
    equals the DP optimum; zero-weight nodes are not added (|T| may be < P). ``"dp"``: the exact Sequoia
    dynamic programme over shapes (any acceptance vector; O(K·P²) work, vectorised over one axis), exactly
    P nodes. ``"auto"``: best-first when acceptance is non-increasing, DP otherwise.
    """
    acc = _check_acceptance(acceptance)
    capacity = _check_capacity(capacity)
    monotone = bool(np.all(np.diff(acc) <= 0))
    if method == "auto":
        method = "best_first" if monotone else "dp"
    if method == "dp":
        return _static_dp(acc, capacity)
    if method != "best_first":
        raise SpecboundError(f"method must be 'auto', 'best_first' or 'dp', got {method!r}")
    if not monotone:
        raise SpecboundError(
            "best_first needs a non-increasing acceptance vector (otherwise top-P rank paths may skip "
            "a rank); use method='dp'"
        )
    positive = np.flatnonzero(acc > 0)  # monotone ⇒ a prefix 0..r of ranks

    def ranked(path: Path, k: int):
        ranks = positive[:k]
        return ranks.tolist(), acc[ranks].tolist()

    return _best_first(ranked, capacity)


def chain_value(alpha, gamma):
    """Expected accepted tokens of a length-γ draft chain with i.i.d. acceptance α: Σ_{i=1}^γ α^i.

    = α(1 − α^γ)/(1 − α) (γ when α = 1); bonus token not counted. Broadcasts over α and γ.
    This is the chain special case of the tree value of Pankratov & Alistarh 2026, §2.
    """
    a = np.asarray(alpha, dtype=np.float64)
    g = np.asarray(gamma)
    if not np.all(np.isfinite(a)) or np.any(a < 0) or np.any(a > 1):
        raise SpecboundError("alpha must be an acceptance probability in [0, 1]")
    if g.dtype.kind not in "iu" or np.any(g < 0):
        raise SpecboundError(f"gamma must be a non-negative integer chain length, got {gamma!r}")
    g = g.astype(np.float64)
    one = a == 1.0
    safe = np.where(one, 0.5, a)
    out = np.where(one, g, safe * (1.0 - safe ** g) / (1.0 - safe))
    return float(out) if out.ndim == 0 else out
