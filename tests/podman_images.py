"""Build and run envrl's server images with podman, for the container tests.

Shared by tests/test_webshop_container.py and tests/test_openenv_container.py: the debootstrap
base image is built once if missing (docker/base-image.sh), each image from this checkout, each
container on the host network, always removed. Without podman a test skips, except under
CI=true, where it fails (.ci/run installs podman).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "envrl-base:bookworm"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
BUILD_TIMEOUT = 1800
START_TIMEOUT = 60

#: ``wait(alive)`` polls a started server until it answers (its answer returned); ``alive()``
#: False means the container has exited, which fails the wait at once
Wait = Callable[[Callable[[], bool]], Any]


def podman() -> str:
    path = shutil.which("podman")
    if path is None:
        message = "podman is not installed (apt-get install podman runc debootstrap; see docker/README.md)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {message}; .ci/run installs it")
        pytest.skip(message)
    return path


def run(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def build_image(dockerfile: str, tag: str, timings: dict[str, Any]) -> str:
    """Build ``dockerfile`` (relative to the repository root) from this checkout as ``tag``;
    the build's seconds and the image's size go into ``timings``."""
    tool = podman()
    if run(tool, "image", "exists", BASE_IMAGE, check=False).returncode != 0:
        started = time.monotonic()
        run("bash", str(REPO / "docker" / "base-image.sh"), BASE_IMAGE, timeout=BUILD_TIMEOUT)
        timings["base_image_s"] = round(time.monotonic() - started, 1)
    build = [tool, "build", "--format", "docker", "--isolation", "chroot", "--network", "host"]
    build += ["--build-arg", f"BASE={BASE_IMAGE}", "-f", str(REPO / dockerfile), "-t", tag]
    if os.path.exists(CA_BUNDLE):  # pip in the build trusts the host's CAs (a TLS-intercepting proxy)
        build += ["-v", f"{CA_BUNDLE}:/run/host-ca.crt:ro", "--build-arg", "HOST_CA=/run/host-ca.crt"]
    started = time.monotonic()
    run(*build, str(REPO), timeout=BUILD_TIMEOUT)
    timings["build_s"] = round(time.monotonic() - started, 1)
    inspect = json.loads(run(tool, "image", "inspect", tag).stdout)[0]
    timings["image_mb"] = round(inspect["Size"] / 1e6)
    return tag


@contextmanager
def running_container(image: str, prefix: str, env: dict[str, str], wait: Wait) -> Iterator[dict[str, Any]]:
    """A container of ``image`` (``-e`` each of ``env``) once ``wait`` has seen it answer: yields its
    ``name``, ``wait``'s answer (``health``) and ``start_s``; removed however the block ends."""
    tool = podman()
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    try:
        command = [tool, "run", "-d", "--name", name, "--network", "host"]
        for key, value in env.items():
            command += ["-e", f"{key}={value}"]
        run(*command, image)

        def alive() -> bool:
            state = run(tool, "inspect", "--format", "{{.State.Running}}", name, check=False)
            return state.stdout.strip() == "true"

        try:
            health = wait(alive)
        except AssertionError as exc:
            logs = run(tool, "logs", name, check=False)
            raise AssertionError(f"{exc}\ncontainer logs:\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}") from None
        yield {"name": name, "health": health, "start_s": round(time.monotonic() - started, 2)}
    finally:
        run(tool, "rm", "-f", "-t", "0", name, check=False)


def exec_in(name: str, *command: str) -> str:
    """``command``'s stdout inside the running container ``name``."""
    return run(podman(), "exec", name, *command).stdout.strip()


def assert_lean_unprivileged_and_healthy(name: str, absent: tuple[str, ...]) -> None:
    """None of the ``absent`` modules is importable in the container, its server does not run as
    root, and the image's HEALTHCHECK passes (podman without systemd does not schedule health
    checks: it is run here)."""
    probe = f"import importlib.util as u; print([m for m in {absent!r} if u.find_spec(m)])"
    found = exec_in(name, "python3", "-c", probe)
    assert found == "[]", f"heavy packages in the server image: {found}"
    assert exec_in(name, "id", "-u") != "0", "the server runs as root"
    run(podman(), "healthcheck", "run", name)


def seconds_to_stop(name: str) -> float:
    """``podman stop`` (SIGTERM, the kill after 20 s) of a running container; its exit code must be 0."""
    tool = podman()
    started = time.monotonic()
    run(tool, "stop", "-t", "20", name, timeout=60)
    took = time.monotonic() - started
    code = run(tool, "inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
    assert code == "0", f"exit code {code} after SIGTERM"
    return took
