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

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.container

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "envrl-base:bookworm"
IMAGE = "localhost/envrl-webshop:test"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
BUILD_TIMEOUT = 1800
START_TIMEOUT = 60


def _podman() -> str:
    path = shutil.which("podman")
    if path is None:
        message = "podman is not installed (apt-get install podman runc debootstrap; see docker/README.md)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {message}; .ci/run installs it")
        pytest.skip(message)
    return path


def _run(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


@pytest.fixture(scope="module")
def timings() -> dict:
    return {}


@pytest.fixture(scope="module")
def image(timings) -> str:
    podman = _podman()
    if _run(podman, "image", "exists", BASE_IMAGE, check=False).returncode != 0:
        started = time.monotonic()
        _run("bash", str(REPO / "docker" / "base-image.sh"), BASE_IMAGE, timeout=BUILD_TIMEOUT)
        timings["base_image_s"] = round(time.monotonic() - started, 1)
    build = [
        podman,
        "build",
        "--format",
        "docker",
        "--isolation",
        "chroot",
        "--network",
        "host",
        "--build-arg",
        f"BASE={BASE_IMAGE}",
        "-f",
        str(REPO / "docker" / "webshop" / "Dockerfile"),
        "-t",
        IMAGE,
    ]
    if os.path.exists(CA_BUNDLE):  # pip in the build trusts the host's CAs (a TLS-intercepting proxy)
        build += ["-v", f"{CA_BUNDLE}:/run/host-ca.crt:ro", "--build-arg", "HOST_CA=/run/host-ca.crt"]
    started = time.monotonic()
    _run(*build, str(REPO), timeout=BUILD_TIMEOUT)
    timings["build_s"] = round(time.monotonic() - started, 1)
    inspect = json.loads(_run(podman, "image", "inspect", IMAGE).stdout)[0]
    timings["image_mb"] = round(inspect["Size"] / 1e6)
    return IMAGE


@pytest.fixture(scope="module")
def container(image, timings):
    from test_webshop_server import free_port, wait_healthy

    podman = _podman()
    name = f"envrl-webshop-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        _run(podman, "run", "-d", "--name", name, "--network", "host", "-e", f"WEBSHOP_PORT={port}", image)

        def alive() -> bool:
            state = _run(podman, "inspect", "--format", "{{.State.Running}}", name, check=False)
            return state.stdout.strip() == "true"

        try:
            health = wait_healthy(url, timeout=START_TIMEOUT, alive=alive)
        except AssertionError as exc:
            logs = _run(podman, "logs", name, check=False)
            raise AssertionError(f"{exc}\ncontainer logs:\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}") from None
        timings["start_to_healthy_s"] = round(time.monotonic() - started, 2)
        yield {"name": name, "url": url, "health": health}
    finally:
        _run(podman, "rm", "-f", "-t", "0", name, check=False)


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
    podman = _podman()
    probe = "import importlib.util as u; print([m for m in ('alfworld', 'textworld', 'torch') if u.find_spec(m)])"
    found = _run(podman, "exec", container["name"], "python3", "-c", probe).stdout.strip()
    assert found == "[]", f"heavy packages in the server image: {found}"
    user = _run(podman, "exec", container["name"], "id", "-u").stdout.strip()
    assert user != "0", "the server runs as root"
    # podman without systemd does not schedule health checks; run the image's one now
    _run(podman, "healthcheck", "run", container["name"])


def test_container_stops_on_sigterm(image, timings):
    """`podman stop` (SIGTERM to gunicorn as PID 1) ends the container well before the kill."""
    from test_webshop_server import free_port, wait_healthy

    podman = _podman()
    name = f"envrl-webshop-stop-{uuid.uuid4().hex[:8]}"
    port = free_port()
    try:
        _run(podman, "run", "-d", "--name", name, "--network", "host", "-e", f"WEBSHOP_PORT={port}", image)
        wait_healthy(f"http://127.0.0.1:{port}", timeout=START_TIMEOUT)
        started = time.monotonic()
        _run(podman, "stop", "-t", "20", name, timeout=60)
        took = time.monotonic() - started
        timings["stop_s"] = round(took, 2)
        print(f"\nwebshop container: podman stop took {took:.2f} s")
        assert took < 15
        code = _run(podman, "inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        assert code == "0", f"exit code {code}"
    finally:
        _run(podman, "rm", "-f", "-t", "0", name, check=False)
