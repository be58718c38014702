"""`specbound serve`: an OpenAI-compatible HTTP server over the models generate decodes with.

Parses generate's model and drafting options (``generate.add_model_arguments``),
loads the pair once as generate does (``generate.load_models``, ``draft_spec_from_args``), says
which target, kernel path and draft it serves, then runs :mod:`specbound.serve` under uvicorn.
"""
from __future__ import annotations

from ..errors import SpecboundError
from . import generate, output

HELP = "an OpenAI-compatible HTTP server (completions, chat, streaming, metrics) over the decoding of generate"


def add_arguments(p) -> None:
    generate.add_model_arguments(p)                # every model and drafting option, defined once
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients name (default: the target's name)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait to start; one more gets 429 (default 64)")
    p.add_argument("--max-batch", type=int, default=8, help="requests decoded together at most (default 8)")
    p.add_argument("--batching", default="auto", choices=["auto", "on", "off"],
                   help="auto (default): requests waiting together share passes where the target's rows read in "
                        "one forward and the measured costs say it pays, else one after another; on; off")
    p.add_argument("--default-max-tokens", type=int, default=256,
                   help="max_tokens of a request that gives none (default 256)")
    p.add_argument("--max-tokens-limit", type=int, default=2048,
                   help="the largest max_tokens a request may ask for (default 2048)")
    p.add_argument("--shutdown-grace", type=float, default=10.0,
                   help="seconds running replies may take to finish after SIGINT/SIGTERM (default 10)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def _check(args) -> None:
    for name in ("max_queue", "max_batch", "default_max_tokens", "max_tokens_limit"):
        if getattr(args, name) < 1:
            raise SpecboundError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0 < args.port < 65536:
        raise SpecboundError(f"--port must be in 1..65535, got {args.port}")
    if args.shutdown_grace < 0:
        raise SpecboundError(f"--shutdown-grace must be >= 0, got {args.shutdown_grace}")
    try:
        import fastapi, prometheus_client, sse_starlette, uvicorn  # noqa: E401, F401
    except ImportError as exc:
        raise SpecboundError(f"specbound serve needs the serve extra ({exc.name} is missing): "
                             "pip install 'specbound[serve]'") from None


def _describe(target, draft, plain: bool) -> str:
    kernels = f"{target.info.backend}:{target.info.kernels}"
    if target.info.backend != "llamacpp" and "kquant" in kernels.lower():
        from ..models.kquant import kernel_path

        kernels += f", kernel path {kernel_path()}"
    if plain:
        return f"serving {target.name} [{kernels}], plain decoding (nothing speculative beats it here)"
    if draft is None:
        return f"serving {target.name} [{kernels}], drafting from the context (no draft model)"
    return f"serving {target.name} [{kernels}] ← draft {draft.name} [{draft.info.backend}:{draft.info.kernels}]"


def run(args) -> int:
    import logging

    from ..serve import DecodeService, ServeSettings, build_app, run_server

    console = output.console(stderr=True)
    _check(args)
    spec = generate.draft_spec_from_args(args)
    target, draft, plain = generate.load_models(args, console)
    console.print(_describe(target, draft, plain))
    logging.basicConfig(level=args.log_level.upper(), format="%(name)s: %(message)s")
    settings = ServeSettings(model_name=args.served_model_name or target.name, max_queue=args.max_queue,
                             max_batch=args.max_batch, default_max_tokens=args.default_max_tokens,
                             max_tokens_limit=args.max_tokens_limit, batching=args.batching)
    service = DecodeService(target=target, draft=draft, spec=spec, settings=settings, plain=plain,
                            ignore_eos=args.ignore_eos)
    console.print(f"batching: {service.batching.mode} ({service.batching.reason}); model id {settings.model_name!r}; "
                  f"http://{args.host}:{args.port}/v1")
    stopped_by = run_server(build_app(service), host=args.host, port=args.port, shutdown_grace=args.shutdown_grace,
                            log_level=args.log_level)
    console.print(f"stopped{f' by {stopped_by}' if stopped_by else ''}: every request finished or cancelled")
    return 0
