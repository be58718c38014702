"""`specbound bench --batch 1,2,4,8`: batched requests on a real pair, per batch size B.

Total tokens per second and per-request latency of speculative decoding of B requests together
(``speculative_decode_batch``) against plain batched decoding on the SAME target
(``autoregressive_decode_batch``), Hugging Face ``generate`` on a left-padded batch of B, llama.cpp plain
decoding of the target's GGUF (one request after another, and at B > 1 the B requests as sequences of
one context, one ``llama_decode`` per step, as llama.cpp's server does) and Hugging Face assisted
generation with the int8 draft (one request after another: it refuses a batch). The held-out prompts
are decoded in groups of B, every method on every group in an order rotated per group, in one process,
every request exactly ``tokens`` new tokens; greedy tokens are compared with each request decoded alone.
Beside each measurement, the theory's prediction (``theory/speedup.py``, ``batch_throughput``) from a cost
curve and the acceptance measured in the same run. A benchmark: it reports, it asserts nothing. Every
method in full: docs/notes.md (`experiments/batched.py`).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from ..assets.models import DEFAULT_DRAFT, DEFAULT_TARGET
from ..assets.prompts import load_prompts
from ..decoding.batch import autoregressive_decode_batch, rows_shared, speculative_decode_batch
from ..decoding.costs import measure_costs
from ..decoding.engine import autoregressive_decode
from ..measure.llm import encode_prompts
from ..models import loading as model_loading   # a module: tests and commands swap its loaders
from ..models.hf import HFModel
from ..theory.speedup import batch_throughput
from .bench import PairSpec, _FirstTokenClock
from .report import fmt, md_table

__all__ = ["HF_ASSISTED", "LLAMACPP", "LLAMACPP_BATCH", "BatchedConfig", "BatchedResult", "TauAgainstAlone", "markdown", "run", "run_batched",
           "tau_against_alone"]

LLAMACPP = "llama.cpp plain, one request after another"
LLAMACPP_BATCH = "llama.cpp plain, B sequences per pass"
#: Hugging Face assisted generation refuses a batch: B requests one after another, per assistant schedule
HF_ASSISTED = {"constant": "HF assisted (constant schedule), one request after another",
               "heuristic": "HF assisted (heuristic schedule), one request after another"}


@dataclass
class BatchedConfig:
    prompt_set: str = "humaneval"
    offset: int = 10
    n_prompts: int = 8
    tokens: int = 64
    batches: tuple[int, ...] = (1, 2, 4, 8)
    gammas: tuple = ("auto", 4)
    hf_generate: bool = True
    hf_assisted: bool = True             # HF assisted generation (the int8 torch draft), B = 1 run B times
    repeats: int = 1                     # every batch size's groups run this many times (order rotated each time)


@dataclass
class BatchedRow:
    """One method at one batch size, over all groups."""

    batch: int
    method: str
    tokens_per_second: float
    decode_tokens_per_second: float      # prefill left out (the rate the prediction describes)
    group_rate_min: float
    group_rate_max: float
    latency_mean: float
    tau: float
    drafted_per_round: float
    identical: int
    requests: int
    predicted: float | None = None
    repeat_ratios: list[float] = field(default_factory=list)   # decode tok/s × plain's, one per repeat


@dataclass
class BatchedResult:
    config: BatchedConfig
    target: str
    draft: str
    prompts: list[str]
    threads: int
    costs: dict
    alpha: list[float] | None
    rows: list[BatchedRow]
    runs: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    assistant: str | None = None         # the HF assisted rows' draft


@dataclass
class TauAgainstAlone:
    """One speculative method at one batch size: each request's τ in its batch over the τ of the same
    request decoded alone by the same method (the first batch size, normally B = 1)."""

    batch: int
    method: str
    mean: float
    low: float
    high: float
    requests: int
    drafted_per_round: float           # mean over the requests, in the batch
    drafted_alone: float               # mean over the same requests, alone


def tau_against_alone(result: BatchedResult) -> list[TauAgainstAlone]:
    """Per-request τ against the same request alone (does batching throw τ away?). With a fixed
    γ at greedy every request drafts and accepts exactly as alone (ratio 1); with γ = auto the batch
    policy sets each round's length (or, llama.cpp draft rows, a limit per round), so its τ follows
    what that policy chose for the batch."""
    first = result.config.batches[0]
    alone = {(r["method"], q["prompt"]): q for r in result.runs if r["B"] == first for q in r["requests"]}
    out = []
    for B in result.config.batches[1:]:
        methods = dict.fromkeys(r["method"] for r in result.runs if r["B"] == B and r["method"].startswith("sd "))
        for method in methods:
            pairs = [(q, alone[(method, q["prompt"])]) for r in result.runs if r["B"] == B and r["method"] == method
                     for q in r["requests"] if (method, q["prompt"]) in alone]
            if not pairs:
                continue
            ratios = [q["tau"] / a["tau"] for q, a in pairs]
            out.append(TauAgainstAlone(batch=B, method=method, mean=statistics.fmean(ratios), low=min(ratios),
                                       high=max(ratios), requests=len(pairs),
                                       drafted_per_round=statistics.fmean(q["drafted"] for q, _ in pairs),
                                       drafted_alone=statistics.fmean(a["drafted"] for _, a in pairs)))
    return out


def _hf_generate(target, group_ids, tokens, assistant=None, schedule: str = "constant"):
    """Hugging Face ``generate`` on a left-padded batch: (seconds, the seconds until its first new tokens
    came out — the prefill's share —, per-request new tokens). With ``assistant`` (an HF model on the
    target's tokenizer): assisted generation under its ``schedule`` ("constant": HF's default, or
    "heuristic"), one request only (HF refuses a batch)."""
    extra = {}
    if assistant is not None:
        if len(group_ids) != 1:
            raise ValueError("Hugging Face assisted generation decodes one request at a time")
        config = assistant.model.generation_config
        before, config.num_assistant_tokens_schedule = config.num_assistant_tokens_schedule, schedule
        extra["assistant_model"] = assistant.model
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(len(ids) for ids in group_ids)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in group_ids])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in group_ids])
    first = _FirstTokenClock()
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            out = target.model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=tokens,
                                        min_new_tokens=tokens, do_sample=False, pad_token_id=pad, streamer=first,
                                        **extra)
    finally:
        if assistant is not None:
            config.num_assistant_tokens_schedule = before
    seconds = time.perf_counter() - t0
    return seconds, (first.at or t0 + seconds) - t0, [row[width:].tolist() for row in out]


def _one_after_another(group_ids, tokens, decode_one, tau: float, drafted: float):
    """A group's requests decoded one after another by ``decode_one(ids) -> (seconds, prefill seconds,
    new tokens)``: :func:`_run_method`'s tuple, each request's latency the time until it is served."""
    rows, wall, prefill = [], 0.0, 0.0
    for ids in group_ids:
        seconds, first, new = decode_one(ids)
        wall += seconds
        prefill += first
        rows.append({"tokens": new, "latency": wall, "tau": tau, "drafted": drafted})
    return wall, prefill, len(group_ids) * tokens, rows


def _run_method(method, target, draft, llama, group_ids, tokens, assistant=None):
    """(wall seconds, the prefill's share of them, target passes, per-request dicts) of one method on one
    group. The prefill's share: a batch's requests read their prompts together, so it ends when the last
    of them has (``BatchDecodeResult.prefill_time``); one request after another (llama.cpp) sums them;
    HF generate: until its first new tokens came out (a streamer's clock). It was estimated from a
    one-token generate of the same batch, which at 8 requests came out at or above the whole run's time
    (a decode rate 5× plain's, meaningless)."""
    if method == "hf-generate":
        seconds, prefill, outs = _hf_generate(target, group_ids, tokens)
        return seconds, prefill, tokens, [{"tokens": o, "latency": seconds, "tau": 1.0, "drafted": 0.0} for o in outs]
    if method in HF_ASSISTED.values():
        schedule = next(k for k, v in HF_ASSISTED.items() if v == method)

        def assisted(ids):
            seconds, first, outs = _hf_generate(target, [ids], tokens, assistant, schedule)
            return seconds, first, outs[0]
        return _one_after_another(group_ids, tokens, assisted, tau=float("nan"), drafted=float("nan"))
    if method == LLAMACPP:
        def plain(ids):
            r = autoregressive_decode(llama, ids, tokens, temperature=0)
            return r.metrics.total_time, r.metrics.prefill_time, r.tokens
        return _one_after_another(group_ids, tokens, plain, tau=1.0, drafted=0.0)
    if method in ("plain", LLAMACPP_BATCH):
        res = autoregressive_decode_batch(target if method == "plain" else llama, group_ids, tokens, temperature=0)
    else:
        g = method.split("=", 1)[1]
        res = speculative_decode_batch(target, draft, group_ids, tokens, gamma=g if g == "auto" else int(g),
                                       temperature=0)
    rows = [{"tokens": r.tokens, "latency": r.metrics.total_time, "tau": r.metrics.tau,
             "drafted": statistics.fmean(r.metrics.drafted_per_step) if r.metrics.drafted_per_step else 0.0,
             "acceptance": r.metrics.acceptance_per_position[:8]} for r in res]
    return res.wall_time, res.prefill_time, res.target_passes, rows


def _decode_rate(runs) -> float:
    """New tokens per second after the prefill over ``runs`` (no time after it: nan, not a negative
    rate)."""
    seconds = sum(r["wall"] - r["prefill"] for r in runs)
    return sum(r["new_tokens"] for r in runs) / seconds if seconds > 0 else float("nan")


def _repeat_ratios(runs, B: int, method: str, repeats: int) -> list[float]:
    """Per repeat: ``method``'s decode tok/s at B over plain batched decoding's in the same repeat (the
    same groups, run beside it)."""
    out = []
    for rep in range(repeats):
        mine = [r for r in runs if r["B"] == B and r["method"] == method and r.get("repeat", 0) == rep]
        plain = [r for r in runs if r["B"] == B and r["method"] == "plain" and r.get("repeat", 0) == rep]
        if mine and plain:
            out.append(_decode_rate(mine) / _decode_rate(plain))
    return out


def _llama_methods(llama, B: int, config: BatchedConfig) -> list[str]:
    """The llama.cpp reference rows at batch size B: one request after another at the first B (its rate does
    not depend on B), B sequences per pass at every B > 1; none without the target's GGUF on llama.cpp."""
    if llama is None:
        return []
    return ([LLAMACPP] if B == config.batches[0] else []) + ([LLAMACPP_BATCH] if B > 1 else [])


def _assisted_methods(assistant, B: int, config: BatchedConfig) -> list[str]:
    """HF assisted generation's rows: at the first batch size only (one request after another: its rate
    does not depend on B); none without an assistant."""
    return list(HF_ASSISTED.values()) if assistant is not None and B == config.batches[0] else []


def run_batched(target, draft, prompt_ids: list[list[int]], prompt_names: list[str], config: BatchedConfig,
                llama=None, progress=None, assistant=None) -> BatchedResult:
    """Measure every method at every batch size (see the module docstring). ``llama``: the target's GGUF
    on llama.cpp (a :class:`~specbound.models.llamacpp.LlamaCppModel`) for the reference row, or None;
    ``assistant``: an HF draft model for Hugging Face assisted generation's rows, or None."""
    t_start = time.perf_counter()
    costs = measure_costs(target, draft, repeats=5)            # this machine, now
    methods = ["plain"] + [f"sd γ={g}" for g in config.gammas] + (["hf-generate"] if config.hf_generate else [])
    warm = [prompt_ids[0][:16], prompt_ids[-1][:12]]
    for method in methods + ([LLAMACPP_BATCH] if llama is not None else []):   # warm-up: every method, short
        _run_method(method, target, draft, llama, warm, 4)
    for method in _assisted_methods(assistant, config.batches[0], config):
        _run_method(method, target, draft, llama, warm[:1], 4, assistant)
    runs = []
    repeats = max(int(config.repeats), 1)
    for rep in range(repeats):          # whole sweeps, so a slow spell of the machine hits every B alike
        for B in config.batches:
            groups = [list(range(i, min(i + B, len(prompt_ids)))) for i in range(0, len(prompt_ids), B)]
            every = methods + _llama_methods(llama, B, config) + _assisted_methods(assistant, B, config)
            for gi, group in enumerate(groups):
                turn = (gi + rep) % len(every)
                for method in every[turn:] + every[:turn]:
                    wall, prefill, passes, rows = _run_method(method, target, draft, llama,
                                                              [prompt_ids[i] for i in group], config.tokens,
                                                              assistant)
                    for i, row in zip(group, rows):
                        row["prompt"] = prompt_names[i]
                    runs.append({"B": B, "group": gi, "repeat": rep, "method": method, "wall": wall,
                                 "prefill": prefill, "target_passes": passes,
                                 "new_tokens": sum(len(r["tokens"]) for r in rows), "requests": rows})
                if progress is not None:
                    progress(f"repeat {rep + 1}/{repeats}, B={B}: group {gi + 1}/{len(groups)} "
                             f"({time.perf_counter() - t_start:.0f} s)")
    alone = {q["prompt"]: q["tokens"] for r in runs if r["method"] == "plain" and r["B"] == config.batches[0]
             and r.get("repeat", 0) == 0 for q in r["requests"]}
    fixed = [g for g in config.gammas if g != "auto"]
    alpha = None
    if fixed and 1 in config.batches:
        acc = [q["acceptance"] for r in runs if r["B"] == 1 and r["method"] == f"sd γ={fixed[0]}" for q in r["requests"]]
        depth = max((len(a) for a in acc), default=0)
        alpha = [statistics.fmean([a[i] for a in acc if len(a) > i and a[i] == a[i]] or [0.0]) for i in range(depth)]
    rows = []
    draft_shared, target_shared = rows_shared(target, draft)
    for B in config.batches:
        for method in methods + _llama_methods(llama, B, config) + _assisted_methods(assistant, B, config):
            sel = [r for r in runs if r["B"] == B and r["method"] == method]
            reqs = [q for r in sel for q in r["requests"]]
            rates = [r["new_tokens"] / r["wall"] for r in sel]
            predicted = None
            if method == "plain":
                predicted = batch_throughput(0.0, 0, B, costs.draft, costs.target, verify_rows_shared=target_shared)
            elif alpha and method.startswith("sd γ=") and method != "sd γ=auto":
                predicted = batch_throughput(alpha, int(method.split("=")[1]), B, costs.draft, costs.target,
                                             draft_rows_shared=draft_shared, verify_rows_shared=target_shared)
            new_tokens = sum(r["new_tokens"] for r in sel)
            rows.append(BatchedRow(
                batch=B, method=method, tokens_per_second=new_tokens / sum(r["wall"] for r in sel),
                decode_tokens_per_second=_decode_rate(sel),
                group_rate_min=min(rates), group_rate_max=max(rates),
                latency_mean=statistics.fmean(q["latency"] for q in reqs), tau=statistics.fmean(q["tau"] for q in reqs),
                drafted_per_round=statistics.fmean(q["drafted"] for q in reqs),   # nan: HF assisted does not say
                identical=sum(q["tokens"] == alone.get(q["prompt"]) for q in reqs), requests=len(reqs),
                predicted=predicted, repeat_ratios=_repeat_ratios(runs, B, method, repeats)))
    return BatchedResult(
        config=config, target=f"{target.name} ({target.info.kernels})", draft=f"{draft.name} ({draft.info.kernels})",
        prompts=list(prompt_names), threads=torch.get_num_threads(),
        costs={"ks": list(costs.target.ks), "target_ms": [1e3 * s for s in costs.target.seconds],
               "target_spread": costs.target_spread, "draft_ms": [1e3 * s for s in costs.draft.seconds],
               "draft_spread": costs.draft_spread},
        alpha=alpha, rows=rows, runs=runs, seconds=time.perf_counter() - t_start,
        assistant=None if assistant is None else f"{assistant.name} ({assistant.info.kernels})")


def run(config: BatchedConfig, pair: PairSpec | None = None, progress=None, loading=None) -> BatchedResult:
    """The study: the held-out prompts of ``config``, the pair (the draft on ``pair.draft_engine``: int8 on
    torch or its GGUF on llama.cpp; and the target's GGUF on llama.cpp when llama-cpp-python is
    installed, for the reference row), loaded inside the
    context ``loading()`` when given, then :func:`run_batched`."""
    import importlib.util
    from contextlib import nullcontext

    pair = pair or PairSpec()
    prompts = load_prompts(config.prompt_set, limit=config.n_prompts, offset=config.offset)
    with (loading or nullcontext)():
        target, draft = model_loading.load_pair(pair.target, pair.draft, draft_int8=True,
                                                target_precision=pair.target_precision, draft_engine=pair.draft_engine,
                                                draft_quant=pair.draft_quant, compiled=pair.compiled)
        llama = None
        if importlib.util.find_spec("llama_cpp") is not None:
            llama = model_loading.load_gguf_model(pair.target or DEFAULT_TARGET, progress=False)
        assistant = None
        if config.hf_assisted:          # the same int8 draft specbound's torch engine uses
            assistant = draft if isinstance(draft, HFModel) else \
                model_loading.load_model(pair.draft or DEFAULT_DRAFT, progress=False, int8=True, invariant=False)
    return run_batched(target, draft, encode_prompts(target, prompts), [p.id for p in prompts], config, llama,
                       progress=progress, assistant=assistant)


def _spread(ratios: list[float]) -> str:
    if not ratios:
        return "–"
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}× (one run)"
    return f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})"


def markdown(result: BatchedResult, command: str = "") -> str:
    c = result.config
    lines = [f"# Batched requests — {c.prompt_set} ({time.strftime('%Y-%m-%d')})", ""]
    if command:
        lines += [f"`{command}`", ""]
    lines += [f"Target {result.target}; draft {result.draft}; greedy; {c.tokens} new tokens per request (no stop "
              f"token); {len(result.prompts)} held-out prompts ({result.prompts[0]} … {result.prompts[-1]}) decoded "
              f"in groups of B, methods interleaved per group in a rotated order, one process, torch threads "
              f"{result.threads}; {result.seconds:.0f} s in all. Throughput (tok/s total) = all new tokens / summed "
              "wall time of the groups (each group starts from its prompts: prefill included, as a server sees it); "
              "decode tok/s leaves each group's prefill out (a batch: until its last request's target has read its "
              "prompt — the draft reads it in the first drafted round, inside the decode time, for every method; "
              "HF generate: until its first new tokens came out), which is what the prediction "
              "describes (bar the draft's prompt read); range = slowest–fastest group (total); "
              "latency = mean per-request time from its first prefill to its last token (HF generate: the batch's "
              "time; llama.cpp one at a time: the time until that request is served); identical = requests whose "
              f"tokens equal plain decoding of the request at B = {c.batches[0]}; per repeat = the decode × plain of "
              f"each of the {max(c.repeats, 1)} repeat(s) (every group of every B once, methods rotated anew), "
              "median and range — the spread a single run's ratio carries."
              + (f" HF assisted: Hugging Face assisted generation with the draft {result.assistant} (it refuses "
                 "a batch: the B requests one after another, at the first B only; its τ is not reported)"
                 if result.assistant else ""), ""]
    table = []
    for B in c.batches:
        plain = next(r for r in result.rows if r.batch == B and r.method == "plain")
        for r in (x for x in result.rows if x.batch == B):
            table.append([str(B), r.method, fmt(r.tokens_per_second, 2), f"{r.group_rate_min:.1f}–{r.group_rate_max:.1f}",
                          f"{r.tokens_per_second / plain.tokens_per_second:.2f}×", fmt(r.decode_tokens_per_second, 2),
                          fmt(r.decode_tokens_per_second / plain.decode_tokens_per_second, 2) + "×",
                          _spread(r.repeat_ratios),
                          fmt(r.predicted, 2),
                          fmt(r.latency_mean, 2), fmt(r.tau, 2), fmt(r.drafted_per_round, 2),
                          f"{r.identical}/{r.requests}"])
    lines += [md_table(["B", "method", "tok/s total", "group range", "× plain", "decode tok/s", "× plain (decode)",
                        "per repeat: median (range)", "predicted decode tok/s", "latency s", "τ", "drafted/round", "identical"], table), ""]
    against = tau_against_alone(result)
    if against:
        lines += [f"Per-request τ in the batch against the same request decoded alone by the same method "
                  f"(B = {c.batches[0]}): mean, lowest and highest ratio over the requests, and the drafted tokens "
                  "per round in the batch and alone. A fixed γ drafts and accepts exactly as alone at greedy; "
                  "with γ = auto the batch policy (BatchDraftLength) sets each round's draft length for the "
                  "batch — or, where the draft's rows are read in turn, a limit under which each "
                  "request sizes its own chain, 0 for a plain round — so τ follows what it chose.", "",
                  md_table(["B", "method", "τ batch / τ alone (mean)", "lowest", "highest", "requests",
                            "drafted/round in batch", "drafted/round alone"],
                           [[str(a.batch), a.method, f"{a.mean:.3f}", f"{a.low:.3f}", f"{a.high:.3f}",
                             str(a.requests), fmt(a.drafted_per_round, 2), fmt(a.drafted_alone, 2)]
                            for a in against]), ""]
    cs = result.costs
    at = {k: (t, d) for k, t, d in zip(cs["ks"], cs["target_ms"], cs["draft_ms"])}
    lines += ["Cost curve measured in this run (median of 5): " + ", ".join(
        f"t({k}) = {at[k][0]:.1f} ms" for k in (1, 2, 4, 8, 16, 32) if k in at) + "; " + ", ".join(
        f"d({k}) = {at[k][1]:.1f} ms" for k in (1, 2, 4, 8) if k in at) + ".", ""]
    if result.alpha:
        lines += ["Prediction (`theory/speedup.py`, `batch_throughput`): plain B / t(B); a chain of γ "
                  "B · (1 + Σ_i Π_{j≤i} α_j) / (γ · d_B + t(B(γ + 1))) — d_B = d(B) where the draft's rows share a "
                  "pass, B · d(1) where they run in turn — with the per-depth greedy acceptance α "
                  "of the fixed-γ chain on the requests alone (B = 1): " + ", ".join(f"{a:.2f}" for a in result.alpha)
                  + ". It leaves out the round's fixed Python work (drafting logic, verification, scheduling).", ""]
    return "\n".join(lines) + "\n"
