"""The OpenEnv server image (docker/openenv/Dockerfile), built and run with podman.

Builds the image from this checkout, starts it on a free port (the default: WebShop's test split,
``--env-arg expert_plan=true`` added through ``ENVRL_SERVE_ARGS``), waits for OpenEnv's /health,
then plays the same WebShop episodes through OpenEnv's WebSocket client and in-process and
compares every observation, reward, flag and info dict; checks the image is lean, unprivileged
and healthy, and that SIGTERM stops it cleanly. The container is always removed.
"""

from __future__ import annotations

import gymnasium as gym
import pytest
from podman_images import (
    BUILD_TIMEOUT,
    START_TIMEOUT,
    assert_lean_unprivileged_and_healthy,
    build_image,
    running_container,
    seconds_to_stop,
)
from test_webshop_server import free_port, wait_healthy

pytest.importorskip("openenv", reason="the openenv extra is not installed (pip install 'envrl[openenv]')")

import envrl.envs  # noqa: E402, F401  (registers the ids)
from envrl.integrations import openenv as oe  # noqa: E402

pytestmark = [pytest.mark.container, pytest.mark.timeout(BUILD_TIMEOUT + 600)]

IMAGE = "localhost/envrl-openenv:test"
MAX_STEPS = 15  # WebShop's step limit


def _openenv(image: str, port: int, serve_args: str = ""):
    url = f"http://127.0.0.1:{port}"
    env = {"OPENENV_PORT": str(port), "ENVRL_SERVE_ARGS": serve_args}
    return running_container(
        image,
        "envrl-openenv-test",
        env,
        lambda alive: wait_healthy(url, START_TIMEOUT, alive, path="/health", status="healthy"),
    )


@pytest.fixture(scope="module")
def timings() -> dict:
    return {}


@pytest.fixture(scope="module")
def image(timings) -> str:
    return build_image("docker/openenv/Dockerfile", IMAGE, timings)


@pytest.fixture(scope="module")
def server(image, timings):
    port = free_port()
    with _openenv(image, port, "--env-arg expert_plan=true --max-sessions 2") as started:
        timings["start_to_healthy_s"] = started["start_s"]
        yield {**started, "url": f"http://127.0.0.1:{port}"}


def _play(reset, step, task_id: str) -> list[tuple]:
    """An episode of the expert plan (after one malformed action): every (text, reward, ends, info)."""
    text, info = reset(task_id)
    trace: list[tuple] = [(text, None, False, False, info)]
    for action in ["click[no such button]"] + [None] * MAX_STEPS:
        text, reward, terminated, truncated, info = step(action or info["expert_plan"][0])
        trace.append((text, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return trace


def test_episodes_over_openenv_equal_in_process(server, timings, record_property):
    local = gym.make("envrl/WebShop-v0", split="test", expert_plan=True)
    client = oe.EnvrlEnvClient(base_url=server["url"], connect_timeout_s=10, message_timeout_s=60).sync()

    def remote_reset(task_id: str) -> tuple:
        result = client.reset(task_id=task_id)
        return result.observation.text, result.observation.info

    def remote_step(action: str) -> tuple:
        result = client.step(action)
        obs = result.observation
        assert result.done == (obs.terminated or obs.truncated)
        return obs.text, result.reward, obs.terminated, obs.truncated, obs.info

    try:
        with client:
            for task_id in ("fixed_0", "fixed_1", "fixed_2"):
                over_openenv = _play(remote_reset, remote_step, task_id)
                in_process = _play(lambda t: local.reset(options={"task_id": t}), local.step, task_id)
                assert over_openenv == in_process
                assert over_openenv[-1][2] and over_openenv[-1][4]["success"] is True, "no purchase"
                assert over_openenv[1][4]["valid_action"] is False  # the malformed action got feedback
    finally:
        local.close()
    for key, value in timings.items():
        record_property(key, value)
    print(f"\nopenenv container: {timings}")


def test_image_is_lean_unprivileged_and_healthy(server):
    assert server["health"] == {"status": "healthy"}
    assert_lean_unprivileged_and_healthy(server["name"], absent=("alfworld", "textworld", "torch"))


def test_container_stops_on_sigterm(image):
    with _openenv(image, free_port()) as started:
        took = seconds_to_stop(started["name"])
    print(f"\nopenenv container: podman stop took {took:.2f} s")
    assert took < 15
