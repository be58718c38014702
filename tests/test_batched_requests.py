"""Several requests decoded together (decoding/batch.py): each request's output law is the target's
(χ² on exact chains, with a planted-bias mutant that must fail), each request's tokens equal the same
request decoded alone (greedy and, with its seed, at T > 0) on tiny transformers whose rows share
passes, a mutant row read that lets a stale KV slot into the softmax is caught, and bad input."""
import _thread
import threading

import numpy as np
import pytest
import torch

from helpers import (
    HF_BACKENDS, CharTokenizer, chain_models, chain_pair, chi_square_pvalue, encode, processed_chain, tiny_pair,
    tiny_transformer,
)
from specbound.decoding import SamplingConfig, speculative_decode
from specbound.decoding.batch import (
    BatchInterrupted, autoregressive_decode_batch, batch_cost_prior, check_batch_memory, speculative_decode_batch,
)
from specbound.decoding.costs import CostMeasurement
from specbound.decoding.engine import autoregressive_decode
from specbound.errors import SpecboundError
from specbound.models import ChainModel, LanguageModel
from specbound.models import static as static_module
from specbound.models.static import StaticCacheHFModel
from specbound.theory.speedup import CostProfile

P_MIN = 1e-3          # χ² significance level; seeds are fixed so each outcome is deterministic

# requests of different prompt lengths and horizons decoded together: (prompt, max_new_tokens)
REQUESTS = [([0], 3), ([2, 1, 3], 5), ([1, 1], 4)]


def _batch_samples(setting, runs=2000, **extra):
    """The first 3 tokens of every request over ``runs`` batch decodes with seeds 3·r .. 3·r + 2."""
    target, draft = chain_pair(31)
    tm, dm = ChainModel(target), ChainModel(draft)
    prompts = [p for p, _ in REQUESTS]
    budgets = [b for _, b in REQUESTS]
    out = np.empty((len(REQUESTS), runs, 3), dtype=np.int64)
    for r in range(runs):
        res = speculative_decode_batch(tm, dm, prompts, budgets, seed=len(REQUESTS) * r, **setting, **extra)
        for i, one in enumerate(res):
            out[i, r] = one.tokens[:3]
    config = SamplingConfig(setting["temperature"], setting.get("top_k"), setting.get("top_p"))
    laws = [processed_chain(target, config).sequence_law(p[-1], 3) for p in prompts]
    return laws, out


SETTINGS = [dict(temperature=0.8, top_k=3, gamma=2), dict(temperature=1.0, top_p=0.8, gamma=3)]


@pytest.mark.montecarlo
@pytest.mark.slow
@pytest.mark.parametrize("setting", SETTINGS, ids=["T=0.8,top_k=3", "top_p=0.8"])
def test_every_request_follows_the_target_law(setting):
    laws, samples = _batch_samples(setting)
    for law, s in zip(laws, samples):
        assert chi_square_pvalue(encode(s, 4), law) > P_MIN


@pytest.mark.montecarlo
@pytest.mark.slow
def test_chi_square_catches_a_biased_batch():
    # the same test on the same batches, decoded with a deliberately biased rule (Decoding-OPT, ε = 0.5)
    laws, samples = _batch_samples(SETTINGS[0], relaxation="opt:0.5")
    assert min(chi_square_pvalue(encode(s, 4), law) for law, s in zip(laws, samples)) < P_MIN


def test_a_request_decodes_as_it_would_alone_on_exact_chains():
    tm, dm = chain_models(5)
    prompts = [p for p, _ in REQUESTS]
    budgets = [b + 9 for _, b in REQUESTS]
    for kw in (dict(gamma=2), dict(tree=5), dict(tree=4, tree_drafter="sampled"), dict(drafts=3, gamma=2)):
        batch = speculative_decode_batch(tm, dm, prompts, budgets, temperature=0.9, seed=100, **kw)
        for i, (p, b) in enumerate(zip(prompts, budgets)):
            alone = speculative_decode(tm, dm, p, b, temperature=0.9, seed=100 + i, **kw)
            assert batch[i].tokens == alone.tokens, (kw, i)


# ------------------------------------------------------------------ rows that share passes
@pytest.fixture(scope="module")
def hf_pair():
    """The two torch modules of a tiny pair (draft noise 0.3); each test wraps them in the backend it needs."""
    return tiny_pair(0, noise=0.3, draft_seed=1)


HF_PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11, 12, 13], [4], [7, 7, 30]]
HF_BUDGETS = [18, 11, 24, 1]
DRAFTERS = [dict(gamma=3), dict(gamma="auto"), dict(tree=6), dict(tree=5, tree_drafter="sampled"),
            dict(drafts=2, gamma=2)]


def _alone(target, draft, i, budget=None, **kw):
    budget = HF_BUDGETS[i] if budget is None else budget
    return speculative_decode(target, draft, HF_PROMPTS[i], budget, seed=50 + i, **kw).tokens


# auto sizing follows measured times, so at T > 0 its random stream (not its law) may differ from a run alone
CASES = [(kw, t) for t in (0.0, 0.9) for kw in DRAFTERS if not (t > 0 and kw.get("gamma") == "auto")]


@pytest.mark.parametrize("kw,temperature", CASES,
                         ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else f"T={v}")
def test_rows_sharing_passes_decode_each_request_as_alone(hf_pair, kw, temperature):
    target, draft = (StaticCacheHFModel(m) for m in hf_pair)
    sampling = dict(temperature=temperature, top_k=None if temperature == 0 else 30, top_p=None)
    batch = speculative_decode_batch(target, draft, HF_PROMPTS, HF_BUDGETS, seed=50, **sampling, **kw)
    shared = [p for p in batch.passes if p.priority == 1 and p.rows > 1]
    assert shared, "no target pass was shared by two requests"
    for i in range(len(HF_PROMPTS)):
        assert batch[i].tokens == _alone(target, draft, i, **sampling, **kw), (kw, i)
        assert len(batch[i].tokens) == HF_BUDGETS[i]


def test_every_target_pass_holds_every_live_request(hf_pair):
    target, draft = (StaticCacheHFModel(m) for m in hf_pair)
    budgets = [12, 12, 12]
    batch = speculative_decode_batch(target, draft, HF_PROMPTS[:3], budgets, gamma=2, temperature=0, seed=1)
    target_passes = [p for p in batch.passes if p.priority == 1]
    # the first target pass holds every prefill; requests only leave, so the rows never grow back
    assert target_passes[0].rows == 3
    assert all(a.rows >= b.rows for a, b in zip(target_passes, target_passes[1:]))
    assert batch.target_passes == len(target_passes)
    assert batch.new_tokens == sum(budgets) and batch.tokens_per_second > 0
    assert 0 < batch.prefill_time < batch.wall_time
    assert batch.decode_tokens_per_second > batch.tokens_per_second


@pytest.mark.parametrize("kw", DRAFTERS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()))
def test_a_batch_prefill_is_its_targets_prompt_reads_for_every_drafter(hf_pair, monkeypatch, kw):
    """Every drafter of a batch reads its prompt into the draft at its first drafted round, inside the
    decode time: a batch's prefill is its target rows' prompt reads, whatever the method (γ = auto always
    drafted so; fixed lengths and trees read the prompt up front, so their decode rate left out a cost
    auto's carried). Checked: no draft row has read anything when its drafter starts, and every request's
    tokens are still those it decodes alone."""
    from specbound.decoding.drafters.base import Drafter

    target, draft = (StaticCacheHFModel(m) for m in hf_pair)
    read_at_start = []
    start = Drafter.start

    def recording_start(self, target_row, prompt):
        start(self, target_row, prompt)
        read_at_start.append(self.model.committed_length)

    monkeypatch.setattr(Drafter, "start", recording_start)
    prompts, budgets = HF_PROMPTS[:3], [6, 6, 6]
    batch = speculative_decode_batch(target, draft, prompts, budgets, temperature=0, seed=1, **kw)
    assert read_at_start == [0, 0, 0]
    for i in range(3):
        assert batch[i].tokens == _alone(target, draft, i, budget=6, temperature=0, **kw)


def test_plain_batched_decoding_equals_plain_decoding(hf_pair):
    target = StaticCacheHFModel(hf_pair[0])
    batch = autoregressive_decode_batch(target, HF_PROMPTS, HF_BUDGETS, temperature=0.7, top_p=0.9, seed=3)
    for i, p in enumerate(HF_PROMPTS):
        alone = autoregressive_decode(target, p, HF_BUDGETS[i], temperature=0.7, top_p=0.9, seed=3 + i)
        assert batch[i].tokens == alone.tokens
        assert batch[i].metrics.target_calls == HF_BUDGETS[i]


def test_rows_without_shared_passes_decode_the_same(hf_pair):
    # the dynamic-cache backend's rows run in turn (no shared pass): the same tokens
    target, draft = (HF_BACKENDS["dynamic-cache"](m) for m in hf_pair)
    batch = speculative_decode_batch(target, draft, HF_PROMPTS, HF_BUDGETS, gamma=3, temperature=0, seed=50)
    assert not batch.passes
    for i in range(len(HF_PROMPTS)):
        assert batch[i].tokens == _alone(target, draft, i, gamma=3, temperature=0)


def test_a_stale_kv_slot_in_the_softmax_is_caught(hf_pair, monkeypatch):
    """Planted trap (mlx-vlm #2113): a row read that lets every cached slot below its end into the
    softmax — the rejected tail of an earlier round included — must change some request's tokens."""
    target, draft = (StaticCacheHFModel(m) for m in hf_pair)
    honest = static_module.read_rows

    def stale_rows(reads):
        for r in reads:
            r.visible = torch.ones_like(r.visible)
        return honest(reads)

    expected = [_alone(target, draft, i, gamma=3, temperature=0) for i in range(len(HF_PROMPTS))]
    monkeypatch.setattr(static_module, "read_rows", stale_rows)
    batch = speculative_decode_batch(target, draft, HF_PROMPTS, HF_BUDGETS, gamma=3, temperature=0, seed=50)
    assert [r.tokens for r in batch] != expected


# ------------------------------------------------------------------ sizing
def test_batch_cost_prior_prices_the_shared_pass():
    m = CostMeasurement(CostProfile((1, 2, 4, 8, 16, 32, 64), (1.0, 1.0, 1.0, 1.1, 1.5, 2.4, 4.0)),
                        CostProfile((1, 2, 4, 8, 16, 32, 64), (0.2, 0.2, 0.21, 0.25, 0.4, 0.7, 1.2)))
    prior = batch_cost_prior(m, 4)
    assert prior.key is None                          # never written to the cost cache
    assert prior.target(2) == pytest.approx(m.target(8))
    assert prior.draft(4) == pytest.approx(m.draft(16))
    assert batch_cost_prior(m, 1).target(8) == pytest.approx(m.target(8))


# ------------------------------------------------------------------ bad input and faults
def test_bad_batches_are_refused_before_decoding(hf_pair):
    target, draft = (StaticCacheHFModel(m) for m in hf_pair)
    with pytest.raises(SpecboundError, match="prompt 1 is empty"):
        speculative_decode_batch(target, draft, [[1, 2], []], 4, gamma=2)
    with pytest.raises(SpecboundError, match="prompts is empty"):
        speculative_decode_batch(target, draft, [], 4, gamma=2)
    with pytest.raises(SpecboundError, match="prompt 1 .* exceeds the target's context"):
        speculative_decode_batch(target, draft, [[1], [2] * 500], 40, gamma=2)
    with pytest.raises(SpecboundError, match="max_new_tokens has 3 entries for 2 prompts"):
        speculative_decode_batch(target, draft, [[1], [2]], [4, 4, 4], gamma=2)
    with pytest.raises(SpecboundError, match="outside"):
        speculative_decode_batch(target, draft, [[1], [999]], 4, gamma=2)
    with pytest.raises(SpecboundError, match="vocabulary mismatch"):
        speculative_decode_batch(target, StaticCacheHFModel(tiny_transformer(2, vocab=40)), [[1]], 4, gamma=2)
    with pytest.raises(SpecboundError, match="gamma"):
        speculative_decode_batch(target, draft, [[1]], 4, gamma=0)


def test_a_batch_beyond_memory_is_refused_before_allocating(hf_pair):
    target, draft = (StaticCacheHFModel(m) for m in hf_pair)
    need = check_batch_memory(target, draft, [[1] * 10] * 4, [100] * 4, available=10 ** 12)
    assert need > 0
    with pytest.raises(SpecboundError, match="KV cache"):
        check_batch_memory(target, draft, [[1] * 10] * 4, [100] * 4, available=need)


def test_a_backend_without_rows_is_refused_clearly():
    target, draft = chain_pair(31)

    class NoRows(ChainModel):
        fork = LanguageModel.fork                     # the protocol's default: no rows

    with pytest.raises(SpecboundError, match="cannot decode several requests at once"):
        speculative_decode_batch(NoRows(target), ChainModel(draft), [[0], [1]], 3, gamma=2)


@pytest.fixture
def python_sigint():
    """Python's own Ctrl-C handler, as in a terminal: interrupt_main does nothing where SIGINT is ignored
    (a suite started as a background job of a non-interactive shell)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_returns_every_request_so_far(hf_pair, python_sigint):
    target, draft = (StaticCacheHFModel(m) for m in hf_pair)
    seen = {i: 0 for i in range(3)}
    fired = threading.Event()

    def callback(i, tokens):
        seen[i] += len(tokens)
        if seen[i] >= 6 and not fired.is_set():
            fired.set()
            _thread.interrupt_main()            # what Ctrl-C does: KeyboardInterrupt in the main thread

    with pytest.raises(BatchInterrupted) as info:
        speculative_decode_batch(target, draft, HF_PROMPTS[:3], [200, 200, 200], gamma=2, temperature=0,
                                 callback=callback)
    result = info.value.result
    assert result.interrupted and len(result) == 3
    for i, r in enumerate(result):
        assert r is not None and r.metrics.interrupted
        assert 0 < len(r.tokens) < 200
        assert r.tokens == _alone(target, draft, i, 200, gamma=2, temperature=0)[:len(r.tokens)]


def test_a_failing_request_names_itself_and_stops_the_batch(hf_pair):
    target, draft = (StaticCacheHFModel(m) for m in hf_pair)

    def callback(i, tokens):
        if i == 1:
            raise SpecboundError("the consumer of request 1 went away")

    with pytest.raises(SpecboundError, match="request 1: the consumer of request 1 went away"):
        speculative_decode_batch(target, draft, HF_PROMPTS[:3], [200, 200, 200], gamma=2, temperature=0,
                                 callback=callback)


# ------------------------------------------------------------------ the command line
def test_generate_decodes_several_prompts_as_one_batch(hf_pair, monkeypatch, capsys):
    import json

    from specbound.cli import main
    from specbound.models import loading

    target = StaticCacheHFModel(hf_pair[0], CharTokenizer(), name="tiny-target")
    draft = StaticCacheHFModel(hf_pair[1], CharTokenizer(), name="tiny-draft")
    monkeypatch.setattr(loading, "load_pair", lambda *a, **k: (target, draft))
    status = main(["generate", "--prompt-set", "builtin", "--index", "0,1,2", "--max-new-tokens", "9", "--gamma", "2",
                   "--threads", "1", "--baseline", "--json", "--target-precision", "int8"])
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    assert report["batch"] == 3 and len(report["requests"]) == 3
    assert all(q["new_tokens"] == 9 and q["identical_to_plain"] for q in report["requests"])
    assert report["tokens_per_second"] > 0 and report["target_passes"] >= 1


def test_bench_batch_study_on_tiny_models(hf_pair):
    from specbound.experiments.batched import BatchedConfig, markdown, run_batched

    target, draft = (StaticCacheHFModel(m) for m in hf_pair)
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
    config = BatchedConfig("tiny", 0, 4, 6, (1, 2, 4), ("auto", 2), hf_generate=False)
    result = run_batched(target, draft, prompts, ["a", "b", "c", "d"], config)
    assert {(r.batch, r.method) for r in result.rows} == {(B, m) for B in (1, 2, 4)
                                                          for m in ("plain", "sd γ=auto", "sd γ=2")}
    for r in result.rows:
        assert r.requests == 4 and r.identical == 4          # greedy: every request as plain decoding alone
        assert r.tokens_per_second > 0
        assert (r.predicted is not None) == (r.method in ("plain", "sd γ=2"))
    assert result.alpha is not None
    text = markdown(result, "specbound bench --batch 1,2,4")
    assert "| 4 | sd γ=2 |" in text and "batch_throughput" in text
    # per-request τ against the same request alone: a fixed γ at greedy drafts and accepts as alone
    from specbound.experiments.batched import tau_against_alone

    against = {(a.batch, a.method): a for a in tau_against_alone(result)}
    assert set(against) == {(B, m) for B in (2, 4) for m in ("sd γ=auto", "sd γ=2")}
    fixed = against[(4, "sd γ=2")]
    assert fixed.requests == 4 and fixed.low == fixed.high == 1.0 and fixed.drafted_per_round == fixed.drafted_alone
    assert "τ batch / τ alone" in text


def test_bench_batch_runs_hf_assisted_one_request_after_another(hf_pair):
    """HF assisted generation beside a batch, at batch 1 run B times: both assistant schedules, at the
    first B only (its rate does not depend on B), each request's greedy tokens those of plain decoding
    alone; the assistant's schedule is left as it was."""
    import types

    from specbound.experiments.batched import HF_ASSISTED, BatchedConfig, _hf_generate, markdown, run_batched

    target, draft = (StaticCacheHFModel(m) for m in hf_pair)
    target.tokenizer = types.SimpleNamespace(pad_token_id=0, eos_token_id=0)     # tiny models have none
    config = BatchedConfig("tiny", 0, 3, 5, (1, 2), (2,), hf_generate=False)
    before = draft.model.generation_config.num_assistant_tokens_schedule
    result = run_batched(target, draft, [[1, 2, 3, 4], [5, 6, 7], [8, 9]], ["a", "b", "c"], config, assistant=draft)
    assisted = [r for r in result.rows if r.method in HF_ASSISTED.values()]
    assert sorted(r.method for r in assisted) == sorted(HF_ASSISTED.values()) and {r.batch for r in assisted} == {1}
    assert all(r.requests == 3 and r.identical == 3 and r.tokens_per_second > 0 for r in assisted)
    assert draft.model.generation_config.num_assistant_tokens_schedule == before
    assert "HF assisted: Hugging Face assisted generation with the draft" in markdown(result)
    with pytest.raises(ValueError, match="one request at a time"):
        _hf_generate(target, [[1, 2], [3, 4]], 3, assistant=draft)


def test_bench_batch_repeats_pair_each_method_with_plain_of_its_own_repeat(hf_pair):
    """Hand-made runs: in repeat 0 the machine is slow (plain 10 tok/s decoding, γ = 2 at 15), in repeat 1
    fast (plain 20, γ = 2 at 40): the per-repeat ratios are 1.5 and 2.0, not ratios across repeats."""
    from specbound.experiments.batched import BatchedConfig, _repeat_ratios, _spread, run_batched

    def run(rep, method, tokens, seconds):
        return {"B": 2, "repeat": rep, "method": method, "new_tokens": tokens, "wall": seconds + 1.0, "prefill": 1.0}

    runs = [run(0, "plain", 20, 2.0), run(0, "sd γ=2", 30, 2.0), run(1, "plain", 40, 2.0), run(1, "sd γ=2", 80, 2.0)]
    assert _repeat_ratios(runs, 2, "sd γ=2", 2) == pytest.approx([1.5, 2.0])
    assert _spread([1.5, 2.0, 1.6]) == "1.60× (1.50–2.00)" and _spread([]) == "–"
    # on tiny models: every group of every B runs once per repeat, and each row has one ratio per repeat
    target, draft = (StaticCacheHFModel(m) for m in hf_pair)
    config = BatchedConfig("tiny", 0, 2, 4, (1, 2), (2,), hf_generate=False, repeats=2)
    result = run_batched(target, draft, [[1, 2, 3], [4, 5, 6, 7]], ["a", "b"], config)
    assert sorted((r["B"], r["repeat"]) for r in result.runs if r["method"] == "plain") == \
        [(1, 0), (1, 0), (1, 1), (1, 1), (2, 0), (2, 1)]
    for row in result.rows:
        assert len(row.repeat_ratios) == 2 and row.requests == 2 * row.batch * (2 // row.batch)
        assert row.identical == row.requests
    plain = [r for r in result.rows if r.method == "plain"]
    assert all(x == pytest.approx(1.0) for r in plain for x in r.repeat_ratios)


def test_bench_batch_puts_llama_cpp_beside_at_every_batch_size():
    """The llama.cpp reference rows: one request after another once (its rate does not depend on B), and
    B sequences per pass at every B > 1; none without the target's GGUF on llama.cpp."""
    from specbound.experiments.batched import LLAMACPP, LLAMACPP_BATCH, BatchedConfig, _llama_methods

    config = BatchedConfig(batches=(1, 2, 4))
    assert _llama_methods(object(), 1, config) == [LLAMACPP]
    assert _llama_methods(object(), 2, config) == [LLAMACPP_BATCH]
    assert _llama_methods(object(), 4, config) == [LLAMACPP_BATCH]
    assert _llama_methods(object(), 2, BatchedConfig(batches=(2, 4))) == [LLAMACPP, LLAMACPP_BATCH]
    assert _llama_methods(None, 2, config) == []


def test_tau_against_alone_pairs_each_request_with_itself():
    """Hand-made runs: request 'a' has τ 4 alone and 2 in the batch, 'b' 2 alone and 3 in the batch."""
    from specbound.experiments.batched import BatchedConfig, BatchedResult, tau_against_alone

    def req(prompt, tau, drafted):
        return {"prompt": prompt, "tau": tau, "drafted": drafted, "tokens": []}

    runs = [{"B": 1, "method": "sd γ=auto", "requests": [req("a", 4.0, 5.0)]},
            {"B": 1, "method": "sd γ=auto", "requests": [req("b", 2.0, 3.0)]},
            {"B": 1, "method": "plain", "requests": [req("a", 1.0, 0.0)]},
            {"B": 2, "method": "sd γ=auto", "requests": [req("b", 3.0, 1.0), req("a", 2.0, 1.0)]},
            {"B": 2, "method": "plain", "requests": [req("a", 1.0, 0.0), req("b", 1.0, 0.0)]}]
    result = BatchedResult(BatchedConfig(batches=(1, 2)), "t", "d", ["a", "b"], 1, {}, None, [], runs)
    (row,) = tau_against_alone(result)
    assert (row.batch, row.method, row.requests) == (2, "sd γ=auto", 2)
    assert row.mean == 1.0 and row.low == 0.5 and row.high == 1.5      # (2/4 + 3/2) / 2
    assert row.drafted_per_round == 1.0 and row.drafted_alone == 4.0


def test_rows_run_in_turn_are_priced_as_the_sum_of_their_reads():
    """llama.cpp rows (a context each) read one after another: a pass over B rows of k tokens costs
    B·c(k), not c(B·k); the batch prior and the throughput model price them so."""
    from specbound.theory.speedup import batch_throughput, expected_tokens_per_step, rows_pass_seconds

    d = CostProfile((1, 2, 4, 8, 16), (0.01, 0.012, 0.02, 0.04, 0.08))
    t = CostProfile((1, 2, 4, 8, 16, 32), (0.1, 0.1, 0.1, 0.11, 0.15, 0.24))
    assert float(rows_pass_seconds(d, 4, 2, shared=True)) == pytest.approx(float(d(8)))
    assert float(rows_pass_seconds(d, 4, 2, shared=False)) == pytest.approx(4 * float(d(2)))
    prior = batch_cost_prior(CostMeasurement(t, d), 4, rows_shared=(False, True))
    assert prior.draft(2) == pytest.approx(4 * float(d(2))) and prior.target(2) == pytest.approx(float(t(8)))
    alpha, gamma, B = 0.8, 3, 4
    by_hand = B * expected_tokens_per_step(alpha, gamma) / (gamma * B * float(d(1)) + float(t(B * (gamma + 1))))
    assert batch_throughput(alpha, gamma, B, d, t, draft_rows_shared=False) == pytest.approx(by_hand)
    assert batch_throughput(alpha, gamma, B, d, t) > by_hand          # shared draft passes cost less here


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_batch_policy_hears_the_drafts_confidence_in_greedy_chains_only(temperature, monkeypatch):
    """γ = auto for a batch: each greedy chain reports the draft's probability of every token it drafted
    (the prior of the batch's acceptance, BatchDraftLength._pooled) — on exact chains, the largest entry
    of the draft's row for the token before it; a sampled chain reports none (its tokens' probabilities
    are not a guess of their acceptance)."""
    from specbound.decoding.policy import BatchDraftLength

    heard = []
    original = BatchDraftLength.observe

    def observe(self, drafted, accepted, round_index=None, confidences=None):
        heard.append((drafted, confidences))
        return original(self, drafted, accepted, round_index, confidences)

    monkeypatch.setattr(BatchDraftLength, "observe", observe)
    target, draft = chain_pair(31)
    speculative_decode_batch(ChainModel(target), ChainModel(draft), [[0], [2, 1, 3]], 12, gamma="auto",
                             temperature=temperature, seed=1)
    drafted = [(n, c) for n, c in heard if n]
    assert drafted
    if temperature == 0.0:
        maxima = draft.transitions.max(axis=1)
        for n, conf in drafted:
            assert conf is not None and len(conf) == n
            assert all(np.isclose(maxima, q).any() for q in conf)
    else:
        assert all(c is None for _, c in drafted)


def test_hf_generate_in_a_batch_times_its_own_prefill(hf_pair):
    """``bench --batch``'s HF generate row: the prefill's share is the time until generate's first new
    tokens came out (a streamer's clock inside the same call), so it lies strictly inside the run, and
    its tokens are HF's own greedy continuation (equal to specbound's plain batch, token for token)."""
    from specbound.experiments.batched import _hf_generate

    from types import SimpleNamespace

    module = hf_pair[0]
    prompts = [HF_PROMPTS[0], HF_PROMPTS[3]]             # one length: no padding to reason about
    wrapped = SimpleNamespace(model=module, tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=0))
    seconds, prefill, outs = _hf_generate(wrapped, prompts, 5)
    assert 0 < prefill < seconds
    plain = autoregressive_decode_batch(StaticCacheHFModel(module), prompts, 5, temperature=0)
    assert [list(r.tokens) for r in plain] == outs
