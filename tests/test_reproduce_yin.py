"""`specbound reproduce yin --quick --skip-llm`: files are written and the numbers in results.json agree
with the theory functions (Yin et al. 2024, Thm 1, Thm 3 / Prop 1, closed forms, Thm 4/5)."""
import json
import time

from types import SimpleNamespace

import numpy as np

import pytest

from helpers import chain_pair
from specbound.cli import main
from specbound.theory import expected_rejections
from specbound.theory.distributions import tv
from specbound.theory.rejections import batch_expected_rejections, batch_rejections_limit
from specbound.theory.tradeoff import pareto_front

FILES = ("fig2a.png", "fig2b.png", "fig2c.png", "fig3.png", "fig4.png", "summary.md", "results.json")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce-yin")
    t0 = time.perf_counter()
    code = main(["reproduce", "yin", "--quick", "--skip-llm", "--out", str(out), "--seed", "0", "--no-progress"])
    seconds = time.perf_counter() - t0
    assert code == 0
    return out, json.loads((out / "results.json").read_text()), seconds


def test_quick_run_writes_every_file_fast(quick_run):
    out, results, seconds = quick_run
    assert seconds < 30, f"quick mode took {seconds:.1f} s"
    for name in FILES:
        path = out / name
        assert path.is_file() and path.stat().st_size > 500, name
        if name.endswith(".png"):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (out / "summary.md").read_text()
    assert "16.41" in summary and "3.05" in summary and "not published" in summary
    assert results["table1"]["status"] == "skipped" and "--skip-llm" in results["table1"]["note"]


def test_fig2_exact_values_are_the_theory_functions_of_the_generated_chain(quick_run):
    _, results, _ = quick_run
    f2 = results["fig2"]
    chain = f2["chain"]                                  # the chain as results.json describes it
    target, draft = chain_pair(chain["target_seed"], chain["states"], horizon=chain["horizon"],
                               concentration=chain["concentration"], noise=chain["draft_noise"],
                               draft_seed=chain["draft_seed"])
    horizon = f2["chain"]["horizon"]
    assert (f2["chain"]["states"], horizon) == (7, 50)
    rows = f2["rows"]
    assert rows["sd"]["exact"] == pytest.approx(expected_rejections(target=target, draft=draft, horizon=horizon),
                                                abs=1e-12)
    for m in (4, 5):
        for design in ("A", "B"):
            assert rows[f"M{m}{design}"]["exact"] == pytest.approx(
                batch_expected_rejections(target=target, draft=draft, horizon=horizon, drafts=m,
                                          design=design), abs=1e-12)
    # only design B is cited as Thm 3; design A is labelled a derived variant
    assert rows["M4B"]["formula"].startswith("Thm 3") and "design B" in rows["M4B"]["formula"]
    assert "Thm 3 (" not in rows["M4A"]["formula"] and "derived variant" in rows["M4A"]["formula"]
    curve = f2["curve"]
    assert curve["limit_B"] == pytest.approx(batch_rejections_limit(target=target, draft=draft, horizon=horizon),
                                             abs=1e-12)
    assert curve["exact_B"][0] == pytest.approx(rows["sd"]["exact"], abs=1e-12)
    assert curve["drafts"] == list(range(1, 21))


@pytest.mark.montecarlo
def test_fig2_monte_carlo_within_four_standard_errors(quick_run):
    _, results, _ = quick_run
    f2 = results["fig2"]
    for key, row in f2["rows"].items():
        mc = row["numpy_mc"]
        assert abs(mc["mean"] - row["exact"]) <= 4 * mc["se"], (key, mc, row["exact"])
        if "engine" in row:                              # the real decoding engine on ChainModels
            eng = row["engine"]
            assert abs(eng["mean"] - row["exact"]) <= 4 * eng["se"], (key, eng, row["exact"])
    assert {"sd", "M4B", "M5B"} <= {k for k, r in f2["rows"].items() if "engine" in r}
    for p in f2["curve"]["mc_points"]:
        assert abs(p["mean"] - p["exact"]) <= 4 * p["se"], p


def test_fig2c_batch_curve_is_non_increasing_and_bounded_away_from_zero(quick_run):
    _, results, _ = quick_run
    c = results["fig2"]["curve"]
    b, a = np.asarray(c["exact_B"]), np.asarray(c["exact_A"])
    assert np.all(np.diff(b) <= 1e-12) and np.all(np.diff(a) <= 1e-12)
    assert np.all(a <= b + 1e-12)                             # the tree DFS never rejects more
    assert 0 < c["limit_B"] <= b[-1] + 1e-12                  # Prop 1: M → ∞ does not reach 0
    assert b[0] - b[-1] > 0.5                                 # batching helps on this instance
    assert c["nonincreasing_B"] and c["A_le_B"]


def test_fig3_closed_forms_match_the_residual_chain(quick_run):
    _, results, _ = quick_run
    f3 = results["fig3"]
    assert f3["max_abs_diff"] < 1e-12
    for row in f3["bernoulli"] + f3["uniform"]:
        closed = np.asarray(row["closed"])
        assert closed[0] == pytest.approx(0.0, abs=1e-15)      # M = 1: no improvement
        assert np.all(np.diff(closed) >= -1e-15) and closed[-1] <= row["tv"] + 1e-12   # saturates below TV
        assert row["max_abs_diff_rho"] < 1e-12


def test_fig4_opt_points_on_the_pareto_line_and_uno_above(quick_run):
    _, results, _ = quick_run
    f4 = results["fig4"]
    draft, target = np.asarray(f4["draft"]), np.asarray(f4["target"])
    assert len(draft) == f4["vocab"] == 10
    assert f4["tv"] == pytest.approx(float(tv(draft, target)), abs=1e-12)
    eps = np.asarray(f4["eps"])
    for form, d in f4["forms"].items():
        rej, opt, uno = (np.asarray(d[k]) for k in ("rejection", "opt_bias", "uno_bias"))
        np.testing.assert_allclose(rej + opt, f4["tv"], atol=1e-9)          # Thm 5: on the line
        np.testing.assert_allclose(np.asarray(d["lp_opt_bias"]), opt, atol=1e-8)   # Thm 4 vs LP
        rejecting = rej > 1e-9
        assert rejecting.sum() >= 3
        assert np.all(rej + uno > f4["tv"] + 1e-6, where=rejecting)       # UNO strictly above the line
        assert np.all(uno >= opt - 1e-12)
        # recomputed from the stored instance
        front = pareto_front(target=target, draft=draft, eps_grid=eps, form=form)
        np.testing.assert_allclose(front.rejection, rej, atol=1e-12)
        np.testing.assert_allclose(front.uno_bias, uno, atol=1e-12)
        for i, core in enumerate(d["core_mc"]):                             # verification core, one step
            assert core["opt"]["rejection"] == core["uno"]["rejection"]     # same b, same uniforms
            assert abs(core["opt"]["rejection"] - rej[i]) <= 4 * core["opt"]["rejection_se"] + 1e-12


@pytest.mark.parametrize("precision", ["int8", "fp32"])
def test_missing_models_skip_the_llm_table_with_a_note(monkeypatch, precision):
    from specbound.assets import convert, gguf, models
    from specbound.experiments import yin, yin_table1

    monkeypatch.setattr(models, "is_converted", lambda name: False)
    monkeypatch.setattr(convert, "check_converted", lambda name, **kw: SimpleNamespace(usable=False))
    monkeypatch.setattr(gguf, "is_installed", lambda model: False)
    out = yin_table1.run_table1(yin.Settings(quick=True, target_precision=precision))
    assert out.status == "skipped"
    assert "not available" in out.note and "qwen2.5-coder-1.5b" in out.note and precision in out.note


def test_sign_test_p_by_hand():
    from specbound.measure.stats import sign_test_p

    assert sign_test_p(8, 2) == pytest.approx(2 * (1 + 10 + 45) / 1024)      # 2·P(Bin(10, ½) ≤ 2)
    assert sign_test_p(2, 8) == sign_test_p(8, 2)
    assert sign_test_p(5, 5) == 1.0 and sign_test_p(0, 0) == 1.0
    assert sign_test_p(0, 6) == pytest.approx(2 / 64)


def test_cluster_bootstrap_covers_a_clustered_mean_where_the_naive_interval_does_not():
    """20 prompts × 3 samples whose pair scores share a strong prompt effect: the prompt bootstrap's
    95% interval covers the true win rate ½ in ≥ 88% of 300 replications (binomial SE of a 95% rate
    over 300 is 1.3%, so 88% is > 5 SE below), while Wilson over the 60 pairs as if independent
    covers clearly less (< 88%)."""
    from specbound.measure.stats import cluster_bootstrap_interval, wilson_interval

    rng = np.random.default_rng(5)
    boot_cover = wilson_cover = 0
    reps = 300
    for r in range(reps):
        lean = rng.choice([0.05, 0.95], size=20)                      # each prompt strongly favours one side
        points = np.array([rng.random() < lean[i] for i in range(20) for _ in range(3)], dtype=float)
        clusters = [i for i in range(20) for _ in range(3)]
        lo, hi = cluster_bootstrap_interval(points, clusters, resamples=1000, seed=r)
        boot_cover += lo <= 0.5 <= hi
        wlo, whi = wilson_interval(points.sum(), points.size)
        wilson_cover += wlo <= 0.5 <= whi
    assert boot_cover / reps >= 0.88
    assert wilson_cover / reps < 0.88


def test_cluster_mean_se_counts_clusters_not_values():
    from specbound.measure.stats import cluster_mean_se, mean_se

    values = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    clusters = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    m, se = cluster_mean_se(values, clusters)
    assert m == pytest.approx(0.5)
    assert se == pytest.approx(mean_se([1, 0, 1, 0])[1])       # four cluster means, equal sizes
    assert se > mean_se(values)[1]
    with pytest.raises(ValueError):
        cluster_mean_se([1.0], [0, 1])


def test_table1_verdict_needs_both_intervals_on_one_side():
    from specbound.experiments.yin_table1 import verdict

    assert verdict((0.55, 0.8), (0.52, 0.85), 60) == "OPT > UNO at 95%"
    assert verdict((0.2, 0.45), (0.1, 0.48), 60) == "UNO > OPT at 95%"
    assert verdict((0.55, 0.8), (0.45, 0.85), 60) == "no difference detectable at n = 60"
    assert verdict((0.55, 0.8), (float("nan"), float("nan")), 60).startswith("no difference")


def test_wilson_interval():
    from specbound.measure.stats import wilson_interval

    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    lo, hi = wilson_interval(0, 5)
    assert lo == 0.0 and 0 < hi < 0.5
