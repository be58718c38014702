"""specbound serve (specbound.serve): the OpenAI-compatible server on tiny models built in code, driven by
the real ``openai`` client against uvicorn on a loopback port. Greedy answers equal ``speculative_decode``
on the same ids, seeded ones its tokens with that seed; bad input gets OpenAI's error body and the
server keeps serving; a full queue is a 429; a client that leaves is dropped and its rows freed; a
shutdown cancels what runs; /metrics parses; a bounded load test loses and garbles nothing."""
from __future__ import annotations

import contextlib
import gc
import http.client
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from helpers import CharTokenizer, chain_models, tiny_pair
from specbound.assets.prompts import Prompt, format_prompt
from specbound.decoding import DraftSpec, speculative_decode
from specbound.decoding.costs import CostMeasurement
from specbound.models.static import StaticCacheHFModel
from specbound.serve import DecodeService, ServeSettings, build_app, choose_batching
from specbound.serve.text import TextStream
from specbound.theory.speedup import CostProfile

NAME = "tiny"
LIMIT = 64
GAMMA = 3


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    """Calibrations and remembered acceptance go to a cache of this file's own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECBOUND_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def modules():
    return tiny_pair(0, noise=0.3, draft_seed=1)


def _wrap(modules, cls=StaticCacheHFModel):
    return (cls(modules[0], CharTokenizer(), name="tiny-target"), cls(modules[1], CharTokenizer(), name="tiny-draft"))


class SlowTarget(StaticCacheHFModel):
    """The tiny target with 20 ms per read: long enough replies to leave, queue behind or shut down."""

    def forward(self, tokens, keep_logits=None):
        time.sleep(0.02)
        return super().forward(tokens, keep_logits)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(service, grace: float = 5.0):
    """``service`` behind uvicorn in a background thread; yields (base url, server, thread)."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(service), host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=grace))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", server, thread
    finally:
        server.should_exit = True
        thread.join(20)


def _service(target, draft, *, spec=None, **settings):
    settings = {"model_name": NAME, "max_tokens_limit": LIMIT, "batching": "on", **settings}
    return DecodeService(target=target, draft=draft, spec=spec or DraftSpec(gamma=GAMMA),
                         settings=ServeSettings(**settings))


@pytest.fixture(scope="module")
def server(modules):
    target, draft = _wrap(modules)
    service = _service(target, draft)
    with serving(service) as (url, _, _):
        yield url, service


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(modules):
    """What speculative_decode gives on the same ids (models of their own, not the server's)."""
    target, draft = _wrap(modules)
    memo = {}

    def decode(text, n, *, chat=False, temperature=0.0, top_p=None, seed=None, gamma=GAMMA):
        key = (text, n, chat, temperature, top_p, seed, gamma)
        if key not in memo:
            prompt = format_prompt(target.tokenizer, Prompt("t", text, "chat")) if chat else text
            ids = target.tokenizer(prompt).input_ids[0].tolist()
            out = speculative_decode(target, draft, ids, n, gamma=gamma, temperature=temperature, top_p=top_p,
                                     seed=seed)
            memo[key] = (target.tokenizer.decode(out.tokens), len(ids))
        return memo[key]

    return decode


def _ask(client, text, n, *, chat=False, stream=False, model=NAME, **kw):
    """(text, finish_reason, usage or None) of one request through the openai client."""
    if chat:
        call = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}], max_tokens=n,
                                              stream=stream, **kw)
    else:
        call = client.completions.create(model=model, prompt=text, max_tokens=n, stream=stream, **kw)
    if not stream:
        choice = call.choices[0]
        return (choice.message.content if chat else choice.text), choice.finish_reason, call.usage
    parts, reason = [], None
    for chunk in call:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        piece = choice.delta.content if chat else choice.text
        parts.append(piece or "")
        reason = choice.finish_reason or reason
    return "".join(parts), reason, None


# ------------------------------------------------------------------ answers
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_greedy_answers_equal_speculative_decode(client, reference, chat, stream):
    text, reason, usage = _ask(client, "def add(a, b):", 20, chat=chat, stream=stream, temperature=0)
    expected, prompt_tokens = reference("def add(a, b):", 20, chat=chat)
    assert text == expected and reason == "length"
    if usage is not None:
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == \
            (prompt_tokens, 20, prompt_tokens + 20)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_sampled_answers_follow_the_request_seed(client, reference, stream):
    kw = dict(temperature=0.9, top_p=0.9)
    got = [_ask(client, "x = ", 16, stream=stream, seed=s, **kw)[0] for s in (7, 7, 8)]
    assert got[0] == got[1] == reference("x = ", 16, seed=7, **kw)[0]
    assert got[2] == reference("x = ", 16, seed=8, **kw)[0]


def test_stop_strings_end_the_answer_before_them(client, reference):
    full, _ = reference("stop here", 30)
    stop = full[9:12]
    cut = full[:full.find(stop)]
    for stream in (False, True):
        text, reason, _ = _ask(client, "stop here", 30, stream=stream, temperature=0, stop=[stop, "never-seen"])
        assert (text, reason) == (cut, "stop")


def test_stream_usage_chunk_and_done_marker(server):
    url, _ = server
    body = {"model": NAME, "prompt": "abc", "max_tokens": 5, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    status, raw = _post(url, "/v1/completions", json.dumps(body).encode())
    assert status == 200
    events = [line[len("data: "):] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_greedy_answers_with_auto_gamma_equal_speculative_decode(modules, reference):
    target, draft = _wrap(modules)
    costs = CostMeasurement(CostProfile((1, 2, 4, 8, 16), (0.01, 0.011, 0.012, 0.015, 0.02)),
                            CostProfile((1, 2, 4, 8, 16), (0.002, 0.002, 0.0022, 0.0025, 0.003)))
    service = DecodeService(target=target, draft=draft, spec=DraftSpec(gamma="auto"), measurement=costs,
                            settings=ServeSettings(model_name=NAME, max_tokens_limit=LIMIT, batching="on"))
    with serving(service) as (url, _, _):
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        assert _ask(c, "def f(x):", 24, temperature=0)[0] == reference("def f(x):", 24, gamma="auto")[0]
        prompts = [f"def f{i}(x):" for i in range(4)]               # sized against the shared pass: same tokens
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda p: _ask(c, p, 24, temperature=0, stream=True)[0], prompts))
        assert got == [reference(p, 24, gamma="auto")[0] for p in prompts]


# ------------------------------------------------------------------ the other endpoints
def test_models_health_and_metrics(client, server):
    url, service = server
    assert [m.id for m in client.models.list()] == [NAME]
    status, raw = _get(url, "/health")
    health = json.loads(raw)
    assert status == 200 and health["status"] == "ok" and health["batching"] == "continuous"
    _ask(client, "metrics", 8, temperature=0)
    status, raw = _get(url, "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(raw.decode())}
    for name in ("specbound_requests", "specbound_output_tokens", "specbound_target_passes",
                 "specbound_drafted_tokens", "specbound_accepted_tokens", "specbound_request_tau",
                 "specbound_queue_depth", "specbound_time_to_first_token_seconds",
                 "specbound_time_per_output_token_seconds", "specbound_rounds", "specbound_batching"):
        assert name in families, name
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert value[("specbound_output_tokens_total", ())] >= 8
    assert value[("specbound_target_passes_total", ())] >= 1
    assert value[("specbound_batching", (("mode", "continuous"),))] == 1


# ------------------------------------------------------------------ bad input
def _post(url, path, body: bytes, timeout=30):
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    out = response.status, response.read()
    conn.close()
    return out


def _get(url, path):
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", path)
    response = conn.getresponse()
    out = response.status, response.read()
    conn.close()
    return out


GOOD = {"model": NAME, "prompt": "hi", "max_tokens": 4}
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
BAD = [
    ("completions", b"{not json", 400, None, "invalid_json"),
    ("completions", b"[1, 2]", 400, None, None),
    ("completions", {**GOOD, "max_tokens": "4"}, 400, "max_tokens", "invalid_type"),
    ("completions", {**GOOD, "prompt": 3}, 400, "prompt", "invalid_type"),
    ("completions", {**GOOD, "temperature": "hot"}, 400, "temperature", "invalid_type"),
    ("completions", {**GOOD, "model": "gpt-9"}, 404, "model", "model_not_found"),
    ("completions", {k: v for k, v in GOOD.items() if k != "model"}, 400, "model", "invalid_type"),
    ("completions", {**GOOD, "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ("completions", {**GOOD, "max_tokens": -3}, 400, "max_tokens", "invalid_value"),
    ("completions", {**GOOD, "max_tokens": LIMIT + 1}, 400, "max_tokens", "invalid_value"),
    ("completions", {**GOOD, "prompt": "a" * 600}, 400, "prompt", "context_length_exceeded"),
    ("completions", {**GOOD, "prompt": ""}, 400, "prompt", "invalid_value"),
    ("completions", {**GOOD, "prompt": [1, 999]}, 400, "prompt", "invalid_value"),
    ("completions", {**GOOD, "temperature": -1}, 400, "temperature", "invalid_value"),
    ("completions", {**GOOD, "top_p": 0}, 400, "top_p", "invalid_value"),
    ("completions", {**GOOD, "n": 2}, 400, "n", "invalid_value"),
    ("completions", {**GOOD, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "invalid_value"),
    ("chat", {**CHAT, "messages": [{"role": "assistant", "content": "hi"}]}, 400, "messages", "invalid_value"),
    ("chat", {**CHAT, "messages": "hi"}, 400, "messages", "invalid_type"),
    ("chat", {**CHAT, "max_completion_tokens": 0}, 400, "max_completion_tokens", "invalid_value"),
    ("chat", {k: v for k, v in CHAT.items() if k != "messages"}, 400, "messages", "invalid_type"),
]


@pytest.mark.parametrize("endpoint, body, status, param, code", BAD,
                         ids=[f"{e}-{i}" for i, (e, *_) in enumerate(BAD)])
def test_bad_requests_get_openai_error_bodies_and_the_server_keeps_serving(server, endpoint, body, status,
                                                                           param, code):
    url, _ = server
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    got, raw = _post(url, path, body if isinstance(body, bytes) else json.dumps(body).encode())
    error = json.loads(raw)["error"]
    assert got == status, error
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert _post(url, path, json.dumps(CHAT if endpoint == "chat" else GOOD).encode())[0] == 200


def test_the_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-9", prompt="hi", max_tokens=4)
    assert info.value.status_code == 404 and "gpt-9" in str(info.value)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=NAME, prompt="hi", max_tokens=0)
    assert _get(client.base_url.__str__().removesuffix("/v1/"), "/nowhere")[0] == 404


# ------------------------------------------------------------------ queue, disconnects, shutdown
def _slow_service(modules, **settings):
    target = SlowTarget(modules[0], CharTokenizer(), name="tiny-target")
    draft = StaticCacheHFModel(modules[1], CharTokenizer(), name="tiny-draft")
    return _service(target, draft, **{"max_tokens_limit": 400, **settings})


def _open_stream(url, n=400):
    """A streamed request on a raw connection; returns it after the first chunk arrived."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = {"model": NAME, "prompt": "slow", "max_tokens": n, "temperature": 0, "stream": True}
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    while b"data: " not in response.readline():
        pass
    return conn, response


def _wait(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out: {condition.__doc__ or ''}"
        time.sleep(0.01)


def _sample(service, name, labels=()):
    text = service.metrics.render().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and tuple(sorted(s.labels.items())) == tuple(labels):
                return s.value
    return 0.0


def test_a_full_queue_gets_429_and_clients_that_leave_are_dropped(modules):
    service = _slow_service(modules, max_queue=1, max_batch=1)
    with serving(service) as (url, _, _):
        first, stream = _open_stream(url)                        # running
        _wait(lambda: len(service.running) == 1)
        host, port = url.removeprefix("http://").split(":")
        waiting = socket.create_connection((host, int(port)))    # queued: a whole (not streamed) request
        body = json.dumps({**GOOD, "max_tokens": 50}).encode()
        waiting.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        _wait(lambda: service.queue_depth == 1)
        status, raw = _post(url, "/v1/completions", json.dumps(GOOD).encode())
        assert status == 429 and json.loads(raw)["error"]["code"] == "queue_full"
        cancelled = (("endpoint", "completions"), ("outcome", "cancelled"))
        waiting.close()                                          # the queued client leaves
        _wait(lambda: _sample(service, "specbound_requests_total", cancelled) == 1)
        stream.close()                                           # and so does the running one
        first.close()
        _wait(lambda: _sample(service, "specbound_requests_total", cancelled) == 2 and not service.running
              and service.queue_depth == 0)
        assert _sample(service, "specbound_output_tokens_total") < 400    # the stream stopped early
        gc.collect()
        assert len(service.live_rows) == 0 and service.scheduler.live == 0
        assert _post(url, "/v1/completions", json.dumps(GOOD).encode())[0] == 200   # still serving


def test_a_client_that_leaves_a_whole_reply_is_dropped_within_a_round(modules):
    service = _slow_service(modules)
    with serving(service) as (url, _, _):
        host, port = url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        body = json.dumps({**GOOD, "max_tokens": 400, "temperature": 0}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        _wait(lambda: len(service.running) == 1)
        time.sleep(0.2)                                          # a few rounds of text arrive meanwhile
        sock.close()
        left = time.monotonic()
        _wait(lambda: not service.running, seconds=5)
        assert time.monotonic() - left < 2.0                     # the poll period plus a round (0.1 s here)
        assert _sample(service, "specbound_output_tokens_total") < 400
        gc.collect()
        assert len(service.live_rows) == 0


SIGTERM_CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
import torch
torch.set_num_threads(1)
from helpers import CharTokenizer, tiny_pair
from specbound.decoding import DraftSpec
from specbound.models.static import StaticCacheHFModel
from specbound.serve import DecodeService, ServeSettings, build_app, run_server

class Slow(StaticCacheHFModel):
    def forward(self, tokens, keep_logits=None):
        time.sleep(0.02)
        return super().forward(tokens, keep_logits)

m = tiny_pair(0, noise=0.3, draft_seed=1)
service = DecodeService(target=Slow(m[0], CharTokenizer(), name="t"), draft=StaticCacheHFModel(m[1], CharTokenizer()),
                        spec=DraftSpec(gamma=3), settings=ServeSettings(model_name="tiny", max_tokens_limit=400))
run_server(build_app(service), port={port}, shutdown_grace=0.5, log_level="warning")
print("exited cleanly", service.scheduler.live, len(service.running), flush=True)
"""


@pytest.mark.slow
def test_sigterm_stops_a_real_server_process_cleanly():
    import signal
    import subprocess
    import sys
    from pathlib import Path

    port = _free_port()
    code = SIGTERM_CHILD.format(tests=str(Path(__file__).parent), port=port)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"

        def up():
            assert proc.poll() is None, proc.stderr.read()
            try:
                return _get(url, "/health")[0] == 200
            except OSError:
                return False

        _wait(up, seconds=60)
        conn, stream = _open_stream(url)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        conn.close()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "exited cleanly 0 0" in out and "Traceback" not in err, err


def test_a_shutdown_cancels_what_runs_and_exits(modules):
    service = _slow_service(modules)
    with serving(service, grace=0.3) as (url, server, thread):
        conn, stream = _open_stream(url)
        server.should_exit = True                                # what SIGINT/SIGTERM do
        thread.join(20)
        assert not thread.is_alive()
        try:
            rest = stream.read()                                 # the stream ends (no hang) ...
        except http.client.IncompleteRead as cut:                # ... cut after the grace period
            rest = cut.partial
        conn.close()
        assert b"[DONE]" not in rest
        assert not service._thread.is_alive() and not service.running and service.scheduler.live == 0
        assert _sample(service, "specbound_output_tokens_total") < 400


# ------------------------------------------------------------------ batching and load
def test_batching_follows_the_rows_and_the_measured_costs(modules):
    target, draft = _wrap(modules)
    cheap = CostMeasurement(CostProfile((1, 2, 4), (1.0, 1.1, 1.3)), CostProfile((1, 2, 4), (0.1, 0.1, 0.1)))
    dear = CostMeasurement(CostProfile((1, 2, 4), (1.0, 2.2, 4.4)), CostProfile((1, 2, 4), (0.1, 0.2, 0.4)))
    assert choose_batching(target, draft, measurement=cheap).batched
    assert not choose_batching(target, draft, measurement=dear).batched
    assert not choose_batching(target, draft, mode="off").batched
    chain_target, chain_draft = chain_models(3)                 # rows read one after another
    choice = choose_batching(chain_target, chain_draft)
    assert not choice.batched and "one after another" in choice.reason


def test_sequential_serving_decodes_one_request_at_a_time(modules, reference):
    target, draft = _wrap(modules)
    service = _service(target, draft, batching="off")
    with serving(service) as (url, _, _):
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        with ThreadPoolExecutor(4) as pool:
            texts = list(pool.map(lambda i: _ask(c, f"seq {i}", 12, temperature=0)[0], range(4)))
        assert texts == [reference(f"seq {i}", 12)[0] for i in range(4)]
        assert json.loads(_get(url, "/health")[1])["batching"] == "sequential"
        assert _sample(service, "specbound_rounds_total", (("mode", "batched"),)) == 0
        assert _sample(service, "specbound_rounds_total", (("mode", "sequential"),)) > 0


def test_many_clients_lose_and_garble_nothing_and_state_is_released(client, server, reference):
    """16 clients × 4 requests each, streamed and not, greedy and T > 0 with seeds, chat and completions:
    every answer equals the same request decoded alone; afterwards no job, row or pass record is left."""
    _, service = server
    before = _sample(service, "specbound_rounds_total", (("mode", "batched"),))

    def plan(c, r):
        temperature, seed = (0.0, None) if (c + r) % 2 == 0 else (0.8, 100 * c + r)
        return dict(text=f"q{c % 5} {r}", n=8 + (c * 3 + r) % 13, chat=c % 3 == 0, stream=r % 2 == 1,
                    temperature=temperature, seed=seed)

    def one_client(c):
        out = []
        for r in range(4):
            p = plan(c, r)
            extra = {} if p["seed"] is None else {"seed": p["seed"]}
            out.append(_ask(client, p["text"], p["n"], chat=p["chat"], stream=p["stream"],
                            temperature=p["temperature"], **extra))
        return out

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one_client, range(16)))
    for c, replies in enumerate(answers):
        for r, (text, reason, _) in enumerate(replies):
            p = plan(c, r)
            expected, _ = reference(p["text"], p["n"], chat=p["chat"], temperature=p["temperature"], seed=p["seed"])
            assert text == expected, (c, r)
            assert reason == "length"
    assert _sample(service, "specbound_rounds_total", (("mode", "batched"),)) > before   # passes were shared
    _wait(lambda: not service.running)
    gc.collect()
    assert len(service.live_jobs) == 0 and len(service.live_rows) == 0
    assert service.scheduler.live == 0 and service.scheduler.passes == [] and not service.scheduler._waiting


# ------------------------------------------------------------------ pieces
def test_text_stream_holds_back_what_may_start_a_stop_string():
    tok = CharTokenizer()                                       # id i decodes to chr(97 + i % 26)
    stream = TextStream(tok, stops=("cd",))
    assert stream.feed([0, 1]) == "a"                          # the last len("cd") - 1 characters are held
    assert stream.feed([2]) == "b"                             # "c" may start "cd"
    assert stream.feed([3, 4]) == "" and stream.stopped        # "cd": the answer ends before it
    plain = TextStream(tok)
    assert plain.feed([0]) == "a" and plain.feed([1], final=True) == "b"


def test_the_serve_command_loads_the_models_once_and_runs_the_server(modules, monkeypatch, capsys):
    import specbound.serve as serve_package
    from specbound.cli import main
    from specbound.models import loading

    loads, served = [], []
    monkeypatch.setattr(loading, "load_pair", lambda *a, **k: loads.append(1) or _wrap(modules))
    monkeypatch.setattr(serve_package, "run_server", lambda app, **kw: served.append((app, kw)))
    argv = ["serve", "--target-precision", "int8", "--gamma", "2", "--threads", "1", "--port", "8123",
            "--max-queue", "3", "--batching", "on"]
    assert main(argv) == 0
    assert loads == [1] and len(served) == 1
    app, kw = served[0]
    service = app.state.service
    assert kw["port"] == 8123 and service.settings.max_queue == 3 and service.spec.gamma == 2
    err = capsys.readouterr().err
    assert "serving tiny-target" in err and "tiny-draft" in err and "batching: continuous" in err
    assert main(["serve", "--max-queue", "0"]) == 2
    assert "specbound: error: --max-queue must be >= 1" in capsys.readouterr().err


@pytest.mark.llamacpp
def test_llama_cpp_rows_come_from_one_pool_and_share_their_passes(tmp_path):
    """llama.cpp rows share a pass only when made together (one context): the server makes max_batch of
    them at start and lends them to requests; concurrent greedy answers still equal speculative_decode."""
    pytest.importorskip("gguf")
    pytest.importorskip("llama_cpp")
    from gguf_tiny import write_tiny_llama_gguf
    from specbound.models.llamacpp import LlamaCppModel

    paths = (write_tiny_llama_gguf(tmp_path / "t.gguf", seed=0),
             write_tiny_llama_gguf(tmp_path / "d.gguf", seed=0, noise=0.1, noise_seed=7))

    def pair(tag):
        return tuple(LlamaCppModel(p, n_ctx=512, n_threads=1, name=f"{tag}-{i}", identity=None)
                     for i, p in enumerate(paths))

    target, draft = pair("served")
    service = _service(target, draft, max_batch=4)
    assert {len(pool) for pool in service._pools.values()} == {4}
    ref_target, ref_draft = pair("reference")
    texts = ["the cat", "a dog ran", "hello world", "it is"]
    expected = []
    for text in texts:
        ids = ref_target.tokenizer(text, return_tensors="pt").input_ids[0].tolist()
        out = speculative_decode(ref_target, ref_draft, ids, 16, gamma=GAMMA, temperature=0,
                                 stop_token_ids=service.stop_ids)
        expected.append(ref_target.tokenizer.decode(out.tokens, skip_special_tokens=True))
    with serving(service) as (url, _, _):
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        for _ in range(2):                                       # rows lent, returned and lent again
            with ThreadPoolExecutor(4) as pool:
                got = list(pool.map(lambda t: _ask(c, t, 16, temperature=0, stream=True)[0], texts))
            assert got == expected
        _wait(lambda: not service.running)
        assert {len(pool) for pool in service._pools.values()} == {4}
        assert _sample(service, "specbound_rounds_total", (("mode", "batched"),)) > 0


class TemplateTokenizer(CharTokenizer):
    """CharTokenizer with a chat template of its own, to check that chat requests get generate's."""

    chat_template = "tiny"

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=False):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


@pytest.mark.parametrize("kind", ["code", "chat"])
def test_greedy_answers_equal_specbound_generate_on_the_same_prompt(modules, monkeypatch, capsys, kind):
    """The command line end to end: `specbound serve` and `specbound generate` with the same model options;
    a greedy completion (code) or chat answer equals generate's tokens for that prompt (--kind)."""
    import specbound.serve as serve_package
    from specbound.cli import main
    from specbound.models import loading

    def tiny(*a, **k):
        return (StaticCacheHFModel(modules[0], TemplateTokenizer(), name="tiny-target"),
                StaticCacheHFModel(modules[1], TemplateTokenizer(), name="tiny-draft"))

    monkeypatch.setattr(loading, "load_pair", tiny)
    options = ["--target-precision", "int8", "--gamma", "3", "--threads", "1"]
    prompt = "def mul(a, b):"
    assert main(["generate", "--prompt", prompt, "--kind", kind, "--max-new-tokens", "18", "--json", *options]) == 0
    report = json.loads(capsys.readouterr().out)
    served = []
    monkeypatch.setattr(serve_package, "run_server", lambda app, **kw: served.append(app))
    assert main(["serve", *options]) == 0
    service = served[0].state.service
    with serving(service) as (url, _, _):
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        text, _, usage = _ask(c, prompt, 18, chat=kind == "chat", temperature=0, model="tiny-target")
    assert text == TemplateTokenizer().decode(report["text_tokens"])
    assert usage.completion_tokens == report["new_tokens"]
