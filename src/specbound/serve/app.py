"""The HTTP side: FastAPI routes over a :class:`DecodeService` (OpenAI's completions, chat completions
and models, plus /health and Prometheus /metrics), and :func:`run_server` (uvicorn; SIGINT/SIGTERM stop
it gracefully: running replies may finish within the grace period, then everything left is cancelled)."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .api_errors import APIError, error_body
from .job import Job
from .protocol import parse_body
from .responses import ReplyShape
from .service import DecodeService

__all__ = ["build_app", "run_server"]

log = logging.getLogger("specbound.serve")

#: how often a non-streamed reply checks that its client is still there (seconds)
_POLL = 0.1


def build_app(service: DecodeService) -> FastAPI:
    """The app over ``service``; the service starts with the app and is closed when it stops."""

    @asynccontextmanager
    async def lifespan(app):
        service.start()
        yield
        await asyncio.to_thread(service.close)

    app = FastAPI(title="specbound", lifespan=lifespan)
    app.state.service = service
    _add_error_handlers(app)
    name = service.settings.model_name

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": name, "batching": service.batching.mode,
                "queue_depth": service.queue_depth, "running": len(service.running)}

    @app.get("/metrics")
    async def metrics():
        return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "specbound"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _reply(service, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _reply(service, request, chat=True)

    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return JSONResponse(exc.body, status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), type=kind), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def server_error(request, exc):
        log.exception("internal error")
        return JSONResponse(error_body(f"internal error: {exc}", type="server_error"), status_code=500)


async def _reply(service: DecodeService, request: Request, *, chat: bool):
    endpoint = "chat" if chat else "completions"
    settings = service.settings
    try:
        try:
            raw = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise APIError("the request body is not valid JSON", code="invalid_json") from None
        parsed = parse_body(raw, chat=chat, target=service.target, tokenizer=service.tokenizer,
                            model_name=settings.model_name, default_max_tokens=settings.default_max_tokens,
                            max_tokens_limit=settings.max_tokens_limit)
        job = service.submit(Job(parsed, tokenizer=service.tokenizer, loop=asyncio.get_running_loop(),
                                 queue=asyncio.Queue(), stop_token_ids=service.stop_ids))
    except APIError as exc:
        service.metrics.requests.labels(endpoint=endpoint, outcome="rejected").inc()
        return JSONResponse(exc.body, status_code=exc.status)
    shape = ReplyShape(chat=chat, model=settings.model_name)
    if parsed.stream:
        return EventSourceResponse(_events(service, job, shape, endpoint), ping=15)
    return await _whole(service, request, job, shape, endpoint)


async def _whole(service, request: Request, job: Job, shape: ReplyShape, endpoint: str):
    parts = []
    checked = time.monotonic()
    while True:
        try:
            kind, payload = await asyncio.wait_for(job.queue.get(), _POLL)
        except TimeoutError:
            kind = None
        if kind != "done" and (kind is None or time.monotonic() - checked >= _POLL):   # is the client still there?
            checked = time.monotonic()
            if await request.is_disconnected():
                job.cancel.set()               # dropped at its next round, its rows freed
                service.metrics.requests.labels(endpoint=endpoint, outcome="cancelled").inc()
                return Response(status_code=499)
        if kind is None:
            continue
        if kind == "text":
            parts.append(payload)
        elif kind == "error":
            service.metrics.requests.labels(endpoint=endpoint, outcome="error").inc()
            return JSONResponse(error_body(f"decoding failed: {payload}", type="server_error"), status_code=500)
        else:
            break
    if payload["finish_reason"] == "cancelled":
        service.metrics.requests.labels(endpoint=endpoint, outcome="cancelled").inc()
        return JSONResponse(error_body("the server shut down before the reply was complete", type="server_error",
                                       code="shutting_down"), status_code=503)
    service.metrics.requests.labels(endpoint=endpoint, outcome="ok").inc()
    return shape.whole("".join(parts), payload["finish_reason"], payload["usage"])


async def _events(service, job: Job, shape: ReplyShape, endpoint: str):
    """The server-sent events of a streamed reply: OpenAI's chunks, then ``data: [DONE]``."""
    outcome = "cancelled"
    try:
        if shape.chat:
            yield {"data": json.dumps(shape.chunk(None, first=True))}
        while True:
            kind, payload = await job.queue.get()
            if kind == "text":
                yield {"data": json.dumps(shape.chunk(payload))}
                continue
            if kind == "error":
                outcome = "error"
                yield {"data": json.dumps(error_body(f"decoding failed: {payload}", type="server_error"))}
            elif payload["finish_reason"] == "cancelled":
                yield {"data": json.dumps(error_body("the server shut down before the reply was complete",
                                                     type="server_error", code="shutting_down"))}
            else:
                outcome = "ok"
                yield {"data": json.dumps(shape.chunk(None, payload["finish_reason"]))}
                if job.request.include_usage:
                    yield {"data": json.dumps(shape.usage_chunk(payload["usage"]))}
                yield {"data": "[DONE]"}
            return
    finally:
        if not job.done:
            job.cancel.set()                   # the client went away: dropped at its next round
        service.metrics.requests.labels(endpoint=endpoint, outcome=outcome).inc()


def run_server(app: FastAPI, *, host: str = "127.0.0.1", port: int = 8000, shutdown_grace: float = 10.0,
               log_level: str = "info") -> str | None:
    """Serve ``app`` with uvicorn until SIGINT/SIGTERM (then up to ``shutdown_grace`` s for running replies);
    returns the signal's name, or None. uvicorn raises the signal again once it has shut down; a handler of
    ours takes it, so the process ends normally instead of being killed by it."""
    import signal

    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=shutdown_grace)
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda number, frame: caught.append(number))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    t0 = time.perf_counter()
    try:
        uvicorn.Server(config).run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    name = signal.Signals(caught[0]).name if caught else None
    log.info("stopped after %.0f s%s", time.perf_counter() - t0, f" ({name})" if name else "")
    return name
