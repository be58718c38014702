"""The bench report on a tiny HF pair: runs end to end, counts assisted target calls, writes files."""
import json

import torch

from helpers import perturbed_copy, tiny_transformer
from specbound.experiments.bench import BenchConfig, markdown_table, run_bench, write_report
from specbound.assets.prompts import Prompt
from specbound.models.hf import HFModel


class CharTokenizer:
    """Just enough tokenizer for the bench: characters → ids below 48."""
    eos_token_id = 0
    chat_template = None

    def __call__(self, text, return_tensors="pt"):
        return type("Enc", (), {"input_ids": torch.tensor([[1 + ord(c) % 47 for c in text]])})()


def test_bench_runs_on_tiny_models(tmp_path):
    target_model = tiny_transformer(0, vocab=48)
    target = HFModel(target_model, CharTokenizer(), name="tiny-target")
    draft = HFModel(perturbed_copy(target_model, 0.3, seed=1), CharTokenizer(), name="tiny-draft")
    prompts = [Prompt(id="p0", text="def f(x):", kind="code"), Prompt(id="p1", text="return x", kind="code")]
    report = run_bench(target, draft, prompts, BenchConfig(n_prompts=2, max_new_tokens=12, gamma=3), progress=False)
    assert len(report["rows"]) == 4
    for row in report["rows"]:
        assert row["hf-generate"]["target_calls"] == 12          # prefill + 11 more decode steps
        assert row["hf-assisted"]["tau"] >= 1.0
        if row["mode"] == "greedy":
            assert row["identical_to_generate"]
    json_path, md_path = write_report(report, tmp_path)
    assert json.loads(json_path.read_text())["summary"]["greedy"]["identical_to_generate"] == 2
    assert "vs assisted" in markdown_table(report)
