"""The thin CLI: `specbound theory` prints Thm 1 / Thm 3 / Prop. 1, target calls and the speed-up."""
import json
import tracemalloc

import pytest

from specbound.cli import main
from specbound.cli.theory import theory_memory_bytes
from specbound.theory import (
    MarkovChain, batch_expected_rejections, batch_expected_target_calls, batch_target_calls_limit,
    expected_rejections, expected_target_calls,
)


def test_theory_json_matches_library(capsys):
    assert main(["theory", "--states", "5", "--horizon", "20", "--seed", "3", "--drafts", "1,4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    target = MarkovChain.random(5, horizon=20, concentration=0.5, seed=3)
    draft = target.perturbed(0.5, seed=4)
    pair = dict(target=target, draft=draft, horizon=20)
    sd, batch = out["rows"]
    assert sd["expected_rejections"] == pytest.approx(expected_rejections(**pair))
    assert sd["expected_target_calls"] == pytest.approx(expected_target_calls(**pair))
    assert sd["speedup"] == pytest.approx(20 / expected_target_calls(**pair))      # T / E[calls]
    assert sd["paper_speedup_T_over_rejections"] == pytest.approx(20 / expected_rejections(**pair))
    assert "Thm 1" in sd["formula"]
    assert batch["expected_rejections"] == pytest.approx(batch_expected_rejections(**pair, drafts=4))
    assert batch["expected_target_calls"] == pytest.approx(batch_expected_target_calls(**pair, drafts=4))
    assert "Thm 3" in batch["formula"] and "design B" in batch["formula"]
    assert batch["expected_rejections"] < sd["expected_rejections"]          # batch drafting helps (Thm 3)
    limit = out["batch_limit"]
    assert limit["expected_target_calls"] == pytest.approx(batch_target_calls_limit(**pair))
    assert limit["expected_rejections"] <= batch["expected_rejections"]
    assert "Prop. 1" in limit["formula"] and "design B" in limit["formula"]
    assert "T / E[target calls]" in out["speedup_formula"]


def test_identical_chains_speed_up_is_the_horizon_not_infinite(capsys):
    # --draft-noise 0: the draft is the target, one round accepts all T tokens
    assert main(["theory", "--horizon", "12", "--draft-noise", "0", "--drafts", "1,3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for r in out["rows"] + [out["batch_limit"]]:
        assert r["expected_rejections"] == pytest.approx(0.0, abs=1e-12)
        assert r["expected_target_calls"] == pytest.approx(1.0, abs=1e-12)
        assert r["speedup"] == pytest.approx(12.0)
        assert r["paper_speedup_T_over_rejections"] is None
    assert main(["theory", "--horizon", "12", "--draft-noise", "0"]) == 0
    text = capsys.readouterr().out
    assert "inf" not in text.lower() and "12.000" in text


def test_theory_table_names_formula_and_design(capsys):
    assert main(["theory", "--horizon", "10", "--drafts", "1,2"]) == 0
    text = capsys.readouterr().out
    for needle in ("Thm 1", "Alg. 1", "Thm 3", "design B", "Prop. 1", "E[N_rej]", "E[target calls]",
                   "T/E[calls]", "E[N_rej] + 1 − P(R_T = 1)"):
        assert needle in text, needle


@pytest.mark.parametrize("argv, needle", [
    (["--states", "0"], "--states"),
    (["--horizon", "0"], "--horizon"),
    (["--horizon", "-3"], "--horizon"),
    (["--drafts", "0"], "--drafts"),
    (["--drafts", "1,1000000"], "--drafts"),
    (["--concentration", "0"], "--concentration"),
    (["--concentration", "nan"], "--concentration"),
    (["--concentration", "inf"], "--concentration"),
    (["--draft-noise", "1.5"], "--draft-noise"),
    (["--draft-noise", "-0.1"], "--draft-noise"),
    (["--draft-noise", "nan"], "--draft-noise"),
    (["--seed", "-1"], "--seed"),
    (["--max-memory-gb", "0"], "--max-memory-gb"),
])
def test_theory_bad_input_is_a_clear_error(capsys, argv, needle):
    assert main(["theory", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_theory_unparsable_drafts_is_an_argparse_error():
    with pytest.raises(SystemExit):
        main(["theory", "--drafts", "a,b"])


def test_theory_refuses_huge_chains_before_allocating(capsys):
    # S = 10 000, T = 50: one chain alone is T·S² = 5·10⁹ float64 (40 GB); refuse without allocating it
    tracemalloc.start()
    try:
        code = main(["theory", "--states", "10000"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code == 2
    err = capsys.readouterr().err
    assert "GB" in err and "--max-memory-gb" in err and "--states 10000" in err
    assert peak < 50e6                                   # nothing chain-sized was allocated
    # the limit is an option: the same size of problem passes or fails with it
    assert main(["theory", "--states", "300", "--horizon", "20", "--max-memory-gb", "0.01"]) == 2
    assert "0.01 GB" in capsys.readouterr().err
    assert main(["theory", "--states", "300", "--horizon", "20", "--max-memory-gb", "0.1", "--json"]) == 0


@pytest.mark.parametrize("states, horizon", [(300, 20), (1000, 2)])
def test_theory_memory_estimate_bounds_the_measured_peak(capsys, states, horizon):
    argv = ["theory", "--states", str(states), "--horizon", str(horizon), "--drafts", "1,4", "--json"]
    assert main(argv) == 0                               # warm-up: imports are not counted below
    capsys.readouterr()
    tracemalloc.start()
    try:
        assert main(argv) == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    estimate = theory_memory_bytes(states, horizon)
    # (300, 20): 8·T·S² = 14.4 MB per chain, measured peak ≈ 3.0 chains = 43 MB, estimate 46.8 MB;
    # (1000, 2): the per-step work arrays matter, measured ≈ 64 MB, estimate 80 MB
    assert peak <= estimate, (peak, estimate)
    assert estimate <= 2 * peak, (peak, estimate)        # and not absurdly conservative
