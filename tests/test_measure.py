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
    laws at T = 0), E[X | T(P)] = Σ_{v ∈ T(P)} p_target(v), nodes per depth, and the probability that the
    accepted path ends at the deepest level (Σ of p_target(v) over the deepest nodes); means over contexts."""
    Q, T = draft.transitions, target.transitions
    law = (lambda s: np.eye(len(T))[np.argmax(T[s])]) if temperature == 0 else (lambda s: T[s])
    pmax = max(capacities)
    values = np.zeros((len(contexts), len(capacities)))
    whole = np.zeros((len(contexts), len(capacities)))
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
            deepest = max(depth for depth, _ in chosen[:P])
            whole[c, j] = sum(p for depth, p in chosen[:P] if depth == deepest)
            for depth, _ in chosen[:P]:
                widths[j][depth] += 1
    return values.mean(axis=0), [w / len(contexts) for w in widths], whole.mean(axis=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_dynamic_tree_values_equal_brute_force(temperature):
    from specbound.measure.drafter_values import dynamic_tree_values

    target, draft = chain_pair(2, 5, concentration=0.3, noise=0.1, draft_seed=3)
    values, widths, _, whole = dynamic_tree_values(ChainModel(target), ChainModel(draft), CONTEXTS, CAPACITIES,
                                                   SamplingConfig(temperature), seed=0)
    want_values, want_widths, want_whole = _brute_force(target, draft, CONTEXTS, CAPACITIES, temperature)
    np.testing.assert_allclose(values, want_values, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(whole, want_whole, rtol=1e-12, atol=1e-12)
    assert np.all(whole[1:] < values[1:])          # wider trees: part of the value ends above the deepest level
    for got, want in zip(widths, want_widths):
        np.testing.assert_allclose(got, want, atol=1e-12)


def _greedy_text(target: MarkovChain, start: int, n: int) -> list[int]:
    out, s = [], start
    for _ in range(n):
        s = int(np.argmax(target.transitions[s]))
        out.append(s)
    return out


def test_greedy_tree_rounds_follow_the_text_round_by_round():
    """Renewal along the target's greedy text: brute-force best-first top-P trees of the draft at each
    round start (the heap of _brute_force), accepted depth = the longest tree path spelling the text,
    next round after it plus one token; the measured function must give the same tokens per round."""
    from specbound.measure.drafter_values import greedy_tree_rounds

    target, draft = chain_pair(4, 5, concentration=0.3, noise=0.4, draft_seed=7)
    Q = draft.transitions
    texts = [([0, 1], _greedy_text(target, 1, 14)), ([3], _greedy_text(target, 3, 9))]

    def top_tree(last: int, P: int, max_depth: int) -> list[tuple]:
        heap = [(-Q[last, t], (t,)) for t in range(len(Q)) if Q[last, t] > 0]
        heapq.heapify(heap)
        chosen = []
        while heap and len(chosen) < P:
            negq, path = heapq.heappop(heap)
            chosen.append(path)
            if len(path) < max_depth:
                for t in range(len(Q)):
                    if Q[path[-1], t] > 0:
                        heapq.heappush(heap, (negq * Q[path[-1], t], path + (t,)))
        return chosen

    got = greedy_tree_rounds(ChainModel(draft), texts, CAPACITIES, SamplingConfig(0.0))
    for j, P in enumerate(CAPACITIES):
        rounds = tokens = whole = 0
        for prompt, text in texts:
            pos = 0
            while pos < len(text):
                last = (prompt + text[:pos])[-1]
                paths = set(top_tree(last, P, len(text) - pos))
                accepted = 0
                while accepted < len(text) - pos and tuple(text[pos:pos + accepted + 1]) in paths:
                    accepted += 1
                whole += accepted == max(len(path) for path in paths)      # ended at the deepest level
                pos, rounds = pos + accepted + 1, rounds + 1
            tokens += len(text)
        assert got.values[j] == pytest.approx(tokens / rounds - 1.0, abs=1e-12)
        assert got.whole[j] == pytest.approx(whole / rounds, abs=1e-12)
        reads = got.reads[j]
        assert reads[1] >= 1.0                                   # the root read, every round
        if P == 1:                                               # a chain: one token per read
            assert reads.sum() == pytest.approx(reads[1])
    assert got.values[0] < got.values[-1]                        # more nodes, more accepted (this pair)


def test_chain_verification_values_match_the_exact_means():
    """One sampled chain per context, scored exactly under token-wise and block verification: over
    1500 contexts (one stream each) the means must match the exact enumeration of theory/verification
    within 4 standard errors (SE = per-context SD / sqrt(1500), ~0.025 here), γ = 1 must give the two
    rules equal values chain by chain, and block's mean must be told apart from token-wise's exact value
    (+30% on this pair): the check has the power to see a scorer that ignored the block rule."""
    from specbound.measure.drafter_values import chain_verification_values
    from specbound.theory.verification import expected_accepted

    target, draft = chain_pair(2, 5, concentration=0.5, noise=0.8)
    got = chain_verification_values(ChainModel(target), ChainModel(draft), [[0]] * 1500, (1, 4),
                                    SamplingConfig(1.0), seed=3)
    exact = {(g, rule): expected_accepted(target=target, draft=draft, gamma=g, verification=rule, start=0)
             for g in (1, 4) for rule in ("token", "block")}
    assert got.token[0] == pytest.approx(got.block[0], abs=1e-12)
    for j, g in enumerate(got.gammas):
        assert abs(got.token[j] - exact[g, "token"]) <= 4 * got.token_se[j]
        assert abs(got.block[j] - exact[g, "block"]) <= 4 * got.block_se[j]
    assert got.block_se[1] < 0.04 and abs(got.block[1] - exact[4, "token"]) > 4 * got.block_se[1]


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


def _random_effects(seed, clusters, sigma_b2, sigma_w2):
    """Values y = a_c + e with a_c ~ N(0, σ_b²) per cluster and e ~ N(0, σ_w²); 1–3 values per cluster."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 4, size=clusters)
    labels = np.repeat(np.arange(clusters), sizes)
    y = rng.normal(0, np.sqrt(sigma_b2), clusters)[labels] + rng.normal(0, np.sqrt(sigma_w2), labels.size)
    return y, labels.tolist(), sizes


def test_variance_split_recovers_between_and_within_variances():
    """One-way random effects, 2000 clusters of 1–3 values (≈ 4000 values), σ_b² = 4, σ_w² = 9.
    Standard errors of the estimators (normal theory): Var(σ̂_w²) = 2σ_w⁴/(N − k) → SE ≈ 0.40 with
    N − k ≈ 2000; Var(σ̂_b²) ≈ 2(σ_b² + σ_w²/n₀)²/(k − 1) with n₀ ≈ 2 → SE ≈ 0.54. Tolerance 4 SE.
    A split that ignores the clusters (all variance "within") must fail the same check."""
    from specbound.measure.stats import variance_split

    y, labels, _ = _random_effects(7, 2000, 4.0, 9.0)
    sb2, sw2 = variance_split(y, labels)
    assert abs(sw2 - 9.0) <= 4 * 0.40
    assert abs(sb2 - 4.0) <= 4 * 0.54
    pooled = float(np.var(y, ddof=1))             # the mutant: every value its own cluster, no between part
    assert abs(pooled - 9.0) > 4 * 0.40
    # a design where every cluster holds one value cannot separate the two: σ_w² undefined
    sb2_1, sw2_1 = variance_split([1.0, 2.0, 4.0], [0, 1, 2])
    assert np.isnan(sw2_1) and np.isnan(sb2_1)
    with pytest.raises(ValueError, match="cluster labels"):
        variance_split([1.0, 2.0], [0])


def test_variance_split_predicts_the_cluster_robust_se():
    """σ_b² Σmᵢ²/N² + σ_w²/N (the variance of the size-weighted mean of clusters of mᵢ values, N = Σmᵢ)
    from the split equals the squared cluster-robust SE of the mean within 20% on 400 clusters (the SE
    of an SE² estimate with 400 clusters is ≈ √(2/400) = 7%: 20% ≈ 3 SE)."""
    from specbound.measure.stats import cluster_mean_se, variance_split

    y, labels, sizes = _random_effects(11, 400, 4.0, 9.0)
    sb2, sw2 = variance_split(y, labels)
    N = float(sizes.sum())
    predicted = sb2 * float((sizes ** 2).sum()) / N ** 2 + sw2 / N
    se = cluster_mean_se(y, labels)[1]
    assert abs(predicted / se ** 2 - 1) < 0.20
