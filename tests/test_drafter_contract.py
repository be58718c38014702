"""The drafter contract: what a round produces travels in the tree and its feedback.

A drafter keeps no per-round state between ``propose`` and ``observe``: its per-node knowledge
(``scores``, ``confidences``, ``cache_nodes``) rides on the DraftTree; ``abandon`` drops an unverified
proposal; a round ends in one of three :class:`RoundEnd` values; the target pass is a
:class:`TargetPass`; every option has one check, shared by :class:`DraftSpec` and the builders.
"""
from __future__ import annotations

import json

import pytest
import torch

from helpers import chain_models
from specbound.decoding import SamplingConfig, speculative_decode
from specbound.decoding.drafters import (
    BatchDrafter, ChainDrafter, DynamicTreeDrafter, RoundFeedback, SampledTreeDrafter, ShapeDrafter,
    make_tree_drafter,
)
from specbound.decoding.engine import DraftSpec, PlainDrafter, Speculator, make_generator
from specbound.decoding.policy import DraftBudget
from specbound.decoding.tree import DraftTree
from specbound.decoding.verify import RoundEnd, verify
from specbound.errors import SpecboundError


def _drafters(draft, sampling):
    return [ChainDrafter(draft, sampling, 3), DynamicTreeDrafter(draft, sampling, 6),
            SampledTreeDrafter(draft, sampling, 6), BatchDrafter(draft, sampling, 2, 3)] + \
        ([] if sampling.greedy else [_rotating_shapes(draft, sampling)])


def _rotating_shapes(draft, sampling):
    """shape="auto" (T > 0: at T = 0 it is the chain of γ = auto) with its choice frozen at its sampled
    tree, so that a second proposal after abandon() drafts the same shape from the same state."""
    drafter = ShapeDrafter(draft, sampling)
    name = list(drafter.shapes)[-1]
    drafter.choice.choose = lambda: name
    return drafter


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_abandon_leaves_only_the_committed_chain(temperature):
    target, draft = chain_models(3, states=5)
    committed = [0, 1, 2, 3]
    for drafter in _drafters(draft, SamplingConfig(temperature)):
        drafter.start(target, committed)
        draft.crop(0)
        tree = drafter.propose(committed, 4, make_generator(0))
        assert len(tree) > 0
        assert draft.cache_length > len(committed)          # the proposal sits in the draft cache
        drafter.abandon()
        assert draft.cache_length == len(committed), drafter.describe()
        again = drafter.propose(committed, 4, make_generator(0))  # same state, same proposal
        assert again.tokens.tolist() == tree.tokens.tolist(), drafter.describe()
        drafter.abandon()


def test_dynamic_tree_carries_scores_confidences_and_cache_ids():
    target, draft = chain_models(5, states=6)
    committed = [1, 2, 3]
    drafter = DynamicTreeDrafter(draft, SamplingConfig(1.0), 8)
    drafter.start(target, committed)
    tree = drafter.propose(committed, 5, make_generator(0))
    n = len(tree)
    assert n == 8 and tree.scores is not None and tree.confidences is not None and len(tree.cache_nodes) == n
    # scores are draft path probabilities: the product of the confidences along the path (temperature 1)
    for i in range(n):
        product = torch.prod(tree.confidences[tree.path_to(i)])
        assert float(tree.scores[i]) == pytest.approx(float(product), rel=1e-12)
    # independently: path probabilities from the draft chain's own transition matrix
    law = draft.chain.transitions
    for i in range(n):
        prev, p = committed[-1], 1.0
        for node in tree.path_to(i):
            tok = int(tree.tokens[node])
            p *= float(law[prev, tok])
            prev = tok
        assert float(tree.scores[i]) == pytest.approx(p, rel=1e-9)


def test_observe_reads_the_tree_not_the_drafter():
    """Two proposals outstanding from two drafters on one draft model would clash in the cache, but the
    feedback alone must be enough: observe with a tree built by ANOTHER instance of the same drafter
    keeps the same cache path as the proposing instance would."""
    target, draft = chain_models(7, states=6)
    committed = [2, 0, 1]
    sampling = SamplingConfig(1.0)
    first = DynamicTreeDrafter(draft, sampling, 6)
    first.start(target, committed)
    tree = first.propose(committed, 4, make_generator(1))
    slots = dict(first.cache.slot)
    second = DynamicTreeDrafter(draft, sampling, 6)
    second.cache.slot, second.cache.root_slot = slots, first.cache.root_slot
    probs = torch.ones(len(tree) + 1, 6, dtype=torch.float64) / 6
    verdict = verify(tree, probs, generator=make_generator(0))
    path = tree.cache_path(verdict.path)
    kept = [slots[node] for node in path]
    second.observe(RoundFeedback(tree, verdict, 0.0, 0.0, len(tree) + 1))
    assert draft.committed_length == first.cache.root_slot + 1 + len(kept)


def test_tree_checks_per_node_fields():
    with pytest.raises(SpecboundError, match="3 nodes but 2 scores"):
        DraftTree([1, 2, 3], [-1, 0, 1], scores=[0.5, 0.25])
    with pytest.raises(SpecboundError, match="3 nodes but 1 confidences"):
        DraftTree.chain([1, 2, 3], confidences=[0.5])
    with pytest.raises(SpecboundError, match="2 nodes but 3 cache_nodes"):
        DraftTree([1, 2], [-1, -1], cache_nodes=[4, 5, 6])
    tree = DraftTree([1, 2], [-1, 0], cache_nodes=[7, 9])
    assert tree.cache_path([0, 1]) == [7, 9]
    assert DraftTree([1, 2], [-1, 0]).cache_path([0, 1]) == [0, 1]


def test_round_ends_are_an_enum_that_reads_as_its_word():
    target, draft = chain_models(11, states=5)
    out = speculative_decode(target, draft, [0, 1], 40, gamma=3, seed=0)
    ends = {r.ended for r in out.rounds}
    assert ends <= set(RoundEnd) and RoundEnd.RECOVERED in ends
    assert all(isinstance(r.ended, RoundEnd) for r in out.rounds)
    assert json.loads(json.dumps([r.ended for r in out.rounds])) == [str(r.ended.value) for r in out.rounds]
    assert out.metrics.rejections == sum(r.ended is RoundEnd.RECOVERED for r in out.rounds)
    # the last round of a budget that ends inside a drafted chain ends at the budget or with a token
    assert out.rounds[-1].ended in (RoundEnd.BUDGET, RoundEnd.BONUS, RoundEnd.RECOVERED)


def test_target_pass_reads_pending_and_tree_in_one_pass():
    target, draft = chain_models(13, states=5)
    prompt = [0, 1, 2]
    engine = Speculator(target, PlainDrafter(SamplingConfig(1.0)))
    target.prefill(prompt[:-1])
    tree = DraftTree([3, 4, 1], [-1, 0, -1])
    scored = engine.score(prompt, tree, remaining=2)      # the depth-2 node lies past the budget: not read
    assert scored.base == 2 and scored.pending == 1 and scored.tokens_read == 1 + 2
    assert scored.slots == [3, -1, 4]
    assert scored.law_mask.tolist() == [True, True, False, True]
    law = target.chain.transitions
    for row, state in [(0, 2), (1, 3), (3, 1)]:          # root after token 2; after node 0 (3); after node 2 (1)
        assert torch.allclose(scored.target_probs[row].double(), torch.as_tensor(law[state]).double())


@pytest.mark.parametrize("kwargs, message", [
    (dict(tree=4, tree_drafter="bogus"), "tree_drafter must be one of"),
    (dict(tree="auto", tree_drafter="sampled"), "tree='auto' sizes the dynamic tree drafter"),
    (dict(tree=0), "tree"),
])
def test_one_check_per_option_in_spec_and_builder(kwargs, message):
    target, draft = chain_models(1, states=4)
    with pytest.raises(SpecboundError, match=message) as from_spec:
        DraftSpec(**kwargs)
    with pytest.raises(SpecboundError, match=message) as from_builder:
        make_tree_drafter(kwargs.get("tree_drafter", "dynamic"), target, draft, SamplingConfig(1.0), kwargs["tree"])
    assert str(from_spec.value) == str(from_builder.value)


def test_batch_gamma_one_check():
    target, draft = chain_models(1, states=4)
    with pytest.raises(SpecboundError) as from_spec:
        DraftSpec(gamma="auto", drafts=2)
    with pytest.raises(SpecboundError) as from_builder:
        BatchDrafter(draft, SamplingConfig(1.0), 2, "auto")
    assert str(from_spec.value) == str(from_builder.value)
    assert "for batch SD" in str(from_spec.value)


def test_chain_confidences_ride_on_the_tree_only_when_sizing():
    target, draft = chain_models(17, states=5)
    committed = [0, 1]
    fixed = ChainDrafter(draft, SamplingConfig(1.0), 3)
    fixed.start(target, committed)
    assert fixed.propose(committed, 3, make_generator(0)).confidences is None
    fixed.abandon()
    draft.crop(0)
    from specbound.decoding.costs import CostMeasurement, CostModel, CostProfile

    ks = (1, 2, 4, 8)
    costs = CostModel(CostMeasurement(CostProfile(ks, (1.0,) * 4), CostProfile(ks, (0.001,) * 4)))
    sized = ChainDrafter(draft, SamplingConfig(1.0), DraftBudget(costs))
    sized.start(target, committed)
    tree = sized.propose(committed, 6, make_generator(0))
    assert len(tree) >= 1 and tree.confidences is not None
    law = draft.chain.transitions
    prev = committed[-1]
    for j, tok in enumerate(tree.tokens.tolist()):        # the draft's probability of each drafted token
        assert float(tree.confidences[j]) == pytest.approx(float(law[prev, tok]), rel=1e-9)
        prev = tok
