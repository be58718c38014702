"""The commands only parse, run a study and write: `bench` and `bench --batch` end to end on tiny models
(the studies' loaders replaced), the journal's fingerprint and the files they write."""
import copy
import json

import torch

from helpers import tiny_pair
from specbound.cli import main
from specbound.experiments import batched, bench
from specbound.models.hf import HFModel
from specbound.models.int8 import quantize_int8
from specbound.models.loading import resolve_target_precision
from specbound.seeds import derive_seed


class _Tokenizer:
    """Characters → ids 1..47, as the bench (tensors) and ``encode_prompts`` (plain lists) call it."""

    eos_token_id, pad_token_id, chat_template = 0, None, None

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        ids = [1 + ord(c) % 47 for c in text[:40]]
        if return_tensors:
            return type("Enc", (), {"input_ids": torch.tensor([ids])})()
        return {"input_ids": ids}


def _models():
    target_model, draft_model = tiny_pair(0, 48, noise=0.3, draft_seed=1)
    tokenizer = _Tokenizer()
    return {"target": HFModel(target_model, tokenizer, name="tiny-target"),
            "draft_int8": HFModel(quantize_int8(copy.deepcopy(draft_model)), tokenizer, name="tiny-draft-int8")}


def test_bench_command_runs_the_study_and_writes_its_report(tmp_path, monkeypatch):
    asked, seeds = [], []
    models = _models()
    real = bench.run_method

    def recording(method, models_, ids, n, sampling, seed):
        seeds.append((method, seed))
        return real(method, models_, ids, n, sampling, seed)

    monkeypatch.setattr(bench, "load_models", lambda methods, pair: asked.append((methods, pair)) or models)
    monkeypatch.setattr(bench, "run_method", recording)
    argv = ["bench", "--prompt-set", "builtin", "--offset", "0", "--n-prompts", "2", "--max-new-tokens", "5",
            "--methods", "hf-generate,specbound-chain", "--modes", "sampled", "--seeds", "2", "--seed", "3",
            "--threads", "1", "--no-progress", "--out", str(tmp_path)]
    default = resolve_target_precision(None)          # kquant where the K-quant kernel builds, else int8
    assert main(argv + ["--target-precision", default]) == 0      # given: no timing of the packaged models
    (methods, pair), = asked
    assert methods == ("hf-generate", "specbound-chain") and pair == bench.PairSpec(None, None, default, compiled=True)
    data = json.loads((tmp_path / "bench-builtin-sampled.json").read_text())
    assert len(data["rows"]) == 4 and (tmp_path / "bench-builtin-sampled.md").is_file()
    assert not (tmp_path / "partial.jsonl").exists()                 # the journal is gone once the report is written
    prompts = [row["prompt"] for row in data["rows"]]
    measured = [seed for method, seed in seeds[2:]]                   # after the two warm-up calls
    expected = [derive_seed(3, "bench", p, s) for p in dict.fromkeys(prompts) for s in range(2) for _ in range(2)]
    assert measured == expected                                       # both methods of a unit: one seed


def test_bench_batch_command_runs_the_study(tmp_path, monkeypatch, capsys):
    from specbound.models import loading
    from specbound.models.static import StaticCacheHFModel

    target_model, draft_model = tiny_pair(0, 48, noise=0.3, draft_seed=1)
    pair = (StaticCacheHFModel(target_model, _Tokenizer(), name="tiny-target"),
            StaticCacheHFModel(draft_model, _Tokenizer(), name="tiny-draft"))
    monkeypatch.setattr(loading, "load_pair", lambda *a, **k: pair)
    monkeypatch.setattr(loading, "load_gguf_model", lambda *a, **k: None)     # no llama.cpp row: no real model
    cost_curve = batched.measure_costs
    monkeypatch.setattr(batched, "measure_costs", lambda t, d, repeats: cost_curve(t, d, ks=(1, 2, 4, 8), repeats=1))
    argv = ["bench", "--batch", "1,2", "--gammas", "2", "--prompt-set", "builtin", "--offset", "0", "--n-prompts", "2",
            "--max-new-tokens", "4", "--threads", "1", "--out", str(tmp_path), "--target-precision", "int8"]
    assert main(argv) == 0
    data = json.loads((tmp_path / "batched-builtin.json").read_text())
    assert data["config"]["batches"] == [1, 2] and data["config"]["gammas"] == [2] and len(data["prompts"]) == 2
    assert {(r["batch"], r["method"]) for r in data["rows"]} >= {(B, m) for B in (1, 2) for m in ("plain", "sd γ=2")}
    assert (tmp_path / "batched-builtin.md").read_text() in capsys.readouterr().out
