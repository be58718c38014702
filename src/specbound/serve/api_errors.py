"""Errors a client gets back, in OpenAI's body: ``{"error": {"message", "type", "param", "code"}}``."""
from __future__ import annotations

from ..errors import SpecboundError

__all__ = ["APIError", "error_body"]


class APIError(SpecboundError):
    """A request the server refuses: an HTTP ``status`` and OpenAI's error fields (``type``, ``param``,
    ``code``). A SpecboundError, so a library check's message can be handed on as it is."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type, param, code

    @property
    def body(self) -> dict:
        return error_body(str(self), type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
