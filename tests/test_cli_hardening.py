"""The CLI refuses bad input up front, in one line, and never registers a run that cannot start.

Seeds outside numpy's range, ports outside 0..65535, agents that share a label, the
hand-coded ALFWorld expert on games without ``traj_data.json``, and a billion episodes.
The runner tests use the fake env of ``envrl.testing``; the ALFWorld checks read the
official samples in ``../shared/data/alfworld`` (skipped where they are missing).
"""

from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path

import pytest

from envrl import cli  # noqa: E402
from envrl import testing as fakes  # noqa: E402
from envrl.evaluation import runner as runner_module  # noqa: E402
from envrl.evaluation.process_pool import ProcessPool  # noqa: E402
from envrl.evaluation.runner import (  # noqa: E402
    SEED_LIMIT,
    agent_run_name,
    default_run_id,
    run_evaluation,
)
from envrl.evaluation.store import EpisodeRecord, ResultStore  # noqa: E402


def cli_run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *needles: str) -> None:
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert lines and "error:" in lines[-1], err
    for needle in needles:
        assert needle in lines[-1], (needle, lines[-1])


@pytest.fixture
def fake_agents(monkeypatch):
    """Agent specs ``fake`` and ``fake:<anything>`` for the CLI: all build
    envrl.testing.FakeAgent, whose label is ``fake`` whatever the spec (as the two ALFWorld
    experts' once was). Worker processes cannot see this patch, so a run of ``fake`` hands
    them the class; ``fake:<anything>`` runs are for tests that play no episode."""

    def build(spec, env_name, agent_options=None):
        if callable(spec):
            return spec()
        if spec == "fake" or spec.startswith("fake:"):
            return fakes.FakeAgent()
        raise ValueError(f"unknown agent spec {spec!r} (known: fake)")

    real_run = runner_module.run_evaluation

    def run(env_name, split, agent_spec, *args, **kwargs):
        return real_run(env_name, split, fakes.FakeAgent if agent_spec == "fake" else agent_spec, *args, **kwargs)

    monkeypatch.setattr(runner_module, "build_agent", build)
    monkeypatch.setattr(runner_module, "run_evaluation", run)


def eval_args(runs_dir: Path, *extra: str, agent: str = "fake", episodes: str = "2") -> list[str]:
    return [
        "eval",
        "--env",
        fakes.ENV_ID,
        "--split",
        "valid",
        "--agent",
        agent,
        "--episodes",
        episodes,
        "--no-progress",
        "--runs-dir",
        str(runs_dir),
        *extra,
    ]


# ---- seeds -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "seed, episodes, needle",
    [
        ("-5", "2", "seed must be in 0..4294967295 (numpy's range), got -5"),
        (str(SEED_LIMIT), "1", f"got {SEED_LIMIT}"),
        (str(SEED_LIMIT - 3), "5", "5 episodes need seed <= 4294967291"),
    ],
)
def test_seeds_outside_numpys_range_are_refused_before_anything_is_written(
    capsys, tmp_path, fake_agents, seed, episodes, needle
):
    runs_dir = tmp_path / "runs"
    code, _, err = cli_run(capsys, *eval_args(runs_dir, "--seed", seed, episodes=episodes))
    assert code == 2
    assert_one_line_error(err, "envrl eval: error:", needle)
    assert not runs_dir.exists()


def test_the_last_seeds_numpy_takes_are_accepted(capsys, tmp_path, fake_agents):
    code, out, err = cli_run(capsys, *eval_args(tmp_path, "--seed", str(SEED_LIMIT - 2)))
    assert code == 0, err
    records = ResultStore(tmp_path).load_episodes(default_run_id(fakes.ENV_ID, "valid", "fake", SEED_LIMIT - 2))
    assert [r.seed for r in records] == [SEED_LIMIT - 2, SEED_LIMIT - 1] and not any(r.error for r in records)


# ---- a billion episodes ------------------------------------------------------------------------


def test_a_billion_episodes_are_streamed_not_listed(tmp_path, monkeypatch):
    """The job list is made as jobs are handed out: planning 10**9 episodes costs no memory,
    and the run that starts records its episodes as usual."""
    seen = {}

    def run(self, jobs):
        seen["left"] = len(jobs)
        first = [jobs.popleft() for _ in range(3)]
        seen["first"] = [(j.index, j.task_id, j.seed) for j in first]
        for job in first:
            self.on_record(
                EpisodeRecord(
                    run_id=self.run_id,
                    episode_index=job.index,
                    env_id=self.env_id,
                    split=self.split,
                    task_id=job.task_id,
                    task_type="pick",
                    seed=job.seed,
                    agent=self.agent_label,
                    success=True,
                    score=1.0,
                    turns=1,
                    valid_action_ratio=1.0,
                    wall_time=0.0,
                )
            )

    monkeypatch.setattr(ProcessPool, "run", run)
    tracemalloc.start()
    try:
        summary = run_evaluation(
            fakes.ENV_ID, "valid", fakes.FakeAgent, episodes=10**9, seed=7, runs_dir=tmp_path, progress=False
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20, f"{peak / 2**20:.0f} MiB"
    assert seen == {"left": 10**9, "first": [(0, "v0", 7), (1, "v1", 8), (2, "v0", 9)]}
    assert (summary.episodes_planned, summary.episodes_done, summary.episodes_played) == (10**9, 3, 3)


def test_the_job_queue_skips_recorded_episodes_and_puts_retries_first():
    recorded = {0: None, 2: None, 7: None}  # 7 is beyond this run's plan: it does not count
    queue = runner_module.missing_jobs(recorded, 5, ["a", "b"], seed=10)
    assert len(queue) == 3
    first = queue.popleft()
    assert (first.index, first.task_id, first.seed) == (1, "b", 11)
    queue.appendleft(first)  # a retry goes first
    assert [queue.popleft().index for _ in range(3)] == [1, 3, 4]
    assert not queue
    with pytest.raises(IndexError):
        queue.popleft()


# ---- ports -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--port", "99999"],
        ["serve", "--port", "-5"],
        ["serve-model", "some-checkpoint", "--port", "65536"],
        ["webshop", "serve", "--port", "99999"],
        ["webshop", "serve", "--port", "-5"],
    ],
)
def test_every_server_refuses_a_port_out_of_range(capsys, argv, monkeypatch):
    from envrl.evaluation import web

    monkeypatch.setattr(web, "serve", lambda *a, **k: pytest.fail("serve() must not be called"))
    code, out, err = cli_run(capsys, *argv)
    assert code == 2 and out == ""
    assert_one_line_error(
        err,
        f"envrl {' '.join(a for a in argv[:2] if not a.startswith(('-', 'some')))}",
        "argument --port: must be in 0..65535, got " + argv[-1],
    )


def test_a_port_that_is_not_a_number(capsys):
    code, _, err = cli_run(capsys, "serve", "--port", "http")
    assert code == 2
    assert_one_line_error(err, "argument --port: must be a port number, got 'http'")


def test_serve_api_reports_a_port_out_of_range_in_one_line(tmp_path, capsys):
    pytest.importorskip("flask")
    from envrl.evaluation.web import serve

    assert serve(tmp_path, port=99999) == 1
    err = capsys.readouterr().err
    assert "cannot listen on 127.0.0.1:99999" in err and "Traceback" not in err


# ---- run ids and agents ------------------------------------------------------------------------


def test_default_run_ids_name_the_whole_agent_spec():
    assert agent_run_name("expert:handcoded", "expert") == "expert:handcoded"
    assert agent_run_name("expert:handcoded", "expert:handcoded") == "expert:handcoded"
    assert agent_run_name("hf:m", "hf:m[react]") == "hf:m[react]"  # the label adds the template
    assert agent_run_name("random", "random") == "random"
    assert agent_run_name("mine", "Other") == "mine-Other"
    assert agent_run_name(fakes.FakeAgent, "fake") == "fake"  # a callable has no spec to add
    ids = {
        default_run_id("alfworld", "valid_seen", agent_run_name(spec, "expert"), 0)
        for spec in ("expert", "expert:handcoded")
    }
    assert ids == {"alfworld-valid_seen-expert-s0", "alfworld-valid_seen-expert_handcoded-s0"}


def test_agents_with_one_label_get_their_own_runs(capsys, tmp_path, fake_agents, monkeypatch):
    monkeypatch.setattr(ProcessPool, "run", lambda self, jobs: None)  # register, play nothing
    for agent in ("fake:v1", "fake:v2"):
        code, out, err = cli_run(capsys, *eval_args(tmp_path, agent=agent))
        assert code == 0, err  # once: "run ... already exists with a different setup" (or a silent resume)
    runs = sorted(run["run_id"] for run in ResultStore(tmp_path).list_runs())
    assert runs == [
        default_run_id(fakes.ENV_ID, "valid", "fake:v1", 0),
        default_run_id(fakes.ENV_ID, "valid", "fake:v2", 0),
    ]


def test_the_handcoded_expert_has_its_own_name():
    from envrl.agents import make_agent

    assert make_agent("expert").name == "expert"
    assert make_agent("expert:handcoded").name == "expert:handcoded"


# ---- the hand-coded expert on games without traj_data.json ---------------------------------------


@pytest.mark.parametrize("episodes, count", [("30", 30), ("2", 2)])
def test_handcoded_expert_refuses_games_without_traj_data(capsys, tmp_path, with_official_data, episodes, count):
    """The official train samples have no traj_data.json: every one would be an errored episode."""
    pytest.importorskip("textworld")
    runs_dir = tmp_path / "runs"
    code, _, err = cli_run(
        capsys,
        "eval",
        "--env",
        "alfworld",
        "--split",
        "train",
        "--agent",
        "expert:handcoded",
        "--episodes",
        episodes,
        "--no-progress",
        "--runs-dir",
        str(runs_dir),
    )
    assert code == 2
    more = f" and {count - 3} more" if count > 3 else ""
    assert_one_line_error(
        err,
        f"agent 'expert:handcoded' cannot play {count} of the {count} tasks of split 'train'",
        "needs traj_data.json",
        "official:train/",
    )
    assert err.rstrip().endswith(more) if more else "more" not in err
    assert not runs_dir.exists()


def test_handcoded_expert_can_play_games_with_traj_data(with_official_data):
    pytest.importorskip("textworld")
    from envrl.agents import make_agent

    agent = make_agent("expert:handcoded")
    probe = runner_module.probe_env("envrl/ALFWorld-v0", "valid_seen", agent.env_kwargs, agent)
    assert len(probe.task_ids) == 30 and probe.unplayable == {}
    probe = runner_module.probe_env("envrl/ALFWorld-v0", "train", agent.env_kwargs, agent, episodes=40)
    assert len(probe.unplayable) == 30  # every train sample lacks traj_data.json
    planner = make_agent("expert")
    assert runner_module.probe_env("envrl/ALFWorld-v0", "train", planner.env_kwargs, planner).unplayable == {}


# ---- nothing unforeseen becomes a traceback ------------------------------------------------------


def test_an_unexpected_exception_is_one_line(capsys, monkeypatch):
    lb = sys.modules["envrl.evaluation.leaderboard"]  # the package exports a function of that name

    def broken(*args, **kwargs):
        raise RuntimeError("something\nnobody foresaw")

    monkeypatch.setattr(lb, "leaderboard", broken)
    monkeypatch.delenv("ENVRL_TRACEBACK", raising=False)
    code, _, err = cli_run(capsys, "leaderboard")
    assert code == 1
    assert_one_line_error(err, "envrl leaderboard: error: unexpected RuntimeError: something nobody foresaw")
    monkeypatch.setenv("ENVRL_TRACEBACK", "1")
    code, _, err = cli_run(capsys, "leaderboard")
    assert code == 1 and "Traceback" in err


def test_bad_input_leaves_the_store_as_it_was(capsys, tmp_path, fake_agents):
    """A refused command adds no run row: the leaderboard never shows a run that could not start."""
    code, _, err = cli_run(capsys, *eval_args(tmp_path))
    assert code == 0, err
    before = json.loads(cli_run(capsys, "leaderboard", "--runs", "--format", "json", "--runs-dir", str(tmp_path))[1])
    refused = [
        eval_args(tmp_path, "--seed", "-1"),
        eval_args(tmp_path, episodes="0"),
        eval_args(tmp_path, agent="nobody"),
        eval_args(tmp_path, "--seed", str(SEED_LIMIT - 1)),
    ]
    for args in refused:
        code, _, err = cli_run(capsys, *args)
        assert code == 2, (args, err)
    after = json.loads(cli_run(capsys, "leaderboard", "--runs", "--format", "json", "--runs-dir", str(tmp_path))[1])
    assert after == before and len(after) == 1
