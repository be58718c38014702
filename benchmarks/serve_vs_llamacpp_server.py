"""`specbound serve` against llama-cpp-python's own OpenAI server on the same Q4_K_M target file, over HTTP.

Each server runs in turn as a subprocess on a free loopback port: ``specbound serve`` with its default
settings on the packaged pair, and ``python -m llama_cpp.server --model <the packaged target GGUF file,
the one specbound's default target reads> --n_threads 2``. Against each, 1 and then 4 concurrent clients
(the ``openai`` package, streamed completions) send held-out prompts (HumanEval 10–17 by default,
through specbound.assets' prompt sets), greedy, ``max_tokens`` 96, 3 repeats. Measured: tokens/s per
client and in total, time to first token, p50/p95 request latency; printed as a table and written as
JSON (and markdown) under docs/results/serve/. Tokens are counted from the reply's ``usage`` where the
server sends it in the stream, else by the server's own tokenizer (llama_cpp.server's /extras/tokenize),
else as the streamed chunks that carried text (llama.cpp's server streams one token per chunk).

Needs the models (``make setup-models``), llama.cpp's binding (``make setup-llamacpp``), specbound's serve
extra and the llama.cpp server's own dependencies — without rebuilding llama-cpp-python:

    .venv/bin/pip install -e '.[serve]' openai 'pydantic-settings>=2.0.1' 'starlette-context>=0.3.6,<0.4' PyYAML
    .venv/bin/python benchmarks/serve_vs_llamacpp_server.py            # ~20-30 min on 2 cores
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

#: what each server needs importable, with where it comes from
NEEDS = {
    "specbound": {"fastapi": "specbound[serve]", "uvicorn": "specbound[serve]", "sse_starlette": "specbound[serve]",
                  "prometheus_client": "specbound[serve]"},
    "llamacpp": {"llama_cpp": "make setup-llamacpp", "fastapi": "specbound[serve]", "uvicorn": "specbound[serve]",
                 "sse_starlette": "specbound[serve]", "pydantic_settings": "pydantic-settings>=2.0.1",
                 "starlette_context": "starlette-context>=0.3.6,<0.4", "yaml": "PyYAML"},
}


def fail(message: str) -> None:
    print(f"serve_vs_llamacpp_server: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_prerequisites(servers) -> None:
    """Every package the run needs, before anything starts (one clear line naming what to install)."""
    missing = {} if importlib.util.find_spec("openai") else {"openai": "openai"}
    for server in servers:
        missing.update({m: p for m, p in NEEDS[server].items() if importlib.util.find_spec(m) is None})
    if missing:
        fail(f"missing {', '.join(sorted(missing))}: install {' '.join(sorted(set(missing.values())))} "
             "(see this script's docstring)")


def target_file() -> Path:
    from specbound.assets.gguf import gguf_path
    from specbound.assets.models import DEFAULT_TARGET
    from specbound.errors import SpecboundError

    try:
        return gguf_path(DEFAULT_TARGET, progress=False)
    except SpecboundError as exc:
        fail(f"the packaged target GGUF file is not available ({exc}); run make setup-models")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(name: str, port: int, args) -> list[str]:
    if name == "specbound":
        return [sys.executable, "-m", "specbound.cli", "serve", "--port", str(port), "--threads", str(args.threads),
                "--log-level", "warning"]
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(target_file()), "--n_threads", str(args.threads),
            "--host", "127.0.0.1", "--port", str(port),
            "--interrupt_requests", "False"]   # its default cancels a running reply when another request comes


def wait_ready(base: str, proc: subprocess.Popen, timeout: float) -> str:
    """The served model id, once /v1/models answers (the server loads its models first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail(f"the server exited with status {proc.returncode} before it answered (its log is above)")
        try:
            with urllib.request.urlopen(base + "/v1/models", timeout=5) as reply:
                return json.load(reply)["data"][0]["id"]
        except OSError:
            time.sleep(1)
    fail(f"the server did not answer within {timeout:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def server_count(base: str, model: str, text: str, chunks: int) -> int:
    """Tokens of ``text`` by the server's own tokenizer (llama_cpp.server), else the chunks that held text."""
    body = json.dumps({"input": text, "model": model}).encode()
    request = urllib.request.Request(base + "/extras/tokenize", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return len(json.load(reply)["tokens"])
    except (OSError, KeyError, ValueError):
        return chunks


def one_request(client, base: str, model: str, text: str, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    first, parts, usage = None, [], None
    import openai

    try:
        stream = client.completions.create(model=model, prompt=text, max_tokens=max_tokens, temperature=0,
                                           stream=True, stream_options={"include_usage": True})
    except openai.BadRequestError:             # a server that does not know stream_options
        stream = client.completions.create(model=model, prompt=text, max_tokens=max_tokens, temperature=0,
                                           stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            first = first or time.perf_counter()
            parts.append(chunk.choices[0].text)
        if getattr(chunk, "usage", None):
            usage = chunk.usage.completion_tokens
    end = time.perf_counter()
    out = "".join(parts)
    tokens = usage if usage is not None else server_count(base, model, out, len(parts))
    return {"ttft": (first or end) - t0, "latency": end - t0, "tokens": tokens, "text": out}


def run_clients(base: str, model: str, prompts: list[str], clients: int, args) -> dict:
    """``clients`` concurrent clients, client c sending prompts c, c + clients, … one after another."""
    import openai

    results: list[list[dict]] = [[] for _ in range(clients)]
    busy = [0.0] * clients

    def client_loop(c: int) -> None:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=600)
        t0 = time.perf_counter()
        for text in prompts[c::clients]:
            results[c].append(one_request(client, base, model, text, args.max_tokens))
        busy[c] = time.perf_counter() - t0

    threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    requests = [r for rs in results for r in rs]
    per_client = [sum(r["tokens"] for r in rs) / b for rs, b in zip(results, busy) if b > 0]
    return {"wall": wall, "total_tps": sum(r["tokens"] for r in requests) / wall,
            "per_client_tps": statistics.mean(per_client), "requests": requests}


def decode_rate(request: dict) -> float:
    """Tokens after the first per second after the first: the decoding speed, prefill left out."""
    return max(request["tokens"] - 1, 0) / max(request["latency"] - request["ttft"], 1e-9)


def percentile(values, q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def measure_server(name: str, prompts: list[str], args) -> list[dict]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    print(f"starting {name} on port {port} …", file=sys.stderr)
    proc = subprocess.Popen(server_command(name, port, args))
    rows = []
    try:
        model = wait_ready(base, proc, args.startup_timeout)
        run_clients(base, model, prompts[:1], 1, args)                   # warm-up
        for clients in args.clients:
            runs = [run_clients(base, model, prompts, clients, args) for _ in range(args.repeats)]
            requests = [r for run in runs for r in run["requests"]]
            rows.append({"server": name, "model": model, "clients": clients,
                         "total_tps": statistics.median(r["total_tps"] for r in runs),
                         "per_client_tps": statistics.median(r["per_client_tps"] for r in runs),
                         "ttft_p50": percentile([r["ttft"] for r in requests], 0.5),
                         "decode_tps_p50": percentile([decode_rate(r) for r in requests], 0.5),
                         "latency_p50": percentile([r["latency"] for r in requests], 0.5),
                         "latency_p95": percentile([r["latency"] for r in requests], 0.95),
                         "runs": [{k: v for k, v in run.items() if k != "requests"} for run in runs],
                         "texts": [r["text"] for r in runs[0]["requests"]]})
            print(f"{name} × {clients}: {rows[-1]['total_tps']:.1f} tok/s total", file=sys.stderr)
    finally:
        stop(proc)
    return rows


def table(rows: list[dict]) -> list[str]:
    lines = ["| server | clients | tok/s total | tok/s per client | decode tok/s p50 | TTFT p50 s | latency p50 s "
             "| latency p95 s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['server']} | {r['clients']} | {r['total_tps']:.1f} | {r['per_client_tps']:.1f} | "
                     f"{r['decode_tps_p50']:.1f} | {r['ttft_p50']:.2f} | {r['latency_p50']:.2f} | "
                     f"{r['latency_p95']:.2f} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="specbound,llamacpp", help="which servers, in order (default both)")
    ap.add_argument("--prompt-set", default="humaneval")
    ap.add_argument("--offset", type=int, default=10)
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", default="1,4", help="concurrent clients, comma-separated (default 1,4)")
    ap.add_argument("--threads", type=int, default=2, help="threads of each server (default 2)")
    ap.add_argument("--startup-timeout", type=float, default=1800, help="seconds a server may take to load")
    ap.add_argument("--out", default="docs/results/serve")
    args = ap.parse_args(argv)
    servers = [s for s in args.servers.split(",") if s]
    if not servers or any(s not in NEEDS for s in servers):
        fail(f"--servers: choose from {', '.join(NEEDS)}, got {args.servers!r}")
    try:
        args.clients = [int(c) for c in args.clients.split(",")]
    except ValueError:
        fail(f"--clients must be comma-separated integers, got {args.clients!r}")
    if min(args.clients) < 1 or args.repeats < 1 or args.max_tokens < 1 or args.n_prompts < 1:
        fail("--clients, --repeats, --max-tokens and --n-prompts must be >= 1")
    check_prerequisites(servers)
    from specbound.assets.prompts import load_prompts
    from specbound.errors import SpecboundError

    try:
        chosen = load_prompts(args.prompt_set, limit=args.n_prompts, offset=args.offset)
    except SpecboundError as exc:
        fail(f"--prompt-set {args.prompt_set}: {exc}")
    if any(p.kind != "code" for p in chosen):
        fail("this benchmark sends raw completions: give a code prompt set (humaneval)")
    prompts = [p.text for p in chosen]
    target_file()                                   # missing models fail here, before any server starts
    rows = []
    for name in servers:
        rows += measure_server(name, prompts, args)
    lines = [f"# specbound serve vs llama.cpp's OpenAI server ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores)",
             "", f"`python benchmarks/serve_vs_llamacpp_server.py {' '.join(argv or sys.argv[1:])}` — {args.prompt_set} {args.offset}–"
             f"{args.offset + args.n_prompts - 1}, greedy, max_tokens {args.max_tokens}, streamed, median of "
             f"{args.repeats} repeats; {args.threads} threads per server.", ""] + table(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve-vs-llamacpp-server.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    (out / "serve-vs-llamacpp-server.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
