"""Several requests decoded together: B prompts share every target pass, each one lossless.

Not Yin et al.'s *batch speculative decoding* (M draft branches of ONE sequence, ``drafts=M``): here a
batch is B independent requests, as a server sees them (docs/design.md, batched requests).

Each request runs THE decoding loop (:class:`~specbound.decoding.engine.Speculator`) with its own
drafter, random stream and *rows* of the target and draft (:meth:`~specbound.models.base.LanguageModel.fork`:
shared weights, a cache of its own). One :class:`~specbound.models.rows.PassScheduler` runs the reads of
all waiting requests as ONE pass (draft rows first, then one target pass over every request's tokens).
Acceptance is ragged, requests finish independently, and each request's output law is that of the same
request decoded alone (``tests/test_batched_requests.py``). Sizing: ``gamma="auto"`` gives the batch one
chain length per round (:class:`~specbound.decoding.policy.BatchDraftLength`), or, where draft rows are
read in turn, a per-round limit under which each request sizes its own chain; ``tree="auto"`` sizes each
request's tree against the shared pass, t_B(k) = t(B·k), d_B(k) = d(B·k) (:func:`batch_cost_prior`).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from ..errors import SpecboundError
from ..models.base import LanguageModel, as_token_batch
from ..models.rows import PassRecord, PassScheduler
from ..theory.speedup import CostProfile, rows_pass_seconds
from .acceptance import acceptance_key, read_acceptance, remember_acceptance
from .costs import CostMeasurement, load_or_measure_costs
from .drafters import ChainDrafter
from .engine import (
    DecodeInterrupted, DraftSpec, PlainDrafter, Speculator, check_budget, check_context, check_vocabularies,
    make_generator,
)
from .policy import BatchDraftLength
from .result import DecodeResult
from .sampling import SamplingConfig
from .verify import STANDARD

__all__ = ["BatchDecodeResult", "BatchInterrupted", "autoregressive_decode_batch", "batch_cost_prior",
           "rows_shared", "speculative_decode_batch"]

#: rows reserve cache slots in doublings; tree nodes of one round on top of prompt + new tokens
_TREE_SLOTS = 64
#: a row's reserved slots may reach this many times what it uses (its reservations double)
_RESERVE_FACTOR = 2
#: the largest share of the available memory a batch's KV caches may take
_MEMORY_SHARE = 0.8
#: bytes per kB (the unit of /proc/meminfo) and per GiB
_KB, _GIB = 1024, 2**30
#: pass priorities in the scheduler: the draft's rows run first, then the target's pass
_DRAFT_PRIORITY, _TARGET_PRIORITY = 0, 1
#: γ = auto for a batch: the longest chain of a round (rows sharing passes) and the highest limit of a
#: round (draft rows read in turn, each request sizing its own chain under it)
_SHARED_MAX_GAMMA, _PER_REQUEST_MAX_GAMMA = 8, 32
#: ... and the timed rounds a measured rate or median reads, for each
_SHARED_WINDOW, _PER_REQUEST_WINDOW = 8, 16


@dataclass
class BatchDecodeResult:
    """One :class:`DecodeResult` per request, in the order of the prompts, and the batch's totals."""

    results: list[DecodeResult]
    wall_time: float = 0.0                    # first prefill to the last request's end
    passes: list[PassRecord] = field(default_factory=list)   # shared passes (rows that can share them)
    interrupted: bool = False

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self):
        return iter(self.results)

    def __getitem__(self, i) -> DecodeResult:
        return self.results[i]

    @property
    def new_tokens(self) -> int:
        return sum(r.metrics.new_tokens for r in self.results if r is not None)

    @property
    def tokens_per_second(self) -> float:
        """Total tokens per second of the batch (all requests' new tokens over the wall time)."""
        return self.new_tokens / self.wall_time if self.wall_time > 0 else float("inf")

    @property
    def prefill_time(self) -> float:
        """The batch's prefill: requests read their prompts together at the start, so it ends when the
        last of them has (their own ``metrics.prefill_time``)."""
        return max((r.metrics.prefill_time for r in self.results if r is not None), default=0.0)

    @property
    def decode_tokens_per_second(self) -> float:
        """Total tokens per second after the prefill (the rate ``theory.speedup.batch_throughput`` predicts)."""
        seconds = self.wall_time - self.prefill_time
        return self.new_tokens / seconds if seconds > 0 else float("inf")

    @property
    def target_passes(self) -> int:
        return sum(1 for p in self.passes if p.priority >= 1)


class BatchInterrupted(KeyboardInterrupt):
    """Ctrl-C during batched decoding; ``result`` holds every request's tokens so far."""

    def __init__(self, result: BatchDecodeResult):
        super().__init__("batched decoding interrupted")
        self.result = result


def batch_cost_prior(measurement: CostMeasurement, batch: int, rows_shared: tuple[bool, bool] = (True, True)
                     ) -> CostMeasurement:
    """The cost prior one request of a batch of ``batch`` sizes its drafts with: t_B(k) = t(B·k) and
    d_B(k) = d(B·k), the shared pass when every request sends k tokens (symmetric requests: one
    request's tokens per second is then the batch's throughput over B); B·d(k) (B·t(k)) where the
    draft's (target's) rows run in turn (``rows_shared`` = (draft, target)). Not cached (``key=None``)."""
    draft_shared, target_shared = rows_shared
    ks = tuple(measurement.target.ks)
    dks = tuple(measurement.draft.ks)
    return CostMeasurement(
        CostProfile(ks, tuple(float(rows_pass_seconds(measurement.target, batch, k, target_shared)) for k in ks)),
        CostProfile(dks, tuple(float(rows_pass_seconds(measurement.draft, batch, k, draft_shared)) for k in dks)),
        source=f"{measurement.source}, scaled to a batch of {batch}", key=None)


def rows_shared(target: LanguageModel, draft: LanguageModel | None) -> tuple[bool, bool]:
    """(draft, target): whether each model's rows share one forward in a batch's pass (no draft: True,
    nothing to price)."""
    return (draft is None or bool(draft.rows_share_passes), bool(target.rows_share_passes))


def _check_prompts(prompts, target: LanguageModel) -> list[list[int]]:
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__"):
        raise SpecboundError("prompts must be a list of prompts (each a list of token ids)")
    if len(prompts) == 0:
        raise SpecboundError("prompts is empty: give at least one prompt")
    out = []
    for i, prompt in enumerate(prompts):
        ids = as_token_batch(prompt, target.vocab_size, name=f"prompt {i}")
        if ids.shape[0] != 1:
            raise SpecboundError(f"prompt {i} must be one sequence of token ids, got shape {tuple(ids.shape)}")
        out.append(ids[0].tolist())
    return out


def _per_request(value, n: int, name: str, check) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise SpecboundError(f"{name} has {len(value)} entries for {n} prompts")
        return [check(v) for v in value]
    return [check(value)] * n


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * _KB
    except OSError:
        return None
    return None


def check_batch_memory(target, draft, prompts, budgets, available: int | None = None) -> int:
    """Refuse, before any cache is allocated, a batch whose rows' caches would not fit in memory.
    Each row reserves its slots in doublings, so up to twice (prompt + new tokens + one round's tree)
    slots per request and model are counted. Returns the estimate in bytes."""
    per_slot = target.cache_bytes_per_slot() + (draft.cache_bytes_per_slot() if draft is not None else 0)
    need = sum(_RESERVE_FACTOR * (len(p) + b + _TREE_SLOTS) * per_slot for p, b in zip(prompts, budgets))
    available = _available_memory() if available is None else available
    if available is not None and need > _MEMORY_SHARE * available:
        raise SpecboundError(
            f"a batch of {len(prompts)} requests needs about {need / _GIB:.1f} GiB of KV cache, more than "
            f"{_MEMORY_SHARE:.0%} of the {available / _GIB:.1f} GiB available: decode fewer prompts at once or fewer "
            "new tokens")
    return need


def _rows(model: LanguageModel, n: int, scheduler: PassScheduler, priority: int) -> list[LanguageModel]:
    if not model.supports_batches:
        model.fork()                         # raises the backend's clear refusal
    rows = model.fork_rows(n)
    for row in rows:
        if hasattr(row, "scheduler"):        # rows whose reads can share one pass
            row.scheduler, row.batch_priority = scheduler, priority
    return rows


def _decode_requests(target, draft, prompts, max_new_tokens, sampling, make_drafter, rule, seed, stop_token_ids,
                     callback) -> BatchDecodeResult:
    """Decode ``prompts`` (checked by :func:`_check_prompts`) together; see :func:`speculative_decode_batch`.
    ``make_drafter(target_row, draft_row, scheduler)`` returns each request's drafter, joined to the batch
    (:meth:`~specbound.decoding.drafters.base.Drafter.join_batch`)."""
    n = len(prompts)
    budgets = _per_request(max_new_tokens, n, "max_new_tokens", check_budget)
    seeds = _per_request(seed, n, "seed", lambda s: s) if isinstance(seed, (list, tuple)) else \
        [None if seed is None else seed + i for i in range(n)]
    for i, (p, b) in enumerate(zip(prompts, budgets)):
        check_context(target, len(p), b, name=f"prompt {i}")
    if callback is not None and not callable(callback):
        raise SpecboundError("callback must be callable as callback(request_index, new_token_ids)")
    check_batch_memory(target, draft, prompts, budgets)
    generators = [make_generator(s) for s in seeds]
    scheduler = PassScheduler(live=n)
    target_rows = _rows(target, n, scheduler, priority=_TARGET_PRIORITY)
    draft_rows = _rows(draft, n, scheduler, priority=_DRAFT_PRIORITY) if draft is not None else [None] * n
    drafters = [make_drafter(t, d, scheduler) for t, d in zip(target_rows, draft_rows)]   # each joined to the batch
    stop = threading.Event()
    engines = [Speculator(t, dr, sampling, rule, stop_token_ids, g, stop=stop)
               for t, dr, g in zip(target_rows, drafters, generators)]
    results: list[DecodeResult | None] = [None] * n
    errors: list[BaseException | None] = [None] * n
    interrupted = False

    def work(i: int) -> None:
        nonlocal interrupted
        # this thread's own torch work is small (sampling, verification): one OpenMP thread, so no second
        # team spins beside the serving thread's (torch's thread count is per OpenMP thread)
        torch.set_num_threads(1)
        try:
            each = None if callback is None else (lambda tokens, i=i: callback(i, tokens))
            results[i] = engines[i].run(prompts[i], budgets[i], callback=each)
        except DecodeInterrupted as exc:
            results[i], interrupted = exc.result, True
        except BaseException as exc:   # noqa: BLE001 - re-raised in the caller's thread
            errors[i] = exc
            stop.set()                   # a failed request stops the batch (the others keep their tokens)
            scheduler.stop()
        finally:
            scheduler.leave()

    threads = [threading.Thread(target=work, args=(i,), name=f"specbound-request-{i}", daemon=True)
               for i in range(n)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    try:
        scheduler.serve()                # every shared pass runs here, in the caller's thread
    except KeyboardInterrupt:
        stop.set()
        scheduler.stop()
        interrupted = True
    for th in threads:
        th.join()
    out = BatchDecodeResult(results, time.perf_counter() - t0, scheduler.passes, interrupted)
    failed = [(i, e) for i, e in enumerate(errors) if e is not None]
    if failed:
        i, exc = failed[0]
        if isinstance(exc, SpecboundError):
            raise SpecboundError(f"request {i}: {exc}") from exc
        raise exc
    if interrupted:
        raise BatchInterrupted(out)
    return out


def speculative_decode_batch(target: LanguageModel, draft: LanguageModel | None, prompts, max_new_tokens, *,
                             gamma=None, temperature: float = 1.0, top_k: int | None = None,
                             top_p: float | None = None, seed=None, tree=None, tree_drafter: str = "dynamic",
                             callback=None, drafts: int | None = None, design: str = "B", relaxation=None,
                             stop_token_ids=(), verification: str = "token") -> BatchDecodeResult:
    """Lossless speculative decoding of several prompts together: one result per prompt, in order.

    The keywords are those of :func:`~specbound.decoding.engine.speculative_decode` and apply to every
    request; ``max_new_tokens`` and ``seed`` may also be lists (one per prompt). An integer ``seed``
    gives request i the seed ``seed + i``, so request 0 decodes exactly as ``speculative_decode`` with
    ``seed`` would, and no request's stream depends on the others. ``callback(i, new_token_ids)``
    streams request i's tokens. Every draft and target pass is shared by the requests waiting on it
    (rows of backends that can share passes: Llama-family Hugging Face models with the static cache,
    and llama.cpp models, whose rows are sequence ids of one context (:meth:`LlamaCppModel.fork_rows`);
    others decode their rows in turn, with the same output). ``gamma="auto"`` gives the batch one chain
    length per round (:class:`~specbound.decoding.policy.BatchDraftLength`; with draft rows read in
    turn, a per-round limit under which each request sizes its own chain); ``tree="auto"`` sizes each
    request's tree against the shared pass (:func:`batch_cost_prior`).
    """
    sampling = SamplingConfig(temperature, top_k, top_p)
    spec = DraftSpec(gamma, tree, tree_drafter, drafts, design, relaxation, verification)
    check_vocabularies(target, draft)
    prompts = _check_prompts(prompts, target)
    n = len(prompts)
    joint = gamma == "auto" and tree is None and (drafts or 1) == 1 and n > 1
    measurement = load_or_measure_costs(target, draft) if "auto" in (gamma, tree) else None
    memory = acceptance_key(target, draft, sampling, spec.verification) if spec.drafts_a_chain else None
    sharing = rows_shared(target, draft)
    per_request = joint and not sharing[0]   # draft rows read in turn: each request sizes its own chain
    shown = read_acceptance(memory) if joint and not per_request else None   # what the start gate prices
    shared = batch_cost_prior(measurement, n, sharing) if measurement is not None and (per_request or not joint) \
        else None
    lengths = {}
    rows: list = []
    budgets = _per_request(max_new_tokens, n, "max_new_tokens", check_budget)

    def outlook():
        """(tokens the unfinished requests may still decode, committed tokens their draft rows have not read)."""
        remaining = backlog = 0
        for (target_row, draft_row), prompt, budget in zip(rows, prompts, budgets):
            committed = max(target_row.committed_length, len(prompt))   # a row may not have counted its prompt yet
            left = budget - max(committed - len(prompt), 0)
            if left > 0:
                remaining += left
                backlog += max(committed - draft_row.cache_length, 0)
        return remaining, backlog

    def make_drafter(target_row, draft_row, scheduler):
        rows.append((target_row, draft_row))
        if joint:                            # one draft-or-plain decision (and length) per round for the batch
            if "policy" not in lengths:
                lengths["policy"] = BatchDraftLength(
                    measurement, passes=lambda: scheduler.passes, live=lambda: scheduler.live,
                    rows_shared=sharing, per_request=per_request,
                    max_gamma=_PER_REQUEST_MAX_GAMMA if per_request else _SHARED_MAX_GAMMA,
                    window=_PER_REQUEST_WINDOW if per_request else _SHARED_WINDOW,
                    outlook=None if per_request else outlook,
                    shown=None if shown is None else shown.per_depth(_SHARED_MAX_GAMMA))
            policy = lengths["policy"]
            return ChainDrafter(draft_row, sampling, "auto" if per_request else policy, shared=policy
                                ).join_batch(shared)
        return spec.build(target_row, draft_row, sampling).join_batch(shared)

    out = _decode_requests(target, draft if spec.needs_draft_model else None, prompts, max_new_tokens, sampling,
                           make_drafter, spec.rule, seed, stop_token_ids, callback)
    remember_acceptance(memory, [r.metrics for r in out.results])
    return out


def autoregressive_decode_batch(target: LanguageModel, prompts, max_new_tokens, *, temperature: float = 1.0,
                                top_k: int | None = None, top_p: float | None = None, seed=None,
                                stop_token_ids=(), callback=None) -> BatchDecodeResult:
    """Plain batched decoding: every request reads one token per shared target pass (the baseline
    of :func:`speculative_decode_batch`; the same loop with no drafter)."""
    sampling = SamplingConfig(temperature, top_k, top_p)
    out = _decode_requests(target, None, _check_prompts(prompts, target), max_new_tokens, sampling,
                           lambda t, d, s: PlainDrafter(sampling).join_batch(),
                           STANDARD, seed, stop_token_ids, callback)
    for r in out.results:
        if r is not None:
            r.method = "autoregressive"
    return out
