"""Evaluation: metrics, records and store, runner, leaderboard, CLI.

The runner tests use the fake env and agents of ``envrl.testing`` (no ALFWorld needed);
the crash/kill/resume tests are in ``test_eval_recovery.py``. One ``slow`` test runs the
real ALFWorld env with the expert.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest

from envrl import cli  # noqa: E402
from envrl import testing as fakes  # noqa: E402
from envrl.evaluation import (  # noqa: E402
    EpisodeRecord,
    EvaluationError,
    ResultStore,
    RunConfigMismatch,
    RunLocked,
    StepRecord,
    compute_metrics,
    default_run_id,
    leaderboard,
    leaderboard_data,
    read_jsonl,
    run_evaluation,
    run_rows,
    split_kind,
    summarize,
    wilson_interval,
)
from envrl.evaluation import runner as runner_module  # noqa: E402

# ---- helpers ---------------------------------------------------------------------------


def make_record(
    index: int,
    *,
    run_id: str = "r1",
    success: bool = True,
    score: float = 1.0,
    turns: int = 3,
    ratio: float | None = 1.0,
    task_type: str = "pick",
    split: str = "train",
    error: str | None = None,
) -> EpisodeRecord:
    steps = [StepRecord(action=f"a{k}", observation=f"o{k}", reward=0.0, valid=True) for k in range(turns)]
    return EpisodeRecord(
        run_id=run_id,
        episode_index=index,
        env_id="envrl/Fake-v0",
        split=split,
        task_id=f"t{index}",
        task_type=task_type,
        seed=index,
        agent="fake",
        success=success,
        score=score,
        turns=turns,
        valid_action_ratio=ratio,
        wall_time=0.01,
        error=error,
        trajectory=steps,
        initial_observation="start",
        finished_at=1.0 + index,
    )


def make_config(run_id: str = "r1", episodes: int = 10, **overrides) -> dict:
    config = {
        "env": "fake",
        "env_id": "envrl/Fake-v0",
        "split": "train",
        "agent": "fake",
        "episodes": episodes,
        "seed": 0,
        "env_kwargs": {},
        "task_count": 5,
        "task_ids_sha256": "abc",
        "versions": {"x": "1"},
    }
    config.update(overrides)
    return config


def db_indices(runs_dir: Path, run_id: str) -> list[int]:
    conn = sqlite3.connect(runs_dir / "envrl.sqlite")
    try:
        return [
            r[0]
            for r in conn.execute(
                "SELECT episode_index FROM episodes WHERE run_id = ? ORDER BY episode_index", (run_id,)
            )
        ]
    finally:
        conn.close()


def jsonl_indices(path: Path) -> list[int]:
    return sorted(json.loads(line)["episode_index"] for line in path.read_text().splitlines() if line.strip())


# ---- metrics ---------------------------------------------------------------------------


def test_wilson_interval_hand_computed():
    # 7/10, z = 1.959964: centre = 0.7 + z²/20 = 0.892073, denominator = 1 + z²/10 = 1.384146,
    # half = z * sqrt(0.021 + z²/400) = 0.342874 -> (0.549199/1.384146, 1.234947/1.384146)
    low, high = wilson_interval(7, 10)
    assert round(low, 4) == 0.3968
    assert round(high, 4) == 0.8922
    # 0/10: (0, z²/10 / (1 + z²/10)) = (0, 0.2775); 10/10 mirrors it
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.27753, abs=1e-5))
    low, high = wilson_interval(10, 10)
    assert (round(low, 4), high) == (0.7225, 1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_summarize_hand_computed():
    records = [
        make_record(0, success=True, score=1.0, turns=3, ratio=2 / 3, task_type="pick"),
        make_record(1, success=False, score=0.5, turns=6, ratio=1.0, task_type="clean"),
        make_record(2, success=True, score=1.0, turns=5, ratio=0.6, task_type="pick", split="valid"),
        make_record(3, success=False, score=0.0, turns=0, ratio=None, task_type="clean", error="worker died"),
    ]
    m = summarize(records)
    assert (m.episodes, m.successes, m.errors) == (4, 2, 1)
    assert m.success_rate == 0.5
    assert m.mean_score == pytest.approx(0.625)
    assert m.mean_turns == pytest.approx(3.5)
    assert m.mean_turns_success == pytest.approx(4.0)
    assert m.valid_action_ratio == pytest.approx((2 / 3 + 1.0 + 0.6) / 3)
    low, high = wilson_interval(2, 4)
    assert (m.ci_low, m.ci_high) == (low, high)

    report = compute_metrics(records)
    assert list(report.by_task_type) == ["clean", "pick"]
    clean = report.by_task_type["clean"]
    assert (clean.episodes, clean.successes, clean.mean_turns_success) == (2, 0, None)
    assert clean.valid_action_ratio == 1.0  # the error episode took no action
    assert report.by_task_type["pick"].mean_turns == 4.0
    assert report.by_split["train"].episodes == 3 and report.by_split["valid"].success_rate == 1.0
    # plain dicts work too
    assert summarize([r.to_dict() for r in records]) == m
    assert summarize([]).episodes == 0


# ---- records and store -----------------------------------------------------------------


def test_record_round_trip():
    record = make_record(4, ratio=None, error="boom")
    data = json.loads(record.to_json())
    assert data["trajectory"][0] == {"action": "a0", "observation": "o0", "reward": 0.0, "valid": True}
    assert EpisodeRecord.from_dict(data) == record
    assert EpisodeRecord.from_dict(dict(data, some_future_key=1)) == record


def test_store_round_trip(tmp_path):
    store = ResultStore(tmp_path)
    with store.open_run("r1", make_config()) as writer:
        for i in range(3):
            writer.append(make_record(i, success=i != 1))
        writer.append(make_record(1, success=True))  # a second result for an index is ignored
        conn = sqlite3.connect(tmp_path / "envrl.sqlite")
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # while written
        conn.close()
    run_dir = tmp_path / "r1"
    assert json.loads((run_dir / "config.json").read_text())["episodes"] == 10
    assert [r.to_dict() for r in read_jsonl(run_dir / "episodes.jsonl")] == [
        make_record(i, success=i != 1).to_dict() for i in range(3)
    ]
    assert store.load_episodes("r1") == [make_record(i, success=i != 1) for i in range(3)]
    assert db_indices(tmp_path, "r1") == [0, 1, 2]
    # at rest, one plain file: readers need not create -wal/-shm files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["envrl.sqlite", "r1"]
    conn = sqlite3.connect(tmp_path / "envrl.sqlite")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()
    (run,) = store.list_runs()
    assert (run["run_id"], run["episodes_planned"], len(run["episodes"])) == ("r1", 10, 3)
    assert store.get_run("r1")["task_ids_sha256"] == "abc"
    # reopening resumes: records are there, the plan grows, the identity must match
    with store.open_run("r1", make_config(episodes=20)) as writer:
        assert writer.done == {0, 1, 2}
    assert store.get_run("r1")["episodes"] == 20
    with pytest.raises(RunConfigMismatch, match="seed"):
        store.open_run("r1", make_config(seed=1))


def test_truncated_jsonl_line_is_dropped_and_repaired(tmp_path, caplog):
    store = ResultStore(tmp_path)
    with store.open_run("r1", make_config()) as writer:
        writer.append(make_record(0))
        writer.append(make_record(1))
    path = tmp_path / "r1" / "episodes.jsonl"
    with open(path, "ab") as fh:  # a kill in the middle of writing episode 2's line
        fh.write(make_record(2).to_json().encode()[:57])
    with caplog.at_level(logging.WARNING, logger="envrl.evaluation"):
        assert [r.episode_index for r in read_jsonl(path)] == [0, 1]
    assert "truncated last line" in caplog.text
    with store.open_run("r1", make_config()) as writer:  # repairs the tail, then appends cleanly
        assert writer.done == {0, 1}
        writer.append(make_record(2))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="envrl.evaluation"):
        assert [r.episode_index for r in read_jsonl(path)] == [0, 1, 2]
    assert caplog.text == ""
    # a complete but unreadable last line is dropped too; a bad line in the middle is skipped
    with open(path, "ab") as fh:
        fh.write(b'{"not": "a record"}\n')
    assert [r.episode_index for r in read_jsonl(path)] == [0, 1, 2]
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([lines[0], b"garbage", *lines[1:3]]) + b"\n")
    assert [r.episode_index for r in read_jsonl(path)] == [0, 1, 2]


def test_reconcile_between_jsonl_and_sqlite(tmp_path, caplog):
    store = ResultStore(tmp_path)
    with store.open_run("r1", make_config()) as writer:
        for i in range(4):
            writer.append(make_record(i))
    # killed between the two writes: episode 3 reached the JSONL but not SQLite
    conn = sqlite3.connect(tmp_path / "envrl.sqlite")
    conn.execute("DELETE FROM episodes WHERE run_id = 'r1' AND episode_index = 3")
    conn.commit()
    conn.close()
    # and episode 1's line was lost from the JSONL (e.g. file edited by hand)
    path = tmp_path / "r1" / "episodes.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:1] + lines[2:]))
    with caplog.at_level(logging.WARNING, logger="envrl.evaluation"):
        with store.open_run("r1", make_config()) as writer:
            assert writer.done == {0, 1, 2, 3}
            assert writer.repaired == {"to_db": 1, "to_jsonl": 1}
    assert "not in the database" in caplog.text
    assert db_indices(tmp_path, "r1") == [0, 1, 2, 3]
    assert jsonl_indices(path) == [0, 1, 2, 3]
    assert store.load_episodes("r1")[3] == make_record(3)  # the very record, not a replay


def test_run_is_locked_while_open(tmp_path):
    store = ResultStore(tmp_path)
    with store.open_run("r1", make_config()):
        with pytest.raises(RunLocked):
            store.open_run("r1", make_config())
    store.open_run("r1", make_config()).close()  # released


def test_default_runs_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("ENVRL_RUNS_DIR", str(tmp_path / "elsewhere"))
    assert ResultStore().runs_dir == tmp_path / "elsewhere"
    monkeypatch.delenv("ENVRL_RUNS_DIR")
    assert ResultStore().runs_dir == Path("runs")


# ---- runner ----------------------------------------------------------------------------


def test_default_run_id():
    assert default_run_id("alfworld", "valid_unseen", "expert", 0) == "alfworld-valid_unseen-expert-s0"
    assert (
        default_run_id("alfworld", "train", "hf:Qwen/Qwen2.5-1.5B-Instruct", 3)
        == "alfworld-train-hf_Qwen_Qwen2.5-1.5B-Instruct-s3"
    )


def test_run_plays_tasks_in_order_and_resumes(tmp_path):
    summary = run_evaluation(
        fakes.ENV_ID, "train", fakes.FakeAgent, episodes=7, workers=2, seed=10, runs_dir=tmp_path, progress=False
    )
    assert (summary.episodes_done, summary.episodes_played, summary.errors) == (7, 7, 0)
    assert summary.run_id == default_run_id(fakes.ENV_ID, "train", "fake", 10)
    by_index = {r.episode_index: r for r in summary.records}
    for i in range(7):
        record = by_index[i]
        assert record.task_id == f"t{i % 5}" and record.seed == 10 + i
        assert record.success == (i % 5 % 2 == 0)
        assert record.turns == (3 if record.success else fakes.MAX_STEPS)
        assert record.trajectory[1] == StepRecord("jump", "Nothing happens.", 0.0, False)
    overall = summary.metrics.overall
    assert overall.successes == 4  # t0, t2, t4, t0
    assert overall.mean_turns_success == 3.0
    assert overall.valid_action_ratio == pytest.approx((4 * 2 / 3 + 3 * 5 / 6) / 7)
    assert set(summary.metrics.by_task_type) == {"pick", "clean", "heat"}
    assert "ALL" in summary.format() and "heat" in summary.format()

    again = run_evaluation(
        fakes.ENV_ID, "train", fakes.FakeAgent, episodes=7, workers=2, seed=10, runs_dir=tmp_path, progress=False
    )
    assert (again.episodes_played, again.episodes_done) == (0, 7)
    more = run_evaluation(
        fakes.ENV_ID, "train", fakes.FakeAgent, episodes=9, workers=2, seed=10, runs_dir=tmp_path, progress=False
    )
    assert (more.episodes_played, more.episodes_done) == (2, 9)
    assert db_indices(tmp_path, more.run_id) == list(range(9))
    assert jsonl_indices(more.run_dir / "episodes.jsonl") == list(range(9))
    # the same run id with another setup is refused
    with pytest.raises(EvaluationError, match="different setup"):
        run_evaluation(
            fakes.ENV_ID,
            "train",
            fakes.FakeAgent,
            episodes=9,
            seed=10,
            runs_dir=tmp_path,
            run_id=more.run_id,
            env_kwargs={"step_delay": 0.001},
            progress=False,
        )


def test_exceptions_in_an_episode_are_recorded(tmp_path):
    summary = run_evaluation(
        fakes.ENV_ID,
        "train",
        fakes.RaisingAgent,
        episodes=5,
        workers=2,
        runs_dir=tmp_path,
        env_kwargs={"raise_on": "t3"},
        progress=False,
    )
    assert summary.episodes_done == 5 and summary.errors == 2
    by_task = {r.task_id: r for r in summary.records}
    assert by_task["t1"].error == "ValueError: the agent is confused"
    assert by_task["t1"].turns == 1 and not by_task["t1"].success and by_task["t1"].task_type == "clean"
    assert by_task["t3"].error == "RuntimeError: the fake engine exploded" and by_task["t3"].turns == 0
    assert [by_task[t].success for t in ("t0", "t2", "t4")] == [True, True, True]  # the workers went on
    assert summary.metrics.overall.errors == 2


def test_agent_env_kwargs_reach_gym_make(tmp_path):
    summary = run_evaluation(
        fakes.ENV_ID,
        "valid",
        fakes.KwargsAgent,
        episodes=2,
        workers=1,
        runs_dir=tmp_path,
        env_kwargs={"max_episode_steps": 4},
        progress=False,
    )
    config = json.loads((summary.run_dir / "config.json").read_text())
    assert config["env_kwargs"] == {"step_delay": 0.0, "max_episode_steps": 4}
    assert config["versions"]["gymnasium"]
    assert {r.task_id: r.turns for r in summary.records} == {"v0": 3, "v1": 4}


def test_workers_see_the_callers_environment_at_each_run(tmp_path, monkeypatch):
    """A forkserver freezes its environment when it starts; workers must not read a stale one
    (CI once ran builtin games with an ALFWORLD_DATA left over from an earlier test's run)."""
    monkeypatch.delenv("ENVRL_FAKE_RAISE_ON", raising=False)
    first = run_evaluation(
        fakes.ENV_ID,
        "valid",
        fakes.FakeAgent,
        episodes=2,
        workers=1,
        runs_dir=tmp_path,
        run_id="before",
        progress=False,
    )
    assert first.errors == 0
    monkeypatch.setenv("ENVRL_FAKE_RAISE_ON", "v0")
    second = run_evaluation(
        fakes.ENV_ID, "valid", fakes.FakeAgent, episodes=2, workers=1, runs_dir=tmp_path, run_id="after", progress=False
    )
    assert {r.task_id: r.error for r in second.records} == {"v0": "RuntimeError: the fake engine exploded", "v1": None}


def test_bad_input_raises_evaluation_error(tmp_path):
    with pytest.raises(EvaluationError, match="unknown env"):
        run_evaluation("nope", "train", fakes.FakeAgent, episodes=1, runs_dir=tmp_path, progress=False)
    with pytest.raises(EvaluationError, match="bogus"):
        run_evaluation(fakes.ENV_ID, "bogus", fakes.FakeAgent, episodes=1, runs_dir=tmp_path, progress=False)
    with pytest.raises(EvaluationError, match="episodes"):
        run_evaluation(fakes.ENV_ID, "train", fakes.FakeAgent, episodes=0, runs_dir=tmp_path, progress=False)
    with pytest.raises(EvaluationError, match="workers"):
        run_evaluation(fakes.ENV_ID, "train", fakes.FakeAgent, episodes=1, workers=0, runs_dir=tmp_path, progress=False)


# ---- leaderboard -----------------------------------------------------------------------


def _two_runs(runs_dir: Path) -> None:
    store = ResultStore(runs_dir)
    with store.open_run("good-run", make_config("good-run", episodes=12, agent="expert")) as writer:
        for i in range(10):
            writer.append(
                make_record(
                    i,
                    run_id="good-run",
                    success=i < 7,
                    score=1.0 if i < 7 else 0.0,
                    turns=4 if i < 7 else 10,
                    ratio=0.5,
                )
            )
    with store.open_run("bad-run", make_config("bad-run", episodes=2, agent="random")) as writer:
        writer.append(make_record(0, run_id="bad-run", success=False, score=0.0, turns=10, ratio=0.25))


def test_leaderboard_formats(tmp_path):
    _two_runs(tmp_path)
    rows = run_rows(tmp_path)
    assert [r["run_id"] for r in rows] == ["good-run", "bad-run"]  # best first
    good = rows[0]
    assert (good["episodes_done"], good["episodes_planned"], good["successes"]) == (10, 12, 7)
    assert round(good["ci_low"], 4) == 0.3968 and round(good["ci_high"], 4) == 0.8922
    assert good["mean_turns_success"] == 4.0 and good["mean_turns"] == pytest.approx(5.8)
    assert rows[1]["mean_turns_success"] is None

    text = leaderboard(tmp_path, "text", runs=True)
    lines = text.splitlines()
    assert lines[0].startswith("run id") and "success % [95% CI]" in lines[0]
    assert "good-run" in lines[2] and "10/12" in lines[2] and "70.0 [39.7, 89.2]" in lines[2]
    assert "50.0" in lines[2]  # valid %
    assert "bad-run" in lines[3] and "1/2" in lines[3] and "0.0 [0.0, 79.3]" in lines[3]

    markdown = leaderboard(tmp_path, "markdown", runs=True).splitlines()
    assert markdown[0].startswith("| run id |") and markdown[1].startswith("|---")
    assert markdown[2] == "| good-run | fake | train | expert | 10/12 | 70.0 [39.7, 89.2] | 0.70 | 5.8 | 4.0 | 50.0 |"
    assert markdown[3].startswith("| bad-run |")

    data = json.loads(leaderboard(tmp_path, "json", runs=True))
    assert [r["run_id"] for r in data] == ["good-run", "bad-run"]
    assert data[0]["success_rate"] == 0.7 and data[1]["episodes_done"] == 1

    assert leaderboard(tmp_path / "empty", "text", runs=True) == "no runs recorded yet"
    assert json.loads(leaderboard(tmp_path / "empty", "json", runs=True)) == []


def _agent_runs(runs_dir: Path, runs: list[tuple[str, str, str, int, int, dict]]) -> None:
    """Runs of (run id, split, agent, successes, episodes, config overrides) on env "alfworld"."""
    store = ResultStore(runs_dir)
    for run_id, split, agent, successes, episodes, overrides in runs:
        config = make_config(
            run_id,
            episodes=episodes,
            env="alfworld",
            env_id="envrl/ALFWorld-v0",
            split=split,
            agent=agent,
            **{"step_limit": 50, **overrides},
        )
        with store.open_run(run_id, config) as writer:
            for i in range(episodes):
                writer.append(
                    make_record(i, run_id=run_id, split=split, success=i < successes, turns=5 if i < successes else 50)
                )


def test_agent_leaderboard_ranks_per_column_with_id_and_ood_side_by_side(tmp_path):
    _agent_runs(
        tmp_path,
        [
            ("a-seen", "valid_seen", "agent-a", 8, 10, {}),
            ("a-unseen", "valid_unseen", "agent-a", 5, 10, {}),
            ("b-seen", "valid_seen", "agent-b", 9, 10, {}),
            ("b-unseen", "valid_unseen", "agent-b", 5, 10, {}),
            ("c-unseen", "valid_unseen", "agent-c", 7, 10, {"step_limit": 30}),  # another protocol
        ],
    )
    data = leaderboard_data(tmp_path)
    measured = [c["key"] for c in data["columns"] if c["env"] == "alfworld"]
    assert measured == ["alfworld/valid_seen", "alfworld/valid_unseen"]  # ID before OOD
    assert [c["kind"] for c in data["columns"] if c["env"] == "alfworld"] == ["ID", "OOD"]
    rows = {r["agent"]: r for r in data["rows"] if r["source"] == "measured"}
    assert rows["agent-b"]["cells"]["alfworld/valid_seen"]["rank"] == 1
    assert rows["agent-a"]["cells"]["alfworld/valid_seen"]["rank"] == 2
    # a tie shares its rank
    assert rows["agent-a"]["cells"]["alfworld/valid_unseen"]["rank"] == 1
    assert rows["agent-b"]["cells"]["alfworld/valid_unseen"]["rank"] == 1
    # a run under another protocol keeps its numbers but is not ranked, and says why
    c_cell = rows["agent-c"]["cells"]["alfworld/valid_unseen"]
    assert c_cell["rank"] is None and c_cell["success_rate"] == 0.7
    assert c_cell["protocol_note"] == "step limit 30 (ranked runs: 50)"
    assert any("c-unseen (step limit 30 (ranked runs: 50))" in note for note in data["notes"])
    cell = rows["agent-a"]["cells"]["alfworld/valid_seen"]
    assert (cell["episodes"], cell["mean_turns"], cell["mean_turns_success"]) == (10, 14.0, 5.0)
    assert round(cell["ci_low"], 4) == 0.4902 and round(cell["ci_high"], 4) == 0.9433

    text = leaderboard(tmp_path, "text")
    assert "valid_seen (ID) success %" in text and "valid_unseen (OOD) success %" in text
    line = next(row for row in text.splitlines() if row.startswith("agent-c"))
    assert "70.0 [39.7, 89.2] (unranked)" in line
    line = next(row for row in text.splitlines() if row.startswith("agent-b"))
    assert "#1 90.0 [59.6, 98.2]" in line and "#1 50.0 [23.7, 76.3]" in line


def test_reported_rows_are_marked_and_never_ranked(tmp_path):
    _agent_runs(tmp_path, [("a-unseen", "valid_unseen", "agent-a", 9, 10, {})])
    data = leaderboard_data(tmp_path)
    reported = [r for r in data["rows"] if r["source"] == "reported"]
    assert reported and all(r["reference"]["paper"] and r["reference"]["model"] for r in reported)
    react = next(r for r in reported if r["agent"] == "ReAct")
    assert react["cells"]["alfworld/valid_unseen"]["success_rate"] == 0.71
    assert all(c["rank"] is None and c["run_id"] is None for r in reported for c in r["cells"].values())
    assert data["rows"][0]["source"] == "measured"  # measured rows first, never interleaved
    assert "webshop/test" in [c["key"] for c in data["columns"]]
    text = leaderboard(tmp_path, "text")
    assert "ReAct (reported) [R1]" in text and "[R1] ReAct: PaLM-540B" in text
    markdown = leaderboard(tmp_path, "markdown")
    assert "### alfworld" in markdown and "| ReAct (reported) [R1] |" in markdown
    assert json.loads(leaderboard(tmp_path, "json"))["rows"][0]["agent"] == "agent-a"


def test_one_row_per_agent_setting(tmp_path):
    _agent_runs(
        tmp_path,
        [
            ("greedy", "valid_seen", "hf:m", 5, 10, {"agent_protocol": {"sampling": {"temperature": 0.0}}}),
            ("sampled", "valid_seen", "hf:m", 6, 10, {"agent_protocol": {"sampling": {"temperature": 0.7}}}),
        ],
    )
    data = leaderboard_data(tmp_path, include_reported=False)
    assert sorted(r["agent"] for r in data["rows"]) == ["hf:m (setting 1)", "hf:m (setting 2)"]
    assert any("hf:m was run with 2 different agent settings" in n for n in data["notes"])


def test_split_kinds():
    assert [split_kind("alfworld", s) for s in ("train", "valid_seen", "valid_unseen", "ood_objects")] == [
        "ID",
        "ID",
        "OOD",
        "OOD",
    ]
    assert split_kind("webshop", "test_ood") == "OOD" and split_kind("webshop", "test") == "ID"
    assert split_kind("scienceworld", "test") == "OOD" and split_kind("textworld", "valid") == "ID"
    assert split_kind("plugin", "my_ood") == "OOD" and split_kind("plugin", "dev") == "ID"


# ---- CLI -------------------------------------------------------------------------------


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _assert_one_line_error(err: str, *needles: str) -> None:
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert "error:" in last
    for needle in needles:
        assert needle in last


@pytest.fixture
def fake_agents(monkeypatch):
    """Agent specs for the CLI without envrl.agents: "fake" only."""

    def build(spec, env_name, agent_options=None):
        if callable(spec):
            return spec()
        if spec == "fake":
            return fakes.FakeAgent()
        raise ValueError(f"unknown agent spec {spec!r} (known: fake)")

    real_run = runner_module.run_evaluation

    def run(env_name, split, agent_spec, *args, **kwargs):  # workers get the class, not the name
        return real_run(env_name, split, fakes.FakeAgent if agent_spec == "fake" else agent_spec, *args, **kwargs)

    monkeypatch.setattr(runner_module, "build_agent", build)
    monkeypatch.setattr(runner_module, "run_evaluation", run)


def test_cli_bad_input(capsys, tmp_path, fake_agents):
    base = ["eval", "--runs-dir", str(tmp_path), "--episodes", "1"]
    code, _, err = _cli(capsys, *base, "--env", "nope", "--split", "train", "--agent", "fake")
    assert code == 2
    _assert_one_line_error(err, "unknown env 'nope'")
    code, _, err = _cli(capsys, *base, "--env", fakes.ENV_ID, "--split", "bogus", "--agent", "fake")
    assert code == 2
    _assert_one_line_error(err, "split='bogus'", "unknown split")
    code, _, err = _cli(capsys, *base, "--env", fakes.ENV_ID, "--split", "train", "--agent", "gpt-17")
    assert code == 2
    _assert_one_line_error(err, "unknown agent", "gpt-17")
    code, _, err = _cli(capsys, "eval", "--env", fakes.ENV_ID, "--split", "train", "--agent", "fake", "--episodes", "0")
    assert code == 2
    _assert_one_line_error(err, "--episodes must be >= 1")
    code, _, err = _cli(
        capsys, "eval", "--env", fakes.ENV_ID, "--split", "train", "--agent", "fake", "--episodes", "ten"
    )
    assert code == 2
    _assert_one_line_error(err, "invalid int value")
    code, _, err = _cli(capsys, "leaderboard", "--format", "html")
    assert code == 2
    _assert_one_line_error(err, "invalid choice")
    code, _, err = _cli(capsys, "data", "alfworld")
    assert code == 2
    _assert_one_line_error(err, "--download")
    assert not list(tmp_path.iterdir())  # bad input leaves nothing behind


def test_cli_unknown_agent_with_real_agents(capsys, tmp_path):
    pytest.importorskip("envrl.agents")
    from envrl import agents

    if not hasattr(agents, "make_agent"):
        pytest.skip("envrl.agents.make_agent is not there yet")
    code, _, err = _cli(
        capsys,
        "eval",
        "--env",
        fakes.ENV_ID,
        "--split",
        "train",
        "--agent",
        "no-such-agent",
        "--episodes",
        "1",
        "--runs-dir",
        str(tmp_path),
    )
    assert code == 2
    _assert_one_line_error(err, "no-such-agent")


def test_cli_eval_and_leaderboard(capsys, tmp_path, fake_agents):
    code, out, err = _cli(
        capsys,
        "eval",
        "--env",
        fakes.ENV_ID,
        "--split",
        "train",
        "--agent",
        "fake",
        "--episodes",
        "5",
        "--workers",
        "2",
        "--seed",
        "1",
        "--runs-dir",
        str(tmp_path),
        "--max-steps",
        "5",
        "--no-progress",
    )
    assert code == 0, err
    assert "episodes: 5/5 recorded" in out
    table = out[out.index("task type") :].splitlines()
    assert table[2].split()[:3] == ["ALL", "5", "60.0"]
    assert {line.split()[0] for line in table[3:]} == {"pick", "clean", "heat"}
    run_id = default_run_id(fakes.ENV_ID, "train", "fake", 1)
    assert json.loads((tmp_path / run_id / "config.json").read_text())["env_kwargs"] == {"max_episode_steps": 5}
    code, out, _ = _cli(capsys, "leaderboard", "--runs", "--runs-dir", str(tmp_path), "--format", "markdown")
    assert code == 0 and f"| {run_id} |" in out and "| 5/5 |" in out


def test_cli_data_calls_the_downloader(capsys, monkeypatch, tmp_path):
    from envrl.envs.alfworld import official

    calls = []
    monkeypatch.setattr(official, "download", lambda dest: calls.append(dest) or dest)
    code, out, _ = _cli(capsys, "data", "alfworld", "--download", "--dest", str(tmp_path / "alf"))
    assert code == 0 and calls == [tmp_path / "alf"]
    assert f"ALFWORLD_DATA={tmp_path / 'alf'}" in out


def test_cli_data_reports_a_failed_download_in_one_line(capsys, monkeypatch, tmp_path):
    from envrl.envs.alfworld import official

    def offline(dest):
        raise official.OfficialDataError("cannot download the official ALFWorld data:\n no route")

    monkeypatch.setattr(official, "download", offline)
    code, out, err = _cli(capsys, "data", "alfworld", "--download", "--dest", str(tmp_path / "alf"))
    assert (code, out) == (1, "")
    assert err == "envrl data alfworld: error: download failed: cannot download the official ALFWorld data: no route\n"
    code, _, err = _cli(capsys, "data", "alfworld")
    assert code == 2 and "pass --download" in err


# ---- the real thing ---------------------------------------------------------------------


@pytest.mark.slow
def test_alfworld_expert_two_episodes(capsys, tmp_path):
    code, out, err = _cli(
        capsys,
        "eval",
        "--env",
        "alfworld",
        "--split",
        "valid_unseen",
        "--agent",
        "expert",
        "--episodes",
        "2",
        "--workers",
        "2",
        "--runs-dir",
        str(tmp_path),
        "--no-progress",
    )
    assert code == 0, err
    (row,) = json.loads(leaderboard(tmp_path, "json", runs=True))
    assert (row["env_id"], row["split"], row["agent"]) == ("envrl/ALFWorld-v0", "valid_unseen", "expert")
    assert row["episodes_done"] == 2 and row["errors"] == 0, out
    assert row["successes"] == 2, f"the expert should solve both episodes:\n{out}"
