"""Rows of a batch that share forward passes: the :class:`PassScheduler`.

Batched decoding runs one decoding loop per request (the same loop as for one request, in a thread of
its own), each on its own *rows* of the target and draft (:meth:`LanguageModel.fork`: the same weights,
a cache of its own). A row that can share passes hands its read to the scheduler; when EVERY live
request is waiting on a read, the serving thread (the caller's, :meth:`PassScheduler.serve`) runs one
group of them as ONE pass (:func:`~specbound.models.static.read_rows`) and wakes their threads. The
group of lowest ``priority`` (the draft's rows) runs first, so the target's reads gather while the draft
finishes; a group holds reads of one set of weights only. The schedule is deterministic: a pass starts
only when all live requests wait, so its members depend on each request's own progress, never on thread
timing. Each row attends only to its own cache, so a request's tokens do not depend on which others
share its passes (up to the kernels' batch invariance; specbound's int8 kernels are batch-invariant).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

__all__ = ["PassScheduler", "PassRecord"]


@dataclass
class _Call:
    run: object          # run(list of reads) -> list of results, one pass
    read: object
    group: object
    priority: int
    done: bool = False
    result: object = None
    error: BaseException | None = None


@dataclass
class PassRecord:
    """One shared pass: its group's priority, how many rows and tokens it read, and its seconds."""

    priority: int
    rows: int
    tokens: int
    seconds: float


@dataclass
class PassScheduler:
    """Gathers the rows' reads into shared passes while ``live`` request threads run."""

    live: int
    passes: list[PassRecord] = field(default_factory=list)

    def __post_init__(self):
        self._cond = threading.Condition()
        self._waiting: list[_Call] = []
        self.stopping = False

    def submit(self, run, read, group, priority: int = 1):
        """(A request's thread.) Wait until ``read`` has been run in a shared pass by the serving
        thread and return its result. Raises KeyboardInterrupt once :meth:`stop` was called."""
        call = _Call(run, read, group, priority)
        with self._cond:
            if self.stopping:
                raise KeyboardInterrupt
            self._waiting.append(call)
            self._cond.notify_all()
            while not call.done:
                if self.stopping:
                    self._waiting.remove(call)
                    raise KeyboardInterrupt
                self._cond.wait()
        if call.error is not None:
            raise call.error
        return call.result

    def serve(self) -> None:
        """(The caller's thread, while the requests run.) Whenever every live request waits on a read,
        run one group as one pass; return when no request is left. All passes run in THIS thread, so the
        process keeps one OpenMP thread team (a pass run from a request's thread would start a team of
        its own, and idle teams spinning beside the working one slowed decoding by ~17% here: 10.2 vs 12.3 tok/s)."""
        with self._cond:
            while self.live > 0:
                if self._waiting and len(self._waiting) >= self.live and not self.stopping:
                    self._run_one_group()
                else:
                    self._cond.wait(0.05)      # a timeout keeps Ctrl-C deliverable to this thread

    def _run_one_group(self) -> None:
        """(Lock held, every live request waiting.) Run the lowest-priority group as one pass."""
        first = min(self._waiting, key=lambda c: c.priority)
        group = [c for c in self._waiting if c.group == first.group and c.priority == first.priority]
        t0 = time.perf_counter()
        interrupted = None
        try:
            results = first.run([c.read for c in group])
            for c, r in zip(group, results):
                c.result = r
        except BaseException as exc:     # noqa: BLE001 - handed to every request of the pass
            for c in group:
                c.error = exc
            if isinstance(exc, KeyboardInterrupt):
                interrupted = exc
        tokens = sum(int(c.read.tokens.shape[1]) for c in group if hasattr(c.read, "tokens"))
        self.passes.append(PassRecord(first.priority, len(group), tokens, time.perf_counter() - t0))
        for c in group:
            c.done = True
            self._waiting.remove(c)
        self._cond.notify_all()
        if interrupted is not None:
            raise interrupted

    def leave(self) -> None:
        """A request thread ends: one fewer to wait for."""
        with self._cond:
            self.live -= 1
            self._cond.notify_all()

    def stop(self) -> None:
        """Ctrl-C: every waiting and every later read raises KeyboardInterrupt in its request's thread."""
        with self._cond:
            self.stopping = True
            self._cond.notify_all()
