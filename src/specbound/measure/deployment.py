"""Which target decodes by default on THIS machine, decided by timing the candidates, not by what compiled.

The packaged pair's target can be read three ways: the GGUF file's own K-quant weights on specbound's
kernel (on the kernel path this CPU runs, :func:`~specbound.models.kquant.kernel_path`), the int8 copy
(fbgemm; only where that copy is already built), or llama.cpp itself. On first use on a machine
:func:`choose_deployment` times each candidate target's t(1) and t(8) and the draft's d(1), predicts
each torch target's speculative tokens per second with the pair's acceptance
(:func:`~specbound.theory.speedup.best_gamma`), and picks the fastest; where no speculative setting is
predicted to beat plain llama.cpp decoding of the same file by :data:`MIN_GAIN`, the default decodes
plainly on llama.cpp. The decision is kept in ``<cache>/deployment.json`` per machine (CPU model and
flags, threads), kernel version, forced path and model files; it is validated when read and measured
again when anything in its key changes or the entry is bad.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..assets.models import DEFAULT_DRAFT, DEFAULT_TARGET
from ..decoding.acceptance import pooled_greedy_acceptance
from ..decoding.costs import machine_name, measure_forward_costs
from ..errors import SpecboundError
from ..theory.speedup import CostProfile, best_gamma

__all__ = ["DEFAULT_ACCEPTANCE", "DEPLOYMENT_VERSION", "MIN_GAIN", "Candidate", "Deployment", "choose_deployment",
           "deployment_file", "deployment_key", "read_deployments"]

DEPLOYMENT_VERSION = 1
#: A speculative setting must be predicted this much faster than plain llama.cpp to be chosen: the
#: prediction's error (advise's, median |measured/predicted - 1| ~5-7% on held-out prompts) must not
#: turn a predicted win into a loss.
MIN_GAIN = 1.08
#: The acceptance per draft depth a pair is priced with before it has shown its own (greedy): the packaged
#: Qwen2.5-Coder 1.5B / 0.5B (q4_0 on llama.cpp) pair's pooled rate over development slices of HumanEval
#: (0.92), GSM8K (0.89) and MT-Bench (0.66), 0.81, rounded down (benchmarks/pair_acceptance.py,
#: docs/results/pair-acceptance/). Runs of the pair replace it with what they show.
DEFAULT_ACCEPTANCE = 0.8
#: Longest chain priced (t(k) is measured at k = 1 and 8, interpolated between)
MAX_GAMMA = 7


def deployment_file() -> Path:
    from ..assets.cache import cache_root

    return cache_root() / "deployment.json"


@dataclass
class Candidate:
    """One way to read the target: its kernels and what a pass costs here (median seconds)."""

    name: str                     # "kquant", "int8", "llamacpp"
    kernels: str
    t1: float
    t8: float
    predicted_rate: float = 0.0   # tokens/s: speculative for torch targets (γ below), plain for llama.cpp
    gamma: int = 0

    def profile(self) -> CostProfile:
        return CostProfile((1, 8), (self.t1, max(self.t8, self.t1)))


@dataclass
class Deployment:
    """The default's target and why: ``target_precision`` for a torch target, or None where the default
    decodes plainly on llama.cpp (``engine == "llamacpp"``)."""

    engine: str                   # "torch" (speculative, target_precision) or "llamacpp" (plain)
    target_precision: str | None
    kernel_path: str | None
    draft_d1: float
    acceptance: float
    candidates: list[Candidate] = field(default_factory=list)
    measured_at: str = ""
    seconds: float = 0.0          # wall time of the measurement (not the loading)
    source: str = "measured"      # or "cache"

    @property
    def plain_llamacpp(self) -> bool:
        return self.engine == "llamacpp"

    def candidate(self, name: str) -> Candidate | None:
        return next((c for c in self.candidates if c.name == name), None)

    def describe(self) -> str:
        """One line: what the default decodes with, and the measurement that chose it."""
        llama = self.candidate("llamacpp")
        bar = f"plain llama.cpp {llama.predicted_rate:.1f} tok/s (t(1) {1e3 * llama.t1:.0f} ms)" if llama else \
            "llama.cpp not installed"
        torch_targets = [c for c in self.candidates if c.name != "llamacpp"]
        costs = "; ".join(f"{c.name}: t(1) {1e3 * c.t1:.0f} ms, t(8) {1e3 * c.t8:.0f} ms → predicted "
                          f"{c.predicted_rate:.1f} tok/s (γ = {c.gamma})" for c in torch_targets)
        when = f"measured {self.measured_at}" + (" (kept)" if self.source == "cache" else f" in {self.seconds:.0f} s")
        if self.plain_llamacpp:
            return (f"decoding plainly on llama.cpp: no speculative setting is predicted to beat it by {MIN_GAIN:.2f}× "
                    f"here ({costs}; draft d(1) {1e3 * self.draft_d1:.0f} ms; {bar}; {when})")
        return (f"target {self.target_precision} on the {self.kernel_path or '-'} kernel path, chosen by measurement "
                f"({costs}; draft d(1) {1e3 * self.draft_d1:.0f} ms, acceptance {self.acceptance:.2f}; {bar}; {when})")

    def as_entry(self) -> dict:
        entry = asdict(self)
        entry.pop("source")
        return entry


# ------------------------------------------------------------------ the key and the file
def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.machine()


def _file_stamp(path) -> str:
    st = Path(path).stat()
    return f"{Path(path).resolve()}:{st.st_size}:{st.st_mtime_ns}"


def deployment_key(target_file, draft_file, threads: int) -> str:
    """The machine (CPU model, flags, threads), the kernel's version and forced path, the llama.cpp
    binding's version and the two model files: any change measures again."""
    from ..models.kquant import PATH_VARIABLE, kernel_available, kernel_hash

    try:
        import llama_cpp
        llama = getattr(llama_cpp, "__version__", "?")
    except ImportError:
        llama = "none"
    parts = [f"cpu={machine_name()}", f"flags={hashlib.sha256(_cpu_flags().encode()).hexdigest()[:16]}",
             f"threads={threads}", f"kernel={kernel_hash() if kernel_available() else 'none'}",
             f"path={os.environ.get(PATH_VARIABLE, '').strip() or 'auto'}", f"llama_cpp={llama}",
             f"target={_file_stamp(target_file)}", f"draft={_file_stamp(draft_file) if draft_file else 'none'}"]
    return "|".join(parts)


def _deployment_from(entry) -> Deployment:
    if not isinstance(entry, dict):
        raise ValueError("entry is not an object")
    candidates = []
    for c in entry.get("candidates") or []:
        cand = Candidate(**c)
        if not all(isinstance(v, (int, float)) and v > 0 for v in (cand.t1, cand.t8)):
            raise ValueError("candidate times must be > 0")
        candidates.append(cand)
    fields = {k: entry[k] for k in ("engine", "target_precision", "kernel_path", "draft_d1", "acceptance",
                                    "measured_at", "seconds")}
    out = Deployment(**fields, candidates=candidates, source="cache")
    if out.engine not in ("torch", "llamacpp") or (out.engine == "torch") != (out.target_precision is not None):
        raise ValueError(f"engine {out.engine!r} with target {out.target_precision!r}")
    return out


def read_deployments(path: Path | None = None) -> dict[str, Deployment]:
    """Valid entries of the deployment file; a malformed file or entry is dropped with a warning naming it."""
    path = path or deployment_file()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        warnings.warn(f"ignoring unreadable {path} ({exc}); the default target will be measured again", stacklevel=2)
        return {}
    if not isinstance(raw, dict) or raw.get("version") != DEPLOYMENT_VERSION or not isinstance(raw.get("entries"), dict):
        warnings.warn(f"ignoring {path}: not a version-{DEPLOYMENT_VERSION} deployment file; measuring again",
                      stacklevel=2)
        return {}
    out = {}
    for key, entry in raw["entries"].items():
        try:
            out[key] = _deployment_from(entry)
        except (TypeError, KeyError, ValueError) as exc:
            warnings.warn(f"dropping a bad entry of {path} ({type(exc).__name__}: {exc}); it will be measured again",
                          stacklevel=2)
    return out


def _write(key: str, deployment: Deployment, path: Path | None = None) -> None:
    from ..assets.cache import atomic_write_json

    path = path or deployment_file()
    entries = read_deployments(path)
    entries[key] = deployment
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"version": DEPLOYMENT_VERSION, "entries": {k: d.as_entry() for k, d in entries.items()}})
    except (OSError, SpecboundError) as exc:
        warnings.warn(f"could not write {path} ({exc}); the default target will be measured again next run",
                      stacklevel=2)


# ------------------------------------------------------------------ the measurement
def _timed(model, repeats: int) -> tuple[float, float]:
    measure_forward_costs(model, ks=(1, 8), repeats=1)            # warm-up: first touches of the weights
    profile, _ = measure_forward_costs(model, ks=(1, 8), repeats=repeats)
    return float(profile(1)), float(profile(8))


def price(candidates: list[Candidate], draft_d1: float, acceptance: float) -> Deployment:
    """Each torch target's best predicted speculative rate (chains of γ ≤ :data:`MAX_GAMMA`, one draft read
    per depth), llama.cpp's plain rate, and the choice (see the module docstring)."""
    for c in candidates:
        if c.name == "llamacpp":
            c.predicted_rate, c.gamma = 1.0 / c.t1, 0
        else:
            gamma, speedup = best_gamma(acceptance, draft_d1, c.profile(), max_gamma=MAX_GAMMA)
            c.predicted_rate, c.gamma = speedup / c.t1, gamma
    torch_targets = [c for c in candidates if c.name != "llamacpp"]
    llama = next((c for c in candidates if c.name == "llamacpp"), None)
    best = max(torch_targets, key=lambda c: c.predicted_rate, default=None)
    if best is None or (llama is not None and best.predicted_rate < MIN_GAIN * llama.predicted_rate):
        if llama is None:
            raise SpecboundError("no target to decode with: neither the K-quant kernel nor llama.cpp is available")
        return Deployment("llamacpp", None, None, draft_d1, acceptance, candidates)
    from ..models.kquant import kernel_path

    path = kernel_path() if best.name == "kquant" else None
    return Deployment("torch", best.name, path, draft_d1, acceptance, candidates)


def choose_deployment(*, target=None, draft=None, draft_quant: str = "q4_0", draft_engine: str = "llamacpp",
                      compiled: bool = True, progress: bool = True, use_cache: bool = True,
                      repeats: int = 5) -> tuple[Deployment, dict]:
    """The default target for this pair on this machine: the kept decision, or a measurement (see the
    module docstring). Returns (decision, models loaded for the measurement by role — "kquant", "int8",
    "llamacpp", "draft" — so a caller decodes with them instead of loading them again)."""
    from ..models.kquant import kernel_available
    from ..models.loading import _kquant_file, gguf_file, load_gguf_model, load_model

    target, draft = target or DEFAULT_TARGET, draft or DEFAULT_DRAFT
    import torch

    target_file = _kquant_file(target, progress)
    try:
        from ..models.llamacpp import load_llama_cpp

        load_llama_cpp()
        have_llama = True
    except SpecboundError:
        have_llama = False
    llama_draft = have_llama and draft_engine == "llamacpp"
    draft_file = gguf_file(draft, progress, draft_quant) if llama_draft else None
    key = deployment_key(target_file, draft_file, torch.get_num_threads()) + f"|draft_engine={draft_engine}"
    if use_cache:
        kept = read_deployments().get(key)
        if kept is not None:
            return kept, {}
    models: dict = {}
    candidates: list[Candidate] = []
    if kernel_available():
        try:
            models["kquant"] = load_model(target, progress, precision="kquant", compiled=compiled)
        except SpecboundError as exc:            # e.g. tensors of other types: not a candidate, said why
            if not have_llama:
                raise
            print(f"the K-quant target is not a candidate here: {exc}", file=sys.stderr)
    int8_copy = _int8_copy_exists(target)
    if int8_copy:
        models["int8"] = load_model(target, progress, precision="int8", compiled=compiled)
    if have_llama:
        models["llamacpp"] = open_plain_llamacpp(target_file, name=str(target))
    if llama_draft:
        models["draft"] = load_gguf_model(draft, progress=progress, quant=draft_quant, role="draft")
    else:                                    # the torch int8 draft
        models["draft"] = load_model(draft, progress, int8=True, invariant=False)
    t0 = time.perf_counter()
    for name in ("kquant", "int8", "llamacpp"):
        if name in models:
            t1, t8 = _timed(models[name], repeats)
            candidates.append(Candidate(name, models[name].info.kernels, t1, t8))
    measure_forward_costs(models["draft"], ks=(1,), repeats=1)
    d1 = float(measure_forward_costs(models["draft"], ks=(1,), repeats=repeats)[0](1))
    first = next(iter(m for n, m in models.items() if n in ("kquant", "int8")), None)
    acceptance = pooled_greedy_acceptance(first.info.identity if first else None, models["draft"].info.identity) \
        or DEFAULT_ACCEPTANCE
    decision = price(candidates, d1, acceptance)
    decision.seconds = time.perf_counter() - t0
    decision.measured_at = time.strftime("%Y-%m-%d %H:%M")
    if use_cache:
        _write(key, decision)
    return decision, models


def open_plain_llamacpp(path, *, name: str | None = None):
    """The target's GGUF file on llama.cpp as a plain decoder runs it: llama.cpp's own defaults (f16 K/V,
    its flash-attention choice), which plain decoding may use (no verify pass to agree with)."""
    from ..models.llamacpp import LlamaCppModel

    return LlamaCppModel(path, name=name, kv_cache_type=None, flash_attn=None)


def _int8_copy_exists(target) -> bool:
    """Whether the packaged target's int8 copy is already built (it is never built just to be timed)."""
    from ..assets.convert import check_converted
    from ..assets.models import is_packaged_name

    return is_packaged_name(target) and check_converted(str(target), precision="int8").state in ("ok", "verified")
