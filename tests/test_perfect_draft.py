"""The perfect-draft bound where users meet it: ``decoding.costs.perfect_draft_speedup`` on a pair's cost
model (by hand, with drafted tokens priced by source), and the line ``specbound generate`` prints from the
curves its run sized drafts with."""
import json

import numpy as np
import pytest

from helpers import CharTokenizer, tiny_pair
from specbound.decoding.costs import CostMeasurement, CostModel, perfect_draft_speedup
from specbound.errors import SpecboundError
from specbound.models.static import StaticCacheHFModel
from specbound.theory.speedup import CostProfile


def test_perfect_draft_speedup_by_hand():
    # t(k) = 40 ms to 4 tokens, then +40 ms per token; d(1) = 10 ms. Speed-up over t(1) per token, γ + 1 tokens:
    # γ = 1: 2·40/50 = 1.60, γ = 2: 3·40/60 = 2.00, γ = 3: 4·40/70 = 2.29, γ = 4: 5·40/(40 + 80) = 1.67
    costs = CostModel(CostMeasurement(CostProfile((1, 4, 5, 64), (0.040, 0.040, 0.080, 2.440)),
                                      CostProfile((1, 64), (0.010, 0.640))))
    gamma, speedup = perfect_draft_speedup(costs)
    assert gamma == 3 and speedup == pytest.approx(160 / 70)
    # the run's own timings move the bound: passes observed at twice the prior's cost shift t(k) up
    for _ in range(5):
        costs.observe_target(4, 0.080)
    gamma, speedup = perfect_draft_speedup(costs)
    assert gamma == 3 and speedup == pytest.approx(4 * 0.080 / (3 * 0.010 + 0.080))
    # a draft as slow as the target never pays, even when it is never wrong
    slow = CostModel(CostMeasurement(CostProfile((1, 64), (0.040, 2.560)), CostProfile((1, 64), (0.040, 2.560))))
    assert perfect_draft_speedup(slow) == (0, pytest.approx(1.0))


@pytest.fixture(scope="module")
def tiny_models():
    modules = tiny_pair(0, noise=0.3, draft_seed=1)
    return (StaticCacheHFModel(modules[0], CharTokenizer(), name="tiny-target"),
            StaticCacheHFModel(modules[1], CharTokenizer(), name="tiny-draft"))


@pytest.mark.parametrize("gamma, shown", [(None, True), ("2", False)])
def test_generate_reports_the_perfect_draft_of_a_sized_run(tiny_models, monkeypatch, tmp_path, capsys, gamma, shown):
    from specbound.cli import main
    from specbound.models import loading

    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path))           # the calibration is written there
    monkeypatch.setattr(loading, "load_pair", lambda *a, **k: tiny_models)
    argv = ["generate", "--prompt-set", "builtin", "--index", "0", "--max-new-tokens", "12", "--threads", "1",
            "--baseline", "--target-precision", "int8"] + (["--gamma", gamma] if gamma else [])
    assert main(argv + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert ("perfect_draft" in report) == shown                    # fixed γ never calibrates: nothing to price
    if shown:
        p = report["perfect_draft"]
        assert p["gamma"] >= 0 and p["speedup"] >= 1.0
        assert (p["gamma"] == 0) == (p["speedup"] == pytest.approx(1.0))
    monkeypatch.setattr(loading, "load_pair", lambda *a, **k: tiny_models)
    assert main(argv + ["--quiet"]) == 0
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert ("most a draft of this cost could give" in text) == shown


def test_drafted_tokens_are_priced_by_their_source():
    """Half the drafted tokens from the context: each chain costs half the draft reads. t(k) = 40 ms to
    4 tokens, +40 ms per token, d(1) = 10 ms: γ = 3 gives 4·40 / (3·5 + 40) = 2.91× (all from the model:
    160 / 70 = 2.29×); every token from the context: 160 / 40 = 4.00× at γ = 3 (t(5) = 80 ms past it)."""
    from specbound.theory.speedup import priced_draft_seconds

    np.testing.assert_allclose(priced_draft_seconds(0.010, 3, 0.5), [0.005, 0.010, 0.015])
    costs = CostModel(CostMeasurement(CostProfile((1, 4, 5, 64), (0.040, 0.040, 0.080, 2.440)),
                                      CostProfile((1, 64), (0.010, 0.640))))
    assert perfect_draft_speedup(costs, context_share=0.0) == (3, pytest.approx(160 / 70))
    assert perfect_draft_speedup(costs, context_share=0.5) == (3, pytest.approx(160 / 55))
    assert perfect_draft_speedup(costs, context_share=1.0) == (3, pytest.approx(4.0))
    with pytest.raises(SpecboundError, match="context_share"):
        priced_draft_seconds(0.010, 3, 1.5)


def test_metrics_count_the_tokens_drafted_from_the_context():
    from helpers import chain_models
    from specbound.decoding import speculative_decode

    target, _ = chain_models(0, states=6)
    out = speculative_decode(target, None, [1, 2, 3, 4, 1, 2, 3, 4, 1, 2], 30, temperature=0.0)
    m = out.metrics
    assert m.context_drafted == sum(m.drafted_per_step) > 0 and m.context_share == 1.0
    assert m.context_accepted == sum(m.accepted_per_step)
