"""An OpenAI-compatible HTTP server over models that are already loaded (``specbound serve``).

:class:`DecodeService` decodes requests with THE decoding loop of ``generate`` (each request a
:class:`~specbound.decoding.engine.Speculator` on rows of its own), joining and leaving a shared
pass schedule between rounds where batching pays; :func:`build_app` puts it behind FastAPI routes
(completions, chat, models, health, Prometheus metrics). docs/serve.md describes the endpoints.
"""
from .api_errors import APIError
from .app import build_app, run_server
from .metrics import ServeMetrics
from .policy import BatchingChoice, choose_batching
from .service import DecodeService, ServeSettings

__all__ = ["APIError", "BatchingChoice", "DecodeService", "ServeMetrics", "ServeSettings", "build_app",
           "choose_batching", "run_server"]
