"""theory.sampled_tree_value: the exact expected accepted drafted tokens of a sampled draft tree under
recursive rejection (design B), given the drafted tree — checked against the engine's accepted counts
on exact Markov chains (the coins integrated out: the mean difference per round is within 4 standard
errors, while a value that forgets the residual update is far outside), against the product rule on
chains exactly, and its bad input refused."""
import numpy as np
import pytest

from helpers import processed_chain
from specbound.decoding import SamplingConfig, speculative_decode
from specbound.decoding.drafters.batch import BatchDrafter
from specbound.decoding.drafters.trees import SampledTreeDrafter
from specbound.errors import SpecboundError
from specbound.models import ChainModel
from specbound.theory import MarkovChain, sampled_tree_value


def _rows(tree, start, chain):
    """Rows [n+1, V] of a homogeneous chain at the root (after ``start``) and after every node."""
    return np.stack([chain.transitions[start]] + [chain.transitions[t] for t in tree.tokens.tolist()])


def _naive_value(parents, tokens, target, draft):
    """A plausible bug: every sibling tested against the target itself (no residual after a rejection)."""
    n = len(tokens)
    value = np.zeros(n + 1)
    children = [[] for _ in range(n + 1)]
    for i, p in enumerate(parents):
        children[p + 1].append(i)
    for u in range(n - 1, -2, -1):
        reach, v = 1.0, 0.0
        for kid in children[u + 1]:
            x = tokens[kid]
            a = min(1.0, target[u + 1, x] / draft[u + 1, x])
            v += reach * a * (1 + value[kid + 1])
            reach *= 1 - a
        value[u + 1] = v
    return value[0]


@pytest.mark.montecarlo
@pytest.mark.parametrize("shape", ["tree", "drafts"])
def test_engine_accepted_matches_the_exact_value_of_each_drafted_tree(monkeypatch, shape):
    target = MarkovChain.random(5, concentration=0.6, seed=41)
    draft = target.perturbed(0.5, seed=42)
    config = SamplingConfig(1.0, top_k=4)
    pt, pd = processed_chain(target, config), processed_chain(draft, config)
    drafter = SampledTreeDrafter if shape == "tree" else BatchDrafter
    trees = []
    propose = drafter.propose

    def recording(self, committed, max_depth, generator):
        tree = propose(self, committed, max_depth, generator)
        trees.append(tree)
        return tree

    monkeypatch.setattr(drafter, "propose", recording)
    kw = dict(tree=6, tree_drafter="sampled") if shape == "tree" else dict(drafts=3, gamma=2)
    start, diffs, naive = 1, [], []
    for seed in range(3000):
        trees.clear()
        out = speculative_decode(ChainModel(target), ChainModel(draft), [start], 8, temperature=1.0, top_k=4,
                                 seed=seed, **kw)
        tree = trees[0]
        parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
        t_rows, d_rows = _rows(tree, start, pt), _rows(tree, start, pd)
        exact = sampled_tree_value(parents=parents, tokens=tokens, target=t_rows, draft=d_rows)
        accepted = out.metrics.accepted_per_step[0]
        diffs.append(accepted - exact)
        naive.append(accepted - _naive_value(parents, tokens, t_rows, d_rows))
    diffs, naive = np.array(diffs), np.array(naive)
    se = diffs.std(ddof=1) / np.sqrt(len(diffs))           # the coins' noise around the exact value
    assert abs(diffs.mean()) <= 4 * se, (diffs.mean(), se)
    assert abs(naive.mean()) > 4 * se, (naive.mean(), se)   # the test has power against the residual bug


def test_a_chain_is_the_product_rule_and_one_level_is_one_minus_all_rejected():
    rng = np.random.default_rng(3)
    target, draft = rng.dirichlet(np.ones(6), size=4), rng.dirichlet(np.ones(6), size=4)
    tokens = [2, 0, 5]
    b = [min(1.0, target[i, x] / draft[i, x]) for i, x in enumerate(tokens)]
    expected = b[0] + b[0] * b[1] + b[0] * b[1] * b[2]
    got = sampled_tree_value(parents=[-1, 0, 1], tokens=tokens, target=target, draft=draft)
    assert got == pytest.approx(expected, rel=1e-12)
    # three siblings at the root, nothing below: the probability that one of them is accepted
    from specbound.theory import residual_chain

    sib = [1, 1, 4]
    r, _ = residual_chain(target=target[0], draft=draft[0], drafts=3)
    a = [min(1.0, r[j, x] / draft[0, x]) for j, x in enumerate(sib)]
    one_accepted = 1 - np.prod([1 - x for x in a])
    got = sampled_tree_value(parents=[-1, -1, -1], tokens=sib, target=target, draft=draft)
    assert got == pytest.approx(one_accepted, rel=1e-12)


def test_bad_input():
    laws = np.full((3, 4), 0.25)
    with pytest.raises(SpecboundError, match="n nodes needs"):
        sampled_tree_value(parents=[-1], tokens=[0, 1], target=laws, draft=laws)
    with pytest.raises(SpecboundError, match="parents must come before"):
        sampled_tree_value(parents=[1, -1], tokens=[0, 1], target=laws, draft=laws)


@pytest.mark.montecarlo
def test_measured_shape_values_are_the_engines_expected_accepted_tokens():
    """measure.sampled_shape_values (what advise prices at T > 0) drafts with the engine's own drafters
    and scores each tree exactly: over many draws at one context its mean equals the engine's mean
    accepted tokens in a first round from that context, within 4 standard errors (both sides' noise)."""
    from specbound.measure.drafter_values import SampledShape, sampled_shape_values

    target = MarkovChain.random(5, concentration=0.6, seed=43)
    draft = target.perturbed(0.5, seed=44)
    tm, dm = ChainModel(target), ChainModel(draft)
    config = SamplingConfig(1.0)
    shapes = [SampledShape("sampled", 6), SampledShape("drafts", 2, 3)]
    draws = 800
    measured = sampled_shape_values(tm, dm, [[2]] * draws, shapes, config, seed=5)
    for j, (shape, kw) in enumerate(zip(shapes, [dict(tree=6, tree_drafter="sampled"), dict(drafts=2, gamma=3)])):
        runs = np.array([speculative_decode(tm, dm, [2], 8, temperature=1.0, seed=s, **kw).metrics.accepted_per_step[0]
                         for s in range(2000)])
        se = np.hypot(runs.std(ddof=1) / np.sqrt(len(runs)), measured.se[j])
        assert abs(runs.mean() - measured.values[j]) <= 4 * se, (shape, runs.mean(), measured.values[j], se)
        assert measured.nodes[j] == 6                       # P = 6 nodes; 2 drafts × 3 tokens


def test_float32_laws_that_sum_to_one_within_rounding_are_accepted():
    """Real models' laws come in float32 (sums 1 ± 1e-6): the value is computed on them, renormalised."""
    rng = np.random.default_rng(8)
    laws = rng.dirichlet(np.ones(50), size=3).astype(np.float32).astype(np.float64)
    laws[:, 0] += 2e-6                                      # as a float32 softmax's row can be off
    exact = sampled_tree_value(parents=[-1, -1], tokens=[3, 7], target=laws / laws.sum(1, keepdims=True),
                               draft=laws[::-1] / laws[::-1].sum(1, keepdims=True))
    assert sampled_tree_value(parents=[-1, -1], tokens=[3, 7], target=laws, draft=laws[::-1]) == \
        pytest.approx(exact, rel=1e-9)
