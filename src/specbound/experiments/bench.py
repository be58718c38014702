"""`specbound bench`: specbound against what users would pick instead, side by side in ONE process.

Per prompt and decoding mode (greedy, sampled) the methods run interleaved, in an order rotated per
prompt so slow drifts of a noisy machine do not favour one method:

* ``hf-generate``  — the target's own ``generate`` (plain autoregressive decoding);
* ``hf-assisted``  — Hugging Face assisted generation, ``generate(assistant_model=draft)``, defaults;
* ``specbound``    — specbound chain speculative decoding (γ from the cost model by default).

All methods decode exactly ``max_new_tokens`` tokens (EOS ignored) so they do the same work, and
every timing includes the prompt's prefill. Ratios are taken per prompt, then summarised by the
median (and minimum) over prompts. This is a benchmark: it prints and writes numbers, it asserts
nothing about speed.
"""
from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..decoding import speculative_decode

METHODS = ("hf-generate", "hf-assisted", "specbound")
MODES = {"greedy": dict(temperature=0.0, top_k=None), "sampled": dict(temperature=1.0, top_k=50)}


@dataclass
class BenchConfig:
    prompt_set: str = "humaneval"
    n_prompts: int = 5
    max_new_tokens: int = 128
    modes: tuple[str, ...] = ("greedy", "sampled")
    gamma: object = "auto"
    seed: int = 0
    notes: dict = field(default_factory=dict)


def _hf_generate(model_wrapper, ids, n, mode, seed, assistant=None):
    settings = MODES[mode]
    kwargs = dict(max_new_tokens=n, min_new_tokens=n, pad_token_id=model_wrapper.tokenizer.eos_token_id,
                  attention_mask=torch.ones_like(ids))
    if settings["temperature"] == 0:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kwargs.update(do_sample=True, temperature=settings["temperature"], top_k=settings["top_k"], top_p=None)
    if assistant is not None:
        kwargs["assistant_model"] = assistant.model
    calls = [0]
    hook = model_wrapper.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            out = model_wrapper.model.generate(ids, **kwargs)
    finally:
        hook.remove()
    seconds = time.perf_counter() - t0
    tokens = out[0, ids.shape[1]:].tolist()
    # tokens per target forward (every HF forward, the prefill included, yields >= 1 token): 1 for generate
    tau = len(tokens) / max(calls[0], 1)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_second": len(tokens) / seconds, "tau": tau,
            "target_calls": calls[0]}


def _specbound(target, draft, ids, n, mode, seed, gamma):
    settings = MODES[mode]
    res = speculative_decode(target, draft, ids, n, gamma=gamma, temperature=settings["temperature"],
                             top_k=settings["top_k"], seed=seed)
    m = res.metrics
    return {"tokens": res.tokens, "seconds": m.total_time, "tokens_per_second": m.tokens_per_second,
            "tau": m.tau, "target_calls": m.target_calls, "mean_gamma": sum(m.drafted_per_step) / len(m.drafted_per_step),
            "plain_steps": m.drafted_per_step.count(0), "draft_time": m.draft_time, "target_time": m.target_time,
            "acceptance_per_position": m.acceptance_per_position[:8]}


def run_bench(target, draft, prompts, config: BenchConfig, assistant=None, progress=True) -> dict:
    """Run the interleaved benchmark. ``assistant`` is the draft HF assisted generation uses
    (default: ``draft``); specbound may use a cheaper (e.g. int8) copy of the same draft."""
    from rich.progress import Progress

    from ..assets.prompts import format_prompt

    assistant = assistant or draft
    rows = []
    total = len(prompts) * len(config.modes) * len(METHODS)
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("bench", total=total)
        # warm-up: page in weights, calibrate specbound's cost model once (cached afterwards)
        warm = target.tokenizer("def f(x):\n", return_tensors="pt").input_ids
        speculative_decode(target, draft, warm, 8, gamma=config.gamma, temperature=0.0)
        _hf_generate(target, warm, 4, "greedy", 0, assistant)
        _hf_generate(target, warm, 4, "greedy", 0)
        for i, prompt in enumerate(prompts):
            ids = target.tokenizer(format_prompt(target.tokenizer, prompt), return_tensors="pt").input_ids
            for mode in config.modes:
                order = METHODS[i % 3:] + METHODS[:i % 3]
                results = {}
                for method in order:
                    bar.update(task, description=f"{prompt.id} {mode} {method}")
                    if method == "hf-generate":
                        results[method] = _hf_generate(target, ids, config.max_new_tokens, mode, config.seed + i)
                    elif method == "hf-assisted":
                        results[method] = _hf_generate(target, ids, config.max_new_tokens, mode, config.seed + i,
                                                       assistant)
                    else:
                        results[method] = _specbound(target, draft, ids, config.max_new_tokens, mode,
                                                     config.seed + i, config.gamma)
                    bar.advance(task)
                row = {"prompt": prompt.id, "kind": prompt.kind, "mode": mode, "prompt_tokens": ids.shape[1],
                       "order": list(order)}
                for method, r in results.items():
                    row[method] = {k: v for k, v in r.items() if k != "tokens"}
                sb = results["specbound"]["tokens_per_second"]
                row["speedup_vs_generate"] = sb / results["hf-generate"]["tokens_per_second"]
                row["speedup_vs_assisted"] = sb / results["hf-assisted"]["tokens_per_second"]
                if mode == "greedy":
                    row["identical_to_generate"] = results["specbound"]["tokens"] == results["hf-generate"]["tokens"]
                    row["assisted_identical_to_generate"] = (results["hf-assisted"]["tokens"]
                                                             == results["hf-generate"]["tokens"])
                rows.append(row)
    return {"config": asdict(config), "machine": _machine(), "target": target.name, "draft": draft.name,
            "assistant": assistant.name, "target_backend": target.info.kernels,
            "draft_backend": draft.info.kernels,
            "assistant_backend": assistant.info.kernels,
            "rows": rows, "summary": summarise(rows)}


def _machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor(), "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def summarise(rows) -> dict:
    out = {}
    for mode in sorted({r["mode"] for r in rows}):
        sel = [r for r in rows if r["mode"] == mode]
        entry = {"prompts": len(sel)}
        for method in METHODS:
            entry[f"{method}_tokens_per_second_median"] = statistics.median(r[method]["tokens_per_second"] for r in sel)
        for ratio in ("speedup_vs_generate", "speedup_vs_assisted"):
            values = [r[ratio] for r in sel]
            entry[ratio] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        entry["tau_median"] = statistics.median(r["specbound"]["tau"] for r in sel)
        entry["assisted_tau_median"] = statistics.median(r["hf-assisted"]["tau"] for r in sel)
        if mode == "greedy":
            entry["identical_to_generate"] = sum(r["identical_to_generate"] for r in sel)
        out[mode] = entry
    return out


def markdown_table(report: dict) -> str:
    lines = [f"target `{report['target']}` ({report['target_backend']}), specbound draft `{report['draft']}` "
             f"({report['draft_backend']}), HF assistant ({report['assistant_backend']}); "
             f"{report['config']['max_new_tokens']} new tokens; torch threads {report['machine']['threads']}", "",
             "| prompt | mode | HF generate tok/s | HF assisted tok/s | specbound tok/s | vs generate | vs assisted "
             "| τ assisted | τ specbound | mean γ | greedy identical |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        ident = {True: "yes", False: "NO"}.get(r.get("identical_to_generate"), "-")
        lines.append(f"| {r['prompt']} | {r['mode']} | {r['hf-generate']['tokens_per_second']:.2f} | "
                     f"{r['hf-assisted']['tokens_per_second']:.2f} | {r['specbound']['tokens_per_second']:.2f} | "
                     f"{r['speedup_vs_generate']:.2f}× | {r['speedup_vs_assisted']:.2f}× | "
                     f"{r['hf-assisted']['tau']:.2f} | {r['specbound']['tau']:.2f} | {r['specbound']['mean_gamma']:.2f} | {ident} |")
    lines.append("")
    for mode, s in report["summary"].items():
        lines.append(f"**{mode}** (median over {s['prompts']} prompts): specbound "
                     f"{s['speedup_vs_generate']['median']:.2f}× HF generate (min {s['speedup_vs_generate']['min']:.2f}×), "
                     f"{s['speedup_vs_assisted']['median']:.2f}× HF assisted (min {s['speedup_vs_assisted']['min']:.2f}×), "
                     f"τ {s['tau_median']:.2f} (HF assisted {s['assisted_tau_median']:.2f})"
                     + (f", greedy outputs identical on {s['identical_to_generate']}/{s['prompts']}" if mode == "greedy" else ""))
    return "\n".join(lines) + "\n"


def write_report(report: dict, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path, md_path = out_dir / f"bench-{stamp}.json", out_dir / f"bench-{stamp}.md"
    json_path.write_text(json.dumps(report, indent=2))
    md_path.write_text(markdown_table(report))
    return json_path, md_path
