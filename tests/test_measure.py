"""The measurement layer (specbound.measure): one copy of each primitive, checked against brute force."""
import heapq

import numpy as np
import pytest

from helpers import chain_pair
from specbound.decoding import SamplingConfig
from specbound.models import ChainModel
from specbound.theory import MarkovChain

CAPACITIES = (1, 2, 4, 8)
CONTEXTS = [[0, 1], [2, 3, 4], [1], [4, 0, 2, 2]]


def _brute_force(target: MarkovChain, draft: MarkovChain, contexts, capacities, temperature):
    """Best-first top-P tree of the draft by path probability q(v) (enumerated with a heap: a prefix is
    never less likely than its extensions), the target's path probability of each node (one-hot arg-max
    laws at T = 0), E[X | T(P)] = Σ_{v ∈ T(P)} p_target(v) and nodes per depth; means over contexts."""
    Q, T = draft.transitions, target.transitions
    law = (lambda s: np.eye(len(T))[np.argmax(T[s])]) if temperature == 0 else (lambda s: T[s])
    pmax = max(capacities)
    values = np.zeros((len(contexts), len(capacities)))
    widths = [np.zeros(pmax + 1) for _ in capacities]
    for c, context in enumerate(contexts):
        heap = [(-Q[context[-1], t], 1, (t,), law(context[-1])[t]) for t in range(len(Q))]
        heapq.heapify(heap)
        chosen = []
        while heap and len(chosen) < pmax:
            negq, depth, path, p = heapq.heappop(heap)
            chosen.append((depth, p))
            for t in range(len(Q)):
                heapq.heappush(heap, (negq * Q[path[-1], t], depth + 1, path + (t,), p * law(path[-1])[t]))
        for j, P in enumerate(capacities):
            values[c, j] = sum(p for _, p in chosen[:P])
            for depth, _ in chosen[:P]:
                widths[j][depth] += 1
    return values.mean(axis=0), [w / len(contexts) for w in widths]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_dynamic_tree_values_equal_brute_force(temperature):
    from specbound.measure.drafter_values import dynamic_tree_values

    target, draft = chain_pair(2, 5, concentration=0.3, noise=0.1, draft_seed=3)
    values, widths = dynamic_tree_values(ChainModel(target), ChainModel(draft), CONTEXTS, CAPACITIES,
                                         SamplingConfig(temperature), seed=0)
    want_values, want_widths = _brute_force(target, draft, CONTEXTS, CAPACITIES, temperature)
    np.testing.assert_allclose(values, want_values, rtol=1e-12, atol=1e-12)
    for got, want in zip(widths, want_widths):
        np.testing.assert_allclose(got, want, atol=1e-12)


def test_positions_evenly_spread_or_drawn_at_random():
    from specbound.measure.moments import MomentSample
    from specbound.measure.oracle import choose_positions, contexts_at

    texts = [MomentSample([9, 8], [1, 2, 3]), MomentSample([7], []), MomentSample([6], [4, 5, 0, 1])]
    flat = [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1), (2, 2), (2, 3)]
    assert choose_positions(texts, 100) == flat == choose_positions(texts, 100, spread="random", seed=5)
    assert choose_positions(texts, 3) == [flat[0], flat[3], flat[6]]                 # ends and the middle
    assert choose_positions(texts, 0) == [] == choose_positions(texts, 0, spread="random")
    drawn = choose_positions(texts, 4, spread="random", seed=1)
    assert len(set(drawn)) == 4 and drawn == sorted(drawn) and set(drawn) <= set(flat)
    assert drawn == choose_positions(texts, 4, spread="random", seed=1)             # reproducible
    assert len({tuple(choose_positions(texts, 4, spread="random", seed=s)) for s in range(20)}) > 1
    assert contexts_at(texts, [(0, 0), (0, 2), (2, 3)]) == [[9, 8], [9, 8, 1, 2], [6, 4, 5, 0]]
    with pytest.raises(ValueError):
        choose_positions(texts, 2, spread="uniform")
