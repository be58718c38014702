"""The decoding side of the server: a queue, one serving thread, and one thread per running request.

Each request runs THE loop of ``generate`` (:class:`~specbound.decoding.engine.Speculator`, the drafter
``DraftSpec.build`` makes) on rows of its own (:meth:`~specbound.models.base.LanguageModel.fork`).
Batched, its rows' reads go through one :class:`ServingScheduler`: a request joins between rounds
(its first read is part of the next shared pass), leaves when it ends, and its rows are then freed;
sequential, one request runs at a time. A request's tokens do not depend on the others: greedy
answers equal ``speculative_decode``'s, sampled ones follow the target's law from the request's seed.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
import weakref
from dataclasses import dataclass

import torch

from ..decoding import DecodeInterrupted, DraftSpec, PlainDrafter, Speculator, make_generator
from ..decoding.batch import batch_cost_prior, rows_shared
from ..decoding.costs import load_or_measure_costs
from ..errors import SpecboundError
from ..models.base import LanguageModel
from ..models.tokens import stop_token_ids
from .api_errors import APIError
from .job import Job
from .metrics import ServeMetrics
from .policy import choose_batching
from .scheduler import ServingScheduler
from .text import SharedTokenizer

__all__ = ["DecodeService", "ServeSettings"]

log = logging.getLogger("specbound.serve")

#: pass priorities, as in batched decoding: the draft's rows first, then the target's pass
_DRAFT_PRIORITY, _TARGET_PRIORITY = 0, 1


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """The server's limits and names (every one an option of ``specbound serve``)."""

    model_name: str
    max_queue: int = 64
    max_batch: int = 8
    default_max_tokens: int = 256
    max_tokens_limit: int = 2048
    batching: str = "auto"

    def __post_init__(self):
        for name in ("max_queue", "max_batch", "default_max_tokens", "max_tokens_limit"):
            if getattr(self, name) < 1:
                raise SpecboundError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


class DecodeService:
    """Decodes requests on ALREADY LOADED models; :meth:`start` it, :meth:`submit` jobs, :meth:`close` it."""

    def __init__(self, *, target, draft, spec: DraftSpec, settings: ServeSettings, measurement=None,
                 plain: bool = False, ignore_eos: bool = False):
        self.target, self.spec, self.settings, self.plain = target, spec, settings, plain
        self.draft = draft if (spec.needs_draft_model and not plain) else None
        auto = "auto" in (spec.gamma, spec.tree) or spec.shape == "auto" or getattr(spec, "context", "off") == "auto"
        if measurement is None and auto and not plain:
            measurement = load_or_measure_costs(target, self.draft)
        self.costs = measurement
        self.batching = choose_batching(target, self.draft, mode=settings.batching, measurement=measurement)
        self.max_batch = settings.max_batch if self.batching.batched else 1
        self.stop_ids = () if ignore_eos else tuple(stop_token_ids(target))
        self.tokenizer = SharedTokenizer(target.tokenizer)
        self.metrics = ServeMetrics(batching_mode=self.batching.mode)
        self.scheduler = ServingScheduler(on_pass=self.metrics.observe_pass)
        self.threads = torch.get_num_threads()
        self._pending: collections.deque[Job] = collections.deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.live_jobs: weakref.WeakSet = weakref.WeakSet()     # every Job not yet collected
        self.live_rows: weakref.WeakSet = weakref.WeakSet()     # every forked row not yet collected
        self.running: set[Job] = set()
        self._pools = {id(m): self._pool(m, p) for m, p in ((target, _TARGET_PRIORITY), (self.draft, _DRAFT_PRIORITY))
                       if m is not None and _pooled(m)}

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="specbound-serve", daemon=True)
        self._thread.start()
        log.info("batching: %s (%s)", self.batching.mode, self.batching.reason)

    def _serve(self) -> None:
        torch.set_num_threads(self.threads)          # the passes run here: the configured thread count
        self.scheduler.serve_forever(lambda: self._admit())

    def close(self, *, timeout: float = 30.0) -> None:
        """Stop: queued requests are cancelled, running ones stop at their next round; waits for them."""
        with self._lock:
            pending, self._pending = list(self._pending), collections.deque()
            running = list(self.running)
        for job in pending:
            job.finish(None, cancelled=True)
        for job in running:
            job.cancel.set()
        self.scheduler.close()
        if self._thread is not None:
            self._thread.join(timeout)
        self.metrics.queue_depth.set(0)

    # ------------------------------------------------------------------ requests
    def submit(self, job: Job) -> Job:
        """Queue ``job``; a full queue is a 429, a closed server a 503."""
        with self._lock:
            if self.scheduler.closed:
                raise APIError("the server is shutting down", status=503, type="server_error", code="shutting_down")
            if len(self._pending) >= self.settings.max_queue:
                raise APIError(f"the queue is full ({self.settings.max_queue} requests wait): retry later",
                               status=429, type="rate_limit_exceeded", code="queue_full")
            self._pending.append(job)
            self.live_jobs.add(job)
            self.metrics.queue_depth.set(len(self._pending))
        return job

    def _admit(self) -> None:
        """(Serving thread, scheduler lock held.) Start queued requests while fewer than max_batch run."""
        with self._lock:
            while self._pending and len(self.running) < self.max_batch:
                job = self._pending.popleft()
                if job.cancel.is_set():                    # its client left while it waited
                    job.finish(None, cancelled=True)
                    continue
                self.running.add(job)
                self.scheduler.join()
                threading.Thread(target=self._work, args=(job,), name="specbound-request", daemon=True).start()
            self.metrics.queue_depth.set(len(self._pending))
            self.metrics.running.set(len(self.running))

    def _pool(self, model, priority: int) -> list:
        """max_batch rows made together (llama.cpp: one context, so their reads share passes), reused."""
        rows = model.fork_rows(self.max_batch)
        for row in rows:
            self._schedule(row, priority)
        return rows

    def _schedule(self, row, priority: int):
        if hasattr(row, "scheduler"):                  # rows whose reads can share one pass
            row.scheduler, row.batch_priority = self.scheduler, priority
        return row

    def _row(self, model, priority: int):
        if not model.supports_batches:
            return model                               # one request at a time (max_batch 1) on the model itself
        pool = self._pools.get(id(model))
        if pool is not None:
            with self._lock:
                return pool.pop()                      # never empty: at most max_batch requests run
        row = self._schedule(model.fork(), priority)
        self.live_rows.add(row)
        return row

    def _release(self, model, row) -> None:
        """(The request's thread, before it leaves: no pass runs meanwhile.) Free or return ``row``."""
        if row is None or row is model:
            return
        pool = self._pools.get(id(model))
        if pool is None:
            getattr(row, "close", lambda: None)()
            return
        row.reset()
        with self._lock:
            pool.append(row)

    def _work(self, job: Job) -> None:
        """(A request's thread.) Decode ``job`` on rows of its own, then free them and leave."""
        rows, result, cancelled = [], None, False
        try:
            target_row = self._row(self.target, _TARGET_PRIORITY)
            rows.append((self.target, target_row))
            scheduled = getattr(target_row, "scheduler", None) is not None
            torch.set_num_threads(1 if scheduled else self.threads)
            draft_row = self._row(self.draft, _DRAFT_PRIORITY) if self.draft is not None else None
            rows.append((self.draft, draft_row))
            request = job.request
            drafter = (PlainDrafter(request.sampling) if self.plain else
                       self.spec.build(target_row, draft_row, request.sampling)).join_batch(self._prior())
            engine = Speculator(target_row, drafter, request.sampling, self.spec.rule, self.stop_ids,
                                make_generator(request.seed), stop=job.cancel)
            try:
                result = engine.run(request.ids, request.max_tokens, callback=job.on_tokens)
            except DecodeInterrupted as stop:
                result, cancelled = stop.result, not job.text.stopped
            done = job.finish(result, cancelled=cancelled)
            self._account(job, result, done, scheduled)
        except BaseException as exc:                   # noqa: BLE001 - handed to the request's handler
            log.exception("request failed")
            job.fail(exc)
        finally:
            for model, row in rows:
                self._release(model, row)
            with self._lock:
                self.running.discard(job)
                self.metrics.running.set(len(self.running))
            self.scheduler.leave()

    def _prior(self):
        """The costs a starting request sizes its drafts with: the shared pass of the requests running as
        it starts (:func:`~specbound.decoding.batch.batch_cost_prior`, as batched decoding's per-request
        sizing), the pair's own costs when it runs alone."""
        with self._lock:
            running = len(self.running)
        if self.costs is None or running <= 1:
            return self.costs
        return batch_cost_prior(self.costs, running, rows_shared(self.target, self.draft))

    def _account(self, job: Job, result, done: dict, scheduled: bool) -> None:
        m = result.metrics
        self.metrics.observe_result(len(job.request.ids), m)
        if not scheduled:
            self.metrics.rounds.labels(mode="sequential").inc(m.target_calls)
        if job.first_token_at is not None:
            self.metrics.ttft.observe(job.first_token_at - job.arrived)
            if m.new_tokens > 1:
                self.metrics.tpot.observe((time.perf_counter() - job.first_token_at) / (m.new_tokens - 1))

    @property
    def queue_depth(self) -> int:
        return len(self._pending)


def _pooled(model) -> bool:
    """Rows that share passes only when made together (llama.cpp's contexts): a pool made at start."""
    return model.supports_batches and type(model).fork_rows is not LanguageModel.fork_rows
