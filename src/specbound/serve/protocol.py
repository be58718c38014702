"""The request bodies the server reads (pydantic, strict types) and what each becomes: a
:class:`DecodeRequest` of token ids, budget, sampling and stops, checked before it is queued."""
from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, ValidationError

from ..assets.prompts import Prompt, format_prompt
from ..decoding import SamplingConfig
from ..decoding.engine import check_context
from ..errors import SpecboundError
from .api_errors import APIError

__all__ = ["ChatBody", "CompletionBody", "DecodeRequest", "parse_body"]

#: OpenAI's limit on stop sequences
MAX_STOPS = 4


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict | None = None
    n: int | None = None


class CompletionBody(_Body):
    prompt: str | list[int] | list[str]


class _Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    role: str
    content: str | list[dict] | None = None


class ChatBody(_Body):
    messages: list[_Message]
    max_completion_tokens: int | None = None


@dataclass
class DecodeRequest:
    """One checked request: what the service decodes and how the reply is shaped."""

    chat: bool
    ids: list[int]
    max_tokens: int
    sampling: SamplingConfig
    seed: int | None
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool


def parse_body(raw: object, *, chat: bool, target, tokenizer, model_name: str, default_max_tokens: int,
               max_tokens_limit: int) -> DecodeRequest:
    """The checked request of a JSON body, else an :class:`APIError` naming the bad field (``tokenizer``:
    the target's, shared with the decoding threads)."""
    if not isinstance(raw, dict):
        raise APIError("the request body must be a JSON object")
    try:
        body = (ChatBody if chat else CompletionBody).model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = str(first["loc"][0]) if first["loc"] else None     # the field (the rest names union members)
        raise APIError(f"{param or 'body'}: {first['msg']}", param=param, code="invalid_type") from None
    if body.model != model_name:
        raise APIError(f"the model {body.model!r} does not exist; this server serves {model_name!r}", status=404,
                       param="model", code="model_not_found")
    if body.n not in (None, 1):
        raise APIError("n must be 1: one choice per request", param="n", code="invalid_value")
    budget = _budget(body, chat, default_max_tokens, max_tokens_limit)
    sampling = _sampling(body)
    ids = _chat_ids(body, tokenizer) if chat else _prompt_ids(body, tokenizer, target.vocab_size)
    try:
        check_context(target, len(ids), budget)
    except SpecboundError as exc:
        raise APIError(str(exc), param="messages" if chat else "prompt", code="context_length_exceeded") from None
    include_usage = bool((body.stream_options or {}).get("include_usage", False))
    return DecodeRequest(chat, ids, budget, sampling, body.seed, _stops(body.stop), body.stream, include_usage)


def _budget(body, chat: bool, default: int, limit: int) -> int:
    value = body.max_completion_tokens if chat and body.max_completion_tokens is not None else body.max_tokens
    name = "max_completion_tokens" if chat and body.max_completion_tokens is not None else "max_tokens"
    if value is None:
        return min(default, limit)
    if value <= 0 or value > limit:
        raise APIError(f"{name} must be between 1 and {limit}, got {value}", param=name, code="invalid_value")
    return value


def _sampling(body) -> SamplingConfig:
    temperature = 1.0 if body.temperature is None else body.temperature
    if temperature > 2:
        raise APIError(f"temperature must be between 0 and 2, got {temperature}", param="temperature",
                       code="invalid_value")
    try:
        return SamplingConfig(temperature, None, body.top_p)
    except SpecboundError as exc:
        param = "temperature" if "temperature" in str(exc) else "top_p"
        raise APIError(str(exc), param=param, code="invalid_value") from None


def _stops(stop) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > MAX_STOPS or any(not s for s in stops):
        raise APIError(f"stop must be at most {MAX_STOPS} non-empty strings", param="stop", code="invalid_value")
    return stops


def _encode(tokenizer, text: str, param: str) -> list[int]:
    if not text:
        raise APIError(f"{param} is empty: give some text", param=param, code="invalid_value")
    ids = tokenizer(text, return_tensors="pt").input_ids[0].tolist()
    if not ids:
        raise APIError(f"{param} tokenizes to nothing", param=param, code="invalid_value")
    return ids


def _prompt_ids(body: CompletionBody, tokenizer, vocab_size: int) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return _encode(tokenizer, prompt, "prompt")
    if prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise APIError("give one prompt per request", param="prompt", code="invalid_value")
        return _encode(tokenizer, prompt[0], "prompt")
    if not prompt:
        raise APIError("prompt is empty", param="prompt", code="invalid_value")
    if any(not 0 <= t < vocab_size for t in prompt):
        raise APIError(f"prompt holds token ids outside [0, {vocab_size})", param="prompt",
                       code="invalid_value")
    return list(prompt)


def _text(message: _Message, i: int) -> str:
    content = message.content
    if isinstance(content, list):
        if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in content):
            raise APIError("only text content parts are supported", param=f"messages.{i}.content",
                           code="invalid_value")
        return "".join(part["text"] for part in content)
    return content or ""


def _chat_ids(body: ChatBody, tokenizer) -> list[int]:
    """The conversation through the chat template ``generate --kind chat`` uses (format_prompt)."""
    messages = body.messages
    if not messages or messages[-1].role != "user":
        raise APIError("messages must end with a user message", param="messages", code="invalid_value")
    history = tuple((m.role, _text(m, i)) for i, m in enumerate(messages[:-1]))
    prompt = Prompt(id="request", text=_text(messages[-1], len(messages) - 1), kind="chat", history=history)
    if not prompt.text:
        raise APIError("the last user message is empty", param="messages", code="invalid_value")
    return _encode(tokenizer, format_prompt(tokenizer, prompt), "messages")
