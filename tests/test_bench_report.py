"""The bench on a tiny HF pair: every method runs end to end, HF target forwards are counted, greedy
outputs match plain generate, the journal resumes, and the report is written."""
import copy
import json

from helpers import CharTokenizer, tiny_pair
from specbound.assets.prompts import Prompt
from specbound.experiments.bench import (BENCH_METHODS, COMPILED_METHODS, LLAMACPP_METHODS, BenchConfig, BenchResult,
                                         run_bench)

TORCH_METHODS = tuple(m for m in BENCH_METHODS if m not in LLAMACPP_METHODS + COMPILED_METHODS)   # compiled: test_compiled
from specbound.experiments.bench_report import bench_markdown
from specbound.measure.journal import PartialResults
from specbound.experiments.report import from_jsonable, to_jsonable
from specbound.models.int8 import quantize_int8
from specbound.models.hf import HFModel


def _models():
    target_model, draft_model = tiny_pair(0, 48, noise=0.3, draft_seed=1)
    int8 = quantize_int8(copy.deepcopy(draft_model))
    tokenizer = CharTokenizer(eos_token_id=0)
    return {"target": HFModel(target_model, tokenizer, name="tiny-target"),
            "draft_fp32": HFModel(draft_model, tokenizer, name="tiny-draft"),
            "draft_int8": HFModel(int8, tokenizer, name="tiny-draft-int8")}


def test_bench_runs_every_method_and_resumes(tmp_path):
    models = _models()
    prompts = [Prompt(id="p0", text="def f(x): return f(x)", kind="code"),
               Prompt(id="p1", text="return x + x + x", kind="code")]
    config = BenchConfig("tiny", 0, 2, 12, ("greedy", "sampled"), TORCH_METHODS)
    journal = PartialResults(tmp_path / "partial.jsonl", {"c": 1})
    result = run_bench(models, prompts, config, journal, progress=False)
    assert len(result.rows) == 4
    for row in result.rows:
        assert set(row.runs) == set(TORCH_METHODS)
        assert all(r.decode_tokens_per_second > 0 for r in row.runs.values())
        assert row.runs["hf-generate"].target_calls == 12          # prefill + 11 more decode steps
        assert all(r.tau >= 1.0 for r in row.runs.values())
        if row.mode == "greedy":                                   # every method is lossless at greedy
            assert all(r.identical for r in row.runs.values()), {m: r.identical for m, r in row.runs.items()}
    summary = result.summary["greedy"]
    assert summary["best_assisted_int8"] in ("hf-assisted-int8", "hf-assisted-int8-heuristic")
    assert summary["methods"]["specbound-tree"]["vs_assisted_int8"]["median"] > 0
    # resume: every (prompt, mode) comes from the journal, nothing is re-measured
    again = PartialResults(tmp_path / "partial.jsonl", {"c": 1}, resume=True)
    run_bench(models, prompts, config, again, progress=False)
    assert again.reused == 4
    back = from_jsonable(BenchResult, json.loads(json.dumps(to_jsonable(result))))
    assert back.rows[0].runs["hf-generate"].target_calls == 12
    text = bench_markdown(result, "specbound bench --test")
    assert "vs HF assisted-int8 (best)" in text and "specbound-tree" in text


def test_greedy_identity_stops_at_the_answers_end():
    from specbound.experiments.bench import same_greedy_answer
    eos = {9}
    ref = [1, 2, 3, 4, 5]                                   # HF with min_new_tokens: EOS masked
    assert same_greedy_answer([1, 2, 3, 4, 5], ref, eos)
    assert same_greedy_answer([1, 2, 9, 7, 7], ref, eos)     # answer ended where HF had to go on
    assert not same_greedy_answer([1, 2, 4, 9, 7], ref, eos)  # differs before the end
    assert not same_greedy_answer([1, 2, 3, 4], ref, eos)     # shorter without an end
    assert not same_greedy_answer([1, 2, 3, 4, 6], ref, eos)
