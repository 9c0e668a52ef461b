"""Evaluation runs survive crashes: killed runs resume, dead workers are replaced, Ctrl-C is clean.

The kill tests really kill: a run is started as a subprocess in its own session, on the fake
env with slow steps, and SIGKILLed (the whole process group) or SIGINTed once some episodes
are recorded; then the same run is started again and must end with every episode recorded
exactly once, in the JSONL journal and in SQLite alike.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO = TESTS_DIR.parent

from envrl import testing as fakes  # noqa: E402
from envrl.evaluation import default_run_id, run_evaluation  # noqa: E402

EPISODES = 16
STEP_DELAY = 0.04  # seconds per step: an episode takes 0.12 to 0.24 s

SCRIPT = textwrap.dedent("""
    import sys
    from envrl import testing as fakes
    from envrl.evaluation import run_evaluation

    if __name__ == "__main__":
        runs_dir, episodes, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
        try:
            summary = run_evaluation(fakes.ENV_ID, "train", fakes.FakeAgent, episodes=episodes, workers=2,
                                     runs_dir=runs_dir, env_kwargs={"step_delay": delay}, progress=False)
        except KeyboardInterrupt:
            sys.exit(130)
        print("played", summary.episodes_played, "done", summary.episodes_done)
""")


def _default_sigint() -> None:
    """In the child: SIGINT at its default, so Python turns it into KeyboardInterrupt even when
    pytest runs in a background job (``make test &``), whose children inherit SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(tmp_path: Path, runs_dir: Path) -> subprocess.Popen:
    script = tmp_path / "run_eval.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, str(script), str(runs_dir), str(EPISODES), str(STEP_DELAY)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=_default_sigint,
    )


def _complete_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _wait_for_lines(proc: subprocess.Popen, path: Path, count: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = _complete_lines(path)
        if lines >= count:
            return lines
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended before {count} episodes were recorded:\n{out}\n{err}")
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"no {count} episodes recorded within {timeout}s")


def _group_gone(pgid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _check_exactly_once(runs_dir: Path, run_id: str, episodes: int) -> None:
    journal = [json.loads(line) for line in (runs_dir / run_id / "episodes.jsonl").read_text().splitlines()]
    assert sorted(r["episode_index"] for r in journal) == list(range(episodes))
    conn = sqlite3.connect(runs_dir / "envrl.sqlite")
    try:
        rows = conn.execute(
            "SELECT episode_index, task_id, seed FROM episodes WHERE run_id = ? ORDER BY episode_index", (run_id,)
        ).fetchall()
    finally:
        conn.close()
    assert rows == [(i, f"t{i % 5}", i) for i in range(episodes)]


RUN_ID = default_run_id(fakes.ENV_ID, "train", "fake", 0)


@pytest.mark.parametrize("target", ["group", "runner"])
def test_resume_after_sigkill_keeps_every_episode_once(tmp_path, target):
    runs_dir = tmp_path / "runs"
    journal = runs_dir / RUN_ID / "episodes.jsonl"
    proc = _start(tmp_path, runs_dir)
    _wait_for_lines(proc, journal, 4)
    if target == "group":
        os.killpg(proc.pid, signal.SIGKILL)  # the runner, its forkserver and its workers, mid-episode
    else:
        os.kill(proc.pid, signal.SIGKILL)  # the runner alone: its workers must notice and exit
    proc.wait(timeout=10)
    proc.communicate()
    assert _group_gone(proc.pid), "worker processes outlived the killed run"
    recorded = _complete_lines(journal)
    assert 4 <= recorded < EPISODES, "the kill came too late to test anything"

    proc = _start(tmp_path, runs_dir)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    played = int(out.split()[1])
    assert played <= EPISODES - recorded  # only the missing ones (a cut last line is replayed)
    assert "resuming run" in err
    _check_exactly_once(runs_dir, RUN_ID, EPISODES)


def test_ctrl_c_stops_cleanly_and_resumes(tmp_path):
    runs_dir = tmp_path / "runs"
    journal = runs_dir / RUN_ID / "episodes.jsonl"
    proc = _start(tmp_path, runs_dir)
    _wait_for_lines(proc, journal, 3)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert _group_gone(proc.pid), "worker processes outlived the interrupted run"
    recorded = _complete_lines(journal)
    assert 3 <= recorded < EPISODES
    assert journal.read_bytes().endswith(b"\n")

    summary = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.FakeAgent,
        episodes=EPISODES,
        workers=2,
        runs_dir=runs_dir,
        env_kwargs={"step_delay": STEP_DELAY},
        progress=False,
    )
    assert summary.episodes_played == EPISODES - recorded
    _check_exactly_once(runs_dir, RUN_ID, EPISODES)


def test_worker_killed_mid_episode_is_replaced_and_retried(tmp_path, capsys):
    marker = tmp_path / "died-once"
    summary = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.FakeAgent,
        episodes=6,
        workers=2,
        runs_dir=tmp_path,
        env_kwargs={"die_on": "t2", "die_marker": str(marker)},
        progress=False,
    )
    err = capsys.readouterr().err
    assert marker.exists()  # the worker did die once
    assert "died (killed by signal SIGKILL) during episode 2 (task t2" in err and "retrying" in err
    assert (summary.episodes_done, summary.errors) == (6, 0)
    assert next(r for r in summary.records if r.episode_index == 2).success
    _check_exactly_once(tmp_path, summary.run_id, 6)


def test_episode_that_always_kills_its_worker_is_recorded_as_failed(tmp_path, capsys):
    summary = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.FakeAgent,
        episodes=6,
        workers=2,
        runs_dir=tmp_path,
        env_kwargs={"die_on": "t2", "die_always": True},
        progress=False,
    )
    err = capsys.readouterr().err
    assert "died again" in err and "recording it as failed" in err
    assert summary.episodes_done == 6 and summary.errors == 1
    failed = next(r for r in summary.records if r.episode_index == 2)
    assert not failed.success and failed.turns == 0
    assert failed.error.startswith("worker process died 2 times") and "SIGKILL" in failed.error
    assert [r.success for r in summary.records if r.episode_index != 2] == [True, False, False, True, True]
    assert summary.metrics.overall.episodes == 6 and summary.metrics.overall.successes == 3
    # a re-run does not retry the recorded failure
    again = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.FakeAgent,
        episodes=6,
        workers=2,
        runs_dir=tmp_path,
        env_kwargs={"die_on": "t2", "die_always": True},
        progress=False,
    )
    assert again.episodes_played == 0 and again.errors == 1


def test_episode_timeout_kills_and_retries(tmp_path, capsys):
    summary = run_evaluation(
        fakes.ENV_ID,
        "valid",
        fakes.FakeAgent,
        episodes=2,
        workers=2,
        runs_dir=tmp_path,
        env_kwargs={"step_delay": 0.5},
        episode_timeout=0.4,
        progress=False,
    )
    err = capsys.readouterr().err
    assert "timeout" in err
    assert summary.errors == 2
    assert all("timeout" in r.error for r in summary.records)


# ---- batch_size > 1: several episodes per worker, in lockstep ----------------------------


def _outcomes(summary):
    return [
        (r.episode_index, r.task_id, r.success, r.turns, [s.action for s in r.trajectory], r.error)
        for r in summary.records
    ]


def test_batched_workers_play_the_same_episodes_as_single_ones(tmp_path):
    single = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.FakeAgent,
        episodes=7,
        workers=1,
        runs_dir=tmp_path,
        run_id="single",
        progress=False,
    )
    batched = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.FakeAgent,
        episodes=7,
        workers=2,
        batch_size=3,
        runs_dir=tmp_path,
        run_id="batched",
        progress=False,
    )
    assert _outcomes(batched) == _outcomes(single)
    _check_exactly_once(tmp_path, "batched", 7)


def test_a_worker_dying_mid_batch_retries_every_episode_it_was_playing(tmp_path, capsys):
    marker = tmp_path / "died-once"
    summary = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.FakeAgent,
        episodes=6,
        workers=1,
        batch_size=3,
        runs_dir=tmp_path,
        env_kwargs={"die_on": "t2", "die_marker": str(marker)},
        progress=False,
    )
    err = capsys.readouterr().err
    assert marker.exists() and "during episode 2 (task t2" in err
    assert (summary.episodes_done, summary.errors) == (6, 0)
    assert [r.success for r in summary.records] == [True, False, True, False, True, True]
    _check_exactly_once(tmp_path, summary.run_id, 6)


def test_an_exception_in_one_batched_env_ends_only_its_episode(tmp_path):
    summary = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.FakeAgent,
        episodes=5,
        workers=1,
        batch_size=5,
        runs_dir=tmp_path,
        env_kwargs={"raise_on": "t3"},
        progress=False,
    )
    errors = {r.episode_index: r.error for r in summary.records if r.error}
    assert list(errors) == [3] and "the fake engine exploded" in errors[3]
    assert [r.success for r in summary.records if r.episode_index != 3] == [True, False, True, True]


def test_an_exception_in_one_batched_agent_ends_only_its_episode(tmp_path):
    summary = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.RaisingAgent,
        episodes=5,
        workers=1,
        batch_size=2,
        runs_dir=tmp_path,
        progress=False,
    )
    errors = {r.episode_index: r.error for r in summary.records if r.error}
    assert list(errors) == [1] and "the agent is confused" in errors[1]
    assert [r.success for r in summary.records if r.episode_index != 1] == [True, True, False, True]
