"""`specbound bench --seeds S`: paired seeds per sampled prompt, and the paired summary (ratios with
standard errors and 95% intervals) checked on synthetic runs whose answer is known."""
import json
import math
import random
import statistics

import pytest

from helpers import CharTokenizer
from specbound.assets.prompts import Prompt
from specbound.experiments import bench
from specbound.experiments.bench import (BenchConfig, BenchResult, BenchRow, MethodRun, _pooled_log_ratio,
                                         _ratio_of_means, paired_summary, run_bench, summarise)
from specbound.experiments.bench_report import bench_markdown
from specbound.measure.journal import PartialResults
from specbound.experiments.report import from_jsonable, to_jsonable
from specbound.seeds import derive_seed


def _run(tps: float, tau: float = 1.0) -> MethodRun:
    return MethodRun(96 / tps, tps, tau, 1, decode_tokens_per_second=tps)


def _rows(true_ratio: float, noise_sd: float, prompts: int = 8, seeds: int = 4, prompt_sd: float = 0.0,
          rng_seed: int = 0) -> list[BenchRow]:
    """hf-generate at a per-prompt base speed with seed noise; specbound-chain = true_ratio × that, times
    log-normal noise of SD ``noise_sd`` per (prompt, seed) and ``prompt_sd`` per prompt."""
    rng = random.Random(rng_seed)
    rows = []
    for p in range(prompts):
        base = rng.uniform(5.0, 15.0)
        shift = rng.gauss(0.0, prompt_sd)
        for s in range(seeds):
            ref = base * math.exp(rng.gauss(0.0, 0.1))
            row = BenchRow(f"p{p}", "sampled", 10, ["hf-generate", "specbound-chain"], seed_index=s)
            row.runs["hf-generate"] = _run(ref, 1.0)
            row.runs["specbound-chain"] = _run(ref * true_ratio * math.exp(shift + rng.gauss(0.0, noise_sd)), 2.0)
            rows.append(row)
    return rows


def test_a_true_speed_up_of_1_2_is_inside_the_interval_and_1_0_is_outside():
    paired = paired_summary(_rows(1.2, 0.05))
    c = paired["comparisons"]["specbound-chain"]["vs_generate"]
    pooled = c["pooled"]
    assert pooled["low"] < 1.2 < pooled["high"]
    assert pooled["low"] > 1.0
    assert abs(pooled["ratio"] - 1.2) < 0.05
    assert (pooled["n"], pooled["prompts"], pooled["seeds"]) == (32, 8, 4)
    assert len(c["per_prompt"]) == 8
    for e in c["per_prompt"]:
        assert e["seeds"] == 4 and e["se"] > 0 and abs(e["ratio"] - 1.2) < 4 * e["se"] + 0.02
    assert paired["median_tau"] == {"hf-generate": 1.0, "specbound-chain": 2.0}
    assert paired["seeds"] == 4 and paired["prompts"] == 8


def test_no_difference_gives_an_interval_containing_1():
    for rng_seed in range(5):
        pooled = paired_summary(_rows(1.0, 0.05, rng_seed=rng_seed))["comparisons"]["specbound-chain"]["vs_generate"]["pooled"]
        assert pooled["low"] < 1.0 < pooled["high"], pooled


@pytest.mark.montecarlo
def test_the_pooled_interval_covers_the_truth_about_95_percent_of_the_time():
    """Prompt-to-prompt spread as well as seed noise: the clustered SE and the t quantile keep coverage."""
    rng = random.Random(1)
    hits, trials = 0, 400
    for _ in range(trials):
        logs = {}
        for p in range(8):
            shift = rng.gauss(0.0, 0.05)
            logs[f"p{p}"] = [math.log(1.2) + shift + rng.gauss(0.0, 0.05) for _ in range(3)]
        pooled = _pooled_log_ratio(logs)
        hits += pooled["low"] < 1.2 < pooled["high"]
    assert 0.90 <= hits / trials <= 0.99, hits / trials


@pytest.mark.montecarlo
def test_the_delta_method_se_matches_the_spread_of_the_ratio_of_means():
    rng = random.Random(2)
    ratios, ses = [], []
    for _ in range(2000):
        b = [10 * math.exp(rng.gauss(0, 0.1)) for _ in range(6)]
        a = [1.2 * x * math.exp(rng.gauss(0, 0.08)) for x in b]       # paired: a moves with b
        r, se = _ratio_of_means(a, b)
        ratios.append(r)
        ses.append(se)
    spread = statistics.stdev(ratios)
    assert 0.8 < statistics.fmean(ses) / spread < 1.2
    assert _ratio_of_means([2.0], [1.0]) == (2.0, None)


def test_one_prompt_falls_back_to_the_seeds_and_one_pair_has_no_interval():
    one = _pooled_log_ratio({"p": [0.1, 0.2, 0.15]})
    assert one["se_log_ratio"] > 0 and one["low"] < math.exp(0.15) < one["high"]
    single = _pooled_log_ratio({"p": [0.1]})
    assert single["se_log_ratio"] is None and single["low"] is None


def test_references_best_assisted_and_llamacpp_are_compared_when_present():
    rows = _rows(1.2, 0.05, prompts=3, seeds=2)
    for r in rows:
        base = r.runs["hf-generate"].tokens_per_second
        r.runs["hf-assisted-int8"] = _run(base * 1.1)
        r.runs["hf-assisted-int8-heuristic"] = _run(base * 0.9)
        r.runs["llamacpp-plain"] = _run(base * 2.0)
    paired = paired_summary(rows)
    assert paired["best_assisted_int8"] == "hf-assisted-int8"
    comps = paired["comparisons"]["specbound-chain"]
    assert set(comps) == {"vs_generate", "vs_assisted_int8", "vs_llamacpp"}
    assert abs(comps["vs_assisted_int8"]["pooled"]["ratio"] - 1.2 / 1.1) < 0.05
    assert comps["vs_llamacpp"]["measure"] == "decode_tokens_per_second"
    assert abs(comps["vs_llamacpp"]["pooled"]["ratio"] - 0.6) < 0.03


def test_summarise_adds_the_paired_section_only_with_several_seeds():
    rows = _rows(1.2, 0.05, prompts=3, seeds=3)
    assert "paired" in summarise(rows)["sampled"]
    assert "paired" not in summarise([r for r in rows if r.seed_index == 0])["sampled"]


@pytest.fixture
def fake_methods(monkeypatch):
    """run_method replaced by a recorder: (method, mode, seed) of every call, a speed that depends on the seed."""
    calls = []

    def fake(method, models, ids, n, sampling, seed):
        if n == 4:                              # the warm-up
            return [1] * n, _run(1.0)
        calls.append((method, "greedy" if sampling.greedy else "sampled", seed))
        speed = 10.0 + seed % 7 + (2.0 if method.startswith("specbound") else 0.0)
        return [1] * n, _run(speed, 2.0 if method.startswith("specbound") else 1.0)

    monkeypatch.setattr(bench, "run_method", fake)
    monkeypatch.setattr(bench, "stop_token_ids", lambda target: [0])
    return calls


def test_seeds_are_paired_rotated_and_journaled_per_seed(fake_methods, tmp_path):
    models = {"target": type("T", (), {"tokenizer": CharTokenizer(eos_token_id=0), "name": "fake"})()}
    prompts = [Prompt(id="p0", text="def f(x):", kind="code"), Prompt(id="p1", text="return x", kind="code")]
    methods = ("hf-generate", "hf-assisted-int8", "specbound-chain")
    config = BenchConfig("tiny", 0, 2, 8, ("greedy", "sampled"), methods, seed=5, seeds=3)
    journal = PartialResults(tmp_path / "partial.jsonl", {"bench": to_jsonable(config)})
    result = run_bench(models, prompts, config, journal, progress=False)
    assert len(result.rows) == 2 * (1 + 3)                          # greedy once, sampled three times
    assert set(journal.units) == {"p0|greedy", "p1|greedy"} | {f"p{i}|sampled|{s}" for i in (0, 1) for s in range(3)}
    sampled = [c for c in fake_methods if c[1] == "sampled"]
    unit_seeds = set()
    for i in (0, 1):
        for s in range(3):
            unit = sampled[(i * 3 + s) * 3:(i * 3 + s + 1) * 3]
            assert {seed for _, _, seed in unit} == {derive_seed(5, "bench", f"p{i}", s)}   # every method, the same seed
            assert [m for m, _, _ in unit] == list(methods[(i + s) % 3:] + methods[:(i + s) % 3])
            unit_seeds.add(unit[0][2])
    assert len(unit_seeds) == 6                                     # every other unit draws its own stream
    paired = result.summary["sampled"]["paired"]
    assert "greedy" in result.summary and "paired" not in result.summary["greedy"]
    pooled = paired["comparisons"]["specbound-chain"]["vs_generate"]["pooled"]
    assert pooled["n"] == 6 and pooled["ratio"] > 1.0
    # resume reuses every unit; the JSON carries the paired numbers; the markdown shows them
    again = PartialResults(tmp_path / "partial.jsonl", {"bench": to_jsonable(config)}, resume=True)
    run_bench(models, prompts, config, again, progress=False)
    assert again.reused == 8
    data = json.loads(json.dumps(to_jsonable(result)))
    assert data["summary"]["sampled"]["paired"]["comparisons"]["specbound-chain"]["vs_generate"]["pooled"]["n"] == 6
    back = from_jsonable(BenchResult, data)
    assert back.config.seeds == 3 and {r.seed_index for r in back.rows} == {0, 1, 2}
    text = bench_markdown(result, "specbound bench --seeds 3")
    assert "95% CI" in text and "n = 2 prompts × 3 seeds" in text and "Seeds are paired" in text
    assert "p1 #2" in text and " ± " in text


def test_one_seed_keeps_the_old_keys_and_draws_repeat_zero(fake_methods, tmp_path):
    models = {"target": type("T", (), {"tokenizer": CharTokenizer(eos_token_id=0), "name": "fake"})()}
    prompts = [Prompt(id="p0", text="def f(x):", kind="code"), Prompt(id="p1", text="return x", kind="code")]
    config = BenchConfig("tiny", 0, 2, 8, ("sampled",), ("hf-generate", "specbound-chain"), seed=5)
    journal = PartialResults(None, {})
    result = run_bench(models, prompts, config, journal, progress=False)
    assert [r.seed_index for r in result.rows] == [0, 0]
    assert {seed for _, _, seed in fake_methods} == {derive_seed(5, "bench", p, 0) for p in ("p0", "p1")}
    assert "paired" not in result.summary["sampled"]
    assert "95% CI" not in bench_markdown(result)
