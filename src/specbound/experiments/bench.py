"""`specbound bench`: specbound against the strongest configuration of each peer, side by side in ONE process.

Methods (all decode exactly ``max_new_tokens`` tokens, EOS ignored, timings include the prefill):

* ``hf-generate`` — the target's own ``generate`` (plain decoding);
* ``hf-assisted-fp32`` — Hugging Face assisted generation with the fp32 draft, its defaults;
* ``hf-assisted-int8`` / ``hf-assisted-int8-heuristic`` — the SAME int8 draft specbound uses, with
  HF's default schedule (up to 20 tokens, confidence 0.4) and with its ``heuristic`` schedule; the
  better of the two per prompt set is the reference ("HF assisted-int8, best");
* ``hf-lookup`` — Hugging Face prompt-lookup decoding (10 tokens, n-gram 2, its documented setting);
* ``specbound-chain`` — chain SD, draft length sized every round (``gamma="auto"``);
* ``specbound-tree`` — dynamic draft tree sized every round (``tree="auto"``).

Every model uses the same kernels (oneDNN-prepacked fp32 target and fp32 draft, the int8 draft
with the padded one-row path), so a ratio compares algorithms, not kernels. Per prompt and mode the
methods run interleaved in an order rotated per prompt; each finished (prompt, mode) is journaled so
``--resume`` continues an interrupted run. This is a benchmark: it prints and writes numbers and
asserts nothing about speed.
"""
from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass, field

import torch

from ..decoding import SamplingConfig, speculative_decode
from ..models.tokens import stop_token_ids

__all__ = ["BENCH_METHODS", "BenchConfig", "BenchResult", "BenchRow", "MethodRun", "run_bench", "summarise"]

BENCH_METHODS = ("hf-generate", "hf-assisted-fp32", "hf-assisted-int8", "hf-assisted-int8-heuristic", "hf-lookup",
                 "specbound-chain", "specbound-tree")
MODES = {"greedy": SamplingConfig(0.0), "sampled": SamplingConfig(1.0, top_k=50)}
ASSISTED_INT8 = ("hf-assisted-int8", "hf-assisted-int8-heuristic")


@dataclass
class BenchConfig:
    prompt_set: str = "humaneval"
    offset: int = 10
    n_prompts: int = 8
    max_new_tokens: int = 96
    modes: tuple[str, ...] = ("greedy",)
    methods: tuple[str, ...] = BENCH_METHODS
    seed: int = 0


@dataclass
class MethodRun:
    """One method on one prompt: throughput, τ (tokens per target forward), drafting and time split."""

    seconds: float
    tokens_per_second: float
    tau: float
    target_calls: int
    identical: bool | None = None          # greedy: same tokens as hf-generate
    drafted_per_round: float | None = None
    depth_per_round: float | None = None
    plain_steps: int | None = None
    draft_seconds: float | None = None
    target_seconds: float | None = None


@dataclass
class BenchRow:
    prompt: str
    mode: str
    prompt_tokens: int
    order: list[str]
    runs: dict[str, MethodRun] = field(default_factory=dict)


@dataclass
class BenchResult:
    config: BenchConfig
    machine: dict
    models: dict
    rows: list[BenchRow]
    summary: dict = field(default_factory=dict)


def _hf_generate(target, ids, n, sampling: SamplingConfig, seed: int, assistant=None, **options) -> tuple[list, MethodRun]:
    """One Hugging Face ``generate`` call (optionally assisted); counts the target's forwards."""
    kwargs = dict(max_new_tokens=n, min_new_tokens=n, pad_token_id=target.tokenizer.eos_token_id,
                  attention_mask=torch.ones_like(ids), **options)
    if sampling.greedy:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kwargs.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    if assistant is not None:
        kwargs["assistant_model"] = assistant.model
    calls = [0]
    hook = target.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            out = target.model.generate(ids, **kwargs)
    finally:
        hook.remove()
    seconds = time.perf_counter() - t0
    tokens = out[0, ids.shape[1]:].tolist()
    return tokens, MethodRun(seconds, len(tokens) / seconds, len(tokens) / max(calls[0], 1), calls[0])


def _specbound(target, draft, ids, n, sampling: SamplingConfig, seed: int, **drafting) -> tuple[list, MethodRun]:
    res = speculative_decode(target, draft, ids, n, temperature=sampling.temperature, top_k=sampling.top_k,
                             top_p=sampling.top_p, seed=seed, **drafting)
    m = res.metrics
    rounds = max(len(m.drafted_per_step), 1)
    return res.tokens, MethodRun(m.total_time, m.tokens_per_second, m.tau, m.target_calls,
                                 drafted_per_round=sum(m.drafted_per_step) / rounds,
                                 depth_per_round=sum(m.depth_per_step) / rounds, plain_steps=m.plain_steps,
                                 draft_seconds=m.draft_time, target_seconds=m.target_time)


def same_greedy_answer(tokens: list, reference: list, eos: set[int]) -> bool:
    """Greedy identity with HF ``generate``, compared up to the method's first end-of-sequence token.

    The HF runs pass ``min_new_tokens`` so every method writes the same number of tokens; that makes
    HF mask EOS, while specbound (no stop tokens here) emits it where it is the target's argmax and
    continues after it. Text after the answer's end is not comparable, the answer itself must be."""
    end = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))
    return len(tokens) == len(reference) and tokens[:end] == reference[:end]


def run_method(method: str, models: dict, ids, n: int, sampling: SamplingConfig, seed: int):
    target = models["target"]
    if method == "hf-generate":
        return _hf_generate(target, ids, n, sampling, seed)
    if method == "hf-assisted-fp32":
        return _hf_generate(target, ids, n, sampling, seed, models["draft_fp32"])
    if method == "hf-assisted-int8":
        return _hf_generate(target, ids, n, sampling, seed, models["draft_int8"])
    if method == "hf-assisted-int8-heuristic":
        models["draft_int8"].model.generation_config.num_assistant_tokens_schedule = "heuristic"
        try:
            return _hf_generate(target, ids, n, sampling, seed, models["draft_int8"])
        finally:
            models["draft_int8"].model.generation_config.num_assistant_tokens_schedule = "constant"
    if method == "hf-lookup":
        return _hf_generate(target, ids, n, sampling, seed, prompt_lookup_num_tokens=10)
    if method == "specbound-chain":
        return _specbound(target, models["draft_int8"], ids, n, sampling, seed, gamma="auto")
    if method == "specbound-tree":
        return _specbound(target, models["draft_int8"], ids, n, sampling, seed, tree="auto")
    raise ValueError(method)


def run_bench(models: dict, prompts, config: BenchConfig, journal, progress: bool = True) -> BenchResult:
    """Interleave every method on every (prompt, mode); journaled per (prompt, mode)."""
    from ..assets.prompts import format_prompt
    from .report import progress_bar

    target = models["target"]
    methods = list(config.methods)
    eos = set(stop_token_ids(target))
    rows = []
    with progress_bar(progress) as bar:
        task = bar.add_task("bench", total=len(prompts) * len(config.modes) * len(methods))
        warm = target.tokenizer("def f(x):\n", return_tensors="pt").input_ids
        for method in methods:                      # page weights in; calibrate/cached costs once
            run_method(method, models, warm, 4, MODES["greedy"], 0)
        for i, prompt in enumerate(prompts):
            ids = target.tokenizer(format_prompt(target.tokenizer, prompt), return_tensors="pt").input_ids
            for mode in config.modes:
                shift = i % len(methods)
                order = methods[shift:] + methods[:shift]

                def measure(order=order, ids=ids, mode=mode, i=i, prompt=prompt) -> BenchRow:
                    row = BenchRow(prompt.id, mode, int(ids.shape[1]), list(order))
                    tokens = {}
                    for method in order:
                        bar.update(task, description=f"{prompt.id} {mode} {method}")
                        tokens[method], row.runs[method] = run_method(method, models, ids, config.max_new_tokens,
                                                                      MODES[mode], config.seed + i)
                        bar.advance(task)
                    if mode == "greedy" and "hf-generate" in tokens:
                        for method, toks in tokens.items():
                            row.runs[method].identical = same_greedy_answer(toks, tokens["hf-generate"], eos)
                    return row

                rows.append(journal.unit(f"{prompt.id}|{mode}", BenchRow, measure))
    return BenchResult(config, machine(), {k: f"{m.name} ({m.info.kernels})" for k, m in models.items()}, rows,
                       summarise(rows))


def machine() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "processor": platform.processor() or platform.machine()}


def summarise(rows: list[BenchRow]) -> dict:
    """Per mode: per method the median tok/s and τ; per specbound method the median and minimum of
    the per-prompt ratios to hf-generate and to the best HF assisted-int8 configuration."""
    out = {}
    for mode in sorted({r.mode for r in rows}):
        mine = [r for r in rows if r.mode == mode]
        methods = [m for m in BENCH_METHODS if any(m in r.runs for r in mine)]
        per = {}
        for m in methods:
            runs = [r.runs[m] for r in mine if m in r.runs]
            per[m] = {"median_tokens_per_second": statistics.median(x.tokens_per_second for x in runs),
                      "median_tau": statistics.median(x.tau for x in runs),
                      "identical": sum(bool(x.identical) for x in runs) if mode == "greedy" else None,
                      "prompts": len(runs)}
        best_assisted = max((m for m in ASSISTED_INT8 if m in per), default=None,
                            key=lambda m: per[m]["median_tokens_per_second"])
        for m in ("specbound-chain", "specbound-tree"):
            if m not in per:
                continue
            for ref, key in (("hf-generate", "vs_generate"), (best_assisted, "vs_assisted_int8")):
                if ref is None or ref not in per:
                    continue
                ratios = [r.runs[m].tokens_per_second / r.runs[ref].tokens_per_second
                          for r in mine if m in r.runs and ref in r.runs]
                per[m][key] = {"median": statistics.median(ratios), "min": min(ratios), "reference": ref}
        out[mode] = {"methods": per, "best_assisted_int8": best_assisted}
    return out
