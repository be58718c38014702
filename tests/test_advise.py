"""`specbound advise` on exact toy models: every setting is predicted from measured quantities, the
predictions follow the theory formulas, a useless draft yields "will not pay", measured settings are
filled in, and the report and exports are written."""
import json
import shlex

import numpy as np
import pytest

from helpers import chain_models
from specbound.decoding import speculative_decode
from specbound.advise import AdviseConfig, advise, measure_settings, measured_vs_predicted, recommendation
from specbound.experiments.advise_report import write_advice
from specbound.export import export_all
from specbound.models import ChainModel
from specbound.theory import MarkovChain
from specbound.theory.speedup import expected_tokens_per_step, round_speedup
from test_policy import SleepyModel

CONFIG = AdviseConfig(engine="torch", n_prompts=2, tokens=12, positions=6, chain_gamma=6, repeats=1)


def test_predictions_follow_the_formulas_and_measurements_fill_in(tmp_path):
    target, draft = chain_models(2, 5, concentration=0.3, noise=0.1, draft_seed=3)
    # reads cost real time (chain models are otherwise free): a flat target, a cheap draft
    target, draft = SleepyModel(target, lambda k: 4e-3 + 1e-5 * k), SleepyModel(draft, lambda k: 4e-4)
    prompts = [[0, 1], [2, 3]]
    advice = advise(target, draft, prompts, CONFIG)
    verify_cost, draft_cost = advice.cost_profiles()
    for mode, m in advice.modes.items():
        assert len(m.acceptance) == CONFIG.chain_gamma and all(0 <= a <= 1 for a in m.acceptance)
        for g, s in m.chain.items():
            if mode == "greedy":        # exact: the engine's own τ of a fixed-γ chain on the same prompts
                runs = [speculative_decode(target, draft, p, CONFIG.tokens, gamma=g, temperature=0.0).metrics
                        for p in prompts]
                engine_tau = sum(r.new_tokens for r in runs) / sum(r.target_calls for r in runs)
                assert s.expected_tokens == pytest.approx(engine_tau)
            else:                       # E[tokens] = 1 + Σ Π α (Leviathan et al.)
                assert s.expected_tokens == pytest.approx(expected_tokens_per_step(m.acceptance, g))
            assert s.predicted == pytest.approx(float(round_speedup(s.expected_tokens - 1, s.draft_seconds,
                                                                    verify_cost, g + 1)))
        values = [m.tree[P].expected_tokens for P in sorted(m.tree)]
        assert all(b >= a - 1e-12 for a, b in zip(values, values[1:]))      # nested trees: non-decreasing
        for P, s in m.tree.items():                         # a tree never beats the target's own T*(P)
            assert s.expected_tokens - 1 <= m.oracle[P] + 1e-9
        assert m.pays and m.best.predicted == max(s.predicted for s in list(m.chain.values()) + list(m.tree.values()))
        if mode == "greedy":            # block verification of a greedy chain is token-wise verification
            assert not m.block
            continue
        assert set(m.block) == set(m.chain) and m.best_block.predicted == max(s.predicted for s in m.block.values())
        assert m.block_positions[1] == pytest.approx(m.block_token[1], abs=1e-12)    # γ = 1: the same rule
        for g, s in m.block.items():                 # the chain's tokens per round times the exact gain
            assert s.expected_tokens == pytest.approx(m.chain[g].expected_tokens * m.block_positions[g]
                                                      / m.block_token[g])
            assert s.draft_seconds == m.chain[g].draft_seconds
            assert s.predicted == pytest.approx(float(round_speedup(s.expected_tokens - 1, s.draft_seconds,
                                                                    verify_cost, g + 1)))
        # sampled trees and M drafts: priced by the same rule from their exact values and draft calls
        from specbound.advise import SAMPLED_SHAPES
        assert [(s.kind, s.size, s.gamma) for s in m.shapes] == [tuple(x) for x in SAMPLED_SHAPES]
        for s in m.shapes:
            assert 1.0 <= s.expected_tokens <= s.verified_tokens and s.draft_seconds > 0
            assert s.predicted == pytest.approx(float(round_speedup(s.expected_tokens - 1, s.draft_seconds,
                                                                    verify_cost, s.verified_tokens)))
        assert m.best_engine.predicted == max(x.predicted for x in list(m.chain.values()) + list(m.tree.values())
                                              + list(m.block.values()) + m.shapes)
    assert advice.modes["sampled"].bound                  # μ, μ₂ bound on E[X](P), T = 1 only
    measure_settings(target, draft, advice, prompts, 10, runs=2)     # two paired runs per prompt (T = 1: streams)
    assert advice.measured_streams == 2
    rows = measured_vs_predicted(advice)
    assert len(rows) >= 5 and all(r[3] > 0 for r in rows)
    assert advice.modes["sampled"].best_shape.measured is not None       # the best sampled shape is checked too
    assert any(r[0] == "sampled" and "block verification" in r[1] for r in rows)
    rec = recommendation(advice, "/models/target", "/models/draft")
    exports = export_all(rec)
    json.loads([line for line in exports["vllm"].splitlines() if line.startswith("{")][0])
    assert shlex.split(exports["llama.cpp"].splitlines()[-1])[0] == "llama-server"
    paths = write_advice(advice, exports, tmp_path, "specbound advise --test")
    assert all(p.exists() for p in paths.values())
    assert "Predicted vs measured" in paths["md"].read_text()
    assert "Chain with block verification" in paths["md"].read_text()
    from specbound.experiments.advise_report import advise_markdown
    # a checked setting that measured faster than the recommendation is named beside it, and only then
    m = advice.modes["greedy"]
    other = next(s for s in m.chain.values() if s.measured is not None and s.label != m.best.label)
    for s in list(m.chain.values()) + list(m.tree.values()) + list(m.block.values()) + m.shapes:
        s.measured = None if s.measured is None else 1.0
    other.measured, m.best.measured = 1.5, 1.2
    assert f"Measured best of the checked settings (greedy): **{other.label}**, 1.50×" in advise_markdown(advice, exports)
    other.measured = 1.1
    assert "Measured best of the checked settings (greedy)" not in advise_markdown(advice, exports)
    advice.costs["draft_spread"][1] = 0.6                 # a burst of outside load during the calibration
    assert "measured on a busy machine" in advise_markdown(advice, exports)


def test_a_useless_draft_is_told_that_speculation_will_not_pay(tmp_path):
    target = MarkovChain.random(5, seed=2, concentration=0.3)
    uniform = MarkovChain(np.full(5, 0.2), np.full((5, 5), 0.2))
    # steep verification and an expensive draft: nothing can pay
    slow_target = SleepyModel(ChainModel(target), lambda k: 2e-3 * k)
    slow_draft = SleepyModel(ChainModel(uniform), lambda k: 3e-3)
    advice = advise(slow_target, slow_draft, [[0, 1]], AdviseConfig(n_prompts=1, tokens=10, positions=4,
                                                                     chain_gamma=4, repeats=1, modes=("greedy",)))
    m = advice.modes["greedy"]
    assert not m.pays and m.best.predicted < 1.05
    rec = recommendation(advice, "/t", "/d")
    assert rec.method == "none"
    paths = write_advice(advice, export_all(rec), tmp_path)
    assert "will not pay" in paths["md"].read_text()


def test_a_chain_round_is_priced_with_the_reads_the_engine_makes():
    """After a chain accepted whole, the next round's first draft read takes two tokens (the last drafted
    one and the bonus token); after a rejection, one. With a draft whose reads cost 2 ms per token and a
    draft that is right most of the time, advise's draft seconds per round of γ must match the engine's own
    draft time per round (fixed γ, the same prompts). Pricing γ one-token reads alone is ~45% low at
    γ = 1 here and fails; the tolerance (15%) covers sleep overshoot and Python around the reads."""
    target, draft = chain_models(2, 5, concentration=0.3, noise=0.05, draft_seed=3)
    target, draft = SleepyModel(target, lambda k: 2e-3), SleepyModel(draft, lambda k: 2e-3 * k)
    prompts, tokens = [[0, 1], [2, 3]], 30
    config = AdviseConfig(engine="torch", n_prompts=2, tokens=tokens, positions=4, chain_gamma=6, repeats=1,
                          modes=("greedy",))
    m = advise(target, draft, prompts, config).modes["greedy"]
    for g in (1, 2, 4):
        runs = [speculative_decode(target, draft, p, tokens, gamma=g, temperature=0.0).metrics for p in prompts]
        whole = sum(a == g for r in runs for a in r.accepted_per_step[:-1]) / sum(r.target_calls for r in runs)
        if g == 1:
            assert whole > 0.5                 # the case the two-token read matters in
        measured = sum(r.draft_time for r in runs) / sum(r.target_calls for r in runs)
        assert m.chain[g].draft_seconds == pytest.approx(measured, rel=0.15), g


def test_the_context_drafter_is_measured_and_reported(tmp_path):
    """Prompts that repeat themselves: the context drafter finds something to draft, its acceptance and τ
    are the engine's, its speed-up over plain decoding is filled in by the checks and reported."""
    from specbound.advise import PAYS
    from specbound.experiments.advise_report import advise_markdown

    target, draft = chain_models(2, 5, concentration=0.3, noise=0.1, draft_seed=3)
    target, draft = SleepyModel(target, lambda k: 4e-3 + 1e-5 * k), SleepyModel(draft, lambda k: 4e-4)
    prompts = [[0, 1, 2, 3, 0, 1, 2, 3, 0, 1], [2, 3, 4, 2, 3, 4, 2]]
    advice = advise(target, draft, prompts, CONFIG)
    for m in advice.modes.values():
        c = m.context
        assert 0 < c.drafted_rounds <= 1 and 0 <= c.acceptance <= 1 and c.tau >= 1 and c.measured is None
    measure_settings(target, draft, advice, prompts, 10)
    for m in advice.modes.values():
        assert m.context.measured > 0 and m.context.pays == (m.context.measured >= PAYS)
    text = advise_markdown(advice, {})
    assert text.count("Context drafts (no draft model") == len(advice.modes)
    assert "plain decoding on the held-out prompts: it " in text
