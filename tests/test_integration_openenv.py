"""envrl over OpenEnv (``envrl.integrations.openenv``), tested against the real ``openenv-core``.

Servers run in a thread of this process (uvicorn on a free 127.0.0.1 port) and are played with
OpenEnv's own client classes: :class:`EnvrlEnvClient` (a subclass of OpenEnv's ``EnvClient``) and
OpenEnv's ``GenericEnvClient`` (raw JSON dicts, so the wire format itself is checked). Every
episode is replayed on an in-process ``gym.make`` env with the same arguments, and the
observations, rewards, flags and info must be equal. The command line's bad input is checked
in-process; serving from a subprocess (another ~6 s of CPU importing) is a slow test. The idle
session reaper test waits ~5 s (OpenEnv's reaper looks every 5 s at least), asleep.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

pytest.importorskip("openenv.core", reason="needs openenv-core: pip install 'envrl[openenv]'")

import uvicorn  # noqa: E402
from openenv.core.generic_client import GenericEnvClient  # noqa: E402

import envrl.envs  # noqa: E402, F401  (registers the ids)
from envrl.envs.base import EPISODE_OVER_FEEDBACK, MAX_ACTION_LENGTH  # noqa: E402
from envrl.integrations import openenv as oe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TW_TASK = "tw-custom:valid:0"
TIMEOUT = 60.0  # seconds any one client call may take (a reset may generate a game)
MAX_STEPS = 60  # bound of every played episode (the envs' limits are 50 and 15)

pytestmark = pytest.mark.timeout(300)  # a hung server or client fails its test instead of the run


class ServerThread:
    """An app served by uvicorn in a daemon thread on 127.0.0.1 (a free port); ``url`` once started."""

    def __init__(self, app: Any):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()
        assert not self.thread.is_alive(), "the server did not stop"


def client(url: str) -> Any:
    """A connected sync :class:`EnvrlEnvClient` (use as a context manager)."""
    return oe.EnvrlEnvClient(base_url=url, connect_timeout_s=10, message_timeout_s=TIMEOUT).sync()


def assert_same(remote: Any, local: tuple) -> None:
    """A client's StepResult equals an in-process ``step`` result (or ``reset`` result)."""
    obs = remote.observation
    if len(local) == 2:  # reset
        text, info = local
        assert (remote.reward, remote.done, obs.terminated, obs.truncated) == (None, False, False, False)
    else:
        text, reward, terminated, truncated, info = local
        assert type(remote.reward) is float and remote.reward == reward
        assert (obs.terminated, obs.truncated, remote.done) == (terminated, truncated, terminated or truncated)
    assert obs.text.encode() == text.encode()
    assert obs.info == info


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tw_kwargs(tw_custom_kwargs) -> dict[str, Any]:
    """gym.make arguments of a TextWorld env on the short custom quests of split valid, whose first
    game (``TW_TASK``) is made in envrl's cache (conftest)."""
    return {**tw_custom_kwargs, "expert_plan": True}


@pytest.fixture(scope="module")
def tw_server(tw_kwargs) -> Iterator[str]:
    with ServerThread(oe.build_app("textworld", "valid", tw_kwargs, max_sessions=3, idle_timeout=None)) as server:
        yield server.url


@pytest.fixture(scope="module")
def webshop_server() -> Iterator[str]:
    app = oe.build_app("webshop", "test", {"expert_plan": True}, max_sessions=2, idle_timeout=300)
    with ServerThread(app) as server:
        yield server.url


@pytest.fixture
def local_env() -> Iterator[Any]:
    made: list[gym.Env] = []

    def make(env_id: str, split: str, **kwargs: Any) -> gym.Env:
        made.append(gym.make(env_id, split=split, **kwargs))
        return made[-1]

    yield make
    for env in made:
        env.close()


# ---------------------------------------------------------------------------- same episodes as in-process


def test_textworld_walkthrough_wins_exactly_as_in_process(tw_server, tw_kwargs, local_env):
    env = local_env("envrl/TextWorld-v0", "valid", **tw_kwargs)
    with client(tw_server) as remote:
        local = env.reset(options={"task_id": TW_TASK})
        result = remote.reset(task_id=TW_TASK)
        assert_same(result, local)
        plan = list(local[1]["expert_plan"])
        assert plan, "the expert walkthrough is empty"
        total, steps = 0.0, 0
        while not result.done:
            assert steps < MAX_STEPS
            action = result.observation.info["expert_plan"][0]
            local = env.step(action)
            result = remote.step(action)
            assert_same(result, local)
            total += result.reward
            steps += 1
        assert result.observation.info["success"] is True and result.observation.terminated
        assert total == pytest.approx(1.0) and steps == len(plan)
        state = remote.state()
        assert (state.env_id, state.split, state.task_id, state.step_count) == (
            "envrl/TextWorld-v0",
            "valid",
            TW_TASK,
            steps,
        )
        assert (state.terminated, state.truncated) == (True, False)
        # the end is final: the env's own message, reward 0, the end's flags, on both sides
        after = remote.step("go north")
        assert_same(after, env.step("go north"))
        assert after.observation.text == EPISODE_OVER_FEEDBACK and after.reward == 0.0 and after.done


def test_webshop_purchase_and_bad_actions_as_in_process(webshop_server, local_env):
    env = local_env("envrl/WebShop-v0", "test", expert_plan=True)
    bad = ["dance", "click[no such button]", "search[" + "x" * (MAX_ACTION_LENGTH + 10) + "]", ""]
    with client(webshop_server) as remote:
        local = env.reset(options={"task_id": "fixed_0"})
        result = remote.reset(options={"task_id": "fixed_0"})
        assert_same(result, local)
        for action in bad:  # feedback, never an exception, and the page is unchanged
            result = remote.step(action)
            assert_same(result, env.step(action))
            assert result.observation.info["valid_action"] is False and not result.done
        for _ in range(MAX_STEPS):
            action = result.observation.info["expert_plan"][0]
            result = remote.step(oe.EnvrlAction(text=action))
            assert_same(result, env.step(action))
            if result.done:
                break
        assert result.reward == 1.0 and result.observation.info["success"] is True
        assert result.observation.info["reward_info"]["r_att"] == 1.0
        assert_same(remote.step("click[buy now]"), env.step("click[buy now]"))

        # a task drawn by seed: the same task and page as in-process
        assert_same(remote.reset(seed=7), env.reset(seed=7))


def test_the_wire_carries_plain_json(webshop_server, local_env):
    """OpenEnv's generic client (raw dicts): the observation's fields on the wire, nothing else."""
    observation, info = local_env("envrl/WebShop-v0", "test", expert_plan=True).reset(options={"task_id": "fixed_3"})
    with GenericEnvClient(base_url=webshop_server, message_timeout_s=TIMEOUT).sync() as raw:
        result = raw.reset(task_id="fixed_3")
        assert result.observation == {"text": observation, "info": info, "terminated": False, "truncated": False}
        assert (result.reward, result.done) == (None, False)
        result = raw.step({"text": "click[no such button]"})
        assert result.observation["info"]["valid_action"] is False and result.reward == 0.0


# ---------------------------------------------------------------------------- sessions


def test_two_clients_get_independent_sessions(webshop_server, local_env):
    env_a = local_env("envrl/WebShop-v0", "test", expert_plan=True)
    env_b = local_env("envrl/WebShop-v0", "test", expert_plan=True)
    with client(webshop_server) as a, client(webshop_server) as b:
        result_a, result_b = a.reset(task_id="fixed_0"), b.reset(task_id="fixed_1")
        assert_same(result_a, env_a.reset(options={"task_id": "fixed_0"}))
        assert_same(result_b, env_b.reset(options={"task_id": "fixed_1"}))
        first_a = a.state()
        for _ in range(2):  # a plays on; b's episode must not move
            action = result_a.observation.info["expert_plan"][0]
            result_a = a.step(action)
            assert_same(result_a, env_a.step(action))
        assert b.state().step_count == 0 and b.state().task_id == "fixed_1"
        action = result_b.observation.info["expert_plan"][0]
        assert_same(b.step(action), env_b.step(action))
        assert a.state().episode_id == first_a.episode_id != b.state().episode_id
        assert a.state().step_count == 2


def test_bad_requests_get_clear_errors_and_the_session_lives_on(tw_server, tw_kwargs, local_env):
    env = local_env("envrl/TextWorld-v0", "valid", **tw_kwargs)
    with client(tw_server) as remote:
        with pytest.raises(oe.ServerError, match="call reset") as error:
            remote.step("look")
        assert error.value.code == "EXECUTION_ERROR"
        with pytest.raises(oe.ServerError, match="unknown reset argument.*tsk_id"):
            remote.reset(tsk_id=TW_TASK)
        with pytest.raises(oe.ServerError, match="unknown task id 'tw-custom:valid:99999'"):
            remote.reset(task_id="tw-custom:valid:99999")
        with pytest.raises(oe.ServerError, match="two task ids"):
            remote.reset(task_id=TW_TASK, options={"task_id": "tw-custom:valid:1"})
        with pytest.raises(oe.ServerError, match="VALIDATION_ERROR") as error:
            remote.step({"text": 5})  # type: ignore[arg-type]  # a raw payload whose text is not text
        # the same connection still plays, exactly as in-process
        assert_same(remote.reset(task_id=TW_TASK), env.reset(options={"task_id": TW_TASK}))
        for action in ("go nowhere", "take the moon; look", "restart", "x" * (MAX_ACTION_LENGTH + 1)):
            result = remote.step(action)
            assert_same(result, env.step(action))
            assert result.observation.info["valid_action"] is False and not result.done


def test_stateless_http_endpoints(tw_server):
    def request(method: str, path: str) -> tuple[int, str]:
        req = urllib.request.Request(tw_server + path, method=method, data=b"{}" if method == "POST" else None)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    for path in ("/reset", "/step"):
        status, body = request("POST", path)
        assert status == 409 and "/ws" in body, (path, body)
    assert request("GET", "/health") == (200, '{"status":"healthy"}')
    status, body = request("GET", "/schema")
    assert status == 200 and '"text"' in body and '"terminated"' in body
    status, body = request("GET", "/metadata")
    assert status == 200 and "envrl/TextWorld-v0" in body


def test_the_session_bound_refuses_one_more_client():
    app = oe.build_app("webshop", "test", max_sessions=1, idle_timeout=None)
    with ServerThread(app) as server, client(server.url) as first:
        first.reset(task_id="fixed_0")
        extra = client(server.url)
        try:
            with pytest.raises(oe.ServerError, match=r"at capacity: 1/1 sessions") as error:
                extra.connect()
                extra.reset(task_id="fixed_1")
            assert error.value.code == "CAPACITY_REACHED"
        finally:
            extra.close()
        first.step("search[sofa]")  # the first session is untouched


def test_an_idle_session_is_closed_and_its_slot_freed():
    """OpenEnv's reaper checks every max(timeout / 4, 5) s: with a 1 s timeout, reaped within ~10 s."""
    app = oe.build_app("webshop", "test", max_sessions=1, idle_timeout=1.0)
    with ServerThread(app) as server, client(server.url) as idle:
        idle.reset(task_id="fixed_0")
        deadline, joined = time.monotonic() + 30, None
        while joined is None:
            assert time.monotonic() < deadline, "the idle session was never reaped"
            time.sleep(0.5)
            other = client(server.url)
            try:
                other.connect()
                other.reset(task_id="fixed_1")
                joined = other
            except oe.ServerError as error:
                assert error.code == "CAPACITY_REACHED"
                other.close()
        try:
            assert joined.step("search[sofa]").observation.info["step"] == 1
            with pytest.raises(oe.ServerError, match=r"closed \(idle for more than 1 s"):
                idle.step("search[sofa]")
        finally:
            joined.close()


# ---------------------------------------------------------------------------- limits, versions, command line


def test_build_app_checks_its_arguments(tw_kwargs):
    with pytest.raises(ValueError, match="unknown environment 'nope'"):
        oe.build_app("nope", "valid")
    with pytest.raises(ValueError, match="unknown TextWorld split 'dev'"):
        oe.build_app("textworld", "dev", tw_kwargs)
    with pytest.raises(ValueError, match="max_sessions"):
        oe.build_app("textworld", "valid", tw_kwargs, max_sessions=0)
    with pytest.raises(ValueError, match="idle_timeout"):
        oe.build_app("textworld", "valid", tw_kwargs, idle_timeout=0)


def _serve(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "envrl.integrations.openenv", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _first_line(process: subprocess.Popen, timeout: float) -> str:
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(process.stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        process.kill()
        pytest.fail(f"no line from the server within {timeout} s: {process.communicate(timeout=10)}")


@pytest.mark.slow
def test_command_line_serves_and_stops_on_sigterm(tw_kwargs, local_env):
    env_args = ["--env-arg", 'families=["custom"]']
    process = _serve("--env", "textworld", "--split", "valid", "--port", "0", "--max-sessions", "2", *env_args)
    try:
        line = _first_line(process, timeout=120)
        assert "envrl/TextWorld-v0 (split valid)" in line and "at most 2 sessions, idle timeout 600 s" in line
        url = line.split(" at ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        env = local_env("envrl/TextWorld-v0", "valid", families=["custom"])
        with client(url) as remote:
            assert_same(remote.reset(task_id=TW_TASK), env.reset(options={"task_id": TW_TASK}))
            assert_same(remote.step("look"), env.step("look"))

    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "Traceback" not in err


def test_main_rejects_bad_input_in_one_line(capsys):
    """In-process: argparse errors exit 2; an env that cannot be made or a busy port return 1."""
    base = ["--env", "textworld", "--split", "valid"]
    for args, message in [
        (["--port", "70000"], "must be in 0..65535"),
        (["--port", "http"], "must be a port number"),
        (["--max-sessions", "0"], "must be an integer >= 1"),
        (["--idle-timeout", "-1"], "must be seconds >= 0"),
        (["--env-arg", "oops"], "KEY=VALUE"),
    ]:
        with pytest.raises(SystemExit) as stop:
            oe.main(base + args, prog="envrl serve-env")
        err = capsys.readouterr().err
        assert stop.value.code == 2 and message in err and "envrl serve-env" in err, (args, err)

    assert oe.main(["--env", "textworld", "--split", "dev", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "unknown TextWorld split 'dev'" in err and len(err.strip().splitlines()) == 1

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert oe.main(base + ["--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and len(err.strip().splitlines()) == 1


def test_envrl_serve_env_hands_its_arguments_to_the_server(capsys):
    """`envrl serve-env` is the same parser: bad input exits 2 in one line, an unknown split 1."""
    from envrl import cli

    assert cli.main(["serve-env", "--env", "textworld", "--split", "valid", "--port", "70000"]) == 2
    err = capsys.readouterr().err
    assert "envrl serve-env: error: argument --port: must be in 0..65535" in err and "Traceback" not in err
    assert cli.main(["serve-env", "--env", "textworld", "--split", "dev", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "unknown TextWorld split 'dev'" in err and len(err.strip().splitlines()) == 1
