"""`specbound bench`: specbound against the strongest configuration of each peer, side by side in ONE process.

Methods (:data:`BENCH_METHODS`; each decodes exactly ``max_new_tokens`` tokens, EOS ignored, timings
include the prefill): Hugging Face ``generate``, assisted generation (the fp32 draft; the SAME int8 draft
specbound uses, HF's default and ``heuristic`` schedules) and prompt lookup; specbound plain, chain
(``gamma="auto"``) and tree (``tree="auto"``); llama.cpp's own loop on the target's GGUF (the reference
row) and the same GGUF under specbound's plain loop; specbound with the draft's GGUF on llama.cpp (chain,
tree, the file as shipped, ``shape="auto"``). Each reports end-to-end and decode tok/s. Every model uses
the same kernels, so a ratio compares algorithms, not kernels; the methods run interleaved in an order
rotated per prompt, each (prompt, mode) journaled for ``--resume``. ``seeds`` = S > 1 repeats every
sampled unit S times with paired seeds (:mod:`specbound.seeds`: common random numbers), and
:func:`paired_summary` gives ratios with 95% intervals. A benchmark: it asserts nothing about speed.
Every method in full: docs/notes.md (`experiments/bench.py`).
"""
from __future__ import annotations

import math
import platform
import statistics
import time
from dataclasses import dataclass, field, replace

import torch

from ..assets.gguf import gguf_path
from ..assets.models import DEFAULT_DRAFT, DEFAULT_TARGET
from ..assets.prompts import format_prompt, load_prompts
from ..decoding import SamplingConfig, autoregressive_decode, speculative_decode
from ..errors import SpecboundError
from ..measure.journal import no_journal
from ..models import loading as model_loading   # a module: tests and commands swap its loaders
from ..models.static import StaticCacheHFModel
from ..models.tokens import stop_token_ids
from ..options import DEFAULT_DRAFT_QUANT, DEFAULT_TARGET_PRECISION
from ..seeds import derive_seed
from .llamacpp_peers import llama_generate, open_llama
from .report import progress_bar

__all__ = ["BENCH_METHODS", "BenchConfig", "BenchResult", "BenchRow", "MethodRun", "PairSpec", "load_models",
           "paired_summary", "run", "run_bench", "summarise", "unit_seed"]

BENCH_METHODS = ("llamacpp-plain", "llamacpp-plain-raw", "hf-generate", "hf-assisted-fp32", "hf-assisted-int8", "hf-assisted-int8-heuristic",
                 "hf-lookup", "specbound-plain", "specbound-chain", "specbound-tree", "specbound-chain-lcdraft",
                 "specbound-tree-lcdraft", "specbound-chain-lcdraft-file", "specbound-plain-compiled",
                 "specbound-chain-lcdraft-compiled", "specbound-shape-lcdraft")
#: What ``specbound bench`` runs unless told otherwise (the rest on request: they add time, not information)
DEFAULT_METHODS = ("llamacpp-plain", "llamacpp-plain-raw", "hf-generate", "hf-assisted-int8", "hf-assisted-int8-heuristic",
                   "specbound-chain", "specbound-tree", "specbound-chain-lcdraft")
SPECBOUND_METHODS = ("specbound-chain", "specbound-tree", "specbound-chain-lcdraft", "specbound-tree-lcdraft",
                     "specbound-chain-lcdraft-file", "specbound-chain-lcdraft-compiled", "specbound-shape-lcdraft")
LLAMACPP_METHODS = ("llamacpp-plain", "llamacpp-plain-raw", "specbound-chain-lcdraft", "specbound-tree-lcdraft",
                    "specbound-chain-lcdraft-file", "specbound-chain-lcdraft-compiled", "specbound-shape-lcdraft")
#: Methods that read the target through torch.compile (the same modules, load_model(compiled=True)'s reads),
#: to compare side by side with their eager twins in one process (``--compile`` compiles every method's target)
COMPILED_METHODS = ("specbound-plain-compiled", "specbound-chain-lcdraft-compiled")
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
    seeds: int = 1          # paired repeats per sampled (prompt, mode); greedy runs once


@dataclass
class PairSpec:
    """The pair a benchmark loads (``bench``, ``bench --batch``): packaged names or directories (None: the
    packaged default), the torch target at ``target_precision``, a llama.cpp draft's weights ``draft_quant``."""

    target: str | None = None
    draft: str | None = None
    target_precision: str = DEFAULT_TARGET_PRECISION
    draft_quant: str = DEFAULT_DRAFT_QUANT
    draft_engine: str = "torch"            # where ``bench --batch`` runs the draft's rows (torch int8 / llamacpp)
    compiled: bool = False                 # the torch target's reads through torch.compile (load_model)


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
    decode_tokens_per_second: float | None = None   # prefill excluded (see the module docstring)


@dataclass
class BenchRow:
    prompt: str
    mode: str
    prompt_tokens: int
    order: list[str]
    runs: dict[str, MethodRun] = field(default_factory=dict)
    seed_index: int = 0     # the repeat s (seed = derive_seed(config.seed, "bench", prompt, s)), 0 when seeds = 1


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
    first = _FirstTokenClock()
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            out = target.model.generate(ids, streamer=first, **kwargs)
    finally:
        hook.remove()
    seconds = time.perf_counter() - t0
    tokens = out[0, ids.shape[1]:].tolist()
    run = MethodRun(seconds, len(tokens) / seconds, len(tokens) / max(calls[0], 1), calls[0])
    run.decode_tokens_per_second = _decode_rate(len(tokens), first.count, seconds, (first.at or t0) - t0)
    return tokens, run


class _FirstTokenClock:
    """A ``generate`` streamer that notes when the first new tokens arrive (the first ``put`` is the prompt)."""

    def __init__(self):
        self.calls, self.at, self.count = 0, None, 0

    def put(self, value):
        self.calls += 1
        if self.calls == 2:
            self.at, self.count = time.perf_counter(), int(value.numel())

    def end(self):
        pass


def _decode_rate(n_tokens: int, first_tokens: int, seconds: float, first_seconds: float) -> float:
    """Tokens after the first chunk over the time after it (the prefill and the first token excluded)."""
    rest = seconds - first_seconds
    return (n_tokens - first_tokens) / rest if rest > 0 and n_tokens > first_tokens else float("nan")


def _llamacpp_plain(llm, ids, n, sampling: SamplingConfig) -> tuple[list, MethodRun]:
    r = llama_generate(llm, ids, n, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    run = MethodRun(r.seconds, len(r.tokens) / r.seconds, len(r.tokens) / max(r.target_evals, 1), r.target_evals)
    run.decode_tokens_per_second = _decode_rate(len(r.tokens), 1, r.seconds, r.extra.get("first_token_seconds", 0.0))
    return r.tokens, run


def _specbound(target, draft, ids, n, sampling: SamplingConfig, seed: int, **drafting) -> tuple[list, MethodRun]:
    res = speculative_decode(target, draft, ids, n, temperature=sampling.temperature, top_k=sampling.top_k,
                             top_p=sampling.top_p, seed=seed, **drafting)
    m = res.metrics
    rounds = max(len(m.drafted_per_step), 1)
    return res.tokens, MethodRun(m.total_time, m.tokens_per_second, m.tau, m.target_calls,
                                 drafted_per_round=sum(m.drafted_per_step) / rounds,
                                 depth_per_round=sum(m.depth_per_step) / rounds, plain_steps=m.plain_steps,
                                 draft_seconds=m.draft_time, target_seconds=m.target_time,
                                 decode_tokens_per_second=m.decode_tokens_per_second)


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
        return _specbound(target, models["draft_int8"], ids, n, sampling, seed, gamma="auto", verification="auto")
    if method == "specbound-tree":
        return _specbound(target, models["draft_int8"], ids, n, sampling, seed, tree="auto")
    if method == "specbound-chain-lcdraft":
        return _specbound(target, models["draft_llamacpp"], ids, n, sampling, seed, gamma="auto", verification="auto")
    if method == "specbound-tree-lcdraft":
        return _specbound(target, models["draft_llamacpp"], ids, n, sampling, seed, tree="auto")
    if method == "specbound-shape-lcdraft":
        return _specbound(target, models["draft_llamacpp"], ids, n, sampling, seed, shape="auto", verification="auto")
    if method == "specbound-chain-lcdraft-compiled":
        return _specbound(models["target_compiled"], models["draft_llamacpp"], ids, n, sampling, seed, gamma="auto",
                          verification="auto")
    if method == "specbound-chain-lcdraft-file":
        return _specbound(target, models["draft_llamacpp_file"], ids, n, sampling, seed, gamma="auto", verification="auto")
    if method == "llamacpp-plain":
        return _llamacpp_plain(models["llamacpp_target"], ids, n, sampling)
    if method in ("llamacpp-plain-raw", "specbound-plain", "specbound-plain-compiled"):
        model = {"llamacpp-plain-raw": models.get("llamacpp_raw"),
                 "specbound-plain-compiled": models.get("target_compiled")}.get(method, target)
        res = autoregressive_decode(model, ids, n, temperature=sampling.temperature,
                                    top_k=sampling.top_k, top_p=sampling.top_p, seed=seed)
        m = res.metrics
        return res.tokens, MethodRun(m.total_time, m.tokens_per_second, 1.0, m.target_calls,
                                     decode_tokens_per_second=m.decode_tokens_per_second)
    raise ValueError(method)


def unit_seed(seed: int, prompt: str, repeat: int) -> int:
    """The seed every method of the unit (``prompt``, repeat s) decodes with: one stream per unit, shared
    by the methods (common random numbers; :mod:`specbound.seeds`)."""
    return derive_seed(seed, "bench", prompt, repeat)


def run_bench(models: dict, prompts, config: BenchConfig, journal, progress: bool = True) -> BenchResult:
    """Interleave every method on every (prompt, mode[, seed repeat]); journaled per unit.

    With ``config.seeds`` = 1 the journal keys are ``"{prompt}|{mode}"`` as before; with S > 1 a
    sampled unit is ``"{prompt}|{mode}|{s}"`` (greedy keeps the plain key: it runs once)."""
    target = models["target"]
    methods = list(config.methods)
    eos = set(stop_token_ids(target))
    rows = []
    with progress_bar(progress) as bar:
        repeats = {mode: 1 if mode == "greedy" else max(1, config.seeds) for mode in config.modes}
        task = bar.add_task("bench", total=len(prompts) * sum(repeats.values()) * len(methods))
        warm = target.tokenizer("def f(x):\n", return_tensors="pt").input_ids
        for method in methods:                      # page weights in; calibrate/cached costs once
            run_method(method, models, warm, 4, MODES["greedy"], 0)
        for i, prompt in enumerate(prompts):
            ids = target.tokenizer(format_prompt(target.tokenizer, prompt), return_tensors="pt").input_ids
            for mode, s in [(mode, s) for mode in config.modes for s in range(repeats[mode])]:
                shift = (i + s) % len(methods)
                order = methods[shift:] + methods[:shift]
                seed = unit_seed(config.seed, prompt.id, s)     # the same for every method of this unit: paired
                label = f"{prompt.id} {mode}" + (f" #{s}" if repeats[mode] > 1 else "")

                def measure(order=order, ids=ids, mode=mode, prompt=prompt, s=s, seed=seed, label=label) -> BenchRow:
                    row = BenchRow(prompt=prompt.id, mode=mode, prompt_tokens=int(ids.shape[1]), order=list(order),
                                   seed_index=s)
                    tokens = {}
                    for method in order:
                        bar.update(task, description=f"{label} {method}")
                        tokens[method], row.runs[method] = run_method(method, models, ids, config.max_new_tokens,
                                                                      MODES[mode], seed)
                        bar.advance(task)
                    if mode == "greedy" and "hf-generate" in tokens:
                        for method, toks in tokens.items():
                            row.runs[method].identical = same_greedy_answer(toks, tokens["hf-generate"], eos)
                    return row

                key = f"{prompt.id}|{mode}" + (f"|{s}" if repeats[mode] > 1 else "")
                rows.append(journal.unit(key, BenchRow, measure))
    return BenchResult(config=config, machine=machine(), models={k: describe_model(m) for k, m in models.items()},
                       rows=rows, summary=summarise(rows))


def compiled_twin(target):
    """The target's modules behind a second wrapper whose reads go through torch.compile (its own cache)."""
    if not isinstance(target, StaticCacheHFModel) or not any(k in target.info.kernels for k in ("int8", "kquant")):
        raise SpecboundError("the *-compiled bench methods need a quantised target on the static cache "
                             "(--target-precision int8 or kquant)")
    twin = target.fork()
    twin.compiled = True
    if twin.compile_now() is None:
        raise SpecboundError("the *-compiled bench methods need torch.compile, which failed here (see the warning)")
    if "torch.compile" not in twin.info.kernels:
        twin.info = replace(twin.info, kernels=twin.info.kernels + ", torch.compile")
    return twin


def load_models(methods, pair: PairSpec) -> dict:
    """The models ``methods`` need: the target and the int8 draft always; the fp32 draft, the draft's and
    the target's GGUF and llama-cpp-python's own ``Llama`` when a method uses them."""
    methods = set(methods)
    target, draft_int8 = model_loading.load_pair(pair.target, pair.draft, draft_int8=True,
                                                 target_precision=pair.target_precision, compiled=pair.compiled)
    models = {"target": target, "draft_int8": draft_int8}
    draft_name = pair.draft or DEFAULT_DRAFT
    if "hf-assisted-fp32" in methods:
        models["draft_fp32"] = model_loading.load_model(draft_name, progress=False)
    if methods & set(COMPILED_METHODS):
        models["target_compiled"] = compiled_twin(target)
    if methods & {"specbound-chain-lcdraft", "specbound-tree-lcdraft", "specbound-chain-lcdraft-compiled",
                  "specbound-shape-lcdraft"}:
        models["draft_llamacpp"] = model_loading.load_gguf_model(draft_name, progress=False, quant=pair.draft_quant,
                                                                 role="draft")
        model_loading.check_same_tokenizer(target, models["draft_llamacpp"])
    if "specbound-chain-lcdraft-file" in methods:
        models["draft_llamacpp_file"] = model_loading.load_gguf_model(draft_name, progress=False, role="draft")
        model_loading.check_same_tokenizer(target, models["draft_llamacpp_file"])
    if "llamacpp-plain-raw" in methods:
        models["llamacpp_raw"] = model_loading.load_gguf_model(pair.target or DEFAULT_TARGET, progress=False)
    if "llamacpp-plain" in methods:
        models["llamacpp_target"] = open_llama(gguf_path(str(pair.target or DEFAULT_TARGET), progress=False))
    return models


def run(config: BenchConfig, pair: PairSpec | None = None, journal=None, progress: bool = True,
        loading=None) -> BenchResult:
    """The study: the held-out prompts of ``config``, the models of its methods on ``pair``
    (:func:`load_models`, inside the context ``loading()`` when given: a display while they load), then
    :func:`run_bench` (every (prompt, mode[, repeat]) unit through ``journal``, for ``--resume``)."""
    from contextlib import nullcontext

    prompts = load_prompts(config.prompt_set, limit=config.n_prompts, offset=config.offset)
    with (loading or nullcontext)():
        models = load_models(config.methods, pair or PairSpec())
    return run_bench(models, prompts, config, journal if journal is not None else no_journal(), progress)


def describe_model(model) -> str:
    """``name (backend:kernels)`` of a LanguageModel, or the GGUF file of a llama-cpp-python ``Llama``."""
    info = getattr(model, "info", None)
    if info is not None:
        return f"{model.name} ({info.backend}:{info.kernels})"
    path = getattr(model, "model_path", None)
    return f"{path} (llama-cpp-python Llama.generate)" if path else type(model).__name__


def machine() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "processor": platform.processor() or platform.machine()}


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


def summarise(rows: list[BenchRow]) -> dict:
    """Per mode: per method the median tok/s and τ; per specbound method the median and minimum of
    the per-prompt ratios to hf-generate and to the best HF assisted-int8 configuration. With several
    seeds per prompt (``seeds`` > 1, sampled modes) the medians are over (prompt, seed) units and
    ``"paired"`` holds :func:`paired_summary` (ratios with standard errors and 95% intervals)."""
    out = {}
    for mode in sorted({r.mode for r in rows}):
        mine = [r for r in rows if r.mode == mode]
        methods = [m for m in BENCH_METHODS if any(m in r.runs for r in mine)]
        per = {}
        for m in methods:
            runs = [r.runs[m] for r in mine if m in r.runs]
            per[m] = {"median_tokens_per_second": statistics.median(x.tokens_per_second for x in runs),
                      "median_tau": statistics.median(x.tau for x in runs),
                      "identical": sum(bool(x.identical) for x in runs)     # None where no reference ran
                      if mode == "greedy" and any(x.identical is not None for x in runs) else None,
                      "prompts": len(runs)}
        best_assisted = max((m for m in ASSISTED_INT8 if m in per), default=None,
                            key=lambda m: per[m]["median_tokens_per_second"])
        for m in methods:
            runs = [r.runs[m] for r in mine if m in r.runs]
            decode = [x.decode_tokens_per_second for x in runs if _finite(x.decode_tokens_per_second)]
            per[m]["median_decode_tokens_per_second"] = statistics.median(decode) if decode else None
        for m in SPECBOUND_METHODS + ("specbound-plain", "specbound-plain-compiled", "hf-generate", "hf-assisted-int8", "hf-assisted-int8-heuristic", "llamacpp-plain"):
            if m not in per:
                continue
            for ref, key, field_ in (("hf-generate", "vs_generate", "tokens_per_second"),
                                     (best_assisted, "vs_assisted_int8", "tokens_per_second"),
                                     ("llamacpp-plain", "vs_llamacpp", "decode_tokens_per_second"),
                                     ("llamacpp-plain-raw", "vs_llamacpp_raw", "decode_tokens_per_second")):
                if ref is None or ref not in per or ref == m or (m not in SPECBOUND_METHODS
                                                                 and key not in ("vs_llamacpp", "vs_llamacpp_raw")):
                    continue
                ratios = [getattr(r.runs[m], field_) / getattr(r.runs[ref], field_)
                          for r in mine if m in r.runs and ref in r.runs
                          and _finite(getattr(r.runs[m], field_)) and _finite(getattr(r.runs[ref], field_))
                          and getattr(r.runs[ref], field_) > 0]
                if ratios:
                    per[m][key] = {"median": statistics.median(ratios), "min": min(ratios), "reference": ref,
                                   "measure": field_}
        out[mode] = {"methods": per, "best_assisted_int8": best_assisted}
        if any(r.seed_index > 0 for r in mine):
            out[mode]["paired"] = paired_summary(mine, best_assisted)
    return out


PAIRING = ("Seeds are paired: in repeat s every method decodes the prompt with the same seed "
           "(derive_seed(seed, \"bench\", prompt, s), specbound.seeds), back to back in one rotated order, "
           "and each ratio is taken within that (prompt, seed) unit.")

#: (summary key, reference, measure) of the paired comparisons; None = the best HF assisted-int8
_REFERENCES = (("vs_generate", "hf-generate", "tokens_per_second"),
               ("vs_assisted_int8", None, "tokens_per_second"),
               ("vs_llamacpp", "llamacpp-plain", "decode_tokens_per_second"))


def _ratio_of_means(a: list[float], b: list[float]) -> tuple[float, float | None]:
    """mean(a)/mean(b) and its delta-method standard error for paired samples (covariance included)."""
    n = len(a)
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    r = ma / mb
    if n < 2:
        return r, None
    va, vb = statistics.variance(a), statistics.variance(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (n - 1)
    rel = va / ma ** 2 + vb / mb ** 2 - 2 * cov / (ma * mb)
    return r, r * math.sqrt(max(rel, 0.0) / n)


def _pooled_log_ratio(logs: dict[str, list[float]]) -> dict:
    """Geometric mean of the paired ratios (``logs``: prompt → per-seed log ratios) with a standard
    error clustered by prompt and a 95% interval (Student t quantile, prompts − 1 degrees of freedom)."""
    from scipy.stats import t as student_t

    every = [x for xs in logs.values() for x in xs]
    n, k = len(every), len(logs)
    mean = statistics.fmean(every)
    if k >= 2:          # cluster-robust (CR1): prompt-to-prompt variation counts, seeds within a prompt are not independent draws
        se = math.sqrt(k / (k - 1) * sum(sum(x - mean for x in xs) ** 2 for xs in logs.values())) / n
        df = k - 1
    elif n >= 2:        # one prompt: the seeds are the only replication
        se, df = statistics.stdev(every) / math.sqrt(n), n - 1
    else:
        se, df = None, None
    q = float(student_t.ppf(0.975, df)) if df else None
    return {"ratio": math.exp(mean), "mean_log_ratio": mean, "se_log_ratio": se, "quantile": q,
            "low": math.exp(mean - q * se) if se is not None else None,
            "high": math.exp(mean + q * se) if se is not None else None,
            "n": n, "prompts": k, "seeds": max(len(xs) for xs in logs.values())}


def paired_summary(rows: list[BenchRow], best_assisted: str | None = None) -> dict:
    """Seed-paired comparison of every specbound method with each reference, for the rows of ONE mode.

    References: ``hf-generate`` and the best HF assisted-int8 configuration (``best_assisted``; by
    default the one with the higher mean tok/s) on end-to-end tok/s, and ``llamacpp-plain`` on decode
    tok/s, each when present. Per prompt: the ratio of the mean tok/s over seeds with its delta-method
    standard error for paired samples, ``R·sqrt((s_a²/ā² + s_b²/b̄² − 2·s_ab/(ā·b̄))/S)``: the covariance
    term is what pairing buys (a seed that makes both methods slow cancels out). Pooled over prompts: the
    geometric mean of the per-(prompt, seed) paired ratios, ``exp(mean log(a/b))``, its standard error
    clustered by prompt (CR1, so the S seeds of one prompt are not S independent prompts) and the 95%
    interval ``exp(mean ± q·SE)`` with q the Student t quantile on prompts − 1 degrees of freedom (2.36
    for 8 prompts). With a single prompt the SE is that of the seeds' log ratios. Also the median τ.
    """
    methods = [m for m in BENCH_METHODS if any(m in r.runs for r in rows)]
    if best_assisted is None:
        means = {m: statistics.fmean(r.runs[m].tokens_per_second for r in rows if m in r.runs)
                 for m in ASSISTED_INT8 if m in methods}
        best_assisted = max(means, key=means.get, default=None)
    prompts = list(dict.fromkeys(r.prompt for r in rows))
    comparisons: dict[str, dict] = {}
    for m in (x for x in SPECBOUND_METHODS if x in methods):
        for key, ref, measure in _REFERENCES:
            ref = best_assisted if ref is None else ref
            if ref is None or ref not in methods:
                continue
            pairs = {p: [] for p in prompts}
            for r in rows:
                if m in r.runs and ref in r.runs:
                    a, b = getattr(r.runs[m], measure), getattr(r.runs[ref], measure)
                    if _finite(a) and _finite(b) and a > 0 and b > 0:
                        pairs[r.prompt].append((a, b))
            pairs = {p: ab for p, ab in pairs.items() if ab}
            if not pairs:
                continue
            per_prompt = []
            for p, ab in pairs.items():
                ratio, se = _ratio_of_means([a for a, _ in ab], [b for _, b in ab])
                per_prompt.append({"prompt": p, "ratio": ratio, "se": se, "seeds": len(ab)})
            pooled = _pooled_log_ratio({p: [math.log(a / b) for a, b in ab] for p, ab in pairs.items()})
            comparisons.setdefault(m, {})[key] = {"reference": ref, "measure": measure,
                                                  "per_prompt": per_prompt, "pooled": pooled}
    return {"pairing": PAIRING, "best_assisted_int8": best_assisted, "prompts": len(prompts),
            "seeds": max((r.seed_index for r in rows), default=0) + 1,
            "median_tau": {m: statistics.median(r.runs[m].tau for r in rows if m in r.runs) for m in methods},
            "comparisons": comparisons}
