"""What B rows cost, measured through the batched loop (measure/batch_passes.py), and advise --batch
priced with it."""
import math

import pytest

from helpers import tiny_pair
from specbound.decoding.costs import measure_costs, pass_ratios
from specbound.errors import SpecboundError
from specbound.measure.batch_passes import BatchPassCosts, _decode_part, measure_batch_passes, prompt_at_context
from specbound.models.rows import PassRecord
from specbound.theory.speedup import CostProfile, expected_tokens_per_step

VERIFY = CostProfile((1, 2, 4, 8, 16, 32, 64), (0.100, 0.101, 0.104, 0.110, 0.160, 0.260, 0.470))
DRAFT = CostProfile((1, 8, 64), (0.030, 0.034, 0.120))


def test_pass_ratios_leave_prompt_reads_out_and_price_rows_shared_or_in_turn():
    from types import SimpleNamespace

    records = [PassRecord(1, 4, 400, 9.0),          # the prompts' read: left out
               PassRecord(1, 4, 4, 0.22),            # 4 rows × 1 token, shared: t(4) = 0.104
               PassRecord(1, 4, 20, 0.32),           # 4 rows × 5 tokens: t(20) = 0.160 + 4/16 · 0.100
               PassRecord(0, 4, 4, 0.24)]            # the draft's 4 rows one after another: 4 · d(1)
    target, draft, seconds = _decode_part(SimpleNamespace(passes=records, wall_time=12.0, prefill_time=9.5), 4)
    assert seconds == pytest.approx(2.5)
    shared = pass_ratios(target, VERIFY, True)
    assert shared == pytest.approx([0.22 / 0.104, 0.32 / 0.185])
    in_turn = pass_ratios(draft, DRAFT, False)
    assert in_turn == pytest.approx([0.24 / 0.120])


def test_measure_batch_passes_on_tiny_rows_counts_every_decode_round():
    from specbound.models.static import StaticCacheHFModel

    target, draft = tiny_pair(3, noise=0.3, draft_seed=4, backend=StaticCacheHFModel)
    costs = measure_costs(target, draft, repeats=1)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]]
    out = measure_batch_passes(target, draft, prompts, (1, 3), costs, gammas=(1, 3), tokens=12, context=8)
    assert set(out) == {1, 3}
    for B, p in out.items():
        assert isinstance(p, BatchPassCosts) and p.batch == B and p.gammas == (1, 3)
        assert p.rounds >= 12 + 12 / 2 + 12 / 4         # 12 plain rounds, chains of ≤ 2 and ≤ 4 tokens a round
        assert math.isfinite(p.target_ratio) and p.target_ratio > 0
        assert all(d > 0 for d in p.draft_round)         # the draft read every drafted round
        assert p.plain_work >= 0 and min(p.drafted_work) >= 0
    with pytest.raises(SpecboundError, match="calibration prompt"):
        measure_batch_passes(target, draft, [], (1,), costs)
    with pytest.raises(SpecboundError, match="two different chain lengths"):
        measure_batch_passes(target, draft, prompts, (1,), costs, gammas=(2, 2))


def test_calibration_prompts_are_cut_or_extended_to_the_context_they_are_priced_at():
    prompts = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert prompt_at_context(prompts, 1, None) == [4, 5, 6, 7]
    assert prompt_at_context(prompts, 1, 2) == [6, 7]                       # its end kept
    assert prompt_at_context(prompts, 1, 7) == [1, 2, 3, 4, 5, 6, 7]        # the prompt before it, then its own
    assert prompt_at_context(prompts, 0, 8) == [5, 6, 7, 8, 9, 1, 2, 3]     # cyclically: prompts 2, 1 before
    assert len(prompt_at_context(prompts, 2, 40)) == 40 and prompt_at_context(prompts, 2, 40)[-2:] == [8, 9]


def test_advise_prices_batches_at_the_check_prompts_length_unless_told():
    """Only the held-out prompts' lengths: their median plus half the extra tokens the checks decode."""
    from types import SimpleNamespace

    from specbound.cli.advise import _batch_context

    args = SimpleNamespace(batch_context=None, check_tokens=96, tokens=48)
    checks = [[0] * 100, [0] * 140, [0] * 300]
    assert _batch_context(args, checks) == 140 + 24
    assert _batch_context(args, []) is None
    assert _batch_context(SimpleNamespace(batch_context=77, check_tokens=96, tokens=48), checks) == 77


def test_a_drafted_round_at_another_length_lies_on_the_line_through_the_two_measured():
    p = BatchPassCosts(4, 1.0, 0.003, (2, 6), (0.060, 0.140), (0.010, 0.030), 40)
    assert p.draft_seconds(4) == pytest.approx(0.100) and p.work(4) == pytest.approx(0.020)
    assert p.draft_seconds(1) == pytest.approx(0.040) and p.work(8) == pytest.approx(0.040)
    assert p.draft_seconds(0) == 0.0 and p.work(0) == 0.003            # a plain round: its own measurement
    falling = BatchPassCosts(4, 1.0, 0.0, (2, 6), (0.010, 0.002), (0.0, 0.0), 40)
    assert falling.draft_seconds(12) == 0.0                             # never negative


def test_advise_batch_priced_with_measured_passes():
    from specbound.advise import Setting, batch_advice

    chain = {g: Setting("chain", g, expected_tokens_per_step(0.8, g), g * float(DRAFT(1)), g + 1, 0.0)
             for g in range(1, 9)}
    oracle = {P: min(P, 3.0) for P in (1, 2, 4, 8)}
    B = 4
    costly = BatchPassCosts(B, 1.3, 0.010, (2, 6), (0.080, 0.200), (0.020, 0.040), 40)
    b = batch_advice(B, chain, oracle, VERIFY, DRAFT, passes=costly)
    assert b.plain == pytest.approx(B / (1.3 * 0.104 + 0.010))        # B / (ratio · t(B) + w_plain)
    assert b.gamma > 0                      # α = 0.8 on a flat pass still pays at 4 requests
    g = b.gamma
    draft = 0.080 + (0.200 - 0.080) / 4 * (g - 2)                       # the lines through γ = 2 and 6
    work = 0.020 + (0.040 - 0.020) / 4 * (g - 2)
    seconds = draft + 1.3 * float(VERIFY(B * (g + 1))) + work
    assert b.speculative == pytest.approx(B * chain[g].expected_tokens / seconds)
    # the drafted round's work alone can make speculation lose at this B
    hopeless = BatchPassCosts(B, 1.0, 0.0, (2, 6), (0.05, 0.1), (5.0, 5.0), 40)
    assert batch_advice(B, chain, oracle, VERIFY, DRAFT, passes=hopeless).gamma == 0


def test_advise_batch_measures_the_rows_and_says_so_in_its_report(tmp_path, monkeypatch):
    from specbound.advise import AdviseConfig, advise, measure_batches
    from specbound.experiments.advise_report import advise_markdown
    from specbound.models.static import StaticCacheHFModel

    target, draft = tiny_pair(5, noise=0.3, draft_seed=6, backend=StaticCacheHFModel)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13]]
    config = AdviseConfig(engine="torch", n_prompts=2, tokens=10, positions=4, chain_gamma=4, repeats=1,
                          modes=("greedy",), batches=(1, 2))
    advice = advise(target, draft, prompts, config)
    batch = advice.modes["greedy"].batch
    assert set(batch) == {1, 2} and all(b.passes is not None and b.passes.batch == B for B, b in batch.items())
    import specbound.decoding.batch as batching

    seen, real = [], batching.autoregressive_decode_batch

    def recording(target, prompts, *args, **kwargs):
        seen.append([list(p) for p in prompts])
        return real(target, prompts, *args, **kwargs)

    check = prompts + [[14, 15, 16]]
    monkeypatch.setattr(batching, "autoregressive_decode_batch", recording)
    measure_batches(target, draft, advice, check, 8, runs=2)
    # every check prompt at every B: B = 1 three batches, B = 2 two (the last filled by cycling), twice each
    assert seen == [[p] for p in check for _ in range(2)] + [check[:2]] * 2 + [[check[2], check[0]]] * 2
    assert (batch[1].measured_batches, batch[2].measured_batches) == (6, 4)
    for b in batch.values():
        low, high = b.measured_plain_range
        assert 0 < low <= b.measured_plain <= high
    text = advise_markdown(advice, {})
    assert "Priced with what B rows measured" in text and "Measured / predicted over the batch sizes" in text
    assert "perfect draft (×plain, γ)" in text
    for B, b in batch.items():               # priced with the same measured passes, every token accepted
        assert b.perfect_draft >= max(b.plain, b.speculative) * (1 - 1e-12)
        assert f"{b.perfect_draft / b.plain:.2f}×, γ {b.perfect_draft_gamma}" in text


def test_a_stale_cost_profile_is_reported_once_for_all_the_requests_of_a_batch():
    import warnings

    from specbound.decoding.costs import CostMeasurement, CostModel

    measurement = CostMeasurement(VERIFY, DRAFT, key="test-stale-once")
    models = [CostModel(measurement) for _ in range(4)]           # one per request of a batch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for m in models:
            for _ in range(6):
                m.observe_target(1, 0.3)                           # three times the profile's t(1)
    assert all(m.stale for m in models)                            # each still replaces the cached profile
    assert len([w for w in caught if "disagrees with this run" in str(w.message)]) == 1
