"""The OpenAI-compatible model server: the official client against a real socket, errors via the test client."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("flask")
from envrl.agents.generation import Generation, SamplingConfig  # noqa: E402
from envrl.agents.serve_model import create_app, get_batcher, parse_chat_request, serve  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MESSAGES = [{"role": "system", "content": "You are an expert agent."}, {"role": "user", "content": "go to cabinet 1"}]
GOOD = {"model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 8}


class FakeBackend:
    """Echoes the last message; records every generate call (batch size and sampling)."""

    model = "fake"
    max_batch_size = 8

    def __init__(self, delay: float = 0.0, fail: str | None = None) -> None:
        self.calls: list[tuple[int, SamplingConfig]] = []
        self.delay, self.fail = delay, fail

    def generate(self, prompts, sampling):
        self.calls.append((len(prompts), sampling))
        time.sleep(self.delay)
        if self.fail == "raise":
            raise RuntimeError("backend exploded")
        if self.fail == "error":
            return [Generation(text="", finish_reason="error", error="CUDA out of memory") for _ in prompts]
        return [Generation(text=p[-1]["content"][::-1], prompt_tokens=3, completion_tokens=2) for p in prompts]

    def protocol(self):
        return {"backend": "fake"}

    def close(self):
        pass


@pytest.fixture()
def fake_app():
    backend = FakeBackend()
    app = create_app(backend, model_name="tiny", max_new_tokens_limit=64, max_body_bytes=10_000)
    yield app, backend
    get_batcher(app).close()


def _start(app):
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


@pytest.fixture(scope="module")
def hf_backend(tiny_checkpoint):
    from envrl.agents.hf import HFBackend

    backend = HFBackend(str(tiny_checkpoint), max_batch_size=8)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def live(hf_backend):
    """The real server on a free port, serving the tiny model as "tiny"."""
    openai = pytest.importorskip("openai")
    app = create_app(hf_backend, model_name="tiny", max_new_tokens_limit=64, max_body_bytes=50_000, batch_wait_s=0.05)
    server, thread = _start(app)
    base = f"http://127.0.0.1:{server.server_port}/v1"
    client = openai.OpenAI(base_url=base, api_key="EMPTY", max_retries=0, timeout=30)
    yield app, client, base
    server.shutdown()
    thread.join(5)
    get_batcher(app).close()


# ---- the official client against a real socket --------------------------------------------


def test_client_gets_the_backends_greedy_text(live, hf_backend):
    app, client, _ = live
    expected = hf_backend.generate([MESSAGES], SamplingConfig(temperature=0, max_new_tokens=16))[0]
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=16)
    assert reply.object == "chat.completion" and reply.model == "tiny" and reply.id.startswith("chatcmpl-")
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text
    assert choice.finish_reason == expected.finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (expected.prompt_tokens, 16)
    assert reply.usage.total_tokens == expected.prompt_tokens + 16


def test_logprobs_carry_the_exact_tokens(live, hf_backend):
    """``logprobs=True``: the sampled token ids (as ``token_id:N``) and their log-probabilities,
    equal to the back end's own; the ``openai:`` back end reads both back."""
    from envrl.agents.openai_backend import OpenAIBackend

    _, client, base = live
    expected = hf_backend.generate([MESSAGES], SamplingConfig(temperature=0, max_new_tokens=16))[0]
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=16, logprobs=True)
    content = reply.choices[0].logprobs.content
    assert [item.token for item in content] == [f"token_id:{t}" for t in expected.token_ids]
    assert [item.logprob for item in content] == pytest.approx(expected.token_logprobs, abs=1e-5)
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=16)
    assert plain.choices[0].logprobs is None
    remote = OpenAIBackend("tiny", base, logprobs=True)
    try:
        gen = remote.generate([MESSAGES], SamplingConfig(temperature=0, max_new_tokens=16))[0]
    finally:
        remote.close()
    assert gen.token_ids == expected.token_ids and gen.token_logprobs == pytest.approx(expected.token_logprobs)


def test_models_and_health(live):
    _, client, base = live
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with urllib.request.urlopen(base.removesuffix("/v1") + "/health") as response:
        assert json.load(response)["status"] == "ok"


def test_concurrent_requests_are_batched(live, hf_backend):
    app, client, _ = live
    prompts = [[{"role": "user", "content": f"take apple {i} from countertop {i + 1}" + " now" * i}] for i in range(6)]
    expected = [hf_backend.generate([p], SamplingConfig(max_new_tokens=12))[0].text for p in prompts]
    batcher = get_batcher(app)
    batches_before, requests_before = batcher.batches, batcher.requests
    barrier = threading.Barrier(len(prompts))
    answers: list[str | None] = [None] * len(prompts)

    def ask(i: int) -> None:
        barrier.wait()
        reply = client.chat.completions.create(model="tiny", messages=prompts[i], temperature=0, max_tokens=12)
        answers[i] = reply.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert answers == expected  # batched with each other, yet the same greedy text as alone
    assert batcher.requests - requests_before == 6
    assert batcher.batches - batches_before < 6


def test_client_sees_errors_and_server_survives(live):
    import openai

    _, client, base = live
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MESSAGES, n=2)
    assert info.value.body["param"] == "n"  # the client unwraps {"error": {...}}
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x" * 200_000}])
    assert info.value.status_code == 413
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=4)
    assert reply.usage.completion_tokens == 4


def test_seeded_sampling_over_http(live):
    _, client, _ = live

    def ask(seed: int) -> str:
        reply = client.chat.completions.create(
            model="tiny", messages=MESSAGES, temperature=1.0, max_tokens=12, seed=seed
        )
        return reply.choices[0].message.content

    assert ask(3) == ask(3)
    assert len({ask(3), ask(4), ask(5)}) > 1


# ---- errors and batching rules, no socket needed --------------------------------------------


def _error(response, status: int) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == "application/json"
    error = response.get_json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert len(error["message"]) < 300 and "Traceback" not in error["message"]
    return error


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "tiny"}, "messages"),
        ({**GOOD, "messages": []}, "messages"),
        ({**GOOD, "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({**GOOD, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({**GOOD, "messages": ["hi"]}, "messages[0]"),
        ({**GOOD, "n": 2}, "n"),
        ({**GOOD, "stream": True}, "stream"),
        ({**GOOD, "max_tokens": 0}, "max_tokens"),
        ({**GOOD, "max_tokens": 65}, "max_tokens"),
        ({**GOOD, "max_completion_tokens": "8"}, "max_completion_tokens"),
        ({**GOOD, "temperature": -1}, "temperature"),
        ({**GOOD, "temperature": "hot"}, "temperature"),
        ({**GOOD, "top_p": 0}, "top_p"),
        ({**GOOD, "seed": 1.5}, "seed"),
        ({**GOOD, "stop": ["\n"]}, "stop"),
        ({**GOOD, "logprobs": "yes"}, "logprobs"),
        ({**GOOD, "top_logprobs": 3}, "top_logprobs"),
        ({k: v for k, v in GOOD.items() if k != "model"}, "model"),
    ],
)
def test_invalid_fields_get_400(fake_app, body, param):
    app, backend = fake_app
    error = _error(app.test_client().post("/v1/chat/completions", json=body), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert backend.calls == []


def test_invalid_json_and_non_objects(fake_app):
    app, _ = fake_app
    client = app.test_client()
    error = _error(client.post("/v1/chat/completions", data="{not json " + "x" * 5000), 400)
    assert "not valid JSON" in error["message"] and "xxxx" not in error["message"]
    _error(client.post("/v1/chat/completions", data=b"\xff\xfe"), 400)
    _error(client.post("/v1/chat/completions", json=[1, 2]), 400)
    _error(client.post("/v1/chat/completions", json="hello"), 400)


def test_unknown_model_route_method_and_size(fake_app):
    app, _ = fake_app
    client = app.test_client()
    huge_name = "m" * 10_00
    error = _error(client.post("/v1/chat/completions", json={**GOOD, "model": huge_name}), 404)
    assert error["code"] == "model_not_found" and huge_name not in error["message"]
    _error(client.get("/v1/nothing-here"), 404)
    _error(client.get("/v1/models/other"), 404)
    _error(client.get("/v1/chat/completions"), 405)
    error = _error(client.post("/v1/chat/completions", data="x" * 20_000), 413)
    assert "xxxx" not in error["message"]
    response = client.post("/v1/chat/completions", json=GOOD)  # still serving
    assert response.status_code == 200


def test_good_request_and_field_defaults(fake_app):
    app, backend = fake_app
    client = app.test_client()
    body = client.post("/v1/chat/completions", json=GOOD).get_json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "1 tenibac ot og"}
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert backend.calls[-1] == (1, SamplingConfig(temperature=0.0, top_p=1.0, max_new_tokens=8, seed=None))
    # OpenAI defaults: temperature 1; max_tokens defaults to the server limit; the newer name wins
    client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": MESSAGES, "max_tokens": 5, "max_completion_tokens": 7, "seed": 2},
    )
    assert backend.calls[-1][1] == SamplingConfig(temperature=1.0, max_new_tokens=7, seed=2)
    # content parts and the developer role are accepted
    msgs, sampling = parse_chat_request(
        {
            "model": "tiny",
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
            ],
        },
        model_name="tiny",
        max_new_tokens_limit=64,
    )
    assert msgs == [{"role": "system", "content": "ab"}] and sampling.max_new_tokens == 64


@pytest.mark.parametrize("fail", ["error", "raise"])
def test_backend_failures_are_500(fail):
    app = create_app(FakeBackend(fail=fail), model_name="tiny")
    try:
        error = _error(app.test_client().post("/v1/chat/completions", json=GOOD), 500)
        assert error["type"] == "server_error"
        assert app.test_client().get("/health").status_code == 200
    finally:
        get_batcher(app).close()


def test_batches_group_identical_sampling():
    backend = FakeBackend(delay=0.05)
    app = create_app(backend, model_name="tiny", batch_wait_s=0.05)
    bodies = [{**GOOD, "max_tokens": 8 if i % 2 else 16} for i in range(8)]
    bodies += [{**GOOD, "temperature": 0.7, "seed": 1}] * 2  # seeded sampling runs alone
    statuses = []

    def post(body):
        statuses.append(app.test_client().post("/v1/chat/completions", json=body).status_code)

    threads = [threading.Thread(target=post, args=(b,)) for b in bodies]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    finally:
        get_batcher(app).close()
    assert statuses == [200] * len(bodies)
    assert sum(n for n, _ in backend.calls) == len(bodies)
    assert len(backend.calls) < len(bodies)
    assert all(n == 1 for n, s in backend.calls if s.seed is not None)
    assert {s.max_new_tokens for _, s in backend.calls if s.seed is None} == {8, 16}


# ---- serve(): the entry point the CLI calls ---------------------------------------------------


def test_serve_fails_fast_on_a_busy_port(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert serve(str(tmp_path / "missing"), port=busy.getsockname()[1]) == 1
    assert "cannot listen" in capsys.readouterr().err


def test_serve_runs_until_sigterm(tiny_checkpoint):
    code = (
        "import sys; from envrl.agents.serve_model import serve; "
        "sys.exit(serve(sys.argv[1], port=0, model_name='tiny'))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tiny_checkpoint)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        assert match, line
        base = f"http://127.0.0.1:{match.group(1)}"
        request = urllib.request.Request(
            base + "/v1/chat/completions", data=json.dumps(GOOD).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.load(response)["usage"]["completion_tokens"] >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
