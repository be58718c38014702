"""Draft trees (Pankratov & Alistarh 2026, §2; docs/paper-notes.md, Pankratov §5 T1, T2, T3, T5): value,
optimal tree, static trees.

Reference numbers come from docs/paper-notes.md, Pankratov §5 (not from running this code);
optimality is checked against an independent exhaustive enumeration and a naive eager search.
"""
import math
from math import comb

import numpy as np
import pytest

from specbound.errors import SpecboundError
from specbound.theory import (
    PathTree, brute_force_optimal_value, chain_value, enumerate_prefix_closed_trees, optimal_tree,
    sample_accepted_length, static_tree_from_acceptance, tree_value,
)


def random_environment(vocab: int, seed: int, concentration: float = 1.0):
    """A fixed random target: every path gets its own Dirichlet law, reproducible from the path."""
    def next_probs(path):
        rng = np.random.default_rng([seed, len(path), *path])
        return rng.dirichlet(np.full(vocab, concentration))
    return next_probs


def constant(probs):
    probs = np.asarray(probs, dtype=np.float64)
    return lambda path: probs


def path_prob(next_probs, path):
    out = 1.0
    for i, token in enumerate(path):
        out *= next_probs(path[:i])[token]
    return out


def all_paths(vocab, max_depth):
    layer = [()]
    out = []
    for _ in range(max_depth):
        layer = [v + (a,) for v in layer for a in range(vocab)]
        out += layer
    return out


def naive_best_first(next_probs, capacity):
    """Eager reference: at each step add the frontier node of largest p(v) (full scan, no heap)."""
    tree, frontier = [], {}
    def expand(path, prob):
        for a, pa in enumerate(next_probs(path)):
            if pa > 0:
                frontier[path + (a,)] = prob * pa
    expand((), 1.0)
    total = 0.0
    for _ in range(capacity):
        best = max(frontier, key=lambda v: (frontier[v], -len(v)))
        prob = frontier.pop(best)
        tree.append(best)
        total += prob
        expand(best, prob)
    return tree, total


# ------------------------------------------------------------------------------------ PathTree
def test_draft_tree_helpers():
    tree = PathTree(((1,), (0,), (1, 2), (1, 2, 0), (1, 0)), value=0.5)
    assert tree.size == len(tree) == 5
    assert tree.parents == (-1, -1, 0, 2, 0)
    assert tree.depths == (1, 1, 2, 3, 2)
    assert tree.depth == 3
    assert tree.is_prefix_closed is True
    assert tree.child_counts[()] == 2 and tree.child_counts[(1,)] == 2 and tree.child_counts[(0,)] == 0
    assert (1, 2) in tree and (2,) not in tree
    broken = PathTree(((0,), (1, 1)))
    assert broken.is_prefix_closed is False
    with pytest.raises(SpecboundError, match="prefix-closed"):
        broken.parents
    with pytest.raises(SpecboundError, match="distinct"):
        PathTree(((0,), (0,)))
    with pytest.raises(SpecboundError, match="root"):
        PathTree(((),))
    assert PathTree(()).depth == 0


def test_tree_value_is_sum_of_path_probabilities_and_cached():
    probs = {(): [0.5, 0.5, 0.0], (0,): [0.2, 0.3, 0.5], (1,): [1.0, 0.0, 0.0]}
    calls = []
    def next_probs(path):
        calls.append(path)
        return probs[path]
    nodes = [(0,), (1,), (0, 2), (0, 1), (1, 0)]
    # 0.5 + 0.5 + 0.25 + 0.15 + 0.5
    assert tree_value(nodes, next_probs) == pytest.approx(1.9, abs=1e-15)
    assert sorted(calls) == [(), (0,), (1,)]        # one call per distinct parent path
    with pytest.raises(SpecboundError, match="prefix-closed"):
        tree_value([(0, 1)], next_probs)
    assert tree_value([(0, 1)], next_probs, check_prefix_closed=False) == pytest.approx(0.15)


# ------------------------------------------------------------------------------------ T1
@pytest.mark.montecarlo
def test_T1_monte_carlo_mean_of_X_equals_tree_value():
    next_probs = random_environment(4, seed=11)
    rng = np.random.default_rng(5)
    nodes = [(0,), (1,), (3,)]                      # grow a random prefix-closed tree of 14 nodes
    while len(nodes) < 14:
        parent = nodes[rng.integers(len(nodes))]
        child = parent + (int(rng.integers(4)),)
        if child not in nodes:
            nodes.append(child)
    tree = PathTree(tuple(nodes))
    exact = tree_value(tree, next_probs)
    x = sample_accepted_length(tree, next_probs, rng, size=100_000)
    se = x.std(ddof=1) / math.sqrt(x.size)
    # tolerance: 4 standard errors of the Monte Carlo mean (a false alarm has probability ~6e-5)
    assert abs(x.mean() - exact) < 4 * se, (x.mean(), exact, se)
    # tail identity P(X >= k) = sum of p(v) over depth-k nodes, same 4-SE tolerance
    for k in (1, 2):
        tail = sum(path_prob(next_probs, v) for v in nodes if len(v) == k)
        freq = (x >= k).mean()
        assert abs(freq - tail) < 4 * math.sqrt(tail * (1 - tail) / x.size)
    assert x.max() <= tree.depth
    single = sample_accepted_length(tree, next_probs, np.random.default_rng(0))
    assert isinstance(single, int) and 0 <= single <= tree.depth


# ------------------------------------------------------------------------------------ T2
@pytest.mark.parametrize("vocab,size,expected", [(3, 7, comb(24, 8) // 17), (3, 4, comb(15, 5) // 11),
                                                 (2, 6, comb(14, 7) // 8)])
def test_enumeration_counts_all_prefix_closed_trees(vocab, size, expected):
    # V-ary Fuss–Catalan: C(V n, n)/((V−1) n + 1) trees with n = size + 1 nodes (root included)
    trees = list(enumerate_prefix_closed_trees(vocab, size))
    assert len(trees) == expected
    assert len(set(frozenset(t) for t in trees)) == expected
    assert all(PathTree(t).is_prefix_closed for t in trees)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_T2_best_first_equals_brute_force_V3(seed):
    next_probs = random_environment(3, seed=seed, concentration=0.7)
    for capacity in range(1, 8):
        best = optimal_tree(next_probs, capacity)
        assert best.size == capacity and best.is_prefix_closed
        assert best.value == pytest.approx(tree_value(best, next_probs), abs=1e-12)
        exact = brute_force_optimal_value(next_probs, 3, capacity)   # no depth cap: the true optimum
        assert best.value == pytest.approx(exact, abs=1e-12)
        capped = brute_force_optimal_value(next_probs, 3, capacity, max_depth=4)
        if best.depth <= 4:
            assert capped == pytest.approx(best.value, abs=1e-12)
        else:
            assert capped <= best.value + 1e-12
    # T* is the top-P set of all prefixes by p(v) (generic weights: no ties), and it is prefix-closed
    paths = all_paths(3, 7)
    probs = np.array([path_prob(next_probs, v) for v in paths])
    top = {paths[i] for i in np.argsort(-probs)[:7]}
    assert set(optimal_tree(next_probs, 7).nodes) == top
    assert PathTree(tuple(top)).is_prefix_closed


def test_wrong_trees_are_strictly_worse_where_T_star_branches():
    """The brute-force comparison can fail: greedy chains and breadth-first trees lose here."""
    target = np.array([0.6, 0.25, 0.1, 0.05])
    next_probs = constant(target)
    capacity = 6
    best = optimal_tree(next_probs, capacity)
    assert max(best.child_counts.values()) >= 2               # T* branches
    exact = brute_force_optimal_value(next_probs, 4, capacity)
    assert best.value == pytest.approx(exact, abs=1e-12)
    chain = [(0,) * k for k in range(1, capacity + 1)]          # greedy chain only
    bfs = [(a,) for a in range(4)] + [(0, 0), (0, 1)]           # breadth-first, ranked
    for wrong in (chain, bfs):
        assert tree_value(wrong, next_probs) < exact - 1e-3
    # chain = 0.6 + … + 0.6^6 ; BFS = 1 + 0.36 + 0.15
    assert tree_value(chain, next_probs) == pytest.approx(chain_value(0.6, 6))
    assert tree_value(bfs, next_probs) == pytest.approx(1.51)


def test_matches_naive_eager_search_with_large_vocabulary():
    # vocabulary much larger than P exercises the partial (argpartition) top-k path
    next_probs = random_environment(600, seed=3, concentration=0.05)
    for capacity in (1, 5, 40):
        best = optimal_tree(next_probs, capacity)
        nodes, value = naive_best_first(next_probs, capacity)
        assert best.value == pytest.approx(value, rel=1e-12)
        assert set(best.nodes) == set(nodes)


def test_next_probs_is_called_at_most_once_per_expanded_node():
    calls = []
    base = random_environment(5, seed=4)
    def next_probs(path):
        calls.append(path)
        return base(path)
    best = optimal_tree(next_probs, 30)
    assert len(calls) == len(set(calls)) <= 31
    assert set(calls) <= set(best.nodes) | {()}


# ------------------------------------------------------------------------------------ T3
T3_CASES = [
    ((0.6, 0.25, 0.1, 0.05), {16: 2.540, 64: 3.833, 256: 5.162, 1024: 6.501, 4096: 7.841, 16384: 9.182}),
    ((0.5, 0.3, 0.2), {64: 3.649, 1024: 6.324, 16384: 9.016}),
    ((0.9, 0.05, 0.03, 0.02), {64: 9.742, 1024: 16.570, 16384: 22.665}),
]


@pytest.mark.parametrize("target,reference", T3_CASES)
def test_T3_identical_environment_reference_values(target, reference):
    big = optimal_tree(constant(target), max(reference))
    assert big.is_prefix_closed and big.size == max(reference)
    running = np.cumsum(big.path_probs)                 # best-first order is nested
    for capacity, value in reference.items():
        assert running[capacity - 1] == pytest.approx(value, abs=6e-4), capacity  # reference values have 3 dp
    small = min(reference)
    assert optimal_tree(constant(target), small).value == pytest.approx(running[small - 1], abs=1e-12)


def test_T3_uniform_vocabulary_fills_complete_levels():
    uniform = constant(np.full(4, 0.25))
    assert optimal_tree(uniform, 4).value == pytest.approx(1.0, abs=1e-14)
    assert optimal_tree(uniform, 20).value == pytest.approx(2.0, abs=1e-14)
    assert optimal_tree(uniform, 84).value == pytest.approx(3.0, abs=1e-14)
    assert optimal_tree(uniform, 20).depth == 2       # ancestors-first ties: full levels only


# ------------------------------------------------------------------------------------ T5 (trees)
def test_T5_zero_entropy_gives_a_chain_of_P():
    assert optimal_tree(constant([0.0, 1.0, 0.0]), 37).value == 37
    # a deterministic but path-dependent target: still a single chain, never zero-probability nodes
    def next_probs(path):
        out = np.zeros(5)
        out[(len(path) * 3) % 5] = 1.0
        return out
    best = optimal_tree(next_probs, 12)
    assert best.value == 12 and best.depth == 12
    assert all(p > 0 for p in best.path_probs)


def test_zero_probability_children_are_never_added():
    best = optimal_tree(constant([0.5, 0.0, 0.5, 0.0]), 50)
    assert all(tok in (0, 2) for v in best.nodes for tok in v)


def test_deep_trees_and_complete_levels():
    # chain nodes have S = 0.01005·k < ln 100 = 4.6 for k ≤ 300, so T*(300) is the greedy chain
    best = optimal_tree(constant([0.99, 0.01]), 300)
    assert best.depth == 300 and best.value == pytest.approx(chain_value(0.99, 300), rel=1e-12)
    best = optimal_tree(constant([0.5, 0.5]), 2 ** 11 - 2)      # all nodes of depth ≤ 10
    assert best.value == pytest.approx(10.0, abs=1e-12) and best.depth == 10


# ------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("capacity", [0, -3, 2.5, 3.0, True, "8", None])
def test_capacity_is_validated(capacity):
    with pytest.raises(SpecboundError, match="capacity"):
        optimal_tree(constant([0.5, 0.5]), capacity)


@pytest.mark.parametrize("bad", [[0.5, 0.6], [np.nan, 1.0], [1.5, -0.5], [[0.5, 0.5]], [], [2.0, 3.0]])
def test_next_probs_outputs_are_validated(bad):
    with pytest.raises(SpecboundError, match="next_probs"):
        optimal_tree(lambda path: bad, 3)


def test_optimal_tree_accepts_numpy_integer_capacity():
    assert optimal_tree(constant([0.5, 0.5]), np.int64(6)).value == pytest.approx(2.0)


# ------------------------------------------------------------------------------------ static trees
def brute_force_static(acceptance, capacity):
    """max Σ_v Π acceptance[rank] over shapes whose nodes have children of ranks 0..c−1, |T| ≤ P."""
    ranks = len(acceptance)
    best = 0.0
    for size in range(1, capacity + 1):
        for nodes in enumerate_prefix_closed_trees(ranks, size):
            node_set = set(nodes)
            if any(v[-1] > 0 and v[:-1] + (v[-1] - 1,) not in node_set for v in nodes):
                continue                                # a rank is skipped: not a valid shape
            best = max(best, sum(math.prod(acceptance[r] for r in v) for v in nodes))
    return best


@pytest.mark.parametrize("acceptance", [[0.5, 0.2, 0.1], [0.8, 0.1], [0.3, 0.3, 0.3], [0.6, 0.0, 0.0]])
def test_static_best_first_equals_dp_and_brute_force(acceptance):
    for capacity in (1, 2, 4, 6):
        best_first = static_tree_from_acceptance(acceptance, capacity, method="best_first")
        dp = static_tree_from_acceptance(acceptance, capacity, method="dp")
        exact = brute_force_static(acceptance, capacity)
        assert best_first.value == pytest.approx(exact, abs=1e-12)
        assert dp.value == pytest.approx(exact, abs=1e-12)
        for tree in (best_first, dp):
            assert tree.is_prefix_closed and tree.size <= capacity
            assert tree.value == pytest.approx(
                sum(math.prod(acceptance[r] for r in v) for v in tree.nodes), abs=1e-12)


def test_static_dp_handles_non_monotone_acceptance():
    acceptance = [0.2, 0.7]          # rank 1 is better but needs rank 0 beside it
    with pytest.raises(SpecboundError, match="non-increasing"):
        static_tree_from_acceptance(acceptance, 4, method="best_first")
    for capacity in (1, 2, 3, 5):
        tree = static_tree_from_acceptance(acceptance, capacity)       # auto → dp
        assert tree.value == pytest.approx(brute_force_static(acceptance, capacity), abs=1e-12)
    # P = 2: ranks {0, 1} under the root (0.2 + 0.7) beat the chain (0.2 + 0.04)
    assert static_tree_from_acceptance(acceptance, 2).value == pytest.approx(0.9)


def test_static_tree_from_sorted_target_equals_optimal_tree_in_identical_environment():
    # in an identical environment the rank-i child is accepted w.p. the i-th largest target prob
    target = (0.6, 0.25, 0.1, 0.05)
    for capacity, reference in ((16, 2.540), (64, 3.833), (256, 5.162)):
        static = static_tree_from_acceptance(target, capacity)
        assert static.value == pytest.approx(reference, abs=6e-4)
        assert static.value == pytest.approx(optimal_tree(constant(target), capacity).value, abs=1e-12)
    assert static_tree_from_acceptance(target, 40, method="dp").value == pytest.approx(
        optimal_tree(constant(target), 40).value, abs=1e-12)


def test_chain_value_and_single_rank_static_tree():
    assert chain_value(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert chain_value(1.0, 7) == 7.0
    assert chain_value(0.0, 5) == 0.0
    assert chain_value(0.3, 0) == 0.0
    np.testing.assert_allclose(chain_value(np.array([0.2, 0.9]), 4), [sum(a ** i for i in range(1, 5))
                                                                    for a in (0.2, 0.9)])
    for alpha in (0.3, 0.8):
        assert static_tree_from_acceptance([alpha], 9).value == pytest.approx(chain_value(alpha, 9))
    with pytest.raises(SpecboundError):
        chain_value(1.2, 3)
    with pytest.raises(SpecboundError):
        chain_value(0.5, 2.5)
    with pytest.raises(SpecboundError, match="sums to"):
        static_tree_from_acceptance([0.7, 0.6], 4)
    with pytest.raises(SpecboundError):
        static_tree_from_acceptance([0.5, np.nan], 4)
    with pytest.raises(SpecboundError, match="capacity"):
        static_tree_from_acceptance([0.5], 0)
