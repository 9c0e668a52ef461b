"""Episode records and the results store.

Layout of a runs directory (default ``$ENVRL_RUNS_DIR``, else ``./runs``)::

    <runs_dir>/
      envrl.sqlite            # every run and episode (tables runs, episodes; WAL mode while written)
                              # and world-model probes (table probes, see below)
      <run_id>/
        config.json           # what was run: env, split, agent, episodes, seed, env kwargs, versions
        episodes.jsonl        # one JSON line per finished episode, in finishing order
        .lock                 # held (flock) while a process writes this run

Each finished episode is written twice, first to ``episodes.jsonl`` (written, flushed and
fsynced before anything else) and then to SQLite (``INSERT OR IGNORE`` on
``UNIQUE(run_id, episode_index)``). The JSONL file is the run's journal: when a run is opened
again, episodes present in one place and missing from the other (a process killed between
the two writes) are copied across, and a last JSONL line cut short by a kill mid-write is
dropped with a warning and cut off the file. So an episode is never lost once its line is
complete, and never counted twice.

Readers (``envrl leaderboard``, ``envrl serve``) open the database read-only (SQLite's
``mode=ro``): they never create the schema, switch the journal mode or write anything, so a
read-only runs directory can be browsed. Writers use WAL mode while they are open (readers
see each episode as it lands) and switch the database back to a plain rollback journal when
the last of them closes, so that a store at rest is one file that readers can open without
creating ``-wal``/``-shm`` files. A runs directory that cannot be used (not a directory, no
permission, a corrupt database) raises :class:`StoreError` with a one-line reason; a
malformed episode record is skipped and counted (:class:`EpisodeLoad`), never fatal.

Schema changes add tables, never alter one: readers look for a table before they read it, so
a store written by an older envrl reads as one where the newer table is empty. The ``probes``
table (:class:`ProbeRecord`, written by ``envrl probe``) is created by the first probe written
into a store, not by run writers. A probe is identified by (agent, env, split, seed,
episodes): writing the same probe again replaces its row (a checkpoint folder retrained in
place is measured anew; the latest measurement stands).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from envrl.evaluation.config import RunConfig

logger = logging.getLogger("envrl.evaluation")

DB_NAME = "envrl.sqlite"
JSONL_NAME = "episodes.jsonl"
CONFIG_NAME = "config.json"
LOCK_NAME = ".lock"

#: config keys that identify a run (the fields of RunConfig marked "identity"): reopening a
#: run with other values is an error
IDENTITY_KEYS = RunConfig.identity_keys()
#: what an identity key means when a config (written by an older envrl) lacks it
IDENTITY_DEFAULTS: dict[str, Any] = {"agent_protocol": {}}

#: seconds a reader waits for a writer that holds the database exclusively (switching journal mode)
READ_TIMEOUT = 10.0


class StoreError(RuntimeError):
    """The runs directory or its database cannot be used: not a directory, no permission, a
    corrupt or locked database. The message is one line naming the path and the reason, so
    the CLI can print it as it is."""


class MalformedRecord(ValueError):
    """A stored episode record that cannot be read back (bad JSON, a missing field)."""


def default_runs_dir() -> Path:
    """``$ENVRL_RUNS_DIR`` if set, else ``./runs``."""
    return Path(os.environ.get("ENVRL_RUNS_DIR") or "runs")


# ---- records ---------------------------------------------------------------------------


@dataclass
class StepRecord:
    """One turn: the agent's action and what the environment answered.

    ``agent_info`` is what the agent reported about this turn, for LLM agents: the raw
    ``response``, its ``think`` part, ``format_valid`` (the response had exactly one
    ``<action>``), ``error`` (the model server failed after its retries), token counts and
    latency. ``None`` for agents that report nothing (random, expert).
    """

    action: str
    observation: str
    reward: float
    valid: bool
    agent_info: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.agent_info is None:
            del data["agent_info"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepRecord:
        agent_info = data.get("agent_info")
        return cls(
            action=str(data["action"]),
            observation=str(data["observation"]),
            reward=float(data["reward"]),
            valid=bool(data["valid"]),
            agent_info=dict(agent_info) if isinstance(agent_info, Mapping) else None,
        )


@dataclass
class EpisodeRecord:
    """One played episode (see docs/design.md).

    ``episode_index`` is the episode's place in the run (episode i plays task
    ``task_ids[i % len(task_ids)]`` with seed ``run seed + i``). ``error`` is ``None`` for an
    episode that ran to its end, else a one-line message (exception in the env or agent, or a
    worker process that died twice); such an episode counts as a failure. ``turns`` is the
    number of actions taken; ``valid_action_ratio`` is the share of them the env could use
    (``None`` when no action was taken). ``wall_time`` is in seconds; ``finished_at`` is a
    Unix timestamp. ``agent_stats`` is what the agent counted over the episode (LLM agents:
    responses, format-invalid responses, failed requests, prompt and completion tokens).
    """

    run_id: str
    episode_index: int
    env_id: str
    split: str
    task_id: str
    task_type: str
    seed: int
    agent: str
    success: bool
    score: float
    turns: int
    valid_action_ratio: float | None
    wall_time: float
    error: str | None = None
    trajectory: list[StepRecord] = field(default_factory=list)
    initial_observation: str = ""
    finished_at: float = 0.0
    agent_stats: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "trajectory"}
        data["trajectory"] = [step.to_dict() for step in self.trajectory]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EpisodeRecord:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (newer writers)."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["trajectory"] = [StepRecord.from_dict(s) for s in data.get("trajectory", [])]
        record = cls(**kwargs)
        record.episode_index = int(record.episode_index)
        record.seed = int(record.seed)
        record.success = bool(record.success)
        record.score = float(record.score)
        record.turns = int(record.turns)
        return record

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))


#: what reading a hand-edited, cut or foreign record can raise
_RECORD_ERRORS = (ValueError, KeyError, TypeError, AttributeError)


def parse_record(line: str | bytes) -> EpisodeRecord:
    """One stored record (a JSONL line or the database's ``record`` column) as an
    :class:`EpisodeRecord`; :class:`MalformedRecord` with a one-line reason when it cannot be
    read, so that callers skip one bad record instead of failing on all of them."""
    try:
        data = json.loads(line)
        if not isinstance(data, Mapping):
            raise TypeError(f"a record is a JSON object, not {type(data).__name__}")
        return EpisodeRecord.from_dict(data)
    except MalformedRecord:
        raise
    except _RECORD_ERRORS as exc:
        reason = f"missing field {exc.args[0]!r}" if isinstance(exc, KeyError) and exc.args else str(exc)
        raise MalformedRecord(" ".join(f"{type(exc).__name__}: {reason}".split())) from exc


@dataclass
class EpisodeLoad:
    """The readable records of a run, and the episodes whose records could not be read
    (episode index -> reason): one malformed record must not hide the others."""

    records: list[EpisodeRecord]
    skipped: dict[int, str] = field(default_factory=dict)


#: the columns of the probes table that identify a probe: writing one again replaces its row
PROBE_IDENTITY = ("agent", "env", "split", "seed", "episodes")
#: the probe figures, fractions in [0, 1] (None: not measured)
PROBE_METRICS = ("sp_token_accuracy", "sp_exact_match", "id_accuracy", "id_chance")


@dataclass
class ProbeRecord:
    """One world-model probe of a policy's model on held-out transitions (``envrl probe``,
    :mod:`envrl.training.probes`).

    ``agent`` is the leaderboard row it belongs to (the label runs of the checkpoint carry);
    ``episodes`` expert episodes of ``split`` (episode i plays task ``i % n`` with seed
    ``seed + i``) gave ``transitions`` transitions. The figures are fractions in [0, 1]:
    state-prediction teacher-forced token accuracy and exact-match rate, inverse-dynamics
    top-1 accuracy and its chance level. ``sp_template``, ``id_template`` and
    ``policy_template`` name the world-model, inverse-dynamics and policy prompt templates;
    ``config`` holds the rest of the setup (checkpoint, history, env kwargs, ...).
    """

    agent: str
    env: str
    split: str
    seed: int
    episodes: int
    transitions: int
    sp_token_accuracy: float | None
    sp_exact_match: float | None
    id_accuracy: float | None
    id_chance: float | None
    sp_template: str
    id_template: str
    policy_template: str
    envrl_version: str
    created_at: float
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def probe_id(self) -> str:
        """``probe-<env>-<split>-<agent>-s<seed>-n<episodes>-<digest>``: readable, and the same
        for the same identity (the digest keeps two agents whose names differ only in characters
        the slug drops apart)."""
        identity = [getattr(self, key) for key in PROBE_IDENTITY]
        digest = hashlib.sha256(json.dumps(identity).encode("utf-8")).hexdigest()[:8]
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{self.env}-{self.split}-{self.agent}-s{self.seed}-n{self.episodes}")
        return f"probe-{slug.strip('._')}-{digest}"


def _jsonable(value: Any) -> Any:
    """``value`` as it will read back from JSON (so stored and new configs compare equal)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


# ---- JSONL journal ---------------------------------------------------------------------


def read_jsonl(path: str | os.PathLike[str], repair: bool = False) -> list[EpisodeRecord]:
    """The records of an ``episodes.jsonl`` file, in file order, one per episode index.

    A last line without its newline (the writer was killed mid-write) or that does not parse
    is dropped with a warning; with ``repair=True`` it is also cut off the file so that the
    next append starts on a clean line. An unreadable line elsewhere is skipped with a
    warning. A second line for an index already read is ignored (first wins).
    """
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    records: list[EpisodeRecord] = []
    seen: set[int] = set()
    pos = 0
    keep_end = 0  # byte offset just past the last line worth keeping
    line_no = 0
    while pos < len(data):
        newline = data.find(b"\n", pos)
        line_no += 1
        if newline == -1:
            logger.warning(
                "%s: dropping a truncated last line (%d bytes, no newline): the writer was "
                "interrupted mid-write; that episode will be run again",
                path,
                len(data) - pos,
            )
            break
        line = data[pos:newline]
        pos = newline + 1
        if not line.strip():
            keep_end = pos
            continue
        try:
            record = parse_record(line)
        except MalformedRecord as exc:
            if pos >= len(data):
                logger.warning(
                    "%s: dropping an unreadable last line %d (%s); that episode will be run again", path, line_no, exc
                )
                break
            logger.warning("%s: skipping unreadable line %d (%s)", path, line_no, exc)
            keep_end = pos
            continue
        keep_end = pos
        if record.episode_index in seen:
            logger.warning("%s: line %d repeats episode %d; keeping the first", path, line_no, record.episode_index)
            continue
        seen.add(record.episode_index)
        records.append(record)
    if repair and keep_end < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(keep_end)
            fh.flush()
            os.fsync(fh.fileno())
    return records


# ---- SQLite ----------------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id            TEXT PRIMARY KEY,
    env               TEXT NOT NULL,
    env_id            TEXT NOT NULL,
    split             TEXT NOT NULL,
    agent             TEXT NOT NULL,
    seed              INTEGER NOT NULL,
    episodes_planned  INTEGER NOT NULL,
    config            TEXT NOT NULL,
    created_at        REAL NOT NULL,
    updated_at        REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS episodes (
    run_id              TEXT NOT NULL REFERENCES runs(run_id),
    episode_index       INTEGER NOT NULL,
    env_id              TEXT NOT NULL,
    split               TEXT NOT NULL,
    task_id             TEXT NOT NULL,
    task_type           TEXT NOT NULL,
    seed                INTEGER NOT NULL,
    agent               TEXT NOT NULL,
    success             INTEGER NOT NULL,
    score               REAL NOT NULL,
    turns               INTEGER NOT NULL,
    valid_action_ratio  REAL,
    wall_time           REAL NOT NULL,
    error               TEXT,
    finished_at         REAL NOT NULL,
    record              TEXT NOT NULL,
    UNIQUE (run_id, episode_index)
);
"""

#: created by the first probe written (:meth:`ResultStore.write_probe`), never by run writers
_PROBE_SCHEMA = """
CREATE TABLE IF NOT EXISTS probes (
    probe_id           TEXT PRIMARY KEY,
    agent              TEXT NOT NULL,
    env                TEXT NOT NULL,
    split              TEXT NOT NULL,
    seed               INTEGER NOT NULL,
    episodes           INTEGER NOT NULL,
    transitions        INTEGER NOT NULL,
    sp_token_accuracy  REAL,
    sp_exact_match     REAL,
    id_accuracy        REAL,
    id_chance          REAL,
    sp_template        TEXT NOT NULL,
    id_template        TEXT NOT NULL,
    policy_template    TEXT NOT NULL,
    envrl_version      TEXT NOT NULL,
    created_at         REAL NOT NULL,
    config             TEXT NOT NULL,
    UNIQUE (agent, env, split, seed, episodes)
);
"""

_PROBE_COLUMNS = tuple(f.name for f in fields(ProbeRecord))

_SUMMARY_COLUMNS = (
    "episode_index",
    "task_id",
    "task_type",
    "split",
    "success",
    "score",
    "turns",
    "valid_action_ratio",
    "error",
)


#: SQLite errors that mean "the -wal/-shm files of a WAL database cannot be created or used
#: here" (a read-only directory or file system); ``sqlite_errorname`` exists from Python 3.11
_CANNOT_OPEN_WAL = (
    "SQLITE_READONLY_DIRECTORY",
    "SQLITE_READONLY_CANTINIT",
    "SQLITE_READONLY_RECOVERY",
    "SQLITE_CANTOPEN",
)


def _sqlite_reason(exc: sqlite3.Error) -> str:
    """A one-line reason for a SQLite error, with what to check: SQLite's own words
    ("unable to open database file") do not say that a directory is read-only."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    name = getattr(exc, "sqlite_errorname", "")
    if "readonly" in text or "read-only" in text or name.startswith("SQLITE_READONLY"):
        return f"{text} (the directory or the database file is read-only)"
    if "unable to open" in text:
        return f"{text} (check that the directory exists and its permissions)"
    if "locked" in text or "busy" in text:
        return f"{text} (another process holds the database)"
    if "not a database" in text or "malformed" in text or type(exc) is sqlite3.DatabaseError:
        return (
            f"the database is corrupt ({text}); move it aside: re-running a run's command rebuilds "
            f"the run from its {JSONL_NAME}"
        )
    return text


@contextlib.contextmanager
def _store_errors(what: str) -> Iterator[None]:
    """Turn SQLite and file-system errors into :class:`StoreError` ("<what>: <reason>"), so
    that no caller has to know SQLite's exception types and no user sees a traceback."""
    try:
        yield
    except sqlite3.Error as exc:
        raise StoreError(f"{what}: {_sqlite_reason(exc)}") from exc
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise StoreError(f"{what}: {exc.strerror or exc}{where}") from exc


def _try_read(uri: str) -> sqlite3.Connection:
    """Open ``uri`` and read its schema once (SQLite opens lazily: errors surface here)."""
    conn = sqlite3.connect(uri, uri=True, timeout=READ_TIMEOUT)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn


def open_read_only(db_path: Path) -> sqlite3.Connection:
    """A connection that cannot write ``db_path`` (SQLite ``mode=ro``).

    A WAL database needs its ``-wal``/``-shm`` files; where they cannot be created (a
    read-only directory or file system) the database is opened ``immutable``, which reads
    the file alone. That is safe there: no writer can write a WAL database in a directory
    where its ``-wal`` file cannot exist either."""
    uri = db_path.resolve().as_uri()
    try:
        return _try_read(f"{uri}?mode=ro")
    except sqlite3.OperationalError as exc:
        text = str(exc)
        if not (
            getattr(exc, "sqlite_errorname", "") in _CANNOT_OPEN_WAL or "readonly" in text or "unable to open" in text
        ):
            raise
        logger.debug("%s: reading it as immutable (%s)", db_path, text)
        return _try_read(f"{uri}?mode=ro&immutable=1")


def _rest_and_close(conn: sqlite3.Connection) -> None:
    """Close a writer's connection, switching the database back to a rollback journal when no
    other connection has it open (else SQLite refuses at once and the last one does it), so
    that a database at rest is one file: readers then need no ``-wal``/``-shm`` files."""
    try:
        conn.execute("PRAGMA busy_timeout = 0")
        conn.execute("PRAGMA journal_mode=DELETE")
    except sqlite3.Error:
        pass
    finally:
        conn.close()


class RunConfigMismatch(ValueError):
    """A run id was reopened with a different env, split, agent, seed, env kwargs or task list."""


class RunLocked(RuntimeError):
    """Another process is writing the same run."""


class ResultStore:
    """All runs under one runs directory; the SQLite database is shared by every run."""

    def __init__(self, runs_dir: str | os.PathLike[str] | None = None):
        self.runs_dir = Path(runs_dir) if runs_dir is not None else default_runs_dir()
        self.db_path = self.runs_dir / DB_NAME

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def _check_dir(self) -> None:
        """StoreError when the runs directory is a file: SQLite and mkdir would say
        something less helpful ("unable to open database file", "File exists")."""
        if self.runs_dir.exists() and not self.runs_dir.is_dir():
            raise StoreError(f"runs directory {self.runs_dir} is not a directory")

    def connect(self) -> sqlite3.Connection:
        """A writable connection with the schema in place (creates the directory and
        database); :class:`StoreError` when that is not possible. Writers only: readers use
        :meth:`_reading`, which never writes."""
        self._check_dir()
        with _store_errors(f"cannot open the results database {self.db_path} for writing"):
            self.runs_dir.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.db_path, timeout=60.0)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SCHEMA)
                conn.commit()
            except BaseException:
                conn.close()
                raise
        return conn

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection | None]:
        """A read-only connection for the duration (None when there is no database yet: an
        empty store); any SQLite error while reading becomes :class:`StoreError`."""
        self._check_dir()
        if not self.db_path.exists():
            yield None
            return
        with _store_errors(f"cannot read the results database {self.db_path}"):
            conn = open_read_only(self.db_path)
            try:
                yield conn
            finally:
                conn.close()

    @staticmethod
    def _tables(conn: sqlite3.Connection) -> set[str]:
        """The tables present: a database no writer has given the schema yet is an empty
        store, not an error (readers never create the schema)."""
        return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    # ---- reading --------------------------------------------------------------------

    def check_readable(self) -> None:
        """Raise :class:`StoreError` now if the store cannot be read (a server checks this
        before it listens rather than answering every page with an error)."""
        with self._reading() as conn:
            if conn is not None:
                self._tables(conn)

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """The stored config of ``run_id`` (with ``episodes`` = episodes planned), or None."""
        with self._reading() as conn:
            if conn is None or "runs" not in self._tables(conn):
                return None
            row = conn.execute("SELECT config, episodes_planned FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        config = _config_of(run_id, row[0])
        config["episodes"] = int(row[1])
        return config

    def list_runs(self) -> list[dict[str, Any]]:
        """Every run: its columns, its config and ``episodes``: a list of per-episode summaries
        (the record fields used by the metrics, without trajectories), by episode index.
        ``skipped`` counts the run's episode rows whose summary columns cannot be read."""
        with self._reading() as conn:
            if conn is None:
                return []
            tables = self._tables(conn)
            if "runs" not in tables:
                return []
            runs = conn.execute(
                "SELECT run_id, env, env_id, split, agent, seed, episodes_planned, config, created_at, "
                "updated_at FROM runs ORDER BY created_at, run_id"
            ).fetchall()
            episode_rows = (
                conn.execute(
                    f"SELECT run_id, {', '.join(_SUMMARY_COLUMNS)} FROM episodes ORDER BY run_id, episode_index"
                ).fetchall()
                if "episodes" in tables
                else []
            )
        by_run: dict[str, list[dict[str, Any]]] = {}
        skipped: dict[str, int] = {}
        for row in episode_rows:
            item = _summary(row[1:])
            if item is None:
                skipped[row[0]] = skipped.get(row[0], 0) + 1
                continue
            by_run.setdefault(row[0], []).append(item)
        out = []
        for run_id, env, env_id, split, agent, seed, planned, config, created, updated in runs:
            out.append(
                {
                    "run_id": run_id,
                    "env": env,
                    "env_id": env_id,
                    "split": split,
                    "agent": agent,
                    "seed": seed,
                    "episodes_planned": planned,
                    "config": _config_of(run_id, config),
                    "created_at": created,
                    "updated_at": updated,
                    "episodes": by_run.get(run_id, []),
                    "skipped": skipped.get(run_id, 0),
                }
            )
        return out

    def read_episodes(self, run_id: str) -> EpisodeLoad:
        """Full records (with trajectories) of ``run_id`` from SQLite, by episode index; a
        record that cannot be read is skipped and listed in ``skipped`` with its reason."""
        with self._reading() as conn:
            if conn is None or "episodes" not in self._tables(conn):
                return EpisodeLoad([])
            rows = conn.execute(
                "SELECT episode_index, record FROM episodes WHERE run_id = ? ORDER BY episode_index", (run_id,)
            ).fetchall()
        load = EpisodeLoad([])
        for index, line in rows:
            try:
                load.records.append(parse_record(line))
            except MalformedRecord as exc:
                load.skipped[int(index)] = str(exc)
        if load.skipped:
            logger.warning(
                "run %s: skipped %d unreadable episode record(s) in %s (episode %s: %s)",
                run_id,
                len(load.skipped),
                self.db_path,
                *next(iter(load.skipped.items())),
            )
        return load

    def load_episodes(self, run_id: str) -> list[EpisodeRecord]:
        """The readable full records of ``run_id`` (see :meth:`read_episodes`)."""
        return self.read_episodes(run_id).records

    def list_probes(self) -> list[ProbeRecord]:
        """Every world-model probe, by env, split, agent, seed and episodes; none in a store
        without the probes table (written before probes existed, or never probed). A row whose
        values cannot be read is skipped with a warning."""
        with self._reading() as conn:
            if conn is None or "probes" not in self._tables(conn):
                return []
            rows = conn.execute(
                f"SELECT probe_id, {', '.join(_PROBE_COLUMNS)} FROM probes ORDER BY env, split, agent, seed, episodes"
            ).fetchall()
        probes = []
        for row in rows:
            probe = _probe_of(row[1:])
            if probe is None:
                logger.warning("%s: skipping probe %s, whose stored values cannot be read", self.db_path, row[0])
                continue
            probes.append(probe)
        return probes

    # ---- writing --------------------------------------------------------------------

    def open_run(self, run_id: str, config: Mapping[str, Any]) -> RunWriter:
        """Create ``run_id`` or reopen it to resume (see :class:`RunWriter`)."""
        return RunWriter(self, run_id, config)

    def write_probe(self, probe: ProbeRecord) -> str:
        """Record ``probe`` (creating the probes table on first use), replacing the row of the
        same identity (:data:`PROBE_IDENTITY`) if there is one; returns its probe id."""
        conn = self.connect()
        try:
            with _store_errors(f"cannot record probe {probe.probe_id!r} in {self.db_path}"):
                conn.executescript(_PROBE_SCHEMA)
                values = [getattr(probe, name) for name in _PROBE_COLUMNS]
                values[_PROBE_COLUMNS.index("config")] = json.dumps(_jsonable(probe.config), sort_keys=True)
                with conn:  # one transaction: the old row is never gone without the new one
                    conn.execute(
                        f"DELETE FROM probes WHERE {' AND '.join(f'{key} = ?' for key in PROBE_IDENTITY)}",
                        [getattr(probe, key) for key in PROBE_IDENTITY],
                    )
                    conn.execute(
                        f"INSERT INTO probes (probe_id, {', '.join(_PROBE_COLUMNS)}) "
                        f"VALUES ({', '.join('?' * (len(_PROBE_COLUMNS) + 1))})",
                        [probe.probe_id, *values],
                    )
        finally:
            _rest_and_close(conn)
        return probe.probe_id


def _config_of(run_id: str, text: str) -> dict[str, Any]:
    """A run's stored config; an unreadable one is shown as empty (with a warning) rather
    than making every page and table that lists the run fail."""
    try:
        config = json.loads(text)
    except (TypeError, ValueError) as exc:
        logger.warning("run %s: its stored config cannot be read (%s)", run_id, exc)
        return {}
    return config if isinstance(config, dict) else {}


def _summary(values: Sequence[Any]) -> dict[str, Any] | None:
    """One episode's summary columns as a dict, or None when a hand-edited or foreign row
    holds values the metrics cannot use (they would fail on every page of its run)."""
    item = dict(zip(_SUMMARY_COLUMNS, values, strict=True))
    numbers = (item["episode_index"], item["turns"], item["score"], item["success"])
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers):
        return None
    ratio = item["valid_action_ratio"]
    if ratio is not None and not isinstance(ratio, (int, float)):
        return None
    item["success"] = bool(item["success"])
    return item


def _probe_of(values: Sequence[Any]) -> ProbeRecord | None:
    """A stored probe row as a :class:`ProbeRecord`, or None when a hand-edited or foreign row
    holds values of the wrong kind."""
    item = dict(zip(_PROBE_COLUMNS, values, strict=True))
    if not all(isinstance(item[key], str) for key in ("agent", "env", "split")):
        return None
    counts = (item["seed"], item["episodes"], item["transitions"])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in counts):
        return None
    if not all(item[key] is None or isinstance(item[key], (int, float)) for key in PROBE_METRICS):
        return None
    try:
        config = json.loads(item["config"])
    except (TypeError, ValueError):
        config = {}
    item["config"] = config if isinstance(config, dict) else {}
    for key in ("sp_template", "id_template", "policy_template", "envrl_version"):
        item[key] = str(item[key])
    return ProbeRecord(**item)


def _insert_episode(conn: sqlite3.Connection, record: EpisodeRecord, line: str) -> None:
    conn.execute(
        "INSERT OR IGNORE INTO episodes (run_id, episode_index, env_id, split, task_id, task_type, seed, "
        "agent, success, score, turns, valid_action_ratio, wall_time, error, finished_at, record) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            record.run_id,
            record.episode_index,
            record.env_id,
            record.split,
            record.task_id,
            record.task_type,
            record.seed,
            record.agent,
            int(record.success),
            record.score,
            record.turns,
            record.valid_action_ratio,
            record.wall_time,
            record.error,
            record.finished_at,
            line,
        ),
    )


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back for the duration (main thread, POSIX); they are delivered
    right after. Elsewhere a no-op: the JSONL-first order and the reconciliation on reopen
    still keep the two copies consistent."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class FileLock:
    """An exclusive, non-blocking ``flock`` held while this process writes a run (POSIX only;
    the kernel releases it when the process dies, however it dies)."""

    def __init__(self, path: Path):
        self.path = path
        self._fh: IO[str] | None = None

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no locking
            return
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip()
            fh.close()
            raise RunLocked(
                f"run directory {self.path.parent} is in use by another process"
                + (f" (pid {holder})" if holder else "")
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing the descriptor releases the flock
            self._fh = None


class RunWriter:
    """Writes the episodes of one run; opening it creates or resumes the run.

    On open: the database is opened for writing first (a store that cannot be written fails
    with :class:`StoreError` before anything is created); the run directory is locked; the
    run row is created, or checked against ``config`` (a difference in :data:`IDENTITY_KEYS`
    raises :class:`RunConfigMismatch`; the number of episodes planned grows to the larger
    value); the JSONL journal is read (a cut last line is dropped) and reconciled with SQLite
    in both directions. ``records`` then holds every episode recorded so far, by index.
    """

    def __init__(self, store: ResultStore, run_id: str, config: Mapping[str, Any]):
        self.store = store
        self.run_id = run_id
        self.run_dir = store.run_dir(run_id)
        self.jsonl_path = self.run_dir / JSONL_NAME
        self.config_path = self.run_dir / CONFIG_NAME
        self._lock = FileLock(self.run_dir / LOCK_NAME)
        self._conn: sqlite3.Connection | None = store.connect()
        self._jsonl = None
        try:
            with _store_errors(f"cannot open run {run_id!r} in {self.run_dir}"):
                self.run_dir.mkdir(exist_ok=True)
                self._lock.acquire()
                self.config = self._register(dict(config))
                self.records: dict[int, EpisodeRecord] = {}
                self.repaired = self._reconcile()
                self._jsonl = open(self.jsonl_path, "ab")
        except BaseException:
            self.close()
            raise

    # ---- opening --------------------------------------------------------------------

    def _register(self, config: dict[str, Any]) -> dict[str, Any]:
        assert self._conn is not None
        config = _jsonable(config)
        config["run_id"] = self.run_id
        now = time.time()
        row = self._conn.execute(
            "SELECT config, episodes_planned FROM runs WHERE run_id = ?", (self.run_id,)
        ).fetchone()
        if row is None and self.config_path.exists():
            # the database was removed or replaced but the run directory survived: its config stands
            on_disk = self._readable_config(self.config_path.read_text(encoding="utf-8"), str(self.config_path))
            on_disk["run_id"] = self.run_id
            self._conn.execute(
                "INSERT INTO runs (run_id, env, env_id, split, agent, seed, episodes_planned, config, created_at, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                self._run_row(on_disk, int(on_disk["episodes"]), now),
            )
            row = (json.dumps(on_disk), int(on_disk["episodes"]))
        if row is None:
            config.setdefault("created_at", now)
            self._conn.execute(
                "INSERT INTO runs (run_id, env, env_id, split, agent, seed, episodes_planned, config, created_at, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                self._run_row(config, int(config["episodes"]), now),
            )
            self._conn.commit()
            self._write_config(config)
            return config

        stored = self._readable_config(row[0], f"the database's row for run {self.run_id!r}")

        def identity(cfg: Mapping[str, Any], key: str) -> Any:
            return cfg.get(key, IDENTITY_DEFAULTS.get(key))

        differences = [k for k in IDENTITY_KEYS if identity(stored, k) != identity(config, k)]
        if differences:
            detail = "; ".join(f"{k}: stored {identity(stored, k)!r}, now {identity(config, k)!r}" for k in differences)
            raise RunConfigMismatch(
                f"run {self.run_id!r} already exists in {self.store.runs_dir} with a different setup ({detail}); "
                f"choose another run id (--run-id) to start a new run"
            )
        if stored.get("versions") != config.get("versions"):
            logger.warning(
                "run %s: package versions differ from when the run started (%s now %s)",
                self.run_id,
                stored.get("versions"),
                config.get("versions"),
            )
        planned = max(int(row[1]), int(config["episodes"]))
        stored["episodes"] = planned
        self._conn.execute(
            "UPDATE runs SET episodes_planned = ?, config = ?, updated_at = ? WHERE run_id = ?",
            (planned, json.dumps(stored, sort_keys=True), now, self.run_id),
        )
        self._conn.commit()
        self._write_config(stored)
        return stored

    def _readable_config(self, text: str, where: str) -> dict[str, Any]:
        """A stored run config that resuming can compare against; StoreError when it cannot be
        read, because resuming a run whose setup is unknown could mix two setups."""
        try:
            config = json.loads(text)
            int(config["episodes"])
            return dict(config)
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(
                f"cannot resume run {self.run_id!r}: its config in {where} cannot be read ({exc}); "
                f"choose another run id (--run-id)"
            ) from exc

    @staticmethod
    def _run_row(config: Mapping[str, Any], planned: int, now: float) -> tuple:
        return (
            config["run_id"],
            config.get("env", config["env_id"]),
            config["env_id"],
            config["split"],
            config["agent"],
            int(config["seed"]),
            planned,
            json.dumps(dict(config, episodes=planned), sort_keys=True),
            float(config.get("created_at", now)),
            now,
        )

    def _write_config(self, config: Mapping[str, Any]) -> None:
        tmp = self.config_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, self.config_path)

    def _reconcile(self) -> dict[str, int]:
        """Make JSONL and SQLite hold the same episodes; returns how many were copied each way."""
        assert self._conn is not None
        journal = read_jsonl(self.jsonl_path, repair=True)
        journal = [r for r in journal if r.run_id == self.run_id]
        in_db = self._readable_db_records({r.episode_index: r for r in journal})
        to_db = [r for r in journal if r.episode_index not in in_db]
        for record in to_db:
            _insert_episode(self._conn, record, record.to_json())
        self._conn.commit()
        if to_db:
            logger.warning(
                "run %s: %d episode(s) were in %s but not in the database (the run was stopped "
                "between the two writes); added them",
                self.run_id,
                len(to_db),
                JSONL_NAME,
            )
        for record in journal:
            self.records[record.episode_index] = record
        to_journal = [i for i in sorted(in_db) if i not in self.records]
        if to_journal:
            with open(self.jsonl_path, "ab") as fh:
                for index in to_journal:
                    record = in_db[index]
                    fh.write((record.to_json() + "\n").encode("utf-8"))
                    self.records[index] = record
                fh.flush()
                os.fsync(fh.fileno())
            logger.warning(
                "run %s: %d episode(s) were in the database but not in %s; added them",
                self.run_id,
                len(to_journal),
                JSONL_NAME,
            )
        return {"to_db": len(to_db), "to_jsonl": len(to_journal)}

    def _readable_db_records(self, journal: Mapping[int, EpisodeRecord]) -> dict[int, EpisodeRecord]:
        """This run's database records by index. An unreadable one is replaced by the
        journal's copy when there is one, else deleted so that its episode is played again
        (kept, it would block the new result: the database ignores a second row per index)."""
        assert self._conn is not None
        rows = self._conn.execute(
            "SELECT episode_index, record FROM episodes WHERE run_id = ?", (self.run_id,)
        ).fetchall()
        readable: dict[int, EpisodeRecord] = {}
        for index, line in rows:
            try:
                readable[int(index)] = parse_record(line)
                continue
            except MalformedRecord as exc:
                reason = str(exc)
            self._conn.execute("DELETE FROM episodes WHERE run_id = ? AND episode_index = ?", (self.run_id, index))
            fate = "replaced it with the journal's copy" if index in journal else "that episode will be played again"
            logger.warning(
                "run %s: the database record of episode %d cannot be read (%s); %s", self.run_id, index, reason, fate
            )
        return readable

    # ---- writing --------------------------------------------------------------------

    @property
    def done(self) -> set[int]:
        return set(self.records)

    def append(self, record: EpisodeRecord) -> None:
        """Record one finished episode: JSONL (fsynced) first, then SQLite. A second record for
        an index already present is ignored."""
        if self._jsonl is None or self._conn is None:
            raise RuntimeError("run writer is closed")
        if record.run_id != self.run_id:
            raise ValueError(f"record of run {record.run_id!r} appended to run {self.run_id!r}")
        if record.episode_index in self.records:
            logger.warning(
                "run %s: episode %d is already recorded; ignoring the second result", self.run_id, record.episode_index
            )
            return
        line = record.to_json()
        with (
            _signals_deferred(),
            _store_errors(f"cannot record episode {record.episode_index} of run {self.run_id!r} in {self.run_dir}"),
        ):
            # Ctrl-C lands after both writes, not between them
            self._jsonl.write((line + "\n").encode("utf-8"))
            self._jsonl.flush()
            os.fsync(self._jsonl.fileno())
            _insert_episode(self._conn, record, line)
            self._conn.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?", (time.time(), self.run_id))
            self._conn.commit()
            self.records[record.episode_index] = record

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._conn is not None:
            _rest_and_close(self._conn)
            self._conn = None
        self._lock.release()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def package_versions(packages: Iterable[str]) -> dict[str, str]:
    """Installed versions of ``packages`` (``"missing"`` when not installed), plus Python's."""
    from importlib import metadata

    versions = {"python": sys.version.split()[0]}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "missing"
    return versions
