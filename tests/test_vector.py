"""Vector envs, the contract: per-env seeds, batched text, same-step autoreset, lost workers
replaced without touching the other envs, clean shutdown.

Each contract test runs once per back end (the ``backend`` fixture: worker processes, Ray
actors on a local Ray instance of this module's own, and the in-process back end; the Ray ones
skip where Ray is not installed, and tests of worker processes skip the in-process one). Back-end-specific tests are marked as such below (subprocess) or live in
tests/test_vector_ray.py (Ray), which shares :func:`ray_instance` and the helpers here.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import envrl.testing as fakes
from envrl.envs.vector import BACKENDS, TextVectorEnv, WorkerLost, make_vec

REPO = Path(__file__).resolve().parents[1]

Factory = Callable[..., TextVectorEnv]


# ---- fixtures and helpers (tests/test_vector_ray.py imports them) --------------------------


@pytest.fixture(scope="module")
def ray_instance(ray_temp_dir):
    """One new local Ray instance for the module (reused, and left alone, if this process has one).

    ``address="local"`` and a temporary directory of its own: a cluster or a stale session
    that another Ray left in Ray's default directory (/tmp/ray) must not be joined. Skips the
    test where Ray is not installed.
    """
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'envrl[ray]')")
    started = not ray.is_initialized()
    if started:
        pythonpath = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).strip(os.pathsep)
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
            _temp_dir=ray_temp_dir,
        )
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request) -> str:
    """Each back end in turn (module scope: all subprocess tests run before Ray starts)."""
    if request.param == "ray":
        request.getfixturevalue("ray_instance")
    return request.param


def needs_workers(backend: str) -> None:
    """Skip a test of worker processes (killing, hanging, reaping) on the in-process back end."""
    if backend == "inline":
        pytest.skip("the inline back end has no worker processes")


@pytest.fixture()
def make(backend) -> Factory:
    """``make_vec`` on the back end under test."""
    return functools.partial(make_vec, backend=backend)


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state not in ("Z", "X")


def wait_gone(pids, timeout: float = 15.0) -> list[int]:
    """The pids still running after ``timeout`` seconds (empty when all are gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if process_alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


def goal(infos, i: int) -> str:
    """The action that wins env ``i``'s fake task (``open box tK``)."""
    return f"open box {infos['task_id'][i]}"


def check_lost_worker_is_replaced(
    make: Factory, lose: Callable[[TextVectorEnv, int], None], expect_in_error: str, **kwargs
) -> None:
    """``lose(vec, 0)`` takes env 0's worker away mid-episode; env 1's episode must go on."""
    vec = make(fakes.ENV_ID, 2, split="train", **kwargs)
    try:
        vec.reset(seed=0, options=[{"task_id": "t1"}, {"task_id": "t3"}])
        vec.step(["look", "look"])
        old_pid = vec.pids[0]
        lose(vec, 0)
        observations, rewards, terminated, truncated, infos = vec.step(["look", "look"])
        assert truncated.tolist() == [True, False] and terminated.tolist() == [False, False]
        assert infos["worker_restarted"].tolist() == [True, False]
        assert infos["_worker_restarted"].tolist() == [True, False]
        assert expect_in_error in infos["error"][0]
        assert infos["final_obs"][0] == "You see box t1."
        assert infos["final_info"]["worker_restarted"][0] and infos["final_info"]["task_id"][0] == "t1"
        assert infos["step"][0] == 0 and observations[0].startswith("You see box t")  # a new episode
        # env 1 did not notice
        assert infos["step"][1] == 2 and infos["task_id"][1] == "t3" and observations[1] == "You see box t3."
        assert vec.restarts == [1, 0] and vec.pids[0] != old_pid
        _, _, _, _, infos = vec.step([goal(infos, 0), "look"])
        assert infos["final_info"]["success"][0] and infos["step"][1] == 3
    finally:
        vec.close()


# ---- the contract, on every back end (fake env) --------------------------------------------


def test_seeds_match_single_envs(make):
    vec = make(fakes.ENV_ID, 3, split="train")
    try:
        assert vec.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        assert vec.single_action_space.contains("look")
        observations, infos = vec.reset(seed=7)
        assert isinstance(observations, tuple) and len(observations) == 3
        assert infos["_task_id"].all()
        singles = [gym.make(fakes.ENV_ID, split="train") for _ in range(3)]
        try:
            expected = [env.reset(seed=7 + i) for i, env in enumerate(singles)]
            assert list(observations) == [o for o, _ in expected]
            assert list(infos["task_id"]) == [info["task_id"] for _, info in expected]
            actions = ["look", "jump", "look"]
            batch = vec.step(actions)
            for i, env in enumerate(singles):
                obs, reward, terminated, truncated, info = env.step(actions[i])
                assert (batch[0][i], batch[1][i], batch[2][i], batch[3][i]) == (obs, reward, terminated, truncated)
                assert batch[4]["valid_action"][i] == info["valid_action"]
            # a list gives each env its own seed
            again, again_infos = vec.reset(seed=[9, 7, 9])
            single_9 = singles[0].reset(seed=9)[0]
            assert again == (single_9, observations[0], single_9)
        finally:
            for env in singles:
                env.close()
        assert len(vec.get_attr("task_ids")) == 3 and list(vec.get_attr("task_ids")[0]) == [
            "t0",
            "t1",
            "t2",
            "t3",
            "t4",
        ]
    finally:
        vec.close()


def test_autoreset_and_options(make):
    vec = make(fakes.ENV_ID, 2, split="train")
    try:
        observations, infos = vec.reset(seed=0, options=[{"task_id": "t2"}, {"task_id": "t3"}])
        assert observations == ("You see box t2.", "You see box t3.")
        observations, rewards, terminated, truncated, infos = vec.step(["open box t2", "look"])
        # env 0 won: its next episode's first observation is already here
        assert terminated.tolist() == [True, False] and rewards.tolist() == [1.0, 0.0]
        assert infos["_final_obs"].tolist() == [True, False]
        assert infos["final_obs"][0] == "The box is open."
        assert infos["final_info"]["success"][0] and infos["final_info"]["_success"].tolist() == [True, False]
        assert observations[0].startswith("You see box t") and infos["step"].tolist() == [0, 1]
        # env 1 keeps looking: truncated at the registered limit
        for _ in range(fakes.MAX_STEPS - 1):
            observations, rewards, terminated, truncated, infos = vec.step([goal(infos, 0), "look"])
        assert truncated[1] and not terminated[1]
        assert infos["final_info"]["step"][1] == fakes.MAX_STEPS and infos["step"][1] == 0

        # reset_mask: only env 1 starts over; env 0's episode goes on
        vec.reset(options=[{"task_id": "t0"}, {"task_id": "t0"}])
        vec.step(["look", "look"])
        observations, infos = vec.reset(options={"task_id": "t4", "reset_mask": np.array([False, True])})
        assert infos["_task_id"].tolist() == [False, True] and observations[1] == "You see box t4."
        _, _, _, _, infos = vec.step(["look", "look"])
        assert infos["step"].tolist() == [2, 1] and infos["task_id"].tolist() == ["t0", "t4"]

        # an exception in an env's reset reaches the caller as it is
        with pytest.raises(ValueError, match="unknown task id"):
            vec.reset(options={"task_id": "no-such-task"})
        with pytest.raises(gym.error.ResetNeeded):
            vec.step(["look", "look"])
        vec.reset(seed=1)
        vec.step(["look", "look"])
    finally:
        vec.close()


#: what ``info["error"]`` says when a worker's process was SIGKILLed, by back end
KILLED_ERROR = {"subprocess": "SIGKILL", "ray": "Ray actor lost"}


def test_killed_worker_is_replaced_and_the_other_episode_goes_on(make, backend):
    needs_workers(backend)
    killed = []

    def sigkill(vec, i):
        killed.append(vec.pids[i])
        os.kill(vec.pids[i], signal.SIGKILL)

    check_lost_worker_is_replaced(make, sigkill, KILLED_ERROR[backend])
    assert not wait_gone(killed)


#: seconds the hung-worker test may take, by back end (Ray takes ~4 s to kill a stopped process)
HUNG_LIMIT = {"subprocess": 20, "ray": 60}


@pytest.mark.parametrize("backend", ["subprocess", pytest.param("ray", marks=pytest.mark.slow)], indirect=True)
def test_hung_worker_is_killed_after_the_timeout(make, backend):
    stopped = []

    def sigstop(vec, i):
        stopped.append(vec.pids[i])
        os.kill(vec.pids[i], signal.SIGSTOP)

    start = time.monotonic()
    check_lost_worker_is_replaced(make, sigstop, "no answer within 1s", timeout=1.0)
    assert time.monotonic() - start < HUNG_LIMIT[backend]
    assert not wait_gone(stopped)


def test_exception_in_step_restarts_that_env(make):
    vec = make(fakes.ENV_ID, 2, split="train", raise_on="t1")
    try:
        vec.reset(options=[{"task_id": "t1"}, {"task_id": "t0"}])
        _, _, _, truncated, infos = vec.step(["look", "look"])
        assert truncated.tolist() == [True, False] and infos["worker_restarted"].tolist() == [True, False]
        assert "the fake engine exploded" in infos["error"][0]
        assert infos["step"][1] == 1
    finally:
        vec.close()


def test_bad_kwargs_raise_the_env_error(make):
    with pytest.raises(ValueError, match="unknown split"):
        make(fakes.ENV_ID, 2, split="no-such-split")


def test_replacements_that_keep_failing_give_up(make, backend):
    """When new workers cannot even build the env, the vector env stops with WorkerLost."""
    needs_workers(backend)
    vec = make(fakes.ENV_ID, 2, split="train")
    try:
        vec.reset(seed=0)
        vec.env_kwargs["split"] = "no-such-split"  # from now on every new worker fails while building its env
        os.kill(vec.pids[0], signal.SIGKILL)
        with pytest.raises(WorkerLost, match="3 new workers in a row failed to start.*unknown split"):
            vec.step(["look", "look"])
        assert vec.restarts == [3, 0]
    finally:
        vec.close()


def test_close_stops_every_worker(make, backend):
    needs_workers(backend)
    vec = make(fakes.ENV_ID, 3, split="train")
    pids = vec.pids
    vec.reset(seed=0)
    assert all(process_alive(p) for p in pids)
    vec.close()
    vec.close()  # twice is fine
    assert not wait_gone(pids)
    with pytest.raises(gym.error.ClosedEnvironmentError):
        vec.step(["look"] * 3)


# ---- the contract on real envs ---------------------------------------------------------------


def test_webshop_matches_single_envs(make):
    vec = make("webshop", 2, split="test")
    singles = [gym.make("envrl/WebShop-v0", split="test") for _ in range(2)]
    try:
        observations, infos = vec.reset(seed=[3, 4])
        assert list(observations) == [env.reset(seed=seed)[0] for env, seed in zip(singles, [3, 4])]
        for _ in range(4):
            actions = [infos["admissible_actions"][i][-1] for i in range(2)]
            observations, _, terminated, truncated, infos = vec.step(actions)
            for i, env in enumerate(singles):
                obs, _, single_terminated, _, _ = env.step(actions[i])
                assert observations[i] == obs or single_terminated
    finally:
        vec.close()
        for env in singles:
            env.close()


def test_alfworld_matches_single_envs(make, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)  # built-in games, whatever the workers start with
    vec = make("alfworld", 2, split="valid_seen")
    single = gym.make("envrl/ALFWorld-v0", split="valid_seen")
    try:
        observations, infos = vec.reset(seed=[0, 1])
        first, first_info = single.reset(seed=1)
        assert observations[1] == first and infos["task_id"][1] == first_info["task_id"]
        actions = [infos["admissible_actions"][i][0] for i in range(2)]
        observations, _, _, _, _ = vec.step(actions)
        assert observations[1] == single.step(actions[1])[0]
    finally:
        vec.close()
        single.close()


def test_alfworld_expert_plans_and_autoreset(make, with_official_data):
    vec = make("alfworld", 2, split="valid_seen", expert_plan=True)
    try:
        observations, infos = vec.reset(seed=[5, 6])
        assert isinstance(observations, tuple) and len(observations) == 2
        assert all(o.startswith("-= Welcome to TextWorld, ALFRED! =-") for o in observations)
        first_tasks = list(infos["task_id"])
        assert all(task.startswith("official:") for task in first_tasks)  # the workers got ALFWORLD_DATA
        again, again_infos = vec.reset(seed=[5, 6])
        assert again == observations and list(again_infos["task_id"]) == first_tasks

        finished = 0
        for _ in range(40):
            actions = [plan[0] if len(plan) else "look" for plan in infos["expert_plan"]]
            observations, rewards, terminated, truncated, infos = vec.step(actions)
            for i in np.flatnonzero(terminated):
                finished += 1
                assert rewards[i] == 1.0
                assert infos["final_info"]["success"][i]
                # same-step autoreset: the next episode's intro is already here
                assert observations[i].startswith("-= Welcome to TextWorld, ALFRED! =-")
                assert infos["step"][i] == 0
        assert finished >= 4
    finally:
        vec.close()


def test_lazy_info_values_are_read_before_the_autoreset(make):
    """ScienceWorld's admissible actions are computed on first read, for the current step only:
    a final_info must carry them as a plain list, read before the worker resets the env."""
    pytest.importorskip("scienceworld")
    vec = make("scienceworld", 1, split="dev", max_episode_steps=2)
    try:
        vec.reset(seed=0)
        vec.step(["look around"])
        _, _, _, truncated, infos = vec.step(["look around"])
        assert truncated[0] and "worker_restarted" not in infos
        final_actions = infos["final_info"]["admissible_actions"][0]
        assert type(final_actions) is list and "look around" in final_actions
    finally:
        vec.close()


# ---- make_vec's arguments ----------------------------------------------------------------------


def test_inline_back_end_plays_what_worker_processes_play_and_takes_no_timeout():
    """The in-process back end against worker processes on a diagnostic: the same batches."""
    vecs = [make_vec("diag-chain", 4, backend=backend, split="train", length=3) for backend in ("subprocess", "inline")]
    try:
        assert vecs[1].pids == [os.getpid()] * 4
        batches = [vec.reset(seed=11) for vec in vecs]
        for step in range(12):
            assert batches[0][0] == batches[1][0] and list(batches[0][-1]["task_id"]) == list(batches[1][-1]["task_id"])
            actions = ["open the left door" if (step + i) % 3 else "open the right door" for i in range(4)]
            batches = [vec.step(actions) for vec in vecs]
            assert batches[0][1].tolist() == batches[1][1].tolist()
            assert batches[0][2].tolist() == batches[1][2].tolist()
    finally:
        for vec in vecs:
            vec.close()
    with pytest.raises(ValueError, match="cannot interrupt a step, so it takes no timeout"):
        make_vec("diag-chain", 2, backend="inline", timeout=5.0, split="train")


def test_bad_arguments():
    with pytest.raises(ValueError, match="backend"):
        make_vec(fakes.ENV_ID, 2, backend="threads", split="train")
    with pytest.raises(ValueError, match="num_envs"):
        make_vec(fakes.ENV_ID, 0, split="train")
    with pytest.raises(ValueError, match="unknown environment"):
        make_vec("no-such-env", 1)
    with pytest.raises(ValueError, match="only apply to backend='ray'"):
        make_vec(fakes.ENV_ID, 1, ray_address="auto", split="train")


def test_ray_back_end_without_ray_says_how_to_install_it(monkeypatch, tmp_path):
    from envrl.evaluation import run_evaluation
    from envrl.evaluation.runner import EvaluationError

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'envrl\[ray\]'"):
        make_vec(fakes.ENV_ID, 1, backend="ray", split="train")
    with pytest.raises(EvaluationError, match="needs Ray"):
        run_evaluation(
            fakes.ENV_ID, "train", fakes.FakeAgent, episodes=1, runs_dir=tmp_path, progress=False, ray_address="auto"
        )


# ---- subprocess back end only: no process outlives its caller ------------------------------------


ORPHAN_SCRIPT = textwrap.dedent("""
    import sys, time
    import envrl.testing as fakes
    from envrl.envs.vector import make_vec

    if __name__ == "__main__":
        vec = make_vec(fakes.ENV_ID, 2, split="train")
        vec.reset(seed=0)
        print(" ".join(map(str, vec.pids)), flush=True)
        if sys.argv[1] == "sleep":
            time.sleep(60)
        # "exit": leave without close()
""")


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_no_orphans_when_the_caller_exits_or_dies(tmp_path, how):
    script = tmp_path / "vec.py"
    script.write_text(ORPHAN_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, str(script), "exit" if how == "exit" else "sleep"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, proc.stderr.read()
        if how == "sigkill":
            proc.kill()
        proc.wait(timeout=30)
        assert not wait_gone(pids), "workers outlived their caller"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
