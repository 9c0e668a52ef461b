"""The WebShop server image (docker/webshop/Dockerfile), built and run with podman.

Builds the debootstrap base image if it is missing (docker/base-image.sh) and the server image
from this checkout, starts a container on a free port, waits for /healthz, plays an episode
over HTTP and checks the done page's reward against ``load_store().reward`` computed here, then
plays the same tasks through ``gym.make("envrl/WebShop-v0", server_url=...)`` and in-process and
compares them byte for byte. The container is always removed.

Without podman the tests skip, except under CI=true, where they fail (.ci/run installs podman).
Build and start times are printed (``pytest -s``) and recorded as test properties.
"""

from __future__ import annotations

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

pytestmark = [pytest.mark.container, pytest.mark.timeout(BUILD_TIMEOUT + 600)]

IMAGE = "localhost/envrl-webshop:test"


@pytest.fixture(scope="module")
def timings() -> dict:
    return {}


@pytest.fixture(scope="module")
def image(timings) -> str:
    return build_image("docker/webshop/Dockerfile", IMAGE, timings)


def _webshop(image: str, port: int):
    url = f"http://127.0.0.1:{port}"
    return running_container(
        image, "envrl-webshop-test", {"WEBSHOP_PORT": str(port)}, lambda alive: wait_healthy(url, START_TIMEOUT, alive)
    )


@pytest.fixture(scope="module")
def container(image, timings):
    port = free_port()
    with _webshop(image, port) as started:
        timings["start_to_healthy_s"] = started["start_s"]
        yield {**started, "url": f"http://127.0.0.1:{port}"}


def test_episode_over_http_matches_local_reward(container, record_property, timings):
    from test_webshop_server import play_episode

    from envrl.envs.webshop.store import load_store

    store = load_store()
    assert container["health"] == {"status": "ok", "products": len(store.products), "goals": len(store.goals)}
    for goal_index in store.split_goals("test")[:3]:
        payload = play_episode(container["url"], goal_index, store)
        assert payload["reward"] == pytest.approx(payload["expected"], abs=1e-9)
        assert payload["reward_info"] == payload["expected_info"]
    for key, value in timings.items():
        record_property(key, value)
    print(f"\nwebshop container: {timings}")


def test_gym_env_over_http_equals_in_process(container):
    import gymnasium as gym

    import envrl  # noqa: F401  (registers the ids)

    def play(env: gym.Env, task_id: str) -> list:
        observation, info = env.reset(options={"task_id": task_id})
        trace = [observation]
        for _ in range(15):
            observation, reward, terminated, truncated, info = env.step(info["expert_plan"][0])
            trace.append((observation, reward, terminated))
            if terminated or truncated:
                break
        return trace

    remote = gym.make("envrl/WebShop-v0", split="test", server_url=container["url"], expert_plan=True)
    local = gym.make("envrl/WebShop-v0", split="test", expert_plan=True)
    try:
        for task_id in remote.unwrapped.task_ids[:3]:
            over_http = play(remote, task_id)
            assert over_http[-1][2], "the episode did not end with a purchase"
            assert over_http[-1][1] > 0
            assert over_http == play(local, task_id)
    finally:
        remote.close()
        local.close()


def test_image_is_lean_and_healthcheck_passes(container):
    assert_lean_unprivileged_and_healthy(container["name"], absent=("alfworld", "textworld", "torch"))


def test_container_stops_on_sigterm(image, timings):
    """`podman stop` (SIGTERM to gunicorn as PID 1) ends the container well before the kill."""
    with _webshop(image, free_port()) as started:
        took = seconds_to_stop(started["name"])
    timings["stop_s"] = round(took, 2)
    print(f"\nwebshop container: podman stop took {took:.2f} s")
    assert took < 15
