"""OpenAI's response objects: completions and chat completions, whole and as stream chunks."""
from __future__ import annotations

import time
import uuid

__all__ = ["ReplyShape"]


class ReplyShape:
    """The objects of one reply (one id and creation time for all its chunks)."""

    def __init__(self, *, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _envelope(self, object_name: str, choices: list, usage: dict | None = None) -> dict:
        out = {"id": self.id, "object": object_name, "created": self.created, "model": self.model,
               "choices": choices}
        if usage is not None:
            out["usage"] = usage
        return out

    def whole(self, text: str, finish_reason: str, usage: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
            return self._envelope("chat.completion", [choice], usage)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice], usage)

    def chunk(self, text: str | None, finish_reason: str | None = None, *, first: bool = False) -> dict:
        if self.chat:
            delta = {} if text is None else {"content": text}
            if first:
                delta["role"] = "assistant"
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice])

    def usage_chunk(self, usage: dict) -> dict:
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", [], usage)
