"""Exact E[target calls] when drafting to the horizon, against the real decoding engine (Monte Carlo).

Alg. 1 (Yin et al. 2024, Thm 1): E[calls] = E[N_rej] + 1 − P(R_T = 1); batch design B (Thm 3 f-recursion):
the same identity with the batch per-position rejection probabilities; design A (derived variant) too.
The engine is `speculative_decode(..., gamma=None, drafts=M)` on ChainModels; x_0 ~ the target's initial law.
"""
import numpy as np
import pytest

from specbound.decoding import speculative_decode
from specbound.models import ChainModel
from specbound.theory import (
    MarkovChain, batch_expected_target_calls, batch_rejections_per_position, expected_target_calls,
)

HORIZON = 6
TARGET = MarkovChain.random(4, horizon=HORIZON, concentration=1.0, seed=8)
DRAFT = TARGET.perturbed(0.7, seed=1008)


@pytest.mark.montecarlo
@pytest.mark.parametrize("drafts, design, runs", [(1, "B", 3000), (2, "B", 3000), (4, "B", 3000), (3, "A", 2000)])
def test_expected_target_calls_match_engine_monte_carlo(drafts, design, runs):
    target_model, draft_model = ChainModel(TARGET), ChainModel(DRAFT)
    initial = TARGET.sample(0, size=runs, seed=100 + drafts)[:, 0]             # x_0 ~ initial law
    calls = np.empty(runs)
    rejections = np.empty(runs)
    for i in range(runs):
        result = speculative_decode(target_model, draft_model, [int(initial[i])], HORIZON, gamma=None,
                                    drafts=drafts, design=design, seed=50_000 * drafts + i)
        calls[i] = result.metrics.target_calls
        rejections[i] = result.metrics.rejections
    kw = dict(target=TARGET, draft=DRAFT, horizon=HORIZON)
    exact = batch_expected_target_calls(**kw, drafts=drafts, design=design)
    if drafts == 1:
        assert exact == pytest.approx(expected_target_calls(**kw), abs=1e-12)
    # SE = sample std / √runs of the per-run call count; std ≈ 1.0 here, so SE ≈ 0.018 (3000 runs) / 0.022 (2000)
    se = calls.std(ddof=1) / np.sqrt(runs)
    assert 0.005 < se < 0.04, se
    assert abs(calls.mean() - exact) <= 4 * se, (calls.mean(), exact, se)          # 4 standard errors
    # power: the exact value is far (> 4 SE) from both naive answers E[N_rej] and E[N_rej] + 1
    per_position = batch_rejections_per_position(**kw, drafts=drafts, design=design)
    assert abs(exact - per_position.sum()) > 4 * se and abs(exact - per_position.sum() - 1) > 4 * se
    # the engine's rejection count itself agrees with the exact E[N_rej] (Thm 1 / Thm 3)
    se_rej = rejections.std(ddof=1) / np.sqrt(runs)
    assert abs(rejections.mean() - per_position.sum()) <= 4 * se_rej
