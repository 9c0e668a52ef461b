"""OpenAIBackend against a real, scripted, misbehaving HTTP server on localhost.

The server is plain ``http.server`` so the bytes on the wire are what the ``openai`` client
really sent, and every failure mode (5xx, 429, slow, garbage, refused, huge) is a real
socket-level event rather than a mock of the client.
"""

from __future__ import annotations

import email.utils
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from envrl.agents import openai_backend
from envrl.agents.generation import Backend, Generation, SamplingConfig
from envrl.agents.openai_backend import (
    LOCAL_API_KEY,
    MAX_ERROR_CHARS,
    MAX_TEXT_CHARS,
    OFFICIAL_BASE_URL,
    OpenAIBackend,
    parse_openai_spec,
)

pytestmark = pytest.mark.timeout(60)

PROMPT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "go north"}]
GREEDY = SamplingConfig(max_new_tokens=32)


# -- the scripted server ----------------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict -> JSON, bytes/str -> as is
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    trickle: float = 0.0  # seconds between 16-byte pieces of the body


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.raw)


def completion(text: str = "open door", finish: str | None = "stop", usage: tuple[int, int] | None = (11, 3)) -> dict:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return body


def error_body(message: str) -> dict:
    return {"error": {"message": message, "type": "test", "code": None}}


class FakeServer:
    """A threaded HTTP server answering each POST with ``responder(index, request)``."""

    def __init__(self, responder: Callable[[int, Seen], Reply]):
        self.responder = responder
        self.requests: list[Seen] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                seen = Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, raw)
                with server.lock:
                    index = len(server.requests)
                    server.requests.append(seen)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    reply = server.responder(index, seen)
                    if reply.delay:
                        server.stopping.wait(reply.delay)
                    body = reply.body if reply.body is not None else completion()
                    if isinstance(body, (dict, list)):
                        payload, ctype = json.dumps(body).encode(), "application/json"
                    else:
                        payload = body.encode() if isinstance(body, str) else body
                        ctype = "text/html"
                    self.send_response(reply.status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(payload)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    if not reply.trickle:
                        self.wfile.write(payload)
                    for start in range(0, len(payload), 16) if reply.trickle else ():
                        self.wfile.write(payload[start : start + 16])
                        self.wfile.flush()
                        if server.stopping.wait(reply.trickle):
                            break
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)
                finally:
                    with server.lock:
                        server.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def script(*replies: Reply) -> Callable[[int, Seen], Reply]:
    """Answer the i-th request with ``replies[i]``, repeating the last one."""
    return lambda index, _seen: replies[min(index, len(replies) - 1)]


@pytest.fixture(autouse=True)
def _no_ambient_keys(monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "TEST_LLM_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def serve():
    servers: list[FakeServer] = []

    def start(*replies: Reply, responder: Callable[[int, Seen], Reply] | None = None) -> FakeServer:
        servers.append(FakeServer(responder or script(*replies)))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def backend():
    made: list[OpenAIBackend] = []

    def make(url: str, model: str = "test-model", **kwargs: Any) -> OpenAIBackend:
        kwargs.setdefault("backoff_base", 0.01)
        kwargs.setdefault("backoff_max", 0.05)
        kwargs.setdefault("timeout", 5.0)
        made.append(OpenAIBackend(model, url, **kwargs))
        return made[-1]

    yield make
    for item in made:
        item.close()


def one(backend: OpenAIBackend, sampling: SamplingConfig = GREEDY) -> tuple[Generation, float]:
    started = time.monotonic()
    [generation] = backend.generate([PROMPT], sampling)
    return generation, time.monotonic() - started


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- success and the request on the wire ------------------------------------------------------


def test_valid_completion_and_request_body(serve, backend):
    server = serve(Reply(body=completion("open door", usage=(11, 3))))
    llm = backend(server.url, model="qwen2.5:1.5b/instruct")
    assert isinstance(llm, Backend)

    generation, elapsed = one(llm, SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=17))

    assert generation == Generation(
        text="open door",
        finish_reason="stop",
        prompt_tokens=11,
        completion_tokens=3,
        latency=generation.latency,
        attempts=1,
        error=None,
    )
    assert 0 < generation.latency <= elapsed < 5
    [seen] = server.requests
    assert seen.path == "/v1/chat/completions"
    body = seen.json
    assert body["model"] == "qwen2.5:1.5b/instruct"
    assert body["messages"] == PROMPT
    assert body["temperature"] == 0.7 and body["top_p"] == 0.9
    assert body["max_tokens"] == 17 and body["n"] == 1
    assert "seed" not in body and not body.get("stream")
    assert seen.headers["authorization"] == f"Bearer {LOCAL_API_KEY}"


def test_greedy_and_seed_are_sent(serve, backend):
    server = serve(Reply())
    llm = backend(server.url)
    llm.generate([PROMPT], SamplingConfig(temperature=0.0, max_new_tokens=8, seed=1234))
    body = server.requests[0].json
    assert body["temperature"] == 0.0 and body["seed"] == 1234 and body["max_tokens"] == 8
    assert b'"seed":1234' in server.requests[0].raw.replace(b" ", b"")


@pytest.mark.parametrize(
    ("finish", "expected"), [("stop", "stop"), ("length", "length"), ("tool_calls", "stop"), (None, "stop")]
)
def test_finish_reason_mapping_and_missing_usage(serve, backend, finish, expected):
    server = serve(Reply(body=completion("x", finish=finish, usage=None)))
    generation, _ = one(backend(server.url))
    assert (generation.text, generation.finish_reason) == ("x", expected)
    assert (generation.prompt_tokens, generation.completion_tokens) == (0, 0)


def test_huge_content_is_capped(serve, backend):
    huge = "a" * 10_000_000
    server = serve(Reply(body=completion(huge)))
    generation, elapsed = one(backend(server.url))
    assert generation.error is None and generation.attempts == 1
    assert len(generation.text) == MAX_TEXT_CHARS and generation.text == huge[:MAX_TEXT_CHARS]
    assert generation.finish_reason == "length"
    assert elapsed < 10


def test_oversized_body_fails_without_retry(serve, backend, monkeypatch):
    monkeypatch.setattr(openai_backend, "MAX_BODY_BYTES", 100_000)
    server = serve(Reply(body=completion("b" * 200_000)))
    generation, _ = one(backend(server.url))
    assert generation.attempts == 1 and len(server.requests) == 1
    assert generation.error.startswith("oversized response after 1 attempt")


def test_trickling_body_hits_the_deadline(serve, backend):
    server = serve(Reply(body=completion("t" * 2000), trickle=0.05))
    generation, elapsed = one(backend(server.url, timeout=0.4, max_retries=0))
    assert generation.error.startswith("timeout after 1 attempt: body still arriving")
    assert elapsed < 0.4 + 0.4 + 0.5


def test_close_interrupts_a_backoff(serve):
    server = serve(Reply(429, error_body("later"), headers={"Retry-After": "30"}))
    llm = OpenAIBackend("m", server.url, backoff_max=30.0)
    results: list[Generation] = []
    worker = threading.Thread(target=lambda: results.extend(llm.generate([PROMPT], GREEDY)))
    worker.start()
    while not server.requests:
        time.sleep(0.01)
    time.sleep(0.1)
    started = time.monotonic()
    llm.close()
    worker.join(5)
    assert time.monotonic() - started < 2
    [generation] = results
    assert generation.attempts == 1 and generation.error.startswith("HTTP 429 after 1 attempt: later")
    assert "backend closed" in generation.error


def test_empty_string_content_is_a_valid_answer(serve, backend):
    server = serve(Reply(body=completion("")))
    generation, _ = one(backend(server.url))
    assert (generation.text, generation.error, generation.attempts) == ("", None, 1)


# -- retries ----------------------------------------------------------------------------------


def test_500_then_ok_is_retried(serve, backend):
    server = serve(Reply(500, error_body("overloaded")), Reply(body=completion("ok")))
    generation, elapsed = one(backend(server.url))
    assert (generation.text, generation.attempts, generation.error) == ("ok", 2, None)
    assert len(server.requests) == 2 and elapsed < 3


def test_always_500_gives_up_with_a_short_error(serve, backend):
    server = serve(Reply(503, error_body("model is loading " + "x" * 1000)))
    generation, elapsed = one(backend(server.url, max_retries=2))
    assert generation.text == "" and generation.finish_reason == "error"
    assert generation.attempts == 3 and len(server.requests) == 3
    assert generation.error.startswith("HTTP 503 after 3 attempts: model is loading")
    assert len(generation.error) <= MAX_ERROR_CHARS and "\n" not in generation.error
    assert elapsed < 3


def test_429_honours_retry_after(serve, backend):
    server = serve(Reply(429, error_body("slow down"), headers={"Retry-After": "1"}), Reply(body=completion("ok")))
    generation, elapsed = one(backend(server.url, backoff_max=5.0))
    assert (generation.text, generation.attempts) == ("ok", 2)
    assert 0.9 <= elapsed < 4


def test_retry_after_is_capped_by_backoff_max(serve, backend):
    server = serve(Reply(429, error_body("slow down"), headers={"Retry-After": "120"}), Reply(body=completion("ok")))
    generation, elapsed = one(backend(server.url, backoff_max=0.2))
    assert (generation.text, generation.attempts) == ("ok", 2)
    assert 0.15 <= elapsed < 2


def test_retry_after_http_date(serve, backend):
    later = email.utils.formatdate(time.time() + 3600, usegmt=True)
    server = serve(Reply(429, error_body("slow"), headers={"Retry-After": later}), Reply(body=completion("ok")))
    generation, elapsed = one(backend(server.url, backoff_base=0.001, backoff_max=0.3))
    assert generation.attempts == 2
    assert 0.25 <= elapsed < 2  # waited the cap, not the 1 ms exponential backoff


def test_slow_server_times_out_and_is_retried(serve, backend):
    server = serve(Reply(delay=10.0))
    generation, elapsed = one(backend(server.url, timeout=0.3, max_retries=1))
    assert generation.finish_reason == "error" and generation.attempts == 2
    assert generation.error.startswith("timeout after 2 attempts")
    assert len(server.requests) == 2
    assert elapsed < 2 * 0.3 + 1.0


def test_timeout_then_ok(serve, backend):
    server = serve(Reply(delay=10.0), Reply(body=completion("late but fine")))
    generation, elapsed = one(backend(server.url, timeout=0.3))
    assert (generation.text, generation.attempts) == ("late but fine", 2)
    assert elapsed < 2


def test_connection_refused(backend):
    generation, elapsed = one(backend(f"http://127.0.0.1:{closed_port()}/v1", max_retries=2))
    assert generation.finish_reason == "error" and generation.attempts == 3
    assert generation.error.startswith("connection error after 3 attempts")
    assert elapsed < 3


GARBAGE = {
    "html": (b"<html><body>502 Bad Gateway</body></html>", "not JSON"),
    "no_choices": ({"id": "x", "object": "chat.completion"}, "no choices"),
    "empty_choices": ({"id": "x", "choices": []}, "empty choices"),
    "null_content": (completion(None), "no text content"),  # type: ignore[arg-type]
    "error_in_200": (error_body("backend crashed"), "backend crashed"),
}


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_garbage_then_ok_is_retried(serve, backend, kind):
    server = serve(Reply(body=GARBAGE[kind][0]), Reply(body=completion("ok")))
    generation, _ = one(backend(server.url))
    assert (generation.text, generation.attempts, generation.error) == ("ok", 2, None)


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_always_garbage_fails(serve, backend, kind):
    body, reason = GARBAGE[kind]
    server = serve(Reply(body=body))
    generation, elapsed = one(backend(server.url, max_retries=1))
    assert generation.finish_reason == "error" and generation.attempts == 2 and len(server.requests) == 2
    assert generation.error.startswith("bad response after 2 attempts: ")
    assert reason in generation.error
    assert elapsed < 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_client_errors_are_not_retried(serve, backend, status):
    server = serve(Reply(status, error_body(f"nope {status}")))
    generation, elapsed = one(backend(server.url, max_retries=4))
    assert len(server.requests) == 1
    assert generation.attempts == 1 and generation.finish_reason == "error" and generation.text == ""
    assert generation.error == f"HTTP {status} after 1 attempt: nope {status}"
    assert elapsed < 2


# -- concurrency, order and stats -------------------------------------------------------------


def test_order_kept_and_concurrency_bounded(serve, backend):
    def echo(index: int, seen: Seen) -> Reply:
        word = seen.json["messages"][-1]["content"]
        number = int(word.split()[-1])
        return Reply(body=completion(f"echo {number}"), delay=0.02 * ((number * 7) % 5))

    server = serve(responder=echo)
    llm = backend(server.url, max_concurrency=4)
    prompts = [[{"role": "user", "content": f"say {i}"}] for i in range(24)]
    for _ in range(2):  # the pool is reused across calls
        started = time.monotonic()
        results = llm.generate(prompts, GREEDY)
        elapsed = time.monotonic() - started
        assert [r.text for r in results] == [f"echo {i}" for i in range(24)]
    assert server.max_in_flight == 4
    assert elapsed < 24 * 0.04  # well under the ~0.96 s a serial loop would take
    assert llm.generate([], GREEDY) == []


def test_stats_count_attempts_retries_and_failures(serve, backend):
    def route(index: int, seen: Seen) -> Reply:
        content = seen.json["messages"][-1]["content"]
        if content == "bad":
            return Reply(400, error_body("bad request"))
        flaky = sum(1 for s in server.requests if s.json["messages"][-1]["content"] == "flaky")
        if content == "flaky" and flaky == 1:
            return Reply(500, error_body("oops"))
        return Reply(body=completion("ok", usage=(10, 2)))

    server = serve(responder=route)
    llm = backend(server.url)
    results = llm.generate([[{"role": "user", "content": c}] for c in ("fine", "flaky", "bad")], GREEDY)
    assert [r.attempts for r in results] == [1, 2, 1]
    assert [r.error is None for r in results] == [True, True, False]
    assert llm.stats() == {
        "requests": 3,
        "attempts": 4,
        "retries": 1,
        "failed_requests": 1,
        "prompt_tokens": 20,
        "completion_tokens": 4,
    }


# -- keys, protocol, lifecycle ----------------------------------------------------------------


def test_api_key_from_environment_is_the_bearer_token(serve, backend, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret-123")
    server = serve(Reply(401, error_body("invalid key sk-test-secret-123")))
    llm = backend(server.url)
    generation, _ = one(llm)
    assert server.requests[0].headers["authorization"] == "Bearer sk-test-secret-123"
    assert "sk-test-secret-123" not in generation.error and "***" in generation.error
    assert "sk-test-secret-123" not in repr(llm) + json.dumps(llm.protocol())


def test_custom_key_variable(serve, backend, monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", "other-key")
    monkeypatch.setenv("OPENAI_API_KEY", "not-this-one")
    server = serve(Reply())
    one(backend(server.url, api_key_env="TEST_LLM_KEY"))
    assert server.requests[0].headers["authorization"] == "Bearer other-key"


def test_missing_key_for_a_remote_server_is_an_error():
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        OpenAIBackend("gpt-4o-mini")
    with pytest.raises(ValueError, match="TEST_LLM_KEY"):
        OpenAIBackend("m", "https://llm.example.com/v1", api_key_env="TEST_LLM_KEY")


@pytest.mark.parametrize("url", ["http://localhost:8000/v1", "http://127.0.0.1:1/v1", "http://[::1]:8000/v1"])
def test_missing_key_for_a_local_server_is_empty(url):
    with OpenAIBackend("m", url) as llm:
        assert llm._client.api_key == LOCAL_API_KEY


def test_protocol(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://elsewhere:1/v1")  # must not redirect the official API
    with OpenAIBackend("gpt-4o-mini", max_retries=2, timeout=30) as llm:
        assert llm.protocol() == {
            "backend": "openai",
            "model": "gpt-4o-mini",
            "base_url": OFFICIAL_BASE_URL,
            "max_retries": 2,
            "timeout": 30.0,
        }
        assert str(llm._client.base_url).startswith(OFFICIAL_BASE_URL)
    with OpenAIBackend("m", "http://localhost:8000/v1?api-version=1#frag") as llm:
        assert llm.protocol()["base_url"] == "http://localhost:8000/v1"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_url": "http://user:pw@localhost:8000/v1"},
        {"base_url": "ftp://localhost/v1"},
        {"base_url": "localhost:8000/v1"},
        {"max_concurrency": 0},
        {"max_retries": -1},
        {"timeout": 0},
    ],
)
def test_invalid_settings(kwargs):
    kwargs = {"base_url": "http://localhost:8000/v1", **kwargs}
    with pytest.raises(ValueError) as info:
        OpenAIBackend("m", **kwargs)
    assert "pw" not in str(info.value)


def test_close_is_idempotent_and_final(serve):
    server = serve(Reply())
    llm = OpenAIBackend("m", server.url)
    assert llm.generate([PROMPT], GREEDY)[0].text == "open door"
    llm.close()
    llm.close()
    with pytest.raises(RuntimeError):
        llm.generate([PROMPT], GREEDY)


# -- spec parsing -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("gpt-4o-mini", ("gpt-4o-mini", None)),
        ("  gpt-4o-mini  ", ("gpt-4o-mini", None)),
        ("qwen2.5-1.5b@http://localhost:8000/v1", ("qwen2.5-1.5b", "http://localhost:8000/v1")),
        ("llama3.1:8b@http://127.0.0.1:11434/v1", ("llama3.1:8b", "http://127.0.0.1:11434/v1")),
        (
            "Qwen/Qwen2.5-7B-Instruct@https://llm.example.com/v1",
            ("Qwen/Qwen2.5-7B-Instruct", "https://llm.example.com/v1"),
        ),
        ("org/model:tag@HTTPS://h.example/v1", ("org/model:tag", "HTTPS://h.example/v1")),
        ("claude-3-5-sonnet@20240620", ("claude-3-5-sonnet@20240620", None)),
        ("vertex@2024@http://[::1]:8000/v1", ("vertex@2024", "http://[::1]:8000/v1")),
    ],
)
def test_parse_spec(spec, expected):
    assert parse_openai_spec(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("@http://localhost:8000/v1", "no model name"),
        ("qwen@localhost:8000/v1", "needs a scheme"),
        ("qwen@ftp://host/v1", "http:// and https://"),
        ("qwen@http://", "no host"),
        ("qwen@http://user:pw@host/v1", "credentials"),
        ("qwen@http://host:notaport/v1", "invalid base URL"),
        ("my model@http://localhost/v1", "whitespace"),
    ],
)
def test_parse_spec_rejects(spec, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_openai_spec(spec)
    assert "pw" not in str(info.value)


def test_per_prompt_seeds_go_into_each_request(serve, backend):
    """Identical prompts sampled in one call get their own seeds, so they are sampled independently."""
    server = serve(Reply())
    llm = backend(server.url)
    sampling = SamplingConfig(temperature=0.7, seed=99)
    llm.generate([PROMPT] * 3, sampling, seeds=[1, 2, None])
    seeds = sorted((seen.json.get("seed") for seen in server.requests), key=lambda s: (s is None, s))
    assert seeds == [1, 2, None]
    with pytest.raises(ValueError, match="2 seeds for 1 prompts"):
        llm.generate([PROMPT], sampling, seeds=[1, 2])


@pytest.mark.parametrize(
    "logprobs, expected",
    [
        (
            {"content": [{"token": "token_id:5", "logprob": -0.5}, {"token": "token_id:7", "logprob": 0}]},
            ([5, 7], [-0.5, 0.0]),
        ),
        ({"content": [{"token": "Hel", "logprob": -0.5}, {"token": "lo", "logprob": -1.0}]}, (None, [-0.5, -1.0])),
        ({"content": [{"token": "token_id:5", "logprob": "x"}]}, (None, None)),
        ({"content": [{"token": "token_id:5", "logprob": True}]}, (None, None)),
        ({"content": "nope"}, (None, None)),
        ({"content": [{"token": "token_id:-1", "logprob": -1}]}, (None, [-1.0])),
        (None, (None, None)),
    ],
)
def test_logprobs_are_read_where_the_server_sent_them(logprobs, expected):
    from envrl.agents.openai_backend import parse_completion

    body = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop", "logprobs": logprobs}]}
    gen = parse_completion(json.dumps(body).encode())
    assert (gen.text, gen.token_ids, gen.token_logprobs) == ("hi", *expected)
