"""The pass scheduler of a running server: requests join and leave between rounds.

:class:`~specbound.models.rows.PassScheduler` runs one pass over every waiting row once EVERY live
request waits; here the set of live requests changes while it serves: :meth:`ServingScheduler.join`
adds one (its first read joins the next pass), ``leave`` drops one, and :meth:`serve_forever` keeps
serving (admitting queued requests whenever a pass is not running) until it is closed and empty.
"""
from __future__ import annotations

from ..models.rows import PassScheduler

__all__ = ["ServingScheduler"]


class ServingScheduler(PassScheduler):
    """A PassScheduler whose live requests come and go; each finished pass is handed to ``on_pass``
    and dropped, so a long run keeps no per-pass history."""

    def __init__(self, *, on_pass=None):
        super().__init__(live=0)
        self.on_pass = on_pass
        self.closed = False

    def join(self) -> None:
        """A request starts: the next pass waits for its read too."""
        with self._cond:
            self.live += 1
            self._cond.notify_all()

    def close(self) -> None:
        """No more requests: :meth:`serve_forever` returns once the live ones have left."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def serve_forever(self, admit) -> None:
        """(The serving thread.) Call ``admit()`` (under the lock: it may :meth:`join` requests) whenever
        no pass runs, and run a pass whenever every live request waits; return once closed and empty."""
        with self._cond:
            while not (self.closed and self.live == 0):
                if not self.closed:
                    admit()
                if self._waiting and len(self._waiting) >= self.live:
                    self._run_one_group()
                    self._hand_on()
                else:
                    self._cond.wait(0.02)

    def _hand_on(self) -> None:
        records, self.passes = self.passes, []
        if self.on_pass is not None:
            for record in records:
                self.on_pass(record)
