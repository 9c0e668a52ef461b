"""The results store never answers with a traceback, and readers never write.

* Readers (``ResultStore`` read methods, ``envrl leaderboard``, ``envrl serve``) open the
  database read-only: the database file keeps its bytes and mtime and no ``-wal``/``-shm``
  file appears, and a read-only runs directory can be read.
* A runs directory that is a file, one without write permission, and a corrupt
  ``envrl.sqlite`` give one clear line and a non-zero exit, and nothing is written.
* A malformed episode record (bad JSON, a step without ``reward``) is skipped and counted;
  the rest of its run is shown.

Tests run as root, where file modes do not stop access. The read-only cases therefore run the
command in a subprocess without ``CAP_DAC_OVERRIDE`` (dropped from its bounding set before
exec), in which root obeys file modes like any user.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO = TESTS_DIR.parent

from envrl import cli  # noqa: E402
from envrl import testing as fakes  # noqa: E402
from envrl.evaluation.store import (  # noqa: E402
    EpisodeRecord,
    MalformedRecord,
    ResultStore,
    StepRecord,
    StoreError,
    parse_record,
)

PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2


# ---- helpers ---------------------------------------------------------------------------


def make_record(index: int, run_id: str = "r1") -> EpisodeRecord:
    steps = [StepRecord(action=f"a{k}", observation=f"o{k}", reward=float(k == 2), valid=True) for k in range(3)]
    return EpisodeRecord(
        run_id=run_id,
        episode_index=index,
        env_id="envrl/Fake-v0",
        split="train",
        task_id=f"t{index}",
        task_type="pick",
        seed=index,
        agent="fake",
        success=index % 2 == 0,
        score=1.0,
        turns=3,
        valid_action_ratio=1.0,
        wall_time=0.01,
        trajectory=steps,
        initial_observation="start",
        finished_at=1.0 + index,
    )


def make_config(run_id: str = "r1", episodes: int = 4) -> dict[str, Any]:
    return {
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


def build_store(runs_dir: Path, episodes: int = 4) -> Path:
    store = ResultStore(runs_dir)
    with store.open_run("r1", make_config(episodes=episodes)) as writer:
        for i in range(episodes):
            writer.append(make_record(i))
    return runs_dir


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root``: content digest and mtime (ns)."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def cli_run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *needles: str) -> None:
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert lines, "no error message"
    assert "error:" in lines[-1], err
    for needle in needles:
        assert needle in lines[-1], (needle, lines[-1])


def _drop_dac_override() -> None:
    """preexec_fn: the exec'd command keeps uid 0 but loses the capabilities that let root
    ignore file modes (so chmod 0555 really makes a directory read-only for it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def run_unprivileged(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """``python args...`` as a process that file modes apply to (see the module docstring)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    preexec = _drop_dac_override if os.geteuid() == 0 else None
    try:
        return subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout, preexec_fn=preexec
        )
    except subprocess.SubprocessError as exc:
        if "preexec_fn" in str(exc):
            pytest.skip(f"cannot drop CAP_DAC_OVERRIDE here ({exc})")
        raise


@pytest.fixture
def read_only(tmp_path):
    """Make paths read-only for the test (file modes), restoring them afterwards."""
    changed: list[tuple[Path, int]] = []

    def apply(*paths: Path) -> None:
        for path in paths:
            changed.append((path, path.stat().st_mode & 0o777))
            path.chmod(0o555 if path.is_dir() else 0o444)

    yield apply
    for path, mode in reversed(changed):
        path.chmod(mode)


# ---- readers never write -------------------------------------------------------------------


def test_readers_leave_the_database_untouched(tmp_path, capsys):
    runs_dir = build_store(tmp_path / "runs")
    db = runs_dir / "envrl.sqlite"
    time.sleep(0.01)  # an mtime change would show even on a coarse clock
    before = snapshot(runs_dir)
    store = ResultStore(runs_dir)
    assert [r["run_id"] for r in store.list_runs()] == ["r1"]
    assert store.get_run("r1")["episodes"] == 4
    assert len(store.load_episodes("r1")) == 4
    code, out, _ = cli_run(capsys, "leaderboard", "--runs", "--runs-dir", str(runs_dir))
    assert code == 0 and "r1" in out
    pytest.importorskip("flask")
    from envrl.evaluation.web import create_app

    client = create_app(runs_dir).test_client()
    for url in ("/", "/runs/r1", "/runs/r1/episodes/1?step=2", "/runs/r1/plots/turns.png"):
        assert client.get(url).status_code == 200, url
    assert snapshot(runs_dir) == before
    assert not db.with_name("envrl.sqlite-wal").exists() and not db.with_name("envrl.sqlite-shm").exists()


def test_reading_never_creates_a_store(tmp_path, capsys):
    missing = tmp_path / "nothing-here"
    assert ResultStore(missing).list_runs() == []
    code, out, _ = cli_run(capsys, "leaderboard", "--runs", "--runs-dir", str(missing))
    assert code == 0 and "no runs" in out
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "envrl.sqlite").touch()  # a database no writer has given a schema yet
    assert ResultStore(empty).list_runs() == [] and ResultStore(empty).load_episodes("r1") == []
    assert (empty / "envrl.sqlite").stat().st_size == 0


def _wal_at_rest(runs_dir: Path) -> None:
    """Leave the database in WAL mode without -wal/-shm files, as envrl did before."""
    conn = sqlite3.connect(runs_dir / "envrl.sqlite")
    assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    conn.close()
    assert not (runs_dir / "envrl.sqlite-wal").exists()


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_a_read_only_runs_directory_can_be_read(tmp_path, read_only, journal):
    runs_dir = build_store(tmp_path / "runs")
    if journal == "wal":
        _wal_at_rest(runs_dir)
    read_only(runs_dir / "r1", runs_dir / "envrl.sqlite", runs_dir)
    before = snapshot(runs_dir)
    result = run_unprivileged(
        ["-m", "envrl.cli", "leaderboard", "--runs", "--format", "json", "--runs-dir", str(runs_dir)]
    )
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert (row["run_id"], row["episodes_done"]) == ("r1", 4)
    page = (
        "import sys; from envrl.evaluation.web import create_app; c = create_app(sys.argv[1]).test_client(); "
        "print(*(c.get(u).status_code for u in ('/', '/runs/r1', '/runs/r1/episodes/0?step=1')))"
    )
    result = run_unprivileged(["-c", page, str(runs_dir)])
    assert result.stdout.split() == ["200", "200", "200"], result.stderr
    assert snapshot(runs_dir) == before


def eval_command(runs_dir: Path) -> list[str]:
    """``python -m envrl.cli eval`` of two random-agent episodes of the fake env into ``runs_dir``."""
    return [
        "-m",
        "envrl.cli",
        "eval",
        "--env",
        fakes.ENV_ID,
        "--split",
        "train",
        "--agent",
        "random",
        "--episodes",
        "2",
        "--no-progress",
        "--runs-dir",
        str(runs_dir),
    ]


def test_eval_into_a_read_only_runs_directory_is_one_line(tmp_path, read_only):
    runs_dir = build_store(tmp_path / "runs")
    read_only(runs_dir / "r1", runs_dir / "envrl.sqlite", runs_dir)
    before = snapshot(runs_dir)
    result = run_unprivileged(eval_command(runs_dir))
    assert result.returncode == 1, result.stderr
    assert_one_line_error(result.stderr, "envrl eval: error:", str(runs_dir / "envrl.sqlite"), "read-only")
    assert snapshot(runs_dir) == before
    assert sorted(p.name for p in runs_dir.iterdir()) == ["envrl.sqlite", "r1"]


def test_eval_without_permission_to_create_the_runs_directory(tmp_path, read_only):
    locked = tmp_path / "locked"
    locked.mkdir()
    read_only(locked)
    result = run_unprivileged(eval_command(locked / "runs"))
    assert result.returncode == 1, result.stderr
    assert_one_line_error(result.stderr, "Permission denied")
    assert list(locked.iterdir()) == []


# ---- unusable runs directories ---------------------------------------------------------------


EVAL = ("eval", "--env", fakes.ENV_ID, "--split", "train", "--agent", "fake", "--episodes", "2", "--no-progress")


@pytest.fixture
def fake_agent_cli(monkeypatch):
    """``--agent fake`` without envrl.agents (the runner builds envrl.testing.FakeAgent)."""
    from envrl.evaluation import runner

    real_run, real_build = runner.run_evaluation, runner.build_agent

    def build(spec, env_name, agent_options=None):
        return fakes.FakeAgent() if spec == "fake" else real_build(spec, env_name, agent_options)

    def run(env_name, split, agent_spec, *args, **kwargs):
        return real_run(env_name, split, fakes.FakeAgent if agent_spec == "fake" else agent_spec, *args, **kwargs)

    monkeypatch.setattr(runner, "build_agent", build)
    monkeypatch.setattr(runner, "run_evaluation", run)


def test_a_runs_directory_that_is_a_file(tmp_path, capsys, fake_agent_cli):
    runs = tmp_path / "runs"
    runs.write_text("not a directory\n")
    for argv, prog in (
        (EVAL, "envrl eval"),
        (("leaderboard",), "envrl leaderboard"),
        (("serve", "--port", "0"), "envrl serve"),
    ):
        code, out, err = cli_run(capsys, *argv, "--runs-dir", str(runs))
        assert code == 1, (argv, err)
        assert_one_line_error(err, f"{prog}: error:", f"runs directory {runs} is not a directory")
        assert "http://" not in out  # serve never listened
    assert runs.read_text() == "not a directory\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_a_corrupt_database(tmp_path, capsys, fake_agent_cli):
    runs = tmp_path / "runs"
    runs.mkdir()
    db = runs / "envrl.sqlite"
    db.write_bytes(b"this is not a SQLite database, but it is somebody's data\n" * 40)
    before = snapshot(runs)
    for argv, prog in (
        (EVAL, "envrl eval"),
        (("leaderboard",), "envrl leaderboard"),
        (("serve", "--port", "0"), "envrl serve"),
    ):
        code, out, err = cli_run(capsys, *argv, "--runs-dir", str(runs))
        assert code == 1, (argv, err)
        assert_one_line_error(err, f"{prog}: error:", str(db), "corrupt")
        assert "http://" not in out
    assert snapshot(runs) == before  # no run directory, no -wal/-shm, the bytes as they were
    with pytest.raises(StoreError, match="corrupt"):
        ResultStore(runs).list_runs()


def test_a_database_that_goes_bad_while_serving_answers_503(tmp_path):
    pytest.importorskip("flask")
    from envrl.evaluation.web import create_app

    runs_dir = build_store(tmp_path / "runs")
    client = create_app(runs_dir).test_client()
    assert client.get("/").status_code == 200
    (runs_dir / "envrl.sqlite").write_bytes(b"garbage" * 1000)
    response = client.get("/runs/r1")
    assert response.status_code == 503
    assert "corrupt" in response.get_data(as_text=True)


# ---- malformed episode records -----------------------------------------------------------------


def _spoil(runs_dir: Path, index: int, record: str) -> None:
    conn = sqlite3.connect(runs_dir / "envrl.sqlite")
    conn.execute("UPDATE episodes SET record = ? WHERE run_id = 'r1' AND episode_index = ?", (record, index))
    conn.commit()
    conn.close()


def _without_reward(index: int) -> str:
    data = make_record(index).to_dict()
    del data["trajectory"][1]["reward"]
    return json.dumps(data)


def test_parse_record_says_what_is_wrong():
    assert parse_record(make_record(0).to_json()) == make_record(0)
    with pytest.raises(MalformedRecord, match="reward"):
        parse_record(_without_reward(0))
    for bad in ('{"episode_index": 1', "[1, 2]", "null", json.dumps(dict(make_record(0).to_dict(), turns=None))):
        with pytest.raises(MalformedRecord):
            parse_record(bad)


def test_malformed_records_are_skipped_and_counted(tmp_path, caplog):
    runs_dir = build_store(tmp_path / "runs")
    _spoil(runs_dir, 1, '{"run_id": "r1", "episode_index": 1, "trajec')  # bad JSON
    _spoil(runs_dir, 2, _without_reward(2))
    load = ResultStore(runs_dir).read_episodes("r1")
    assert [r.episode_index for r in load.records] == [0, 3]
    assert sorted(load.skipped) == [1, 2] and "reward" in load.skipped[2]
    assert "skipped 2 unreadable episode record(s)" in caplog.text
    assert [r.episode_index for r in ResultStore(runs_dir).load_episodes("r1")] == [0, 3]


def test_the_viewer_shows_the_rest_of_a_run_with_malformed_records(tmp_path):
    pytest.importorskip("flask")
    bs4 = pytest.importorskip("bs4")
    from envrl.evaluation.web import create_app

    runs_dir = build_store(tmp_path / "runs")
    _spoil(runs_dir, 1, "{not json")
    _spoil(runs_dir, 2, _without_reward(2))
    client = create_app(runs_dir).test_client()
    response = client.get("/runs/r1")
    assert response.status_code == 200
    soup = bs4.BeautifulSoup(response.get_data(as_text=True), "html.parser")
    note = " ".join(soup.find(id="skipped").get_text(" ").split())
    assert note.startswith("Skipped 2 unreadable episode records of this run")
    assert "episode 1 (" in note and "episode 2 (KeyError: missing field 'reward')" in note
    assert len(soup.find("table", id="episodes").find("tbody").find_all("tr")) == 4
    for url in (
        "/",
        "/runs/r1/episodes/0?step=3",
        "/runs/r1/episodes/3",
        "/runs/r1/plots/turns.png",
        "/runs/r1/plots/task_types.png",
        "/runs/r1/plots/splits.png",
    ):
        assert client.get(url).status_code == 200, url
    bad = client.get("/runs/r1/episodes/2")
    assert bad.status_code == 404 and "cannot be read" in bad.get_data(as_text=True)
    assert client.get("/runs/r1/episodes/9").status_code == 404


def test_resuming_repairs_malformed_database_records(tmp_path, caplog):
    runs_dir = build_store(tmp_path / "runs")
    _spoil(runs_dir, 1, _without_reward(1))  # the journal has a good copy of episode 1
    _spoil(runs_dir, 2, "{not json")
    journal = runs_dir / "r1" / "episodes.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[:2] + lines[3:]))  # ... but not of episode 2
    with ResultStore(runs_dir).open_run("r1", make_config()) as writer:
        assert writer.done == {0, 1, 3}  # episode 2 will be played again
        writer.append(make_record(2))
    load = ResultStore(runs_dir).read_episodes("r1")
    assert not load.skipped and load.records == [make_record(i) for i in range(4)]
    assert "that episode will be played again" in caplog.text


def test_unreadable_summary_columns_are_skipped(tmp_path):
    runs_dir = build_store(tmp_path / "runs")
    conn = sqlite3.connect(runs_dir / "envrl.sqlite")
    conn.execute("UPDATE episodes SET turns = 'many' WHERE episode_index = 3")
    conn.commit()
    conn.close()
    (run,) = ResultStore(runs_dir).list_runs()
    assert [e["episode_index"] for e in run["episodes"]] == [0, 1, 2] and run["skipped"] == 1


def test_the_raw_journal_never_holds_an_episode_twice(tmp_path):
    """The writer itself refuses a second record of an index, in one session and after a
    reopen: the raw episodes.jsonl (not only de-duplicating readers) has each episode once."""
    store = ResultStore(tmp_path)
    first = make_record(0)
    with store.open_run("r1", make_config()) as writer:
        writer.append(first)
        writer.append(make_record(0))  # same index again, same session
        writer.append(make_record(1))
    with store.open_run("r1", make_config()) as writer:
        writer.append(make_record(0))  # and after a reopen
    lines = [json.loads(line) for line in (tmp_path / "r1" / "episodes.jsonl").read_text().splitlines()]
    assert [line["episode_index"] for line in lines] == [0, 1]
    assert lines[0] == json.loads(first.to_json())
    with sqlite3.connect(tmp_path / "envrl.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM episodes WHERE run_id = 'r1'").fetchone() == (2,)
