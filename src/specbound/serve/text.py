"""Token ids to text deltas for streaming, with stop strings: text is released only once it can no
longer be the start of a stop string or half of a multi-byte character."""
from __future__ import annotations

import threading

__all__ = ["SharedTokenizer", "TextStream"]


class SharedTokenizer:
    """A tokenizer used by several threads at once (the event loop encodes prompts, each request's thread
    decodes its text): every call holds one lock, since a fast tokenizer's Rust state refuses concurrent
    use ("Already borrowed")."""

    def __init__(self, tokenizer):
        self.inner = tokenizer
        self.lock = threading.Lock()
        self.chat_template = getattr(tokenizer, "chat_template", None)

    def __call__(self, *args, **kwargs):
        with self.lock:
            return self.inner(*args, **kwargs)

    def decode(self, *args, **kwargs):
        with self.lock:
            return self.inner.decode(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        with self.lock:
            return self.inner.apply_chat_template(*args, **kwargs)


class TextStream:
    """Feed each round's new ids; :meth:`feed` returns the text that is now safe to send and whether a
    stop string was found (the text then ends right before it)."""

    def __init__(self, tokenizer, stops: tuple[str, ...] = ()):
        self.tokenizer, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self.sent = 0
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.stopped = False

    def feed(self, new_ids, *, final: bool = False) -> str:
        if self.stopped:
            return ""
        self.ids.extend(int(t) for t in new_ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = self._stop_at(text)
        if cut is not None:
            self.stopped, end = True, cut
        elif final:
            end = len(text)
        else:
            end = len(text) - self.hold
            while end > self.sent and text[end - 1] == "\ufffd":     # an unfinished character
                end -= 1
        if end <= self.sent:
            return ""
        delta, self.sent = text[self.sent:end], end
        return delta

    def _stop_at(self, text: str) -> int | None:
        found = [i for i in (text.find(s, max(self.sent - len(s), 0)) for s in self.stops) if i >= 0]
        return min(found) if found else None
