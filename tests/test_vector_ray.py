"""What only the Ray back end does: actors killed through Ray, the caller's environment
variables forwarded to actors, which Ray instance is used and when it is shut down, and
evaluation runs on Ray actors.

The vector env contract itself runs on Ray in tests/test_vector.py (the ``backend`` fixture).
Skipped when Ray is not installed (``pip install 'envrl[ray]'``). The module runs on one local
Ray instance of its own (:func:`test_vector.ray_instance`: 2 CPUs, no dashboard, shut down at
the end).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'envrl[ray]')")

from test_vector import check_lost_worker_is_replaced, ray_instance, wait_gone  # noqa: E402,F401

import envrl.testing as fakes  # noqa: E402
from envrl.envs.vector import make_vec  # noqa: E402
from envrl.evaluation import run_evaluation  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def _on_ray(ray_instance):  # noqa: F811  (the fixture imported above)
    """Every test here runs with the module's Ray instance up."""
    yield


def make_ray(name, num_envs, **kwargs):
    return make_vec(name, num_envs, backend="ray", **kwargs)


def _wait_until_dead(actor, limit: float = 30.0) -> None:
    """``ray.kill`` goes through Ray's control plane while actor calls go straight to the
    actor, so on a busy machine a call made right after the kill can still be answered."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            continue
        time.sleep(0.05)
    raise AssertionError(f"the actor was still alive {limit:g}s after ray.kill")


def test_ray_killed_actor_is_replaced_and_the_other_episode_goes_on():
    killed = []

    def kill_actor(vec, i):
        killed.append(vec.actors[i])
        ray.kill(vec.actors[i])
        _wait_until_dead(vec.actors[i])

    check_lost_worker_is_replaced(make_ray, kill_actor, "killed by `ray.kill`")
    assert ray.is_initialized()  # the instance this module started is still up


def test_ray_close_kills_the_actors_and_keeps_ray():
    vec = make_ray(fakes.ENV_ID, 2, split="train")
    pids = vec.pids
    vec.reset(seed=0)
    vec.close()
    assert not wait_gone(pids)
    assert ray.is_initialized()  # not started by the vector env: not shut down by it


def test_ray_forwards_envrl_variables(monkeypatch):
    """Actors see the caller's ENVRL_* variables as they are now, not as Ray started."""
    monkeypatch.setenv("ENVRL_FAKE_RAISE_ON", "t1")
    vec = make_ray(fakes.ENV_ID, 1, split="train")
    try:
        assert vec.get_attr("raise_on") == ("t1",)
    finally:
        vec.close()


# ---- evaluation runs on Ray ----------------------------------------------------------------


def _outcomes(summary):
    return [(r.episode_index, r.task_id, r.success, r.turns, r.error) for r in summary.records]


def test_eval_on_ray_matches_processes(tmp_path):
    on_ray = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.FakeAgent,
        episodes=6,
        workers=2,
        runs_dir=tmp_path / "ray",
        progress=False,
        ray_address="auto",
    )
    local = run_evaluation(
        fakes.ENV_ID, "train", fakes.FakeAgent, episodes=6, workers=2, runs_dir=tmp_path / "local", progress=False
    )
    assert on_ray.episodes_done == 6 and on_ray.errors == 0
    assert _outcomes(on_ray) == _outcomes(local)
    assert ray.is_initialized()
    # resuming on Ray plays only what is missing
    again = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.FakeAgent,
        episodes=8,
        workers=2,
        runs_dir=tmp_path / "ray",
        progress=False,
        ray_address="auto",
    )
    assert again.episodes_played == 2 and again.episodes_done == 8


def test_eval_on_ray_with_batches_matches_processes(tmp_path):
    on_ray = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.FakeAgent,
        episodes=7,
        workers=2,
        batch_size=3,
        runs_dir=tmp_path / "ray",
        progress=False,
        ray_address="auto",
    )
    local = run_evaluation(
        fakes.ENV_ID, "train", fakes.FakeAgent, episodes=7, workers=1, runs_dir=tmp_path / "local", progress=False
    )
    assert on_ray.episodes_done == 7 and _outcomes(on_ray) == _outcomes(local)


def test_eval_on_ray_retries_an_episode_whose_actor_died(tmp_path, capsys):
    marker = tmp_path / "died-once"
    summary = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.FakeAgent,
        episodes=4,
        workers=2,
        runs_dir=tmp_path,
        progress=False,
        ray_address="auto",
        env_kwargs={"die_on": "t2", "die_marker": str(marker)},
    )
    assert marker.exists() and summary.errors == 0 and summary.records[2].success
    assert "Ray actor" in capsys.readouterr().err

    always = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.FakeAgent,
        episodes=4,
        workers=2,
        runs_dir=tmp_path,
        run_id="always",
        progress=False,
        ray_address="auto",
        env_kwargs={"die_on": "t2", "die_always": True},
    )
    failed = always.records[2]
    assert always.errors == 1 and failed.error.startswith("Ray actor died 2 times")
    assert [r.error for i, r in enumerate(always.records) if i != 2] == [None, None, None]


def test_cli_eval_ray(tmp_path, capsys):
    from envrl.cli import main

    code = main(
        [
            "eval",
            "--env",
            fakes.ENV_ID,
            "--split",
            "train",
            "--agent",
            "random",
            "--episodes",
            "3",
            "--workers",
            "2",
            "--ray",
            "auto",
            "--runs-dir",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert "episodes: 3/3 recorded" in capsys.readouterr().out


# ---- which Ray instance ----------------------------------------------------------------------


def test_an_unreachable_address_fails_fast(tmp_path, capsys):
    from envrl.cli import main
    from envrl.ray_cluster import check_reachable

    start = time.monotonic()
    with pytest.raises(ConnectionError, match="nothing answers"):
        check_reachable("ray://127.0.0.1:1")
    assert time.monotonic() - start < 10
    assert (
        main(
            [
                "eval",
                "--env",
                "webshop",
                "--split",
                "test",
                "--agent",
                "random",
                "--episodes",
                "1",
                "--ray",
                " ",
                "--runs-dir",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "--ray needs an address" in capsys.readouterr().err


OWN_INSTANCE = textwrap.dedent("""
    import ray
    import envrl.testing as fakes
    from envrl.envs.vector import make_vec

    if __name__ == "__main__":
        vec = make_vec(fakes.ENV_ID, 1, backend="ray", ray_address="local", split="train",
                       ray_init_kwargs={"num_cpus": 1, "log_to_driver": False, "_temp_dir": %r,
                                        "runtime_env": {"env_vars": {"PYTHONPATH": %r}}})
        vec.reset(seed=0)
        assert ray.is_initialized()
        vec.close()
        print("shut down:", not ray.is_initialized())
""")


@pytest.mark.slow
def test_an_instance_envrl_started_is_shut_down_with_its_last_user(tmp_path):
    script = tmp_path / "own.py"
    ray_dir = tempfile.mkdtemp(prefix="envrl-ray-")  # short: Ray's socket paths live under it
    script.write_text(OWN_INSTANCE % (ray_dir, str(REPO)))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    start = time.monotonic()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert "shut down: True" in out.stdout, out.stderr[-2000:]
    assert time.monotonic() - start < 120
