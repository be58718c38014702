"""One argument order in specbound.theory: target first, then draft, keyword-only.

Target and draft share a type and a shape, so a positional swap would give silently wrong numbers.
Every public function taking both must refuse positional calls (TypeError), and a signature scan
catches any future function that takes them positionally.
"""
import inspect

import numpy as np
import pytest

import specbound.theory as theory
from specbound.theory import MarkovChain

TARGET = MarkovChain.random(3, horizon=4, seed=1)
DRAFT = TARGET.perturbed(0.5, seed=2)
T_ROW = TARGET.transitions[0, 0]
D_ROW = DRAFT.transitions[0, 0]
ACCEPT = np.full(3, 0.5)


def _pair_params(func):
    """(target-like, draft-like) parameters of ``func``: names starting with target / draft (and output_law's
    draft/resample pair, two laws of the same shape)."""
    params = inspect.signature(func).parameters
    targets = [p for name, p in params.items() if name.startswith("target") or name == "resample"]
    drafts = [p for name, p in params.items() if name.startswith("draft") and name != "drafts"]
    return targets, drafts


def _public_functions():
    seen = {}
    modules = [theory] + [getattr(theory, m) for m in ("rejections", "tradeoff", "distributions", "chains",
                                                       "bounds", "trees", "speedup")]
    for module in modules:
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                seen[name] = obj
    return seen


PAIR_FUNCTIONS = {name: f for name, f in _public_functions().items() if all(_pair_params(f))}


def test_the_scan_finds_the_known_pair_functions():
    # guards the scan itself: if it found nothing, the next test could not fail
    expected = {"expected_rejections", "expected_target_calls", "batch_expected_rejections",
                "batch_expected_target_calls", "residual", "optimal_residual", "over_acceptance",
                "uniform_all_reject", "bernoulli_all_reject", "output_law", "pareto_front"}
    assert expected <= set(PAIR_FUNCTIONS), expected - set(PAIR_FUNCTIONS)


@pytest.mark.parametrize("name", sorted(PAIR_FUNCTIONS))
def test_target_and_draft_are_keyword_only_target_first(name):
    targets, drafts = _pair_params(PAIR_FUNCTIONS[name])
    for param in targets + drafts:
        assert param.kind is inspect.Parameter.KEYWORD_ONLY, (name, param.name)
    order = list(inspect.signature(PAIR_FUNCTIONS[name]).parameters)
    target_names = [p.name for p in targets if p.name.startswith("target")]
    if target_names:                    # output_law has a draft and a resampling law but no target
        assert order.index(target_names[0]) < order.index(drafts[0].name), (name, order)


def test_no_bare_p_or_q_parameters():
    for name, func in _public_functions().items():
        assert not {"p", "q"} & set(inspect.signature(func).parameters), name


# Every public pair function called positionally with otherwise valid arguments (target first): each
# must raise TypeError. The keyword call next to it must work, so the TypeError is about the positional
# call and not about the arguments.
CALLS = {
    "standard_acceptance": ((T_ROW, D_ROW), {}),
    "rejections_per_position": ((TARGET, DRAFT, 4), {}),
    "expected_rejections": ((TARGET, DRAFT, 4), {}),
    "expected_target_calls": ((TARGET, DRAFT, 4), {}),
    "check_rejection_based": ((T_ROW, D_ROW, np.zeros(3)), {}),
    "rejection_based_output": ((T_ROW, D_ROW, np.zeros(3)), {}),
    "rejection_based_expected_rejections": ((TARGET, DRAFT, np.zeros((3, 3)), 4), {}),
    "random_rejection_based_acceptance": ((TARGET, DRAFT, 4), {}),
    "residual_chain": ((T_ROW, D_ROW, 2), {}),
    "batch_rejections_per_position": ((TARGET, DRAFT, 4, 2), {}),
    "batch_expected_rejections": ((TARGET, DRAFT, 4, 2), {}),
    "batch_expected_target_calls": ((TARGET, DRAFT, 4, 2), {}),
    "batch_improvement": ((TARGET, DRAFT, 4, 2), {}),
    "batch_rejections_limit": ((TARGET, DRAFT, 4), {}),
    "batch_target_calls_limit": ((TARGET, DRAFT, 4), {}),
    "batch_round_starts": ((TARGET, DRAFT, 4, 2), {}),
    "bernoulli_all_reject": ((0.6, 0.2, 2), {}),
    "bernoulli_batch_improvement": ((0.6, 0.2, 2), {}),
    "uniform_all_reject": ((3, 10, 2), {}),
    "uniform_batch_improvement": ((3, 10, 2), {}),
    "simulate_batch_rejections": ((TARGET, DRAFT, 4, 2), {"n_runs": 5, "seed": 0}),
    "residual": ((T_ROW, D_ROW), {}),
    "over_acceptance": ((T_ROW, D_ROW, 0.1), {}),
    "optimal_residual": ((T_ROW, D_ROW, ACCEPT), {}),
    "minimal_bias": ((T_ROW, D_ROW, ACCEPT), {}),
    "tradeoff_point": ((T_ROW, D_ROW, ACCEPT), {}),
    "tv_loss": ((T_ROW, D_ROW, ACCEPT), {}),
    "uno_bias": ((T_ROW, D_ROW, ACCEPT), {}),
    "lp_minimal_bias": ((T_ROW, D_ROW, ACCEPT), {}),
    "pareto_front": ((T_ROW, D_ROW, [0.0, 0.1]), {}),
    "output_law": ((D_ROW, ACCEPT, T_ROW), {}),
    "block_weights": ((np.stack([T_ROW, T_ROW]), np.stack([D_ROW]), np.array([0])), {}),
    "block_stop_probabilities": ((np.stack([T_ROW, T_ROW]), np.stack([D_ROW]), np.array([0])), {}),
    "block_accepted_by_length": ((np.stack([T_ROW, T_ROW]), np.stack([D_ROW]), np.array([0])), {}),
    "token_stop_probabilities": ((np.stack([T_ROW, T_ROW]), np.stack([D_ROW]), np.array([0])), {}),
    "block_residual": ((T_ROW, D_ROW, 0.5), {}),
    "expected_accepted": ((TARGET, DRAFT, 2), {}),
    "sampled_tree_value": ((np.array([-1]), np.array([0]), np.stack([T_ROW, T_ROW]), np.stack([D_ROW, D_ROW])), {}),
}


def test_every_pair_function_has_a_positional_call_case():
    assert set(CALLS) == set(PAIR_FUNCTIONS), set(CALLS) ^ set(PAIR_FUNCTIONS)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_positional_call_is_a_type_error(name):
    func = PAIR_FUNCTIONS[name]
    args, extra = CALLS[name]
    with pytest.raises(TypeError, match="positional"):
        func(*args, **extra)
    keywords = dict(zip(inspect.signature(func).parameters, args))
    func(**keywords, **extra)          # the same arguments by keyword are fine


def test_symmetric_tv_and_overlap_stay_positional():
    assert theory.tv(T_ROW, D_ROW) == pytest.approx(theory.tv(D_ROW, T_ROW))
    assert theory.overlap(T_ROW, D_ROW) == pytest.approx(1 - theory.tv(T_ROW, D_ROW))
