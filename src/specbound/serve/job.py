"""One request inside the server: its checked request, its text stream, and the events its handler
awaits (text deltas, then one "done" with the finish reason and usage), handed from the decoding
thread to the event loop."""
from __future__ import annotations

import threading
import time

from .protocol import DecodeRequest
from .text import TextStream

__all__ = ["Job"]


class Job:
    """A queued or running request. ``cancel`` (a threading.Event) stops its decoding at the next round:
    set when the client goes away, a stop string is found, or the server shuts down."""

    def __init__(self, request: DecodeRequest, *, tokenizer, loop, queue, stop_token_ids=()):
        self.request = request
        self.loop, self.queue = loop, queue
        self.cancel = threading.Event()
        self.text = TextStream(tokenizer, request.stops)
        self.stop_token_ids = set(stop_token_ids)
        self.arrived = time.perf_counter()
        self.first_token_at: float | None = None
        self.done = False

    def push(self, kind: str, payload) -> None:
        """(Any thread.) Hand an event to the handler's queue on the event loop."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, payload))
        except RuntimeError:               # the loop is gone (shutdown): nobody is listening
            pass

    def on_tokens(self, ids) -> None:
        """(The decoding thread.) One round's committed ids."""
        if not ids:
            return
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        delta = self.text.feed(ids)
        if delta:
            self.push("text", delta)
        if self.text.stopped:
            self.cancel.set()              # a stop string: no more rounds

    def finish(self, result, *, cancelled: bool) -> dict:
        """(The decoding thread.) The last text and the "done" event; returns its payload."""
        tokens = [] if result is None else list(result.tokens)
        tail = self.text.feed([], final=True)
        if tail:
            self.push("text", tail)
        if self.text.stopped or (tokens and tokens[-1] in self.stop_token_ids):
            reason = "stop"
        elif cancelled:
            reason = "cancelled"
        else:
            reason = "length" if len(tokens) >= self.request.max_tokens else "stop"
        prompt = len(self.request.ids)
        done = {"finish_reason": reason, "usage": {"prompt_tokens": prompt, "completion_tokens": len(tokens),
                                                   "total_tokens": prompt + len(tokens)}}
        self.done = True
        self.push("done", done)
        return done

    def fail(self, exc: BaseException) -> None:
        self.done = True
        self.push("error", exc)
