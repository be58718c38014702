"""Theory of batched requests (theory/speedup.py): the shared-pass throughput and the best-first
allocation of drafted nodes across requests, checked against brute force on exact Markov chains."""
import itertools

import numpy as np
import pytest

from specbound.errors import SpecboundError
from specbound.theory import MarkovChain, pool_moments
from specbound.theory.speedup import (
    CostProfile, allocate_batch_nodes, batch_throughput, best_batch_gamma, expected_tokens_per_step,
)

# a CPU-like pass: flat to 8 tokens, then rising
VERIFY = CostProfile((1, 2, 4, 8, 16, 32, 64), (0.100, 0.101, 0.104, 0.110, 0.160, 0.260, 0.470))
DRAFT = CostProfile((1, 8, 64), (0.030, 0.034, 0.120))


def _greedy_chain_values(target: MarkovChain, draft: MarkovChain, context: int, depth: int) -> np.ndarray:
    """Exact values of a greedy draft chain's nodes at T > 0 (deterministic-tree walk): node j is
    accepted iff the target samples the draft's arg-max at every depth ≤ j, so its value is the
    product of the target's probabilities of those tokens."""
    values, x, v = [], context, 1.0
    for _ in range(depth):
        y = int(np.argmax(draft.transitions[x]))
        v *= float(target.transitions[x, y])
        values.append(v)
        x = y
    return np.array(values)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_best_first_allocation_is_optimal_on_exact_chains(seed):
    target = MarkovChain.random(6, concentration=0.4, seed=seed)
    draft = target.perturbed(0.5, seed=seed + 100)
    contexts, depth = [0, 2, 3, 5], 4
    values = [_greedy_chain_values(target, draft, c, depth) for c in contexts]
    c_node = 0.004
    counts, rate = allocate_batch_nodes(values, VERIFY, draft_seconds_per_node=c_node)

    def throughput(ns):
        tokens = sum(1 + v[:n].sum() for v, n in zip(values, ns))
        return tokens / (float(VERIFY(len(ns) + sum(ns))) + c_node * sum(ns))

    brute = max(itertools.product(range(depth + 1), repeat=len(contexts)), key=throughput)
    assert rate == pytest.approx(throughput(brute), rel=1e-12)
    assert rate == pytest.approx(throughput(counts), rel=1e-12)
    assert throughput(counts) >= throughput([0] * len(contexts))


def test_allocation_gives_nothing_when_drafts_never_pay():
    counts, rate = allocate_batch_nodes([[0.01, 0.001], [0.02]], CostProfile((1, 2, 64), (0.1, 0.2, 6.4)))
    assert counts == [0, 0] and rate == pytest.approx(2 / 0.2)


def test_allocation_prefers_the_request_whose_nodes_pay():
    counts, _ = allocate_batch_nodes([[0.95, 0.9, 0.85, 0.8], [0.2, 0.05, 0.01, 0.001]], VERIFY)
    assert counts[0] == 4 and counts[1] <= 1


def test_batch_throughput_matches_its_formula_and_plain():
    alpha = [0.8, 0.7, 0.6]
    for B in (1, 2, 4, 8):
        assert batch_throughput(0.0, 0, B, DRAFT, VERIFY) == pytest.approx(B / float(VERIFY(B)))
        expect = B * expected_tokens_per_step(alpha, 3) / (3 * float(DRAFT(B)) + float(VERIFY(4 * B)))
        assert batch_throughput(alpha, 3, B, DRAFT, VERIFY) == pytest.approx(expect)


def test_best_gamma_falls_as_the_batch_grows():
    gammas = [best_batch_gamma(0.8, B, DRAFT, VERIFY)[0] for B in (1, 2, 4, 8, 16, 32)]
    assert gammas[0] >= 2 and gammas[-1] == 0
    assert all(a >= b for a, b in zip(gammas, gammas[1:]))


def test_bad_allocation_input():
    with pytest.raises(SpecboundError, match="non-increasing"):
        allocate_batch_nodes([[0.2, 0.5]], VERIFY)
    with pytest.raises(SpecboundError, match="probabilities"):
        allocate_batch_nodes([[1.5]], VERIFY)
    with pytest.raises(SpecboundError, match="batch must be"):
        batch_throughput(0.5, 2, 0, DRAFT, VERIFY)


def test_advise_batch_prediction_and_table():
    from specbound.advise import AdviseConfig, Advice, ModeAdvice, Setting, batch_advice, batch_table
    from specbound.theory.speedup import shared_pass_throughput

    # chain settings as advise measures them: E[tokens/round] and draft seconds per round at B = 1
    chain = {g: Setting("chain", g, expected_tokens_per_step(0.8, g), g * float(DRAFT(1)), g + 1, 0.0)
             for g in range(1, 9)}
    oracle = {P: min(P, 3.0) for P in (1, 2, 4, 8, 16)}
    advice = {}
    for B in (1, 4, 32):
        b = batch_advice(B, chain, oracle, VERIFY, DRAFT)
        assert b.plain == pytest.approx(B / float(VERIFY(B)))
        if b.gamma:
            s = chain[b.gamma]
            assert b.speculative == pytest.approx(float(shared_pass_throughput(
                s.expected_tokens, B, s.draft_seconds * float(DRAFT(B)) / float(DRAFT(1)), b.gamma + 1, VERIFY)))
            assert b.speculative > b.plain
        else:
            assert b.speculative == b.plain
        assert b.speed_of_light >= b.speculative * 0.999 or b.gamma == 0
        advice[B] = b
    assert advice[1].gamma >= advice[4].gamma >= advice[32].gamma
    assert advice[32].gamma == 0            # 32 requests fill the pass: speculation no longer pays
    mode = ModeAdvice("greedy", [0.8], chain, {}, batch=advice)
    full = Advice(AdviseConfig(batches=(1, 4, 32)), {}, {}, pool_moments([1.0], [2.0]), {"greedy": mode})
    assert batch_table(full) == {1: advice[1].gamma, 4: advice[4].gamma, 32: 0}


def test_a_cost_curve_never_falls_beyond_its_last_point():
    noisy = CostProfile((1, 32, 64), (0.1, 0.5, 0.4))          # a noisy last point
    assert float(noisy(128)) == pytest.approx(0.4)
    assert float(noisy(640)) > 0


def test_batch_draft_length_is_one_length_per_round_and_follows_the_faster_choice():
    from types import SimpleNamespace

    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength

    cheap = CostMeasurement(VERIFY, DRAFT)
    policy = BatchDraftLength(cheap, live=lambda: 2, start=3)
    assert policy.gamma_for_round(1) == 3                       # nothing observed yet: the start length
    for _ in range(40):
        policy.observe(3, 3)                                    # every drafted token accepted
    assert policy.model_gamma() >= 3
    g = policy.gamma_for_round(2)
    assert policy.gamma_for_round(2) == g                       # fixed for the round once asked
    # drafts that are never accepted never pay in the model: its candidate is plain decoding
    policy = BatchDraftLength(cheap, live=lambda: 4, start=2)
    for _ in range(40):
        policy.observe(2, 0)
    assert policy.model_gamma() == 0
    # the batch's measured passes rescale the curves
    slow_target = [SimpleNamespace(priority=1, rows=2, tokens=8, seconds=2 * float(VERIFY(8)))] * 5
    policy = BatchDraftLength(cheap, passes=lambda: slow_target, live=lambda: 2)
    assert policy._ratio(1, VERIFY, True) == pytest.approx(2.0) and policy._ratio(0, DRAFT, True) == 1.0
    # draft rows read in turn (llama.cpp): a pass over 4 rows of one token is priced 4·d(1), not d(4)
    in_turn = [SimpleNamespace(priority=0, rows=4, tokens=4, seconds=4 * float(DRAFT(1)))] * 5
    policy = BatchDraftLength(cheap, passes=lambda: in_turn, live=lambda: 4, rows_shared=(False, True))
    assert policy._ratio(0, DRAFT, False) == pytest.approx(1.0)
    assert policy._ratio(0, DRAFT, True) == pytest.approx(4 * float(DRAFT(1)) / float(DRAFT(4)))
    for _ in range(40):
        policy.observe(3, 3)
    shared = BatchDraftLength(cheap, live=lambda: 4)
    for _ in range(40):
        shared.observe(3, 3)
    assert policy.model_gamma() <= shared.model_gamma()       # dearer draft passes never lengthen the chain


def _run_simulated_batch(monkeypatch, policy, seconds, rounds):
    """Drive a shared-rows policy for ``rounds`` rounds of 2 requests on a simulated clock: a round of
    chain length g takes ``seconds(g)``, and each request accepts all g of its drafts. The lengths chosen."""
    import time

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    chosen = []
    for r in range(1, rounds + 1):
        g = policy.gamma_for_round(r)
        chosen.append(g)
        for _ in range(2 if g else 0):
            policy.observe(g, g, r)
        clock[0] += seconds(g)
    return chosen


def test_batch_draft_length_trusts_timed_rounds_over_its_model(monkeypatch):
    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength

    policy = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), live=lambda: 2, start=3, trial=2,
                              explore_every=10)
    # drafted rounds: all accepted, yet each takes 10 s; plain rounds: 2 tokens in 0.2 s
    chosen = _run_simulated_batch(monkeypatch, policy, lambda g: 10.0 if g > 0 else 0.2, 29)
    assert policy.model_gamma() == 0               # the model learns the rounds' work outside the passes…
    assert chosen[0] == 3 and 0 in chosen[:6]      # …once both its γ and plain are timed…
    later = chosen[10:]
    assert later.count(0) >= len(later) - 3        # …then the measured faster choice, plain, with re-tries


def test_batch_draft_length_learns_the_round_work_outside_the_passes(monkeypatch):
    """Rounds that cost their passes (the curves above) plus 0.05 + 0.08·γ s of work outside them (the
    rows' sampling and verification): the pass-only model over-rates long chains; once two lengths are
    timed the policy fits that work and settles on the γ that is truly fastest (computed here from the
    simulated times, every token accepted: 2(γ+1) tokens per round for 2 requests)."""
    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength

    def seconds(g):
        return (g * float(DRAFT(2)) + float(VERIFY(2 * (g + 1))) if g else float(VERIFY(2))) + 0.05 + 0.08 * g

    rates = {g: (2 * (g + 1) if g else 2) / seconds(g) for g in range(9)}
    truth = max(rates, key=rates.get)
    assert 0 < truth < 4 and rates[truth] > 1.1 * rates[0]          # the simulated pair: a short chain pays
    policy = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), live=lambda: 2, start=2, trial=2, explore_every=16)
    chosen = _run_simulated_batch(monkeypatch, policy, seconds, 119)
    plain, c0, c1 = policy.round_overhead(2, DRAFT, VERIFY)
    assert plain == pytest.approx(0.05, abs=1e-9) and c0 == pytest.approx(0.05, abs=1e-6)
    assert c1 == pytest.approx(0.08, abs=1e-6)
    later = chosen[40:]
    # the estimated acceptance stays below 1 (Beta prior), so a neighbour of the truth may win: what
    # matters is the rate the batch gets; re-tries of plain and of other lengths are allowed
    got = sum(rates[g] for g in later) / len(later)
    assert got >= 0.95 * rates[truth], (later, rates)
    assert later.count(0) <= 4


def test_batch_throughput_with_work_outside_the_passes_by_hand():
    """B = 2, α = 0.5, γ = 2, d = 10 ms, t = 100 ms flat, work: plain 30 ms, drafted 20 ms + 10 ms per γ:
    2·(1 + 0.5 + 0.25) / (2·0.01 + 0.1 + 0.02 + 0.01·2) = 21.875 tok/s; plain 2 / (0.1 + 0.03)."""
    from specbound.theory.speedup import batch_throughput

    d, t = CostProfile.constant(0.01), CostProfile.constant(0.1)
    assert batch_throughput(0.5, 2, 2, d, t, (0.03, 0.02, 0.01)) == pytest.approx(21.875)
    assert batch_throughput(0.5, 0, 2, d, t, (0.03, 0.02, 0.01)) == pytest.approx(2 / 0.13)
    assert batch_throughput(0.5, 2, 2, d, t) == pytest.approx(3.5 / 0.12)
    with pytest.raises(SpecboundError, match="round_overhead"):
        batch_throughput(0.5, 2, 2, d, t, (0.0, -1.0, 0.0))


def test_batch_draft_length_per_request_decides_between_drafting_and_plain_by_the_model(monkeypatch):
    """Draft rows read in turn (llama.cpp): each request sizes its own chain under the limit the batch
    policy hands out, the model's γ* from the pooled acceptance and the measured costs (0: the round
    is plain). Rounds are timed at the depth of their LONGEST chain
    (what the round waited for), not at the limit handed out."""
    import time

    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def run(accept, rounds=60):
        policy = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), live=lambda: 2, per_request=True, max_gamma=32,
                                  explore_every=8, rows_shared=(False, True))
        chosen = []
        for r in range(1, rounds):
            g = policy.gamma_for_round(r)
            chosen.append(g)
            if g:                                   # a drafting round: the requests drafted 4 and 2 tokens
                policy.observe(4, 4 if accept else 0, r)
                policy.observe(2, 2 if accept else 0, r)
            clock[0] += 0.3 if g else 0.1          # 6 draft reads in turn + t(8) ≈ 0.29 s; plain t(2) ≈ 0.1 s
        return policy, chosen

    policy, chosen = run(accept=True)
    assert chosen[0] == 0                                            # the prior (α = ½ per depth) does not pay here ...
    assert sum(g > 0 for g in chosen[-20:]) >= 18                   # ... what the requests accept does (a probe found it)
    assert all(g >= 4 for g in chosen[-20:] if g)                    # the limit (break-even γ) leaves room for the
                                                                     # chains the requests' own budgets choose
    assert 4 in policy.rounds and set(policy.rounds) <= {0, 4}       # timed at the longest chain drafted, 4
    policy, chosen = run(accept=False)
    assert chosen[-20:].count(0) >= 18                               # nothing accepted: plain rounds ...
    assert any(g > 0 for g in chosen[20:])                           # ... with drafting probed now and then
    # 8 requests: 8 draft reads in turn per depth cost more than a whole pass; even if every drafted token
    # were accepted drafting would lose, so it is never tried (a probe would make each row read its backlog)
    policy = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), live=lambda: 8, per_request=True, max_gamma=32,
                              explore_every=8, rows_shared=(False, True))
    assert not policy.could_pay()
    assert [policy.gamma_for_round(r) for r in range(1, 80)] == [0] * 79


def test_batch_draft_length_per_request_reuses_a_plain_decision_until_something_changes(monkeypatch):
    """In plain rounds the per-request model's inputs move only with the passes' timing: its answer
    "plain" is reused for ``recheck`` rounds, and recomputed at once when the batch shrinks or a drafted
    round brings news of the acceptance."""
    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength

    live = [8]
    policy = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), live=lambda: live[0], per_request=True, max_gamma=32,
                              explore_every=10_000, rows_shared=(False, True), recheck=5)
    calls = []
    model = policy.model_gamma
    monkeypatch.setattr(policy, "model_gamma", lambda: calls.append(1) or model())
    assert [policy.gamma_for_round(r) for r in range(1, 12)] == [0] * 11
    assert len(calls) == 3                                 # rounds 1, 6, 11
    live[0] = 7
    policy.gamma_for_round(12)
    assert len(calls) == 4                                 # the batch shrank: asked again
    policy.gamma_for_round(13)
    assert len(calls) == 4
    policy.observe(2, 1, 13)                               # a drafted round (a probe) was observed
    policy.gamma_for_round(14)
    assert len(calls) == 5
    policy.observe(0, 0, 14)                               # a request that drafted nothing teaches nothing
    policy.gamma_for_round(15)
    assert len(calls) == 5


def test_per_request_rounds_are_charged_their_work_outside_the_passes_the_scheduler_timed(monkeypatch):
    """A drafted round's first draft read re-reads every row's backlog, which the one-token curves do not
    price: with the scheduler's records the policy charges each round only its time outside its own
    passes (here 10 ms), not that time plus whatever the curves missed (a 150 ms backlog read)."""
    import time

    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength
    from specbound.models.rows import PassRecord

    clock, records = [0.0], []
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    policy = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), passes=lambda: records, live=lambda: 2,
                              per_request=True, max_gamma=32, explore_every=10_000, rows_shared=(False, True))
    assert policy.gamma_for_round(1) == 0 and policy.gamma_for_round(2) > 0     # drafting probed at round 2
    for r in range(2, 12):
        if r > 2:
            policy.gamma_for_round(r)
        policy.observe(4, 4, r)
        policy.observe(4, 4, r)
        records.append(PassRecord(0, 2, 16, 0.150))          # the backlog read (2 rows × 8 tokens, in turn)
        records.append(PassRecord(0, 6, 6, 0.180))           # three more depths, 2 rows each, in turn
        records.append(PassRecord(1, 2, 10, 0.110))          # the target's pass
        clock[0] += 0.150 + 0.180 + 0.110 + 0.010
    policy.gamma_for_round(12)
    draft, verify = policy._scaled_costs()
    w_plain, c0, c1 = policy.round_overhead(2, draft, verify)
    assert c0 == pytest.approx(0.010) and c1 == pytest.approx(0.0)


def test_per_request_policy_never_probes_where_even_full_acceptance_gains_little():
    """Three requests whose draft rows are read in turn: fully accepted chains would beat plain rounds,
    but by less than a probe margin of 20% — so the batch decodes plainly throughout (the margin is a
    setting; its default, 1.0, probes wherever drafting could pay at all)."""
    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength

    draft = CostProfile((1, 8, 64), (0.030, 0.033, 0.120))
    policy = BatchDraftLength(CostMeasurement(VERIFY, draft), live=lambda: 3, per_request=True, max_gamma=32,
                              explore_every=4, rows_shared=(False, True), probe_margin=1.2)
    assert policy.could_pay(1.0) and not policy.could_pay(policy.probe_margin)
    assert [policy.gamma_for_round(r) for r in range(1, 60)] == [0] * 59


def test_batch_draft_length_counts_every_request_of_a_timed_round(monkeypatch):
    """Requests share a round's pass, then verify in their own threads: the first to ask for round r + 1
    has observed round r while the others may not have. A round's rate must count every request's
    tokens (here 2 requests accept all 2 drafted tokens: 6 tokens per 0.1 s round = 60 tok/s; a plain
    round 2 tokens = 20 tok/s). Counting round r at once gave 30 tok/s for drafting."""
    import time

    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength

    clock = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    policy = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), live=lambda: 2, start=2, trial=2, explore_every=4)
    policy.plain_margin = float("inf")                 # plain rounds are tried however well drafting measures
    def check_rates():                                 # what the policy sees when it decides
        rated = {g: policy._rate(g) for g in policy.rounds if policy._rate(g) is not None}
        for g, rate in rated.items():                  # drafting is rated over its recent rounds of any γ
            timed = sorted((r, h) for h, entries in policy.rounds.items() if (h > 0) == (g > 0)
                           for r, _, _ in entries if r <= policy._deciding - 2)[-policy.window:]
            expected = sum(2 * (h + 1) if h else 2 for _, h in timed) / (0.1 * len(timed))
            assert rate == pytest.approx(expected), (g, rate, chosen)
        return rated

    chosen, seen = [], set()
    for r in range(1, 30):
        g = policy.gamma_for_round(r)                  # request A asks first (round r - 1 ended for both)
        assert policy.gamma_for_round(r) == g          # request B gets the same length
        chosen.append(g)
        clock[0] += 0.1
        if g:
            policy.observe(g, g, r)                    # A verifies round r and observes it ...
            policy.gamma_for_round(r + 1)              # ... and asks for round r + 1 before B has verified
            seen |= set(check_rates())
            policy.observe(g, g, r)                    # B's observation of round r
    assert 0 in seen and any(g > 0 for g in seen), chosen


def test_batch_draft_length_acceptance_of_rarely_tested_depths_shrinks_to_the_pooled_rate():
    """Depth 1 accepted 42 times of 45, depth 2 tested twice and rejected once: depth 2's estimate lies
    near the pooled acceptance (not at the ½ of a flat prior per depth), and an untested depth gets the
    pooled rate — so the model does not price long chains as losing on two observations."""
    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength

    policy = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), live=lambda: 2)
    for _ in range(40):
        policy.observe(1, 1)
    for _ in range(3):
        policy.observe(1, 0)
    policy.observe(2, 1)                               # depth 1 accepted, depth 2 rejected
    policy.observe(2, 2)
    a = policy.alpha()
    pooled = (42 + 1 + 1) / (45 + 2 + 2)                # Beta(1, 1) over all depths' tests
    assert a[0] == pytest.approx((42 + 2 * pooled) / (45 + 2))
    assert a[1] == pytest.approx((1 + 2 * pooled) / (2 + 2)) and a[1] > 0.6
    assert a[2] == pytest.approx(pooled) and a[-1] == pytest.approx(pooled)


def test_batch_draft_length_starts_drafting_only_where_it_can_repay_the_draft_backlog(monkeypatch):
    """Switching from plain rounds (or the batch's start) to drafting first makes the draft rows read
    every committed token they have not read. A batch that could save less than twice that read even
    with every drafted token accepted stays plain; one with a long way to go and a short backlog drafts
    its start length at once."""
    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength

    def run(remaining, backlog, rounds=30):
        policy = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), live=lambda: 2, start=2,
                                  outlook=lambda: (remaining, backlog))
        return _run_simulated_batch(monkeypatch, policy, lambda g: 0.2, rounds - 1)

    # saving at full acceptance, 2 requests: plain 2 / t(2) vs the best chain; 40 tokens save < 1 s,
    # while reading a backlog of 2000 tokens costs d(2000) ≈ 4 s on the DRAFT curve
    assert float(DRAFT(2000)) > 2.0
    assert run(remaining=40, backlog=2000) == [0] * 29
    assert run(remaining=100_000, backlog=10)[0] == 2


def test_batch_draft_length_prices_its_start_at_the_acceptance_the_pair_has_shown(monkeypatch):
    """Before a batch has drafted, its start is priced at the per-depth acceptance the pair showed in
    earlier runs (``shown``), not at full acceptance. 200 tokens to go and a 500-token backlog (d(500)
    ≈ 0.79 s, twice that 1.58 s): full acceptance saves ≈ 200 · 0.027 s = 5.5 s and starts; a pair that
    accepted half its drafts saves ≈ 200 · 0.0056 s = 1.1 s and stays plain; one that accepted 0.9 per
    depth saves ≈ 4.2 s and starts."""
    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength

    def first_rounds(shown):
        policy = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), live=lambda: 2, start=2,
                                  outlook=lambda: (200, 500), shown=shown)
        return _run_simulated_batch(monkeypatch, policy, lambda g: float(VERIFY(2)), 20)   # plain rounds: their pass

    assert 1.5 < 2 * float(DRAFT(500)) < 1.7
    assert first_rounds(None)[0] == 2                       # full acceptance: an upper bound that opens
    assert first_rounds(np.full(8, 0.5)) == [0] * 20        # the shown acceptance keeps it shut
    assert first_rounds(np.full(8, 0.9))[0] == 2
    assert first_rounds(np.full(3, 0.9))[0] == 2            # depths beyond the memory: its deepest value


def test_batch_draft_length_tests_the_next_depth_before_writing_it_off():
    """Depth 1 accepted 38 times of 40, depth 2 rejected in both of its tries: the shrunk acceptance
    prices γ = 2 below γ = 1, and a chain of 1 never tests depth 2 again. The model drafts γ* + 1 = 2
    while depth 2 has had fewer than ``min_tries`` tries and would pay at the pooled acceptance; once
    it has failed them all, γ* = 1 stands. (Without the probe, ``min_tries = 0``, the model keeps γ = 1
    from the start — the trap measured at 2 requests on code.)"""
    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength
    from specbound.theory.speedup import best_batch_gamma

    def policy_after(depth2_failures, min_tries=None):
        policy = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), live=lambda: 2)
        if min_tries is not None:
            policy.min_tries = min_tries
        for _ in range(36):
            policy.observe(1, 1)
        for _ in range(2):
            policy.observe(1, 0)
        for _ in range(depth2_failures):
            policy.observe(2, 1)                   # depth 1 accepted, depth 2 rejected
        return policy

    early = policy_after(2)
    assert best_batch_gamma(early.alpha(), 2, DRAFT, VERIFY, early.max_gamma)[0] == 1   # the shrunk estimate
    assert early.model_gamma() == 2                                                   # depth 2 tested again
    assert policy_after(2, min_tries=0).model_gamma() == 1                            # the trap, for contrast
    assert policy_after(8).model_gamma() == 1                                         # tested enough: it fails


def test_batch_draft_length_prices_each_pass_size_by_its_own_passes():
    """Two rows: plain passes (2 tokens) measured 1.3× the one-row curve, γ = 4 passes (10 tokens) at
    0.9× it. The γ = 4 pass is priced at its own measured median, not at 1.3× the curve; a size never
    read is priced at the curve (the ratio capped at 1), and rows whose target passes run in turn keep
    the scaled curve."""
    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength
    from specbound.models.rows import PassRecord

    records = [PassRecord(1, 2, 2, 1.3 * float(VERIFY(2))) for _ in range(6)]
    records += [PassRecord(1, 2, 10, s * 0.9 * float(VERIFY(10))) for s in (0.98, 1.0, 1.02)]
    records += [PassRecord(1, 4, 10, 5.0), PassRecord(0, 2, 10, 5.0)]     # other rows / the draft: not priced
    policy = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), passes=lambda: records, live=lambda: 2)
    scaled = policy._scaled_costs()[1]
    by_size = policy._verify_by_size(2, scaled)
    assert float(by_size(10)) == pytest.approx(0.9 * float(VERIFY(10)))
    assert float(by_size(2)) == pytest.approx(1.3 * float(VERIFY(2)))
    assert float(by_size(6)) == pytest.approx(float(VERIFY(6)))            # never read: the curve, ratio ≤ 1
    assert float(scaled(10)) > 1.2 * float(VERIFY(10))                     # one ratio for all: the old price
    in_turn = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), passes=lambda: records, live=lambda: 2,
                               rows_shared=(True, False))
    assert in_turn._verify_by_size(2, scaled) is scaled


def test_batch_policy_tries_plain_rounds_only_where_they_could_keep_up(monkeypatch):
    """Drafting at 2 requests, every draft accepted, rounds costing their passes: drafted rounds measure
    ~1.8× what plain rounds could give even priced at their cheapest (t(2), no work outside the pass),
    so no round goes to a plain trial (before: a trial of plain rounds in the first few rounds and
    re-tries every ``explore_every`` · 2^k rounds, here forced back with an infinite margin)."""
    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength

    def seconds(g):
        return g * float(DRAFT(2)) + float(VERIFY(2 * (g + 1))) if g else float(VERIFY(2))

    assert (2 * 3 / seconds(2)) / (2 / float(VERIFY(2))) > 1.6
    policy = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), live=lambda: 2, start=2, trial=2, explore_every=8)
    chosen = _run_simulated_batch(monkeypatch, policy, seconds, 40)
    assert 0 not in chosen, chosen
    wary = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), live=lambda: 2, start=2, trial=2, explore_every=8)
    wary.plain_margin = float("inf")                # the old behaviour: plain rounds tried whatever drafting measured
    chosen = _run_simulated_batch(monkeypatch, wary, seconds, 40)
    assert 0 in chosen[:8] and chosen.count(0) >= 6, chosen


def test_batch_policy_prior_acceptance_is_the_drafts_own_confidence():
    """After one round in which one request accepted both drafts and the other neither, the pooled
    acceptance under a Beta(1, 1) prior is 0.6 and the model drafts 2; with the draft's confidence in
    its greedy tokens (0.95) as the prior's centre (weight 8) it is (2 + 8·0.95)/(3 + 8) = 0.873 and
    the model drafts longer chains."""
    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength

    plain = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), live=lambda: 2, start=2)
    sure = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), live=lambda: 2, start=2)
    for policy, conf in ((plain, None), (sure, [0.95, 0.95])):
        policy.gamma_for_round(1)
        policy.observe(2, 2, 1, conf)
        policy.observe(2, 0, 1, conf)
    assert plain._pooled() == pytest.approx(3 / 5)
    assert sure._pooled() == pytest.approx((2 + 8 * 0.95) / (3 + 8))
    assert sure.model_gamma() > plain.model_gamma() >= 1


def test_batch_policy_charges_one_slow_round_to_no_depth(monkeypatch):
    """Rounds of γ = 2 and γ = 4 whose passes the scheduler timed, 10 ms outside them, except one γ = 4
    round that took 300 ms more (a busy machine): the work per depth stays 0 and c₀ 10 ms (medians of the
    rounds' own time outside their passes). Before, the mean over rounds charged the outlier to c₁."""
    import time

    from specbound.decoding.costs import CostMeasurement
    from specbound.decoding.policy import BatchDraftLength
    from specbound.models.rows import PassRecord

    clock, records = [0.0], []
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    policy = BatchDraftLength(CostMeasurement(VERIFY, DRAFT), passes=lambda: records, live=lambda: 2,
                              explore_every=10_000)
    lengths = [2, 2, 4, 2, 4, 4, 2, 4, 2, 4, 2, 4, 2, 4]
    policy.model_gamma = lambda: lengths[(policy._deciding - 1) % len(lengths)]   # lengths imposed: only the
    policy.plain_margin = -1.0                                       # charging of rounds is tested
    for r in range(1, len(lengths) + 1):
        g = policy.gamma_for_round(r)
        assert g > 0
        policy.observe(g, g, r)
        policy.observe(g, g, r)
        records.extend([PassRecord(0, 2, 2, 0.030)] * g + [PassRecord(1, 2, 2 * (g + 1), 0.110)])
        clock[0] += 0.030 * g + 0.110 + 0.010 + (0.300 if r == 5 else 0.0)
    policy.gamma_for_round(len(lengths) + 1)
    assert {g for g in policy.rounds} == {2, 4}
    w_plain, c0, c1 = policy.round_overhead(2, *policy._round_costs(2))
    assert c0 == pytest.approx(0.010) and c1 == pytest.approx(0.0, abs=1e-9)


# ------------------------------------------------------------------ the perfect-draft bound
def test_perfect_draft_bound_by_hand():
    from specbound.theory.speedup import perfect_draft_throughput

    # t(k) = 1 s up to 4 tokens, then +1 s per token; 0.2 s per draft pass. By hand, γ + 1 tokens per round:
    # γ = 1: 2 / 1.2 = 1.67, γ = 2: 3 / 1.4 = 2.14, γ = 3: 4 / 1.6 = 2.50, γ = 4: 5 / (0.8 + 2) = 1.79 tok/s
    verify = CostProfile((1, 4, 5, 6), (1.0, 1.0, 2.0, 3.0))
    gamma, rate = perfect_draft_throughput(1, [0.2 * g for g in range(1, 9)], verify)
    assert (gamma, rate) == (3, pytest.approx(2.5))
    # a pass whose cost is proportional to its tokens: drafting can never beat plain rounds
    linear = CostProfile((1, 64), (0.1, 6.4))
    assert perfect_draft_throughput(4, [0.01 * g for g in range(1, 17)], linear) == (0, pytest.approx(4 / 0.4))
    # work outside the passes counts once per round on both sides
    gamma, rate = perfect_draft_throughput(1, [0.2 * g for g in range(1, 9)], verify, work=0.4)
    assert (gamma, rate) == (3, pytest.approx(4 / 2.0))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_drafter_of_the_same_cost_beats_the_perfect_draft(seed):
    """Chains of every γ at random acceptance, and trees (tokens ≤ depth + 1, at least depth draft passes,
    at least depth + 1 tokens read per request), priced with the same passes: all below the bound."""
    from specbound.theory.speedup import perfect_draft_throughput, shared_pass_throughput

    rng = np.random.default_rng(seed)
    for B in (1, 2, 4, 8):
        d_B = float(DRAFT(B))
        _, bound = perfect_draft_throughput(B, [g * d_B for g in range(1, 33)], VERIFY, work=0.002)
        for _ in range(50):
            gamma = int(rng.integers(1, 17))
            alpha = rng.uniform(0.0, 1.0, size=gamma)
            assert batch_throughput(alpha, gamma, B, DRAFT, VERIFY, (0.002, 0.002, 0.0005)) <= bound * (1 + 1e-12)
            depth = int(rng.integers(1, 12))
            nodes = depth + int(rng.integers(0, 40))
            value = rng.uniform(0.0, depth)                           # E[X | T] ≤ depth(T)
            tree = shared_pass_throughput(1 + value, B, depth * d_B * rng.uniform(1.0, 2.0), nodes + 1, VERIFY,
                                          work=0.002)
            assert float(tree) <= bound * (1 + 1e-12)
        # and the bound is reached: a chain whose every drafted token is accepted
        g, _ = perfect_draft_throughput(B, [g * d_B for g in range(1, 33)], VERIFY, work=0.002)
        if g:
            assert batch_throughput(np.ones(g), g, B, DRAFT, VERIFY, (0.002, 0.002, 0.0)) == pytest.approx(bound)


def test_perfect_draft_bad_input():
    from specbound.theory.speedup import perfect_draft_throughput

    for bad in ([], [0.1, -0.1], [float("nan")]):
        with pytest.raises(SpecboundError, match="draft_round_seconds"):
            perfect_draft_throughput(1, bad, VERIFY)
    with pytest.raises(SpecboundError, match="batch must be"):
        perfect_draft_throughput(0, [0.1], VERIFY)


def test_advise_batch_reports_the_perfect_draft_above_its_prediction():
    from specbound.advise import Setting, batch_advice

    chain = {g: Setting("chain", g, expected_tokens_per_step(0.8, g), g * float(DRAFT(1)), g + 1, 0.0)
             for g in range(1, 9)}
    oracle = {P: min(P, 3.0) for P in (1, 2, 4, 8, 16)}
    for B in (1, 2, 4, 32):
        b = batch_advice(B, chain, oracle, VERIFY, DRAFT)
        assert b.perfect_draft >= b.speculative * (1 - 1e-12) and b.perfect_draft >= b.plain * (1 - 1e-12)
        if b.perfect_draft_gamma == 0:
            assert b.gamma == 0 and b.perfect_draft == pytest.approx(b.plain)
