"""Evaluation runs: play N episodes of one env split with one agent in K worker processes.

Which episode plays what
    Episode ``i`` (0-based) of a run plays task ``task_ids[i % len(task_ids)]`` of the split
    (the env's fixed, ordered ``env.unwrapped.task_ids``), resetting the env with
    ``seed=seed + i`` and ``options={"task_id": ...}`` and the agent with ``seed=seed + i``.
    So a run is a pure function of (env, split, agent, seed, env kwargs, episodes), however
    many workers play it and in whatever order episodes finish.

Workers
    Episodes are played in ``workers`` separate processes (the ALFWorld engine is not
    thread-safe), started with the ``forkserver`` method where available, else ``spawn``
    (never plain ``fork``: safe when the parent runs threads). Each worker builds its agent
    and env once and reuses them; after an episode that raised, it rebuilds both. Each worker
    talks to the parent over its own pipe, so one dying cannot corrupt the others' traffic.
    With ``ray_address`` (``envrl eval --ray ADDRESS``) the workers are Ray actors instead,
    on any node of a Ray cluster; everything below holds for them too (an actor that dies is
    replaced, its episode retried once), and the records are still written by the caller.

Failures
    * An exception in the env or the agent ends that episode: it is recorded with ``error``
      set (a failure) and the run goes on.
    * A worker process that dies during an episode (SIGKILL, a segfault in the engine, the
      OOM killer, or the optional ``episode_timeout``) is noticed through its process
      sentinel: a message is printed, a replacement worker is started and the episode is
      played once more; if it kills its worker again it is recorded with ``error`` set.
    * Ctrl-C (KeyboardInterrupt) stops the workers at once and closes the run; every episode
      finished so far is on disk and KeyboardInterrupt propagates to the caller.

Resume
    Results go to a :class:`~envrl.evaluation.store.RunWriter` as they finish. The default
    run id is derived from (env, split, agent spec and label, seed), so running the same
    command again reopens the run and plays only the episodes it has not recorded, and two
    different agents never share one.

Notes
    * The agent and the env are also built once in the calling process, to check the input
      (unknown split or agent, seeds outside numpy's range, tasks the agent says it cannot
      play: each fails fast, with a one-line message, before the run is registered) and to
      read the task list and the agent's ``env_kwargs``; agents with heavy state should load
      it lazily. Jobs are made as they are handed out, so the number of episodes planned
      costs no memory.
    * Worker processes import the caller's main module, as with any spawn/forkserver pool:
      a script that calls :func:`run_evaluation` must do so under
      ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import multiprocessing.connection
import os
import re
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Union

from envrl.processes import apply_environment, environment_snapshot, exit_reason
from envrl.processes import start_method as default_start_method
from envrl.evaluation.metrics import MetricsReport, compute_metrics, report_table
from envrl.evaluation.store import (
    EpisodeRecord,
    ResultStore,
    RunConfigMismatch,
    StepRecord,
    package_versions,
)

#: an agent spec for ``envrl.agents.make_agent`` ("random", "expert", "hf:...", ...), or a
#: picklable zero-argument callable that returns an agent (a top-level class or function)
AgentSpec = Union[str, Callable[[], Any]]

#: engine packages whose versions a run records, by short env name
ENGINE_PACKAGES: dict[str, tuple[str, ...]] = {
    "alfworld": ("alfworld", "textworld"),
    "webshop": ("flask", "bm25s", "rapidfuzz"),
    "scienceworld": ("scienceworld",),
    "textworld": ("textworld",),
}

#: packages whose versions can change an LLM agent's answers, by agent kind (the spec's prefix)
AGENT_PACKAGES: dict[str, tuple[str, ...]] = {
    "hf": ("torch", "transformers", "tokenizers"),
    "openai": ("openai",),
}

#: how often an episode whose worker died is played again before it is recorded as failed
MAX_RETRIES = 1

#: an episode that has not ended after this many steps is stopped (an env without step limit)
HARD_STEP_CAP = 10_000

#: longest error message kept in a record
MAX_ERROR_LENGTH = 500

#: seeds go to numpy's generators, which take 0 <= seed < 2**32
SEED_LIMIT = 2**32

#: task ids named in an error about tasks an agent cannot play
SHOWN_TASKS = 3


class EvaluationError(ValueError):
    """Bad input to an evaluation (unknown env, split or agent, episodes < 1, ...)."""


class RunFailed(RuntimeError):
    """The run could not go on (e.g. worker processes cannot start)."""


@dataclass
class RunSummary:
    """What :func:`run_evaluation` returns: the run's episodes ``0..episodes-1`` and metrics."""

    run_id: str
    run_dir: Path
    env_id: str
    split: str
    agent: str
    episodes_planned: int
    episodes_done: int
    episodes_played: int
    errors: int
    wall_time: float
    metrics: MetricsReport
    records: list[EpisodeRecord] = field(default_factory=list, repr=False)

    def format(self) -> str:
        """The text the CLI prints at the end of a run."""
        lines = [
            f"run {self.run_id}: {self.env_id} split={self.split} agent={self.agent}",
            f"episodes: {self.episodes_done}/{self.episodes_planned} recorded "
            f"({self.episodes_played} played now in {self.wall_time:.1f}s, {self.errors} with errors)",
            f"results: {self.run_dir}",
        ]
        stats = [r.agent_stats for r in self.records if r.agent_stats]
        if stats:
            total = {key: sum(int(s.get(key, 0)) for s in stats) for key in
                     ("responses", "format_invalid", "failed_requests", "prompt_tokens", "completion_tokens")}
            share = total["format_invalid"] / total["responses"] if total["responses"] else 0.0
            lines.append(f"model responses: {total['responses']} ({100 * share:.1f}% format-invalid, "
                         f"{total['failed_requests']} failed requests), tokens: {total['prompt_tokens']} prompt, "
                         f"{total['completion_tokens']} completion")
        lines += ["", report_table(self.metrics)]
        return "\n".join(lines)


# ---- names and ids ---------------------------------------------------------------------


def _env_ids() -> tuple[dict[str, str], str | None]:
    try:
        from envrl.envs import ENV_IDS
    except ImportError as exc:
        return {}, f"{type(exc).__name__}: {exc}"
    return dict(ENV_IDS), None


def resolve_env(env: str) -> tuple[str, str]:
    """``(short name, gymnasium id)`` for a short name ("alfworld"), a registered id, or a
    ``"module:id"`` id (gymnasium imports the module first; used by tests and plugins)."""
    import gymnasium as gym

    ids, problem = _env_ids()
    if env in ids:
        return env, ids[env]
    lowered = {name.lower(): name for name in ids}
    if env.lower() in lowered:
        name = lowered[env.lower()]
        return name, ids[name]
    for name, env_id in ids.items():
        if env == env_id:
            return name, env_id
    if ":" in env or env in gym.registry:
        return env, env
    known = ", ".join(sorted(ids)) if ids else f"none (envrl.envs could not be imported: {problem})"
    raise EvaluationError(f"unknown env {env!r}; known envs: {known}")


def default_run_id(env: str, split: str, agent: str, seed: int) -> str:
    """``<env>-<split>-<agent>-s<seed>`` with characters other than ``[A-Za-z0-9._-]`` as
    ``_`` (e.g. ``alfworld-valid_unseen-expert-s0``). The same command gives the same id,
    which is what makes re-running it resume. ``agent`` should name the agent fully
    (:func:`agent_run_name`): two agents must never share a default id."""
    raw = f"{env}-{split}-{agent}-s{seed}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("._") or "run"


def agent_run_name(agent_spec: AgentSpec, agent_label: str) -> str:
    """The agent's part of a default run id: its label (which may add settings, e.g. an LLM
    agent's template) and the whole spec, whichever holds the other, else both. The spec is
    always in it, because an agent's label need not say everything its spec does (the
    hand-coded and the planner expert were once both labelled ``expert``)."""
    if not isinstance(agent_spec, str) or agent_spec in agent_label:
        return agent_label
    if agent_label in agent_spec:
        return agent_spec
    return f"{agent_spec}-{agent_label}"


def _check_seeds(seed: Any, episodes: int) -> None:
    """Every seed of the run (``seed .. seed + episodes - 1``) must be one numpy accepts:
    a bad one would make every episode an error that no resume can fix."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise EvaluationError(f"seed must be an integer, got {seed!r}")
    if not 0 <= seed < SEED_LIMIT:
        raise EvaluationError(f"seed must be in 0..{SEED_LIMIT - 1} (numpy's range), got {seed}")
    if seed + episodes > SEED_LIMIT:
        raise EvaluationError(f"episode i uses seed {seed} + i, so {episodes} episodes need seed <= "
                              f"{SEED_LIMIT - episodes} (seeds stop at {SEED_LIMIT - 1}), got {seed}")


def _check_run_id(run_id: str) -> None:
    if not run_id or run_id in (".", "..") or "/" in run_id or "\\" in run_id or "\0" in run_id:
        raise EvaluationError(f"invalid run id {run_id!r}: it names a directory, so no slashes")


def _envrl_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("envrl")
    except metadata.PackageNotFoundError:
        try:
            import envrl

            return str(getattr(envrl, "__version__", "unknown"))
        except ImportError:  # pragma: no cover
            return "unknown"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or repr(exc)
    if isinstance(exc, KeyError) and len(exc.args) == 1:
        text = str(exc.args[0])
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 3] + "..."


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_one_line(exc)}"


# ---- building agents and envs (in the parent for checking, in each worker for playing) ---


@dataclass(frozen=True)
class _Setup:
    """Everything a worker needs to build its agents and envs and to label its records."""

    env_id: str
    split: str
    env_kwargs: dict[str, Any]
    agent_spec: AgentSpec
    agent_options: dict[str, Any]
    env_name: str
    run_id: str
    agent_label: str
    batch_size: int = 1


def _build_agent(agent_spec: AgentSpec, env_name: str, agent_options: Mapping[str, Any] | None = None) -> Any:
    if isinstance(agent_spec, str):
        from envrl.agents import make_agent

        return make_agent(agent_spec, env_name, options=agent_options or None)
    return agent_spec()


def _build_agents(setup: _Setup) -> list[Any]:
    """``batch_size`` agents; LLM agents are siblings that share one back end (one model)."""
    first = _build_agent(setup.agent_spec, setup.env_name, setup.agent_options)
    agents = [first]
    while len(agents) < setup.batch_size:
        sibling = getattr(first, "sibling", None)
        agents.append(sibling() if callable(sibling) else _build_agent(setup.agent_spec, setup.env_name,
                                                                         setup.agent_options))
    return agents


def _build_env(env_id: str, split: str, env_kwargs: Mapping[str, Any]) -> Any:
    import gymnasium as gym

    return gym.make(env_id, split=split, **dict(env_kwargs))


def _close(obj: Any) -> None:
    close = getattr(obj, "close", None)
    if callable(close):
        try:
            close()
        except Exception:
            pass


def _agent_label(agent_spec: AgentSpec, agent: Any) -> str:
    if isinstance(agent_spec, str):
        return str(getattr(agent, "name", None) or agent_spec)
    return str(getattr(agent, "name", None) or getattr(agent_spec, "__name__", type(agent).__name__))


# ---- playing episodes (in a worker process or a Ray actor) ------------------------------


class _Episode:
    """One episode in progress: the env's latest answer and the trajectory so far."""

    def __init__(self, setup: _Setup, env: Any, agent: Any, index: int, task_id: str, seed: int):
        self.setup, self.env, self.agent = setup, env, agent
        self.index, self.task_id, self.seed = index, task_id, seed
        self.start = time.perf_counter()
        self.trajectory: list[StepRecord] = []
        self.task_type = ""
        self.initial_observation = ""
        self.observation = ""
        self.info: dict[str, Any] = {}
        self.success = False
        self.score = 0.0
        self.error: str | None = None

    def begin(self) -> None:
        """Reset the env on this episode's task and the agent with its seed (may raise)."""
        self.observation, self.info = self.env.reset(seed=self.seed, options={"task_id": self.task_id})
        self.task_type = str(self.info.get("task_type", ""))
        self.initial_observation = str(self.observation)
        self.agent.reset(seed=self.seed)

    def apply(self, action: str) -> bool:
        """Play ``action``; True when the episode is over (may raise)."""
        agent_info = getattr(self.agent, "step_info", None)
        self.observation, reward, terminated, truncated, self.info = self.env.step(action)
        self.trajectory.append(StepRecord(action=str(action), observation=str(self.observation),
                                          reward=float(reward), valid=bool(self.info.get("valid_action", True)),
                                          agent_info=dict(agent_info) if agent_info else None))
        self.success = bool(self.info.get("success", False))
        self.score = float(self.info.get("score", 0.0))
        if terminated or truncated:
            return True
        if len(self.trajectory) >= HARD_STEP_CAP:
            self.error = f"episode did not end within {HARD_STEP_CAP} steps (no step limit?)"
            return True
        return False

    def record(self, exc: BaseException | None = None) -> EpisodeRecord:
        """The finished episode; ``exc`` is the exception that ended it, if any."""
        if exc is not None:
            self.error = _describe(exc)
        stats = getattr(self.agent, "episode_stats", None)
        turns = len(self.trajectory)
        s = self.setup
        return EpisodeRecord(
            run_id=s.run_id, episode_index=self.index, env_id=s.env_id, split=s.split, task_id=self.task_id,
            task_type=self.task_type, seed=self.seed, agent=s.agent_label,
            success=self.success and self.error is None, score=self.score, turns=turns,
            valid_action_ratio=(sum(step.valid for step in self.trajectory) / turns) if turns else None,
            wall_time=time.perf_counter() - self.start, error=self.error, trajectory=self.trajectory,
            initial_observation=self.initial_observation, finished_at=time.time(),
            agent_stats=stats() if callable(stats) else None,
        )


class _Slots:
    """``batch_size`` (env, agent) pairs played in lockstep: each turn, every slot with an
    episode in progress gets its action from one :func:`~envrl.agents.base.act_batch` call
    (one batched generation for LLM agents). ``report(kind, payload)`` receives
    ``("started", (index, task_type))`` and ``("done", record)``.

    An exception in one env, or in one agent that acts on its own, ends that episode only (its
    env or agent is rebuilt); an exception in batched agents' shared ``act_batch`` call ends every
    episode in that call (the agents are rebuilt)."""

    def __init__(self, setup: _Setup, report: Callable[[str, Any], None]):
        self.setup = setup
        self.report = report
        self.agents = _build_agents(setup)
        self.envs: list[Any] = []
        try:
            self.envs = [_build_env(setup.env_id, setup.split, setup.env_kwargs) for _ in range(setup.batch_size)]
        except BaseException:
            self.close()
            raise
        self.episodes: list[_Episode | None] = [None] * setup.batch_size

    def free(self) -> int:
        return sum(1 for e in self.episodes if e is None)

    def busy(self) -> bool:
        return any(e is not None for e in self.episodes)

    def start(self, index: int, task_id: str, seed: int) -> None:
        slot = self.episodes.index(None)
        episode = _Episode(self.setup, self.envs[slot], self.agents[slot], index, task_id, seed)
        self.episodes[slot] = episode
        try:
            episode.begin()
        except Exception as exc:
            self._finish(slot, exc)
            return
        self.report("started", (index, episode.task_type))

    def turn(self) -> None:
        """One action for every episode in progress."""
        from envrl.agents.base import act_batch, is_batched

        active = [i for i, e in enumerate(self.episodes) if e is not None]
        if not active:
            return
        episodes = [self.episodes[i] for i in active]
        if not all(is_batched(e.agent) for e in episodes):
            actions = []  # agents that act one by one: an exception ends only its own episode
            for i, episode in zip(list(active), list(episodes)):
                try:
                    actions.append(episode.agent.act(episode.observation, episode.info))
                except Exception as exc:
                    self._finish(i, exc, rebuild_env=False)
                    slot = active.index(i)
                    del active[slot], episodes[slot]
                    self.agents[i] = _build_agent(self.setup.agent_spec, self.setup.env_name,
                                                  self.setup.agent_options)
        else:
            try:  # one generate call for all of them: if it fails, every episode in it ends
                actions = act_batch([e.agent for e in episodes], [e.observation for e in episodes],
                                    [e.info for e in episodes])
            except Exception as exc:
                for i in active:
                    self._finish(i, exc, rebuild_env=False)
                for agent in self.agents:
                    _close(agent)
                self.agents = _build_agents(self.setup)
                return
        for i, episode, action in zip(active, episodes, actions):
            try:
                ended = episode.apply(action)
            except Exception as exc:
                self._finish(i, exc)
                continue
            if ended:
                self._finish(i, None)

    def _finish(self, slot: int, exc: BaseException | None, rebuild_env: bool = True) -> None:
        episode = self.episodes[slot]
        self.episodes[slot] = None
        self.report("done", episode.record(exc))
        if exc is not None and rebuild_env:  # the exception may have left the engine in a bad state
            _close(self.envs[slot])
            self.envs[slot] = _build_env(self.setup.env_id, self.setup.split, self.setup.env_kwargs)

    def close(self) -> None:
        for env in self.envs:
            _close(env)
        for agent in self.agents:
            _close(agent)


def _worker_main(conn: Any, environ: dict[str, str], setup: _Setup) -> None:
    """Entry point of a worker process: build once, then play the episodes it is sent,
    ``setup.batch_size`` at a time, until told to stop."""
    apply_environment(environ)
    # Ctrl-C in a terminal reaches the whole process group; the parent decides what stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    global _PARENT_PID
    _PARENT_PID = os.getppid()

    def report(kind: str, payload: Any) -> None:
        conn.send(("started", *payload) if kind == "started" else ("done", payload.to_dict()))

    try:
        slots = _Slots(setup, report)
    except Exception as exc:
        try:
            conn.send(("init_error", _describe(exc)))
        except OSError:
            pass
        return
    queue: deque[tuple[int, str, int]] = deque()
    try:
        conn.send(("ready", os.getpid()))
        while True:
            try:
                # wait for work when idle; otherwise only pick up what has arrived
                while (not slots.busy() and not queue) or conn.poll():
                    message = conn.recv()
                    if message[0] != "play":
                        return
                    queue.append(message[1:])
            except (EOFError, OSError):
                return  # the parent is gone
            while queue and slots.free():
                slots.start(*queue.popleft())
            if _orphaned():
                os._exit(0)
            slots.turn()
    except (BrokenPipeError, OSError):
        return
    finally:
        slots.close()


#: the worker's parent (the runner, or the forkserver, which exits with the runner)
_PARENT_PID: int | None = None


def _orphaned() -> bool:
    """True in a worker whose runner is gone: its episode is then pointless, so it exits."""
    return _PARENT_PID is not None and os.getppid() != _PARENT_PID


# ---- the parent side -------------------------------------------------------------------


@dataclass
class _Job:
    index: int
    task_id: str
    seed: int
    attempts: int = 0
    started: float = 0.0  # when it was sent to its worker (time.monotonic)
    task_type: str = ""


class _JobQueue:
    """The jobs still to play: episodes not yet handed out, made one at a time from their
    indices (a run of a billion episodes must not build a billion jobs up front), and jobs
    given back for a retry, which go first."""

    def __init__(self, indices: Iterable[int] = (), count: int = 0,
                 make: Callable[[int], _Job] | None = None) -> None:
        self._fresh: Iterator[int] = iter(indices)
        self._fresh_left = count
        self._make = make
        self._retries: deque[_Job] = deque()

    @classmethod
    def of(cls, jobs: Iterable[_Job]) -> "_JobQueue":
        queue = cls()
        queue.extend(jobs)
        return queue

    def extend(self, jobs: Iterable[_Job]) -> None:
        self._retries.extend(jobs)

    def appendleft(self, job: _Job) -> None:
        self._retries.appendleft(job)

    def popleft(self) -> _Job:
        if self._retries:
            return self._retries.popleft()
        if self._fresh_left <= 0 or self._make is None:
            raise IndexError("no job left")
        self._fresh_left -= 1
        return self._make(next(self._fresh))

    def __len__(self) -> int:
        return len(self._retries) + self._fresh_left


class _Worker:
    """The parent's handle on one worker process, which plays up to ``capacity`` jobs at once."""

    def __init__(self, ctx: Any, args: tuple, capacity: int = 1) -> None:
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child_conn, *args), name="envrl-eval-worker")
        self.proc.start()
        child_conn.close()
        self.conn = parent_conn
        self.capacity = capacity
        self.ready = False
        self.jobs: dict[int, _Job] = {}
        self.kill_reason: str | None = None

    def assign(self, job: _Job) -> bool:
        """Send ``job`` to the worker; False if it is already gone (its death is noticed next)."""
        try:
            self.conn.send(("play", job.index, job.task_id, job.seed))
        except (BrokenPipeError, ConnectionError, OSError):
            self.ready = False
            return False
        job.started = time.monotonic()
        job.task_type = ""
        self.jobs[job.index] = job
        return True

    def stop(self, graceful: bool) -> None:
        if graceful and self.proc.is_alive():
            try:
                self.conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


def _say(message: str) -> None:
    from tqdm import tqdm

    tqdm.write(message, file=sys.stderr)


class _Pool:
    """Plays jobs in worker processes and hands each finished record to ``on_record``."""

    def __init__(self, size: int, worker_args: tuple, on_record: Callable[[EpisodeRecord], None], *,
                 run_id: str, env_id: str, split: str, agent_label: str, episode_timeout: float | None,
                 start_method: str, batch_size: int = 1) -> None:
        self.ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            # workers fork from a server that already imported this module: fast start-up
            self.ctx.set_forkserver_preload(["envrl.evaluation.runner"])
        self.size = size
        self.batch_size = batch_size
        self.worker_args = worker_args
        self.on_record = on_record
        self.run_id, self.env_id, self.split, self.agent_label = run_id, env_id, split, agent_label
        self.episode_timeout = episode_timeout
        self.workers: list[_Worker] = []
        self.pending = _JobQueue()
        self.startup_failures = 0

    def run(self, jobs: Iterable[_Job] | _JobQueue) -> None:
        self.pending = jobs if isinstance(jobs, _JobQueue) else _JobQueue.of(jobs)
        graceful = False
        try:
            while self.pending or any(w.jobs for w in self.workers):
                self._top_up()
                self._dispatch()
                self._wait_and_handle()
            graceful = True
        finally:
            for worker in self.workers:
                worker.stop(graceful)
            self.workers.clear()

    def _top_up(self) -> None:
        busy = sum(1 for w in self.workers if w.jobs)
        wanted = busy + -(-len(self.pending) // self.batch_size)  # workers that would have work
        while len(self.workers) < min(self.size, wanted):
            self.workers.append(_Worker(self.ctx, self.worker_args, self.batch_size))

    def _dispatch(self) -> None:
        for worker in self.workers:
            while self.pending and worker.ready and len(worker.jobs) < worker.capacity:
                job = self.pending.popleft()
                if not worker.assign(job):
                    self.pending.appendleft(job)
                    break

    def _wait_and_handle(self) -> None:
        waitables: list[Any] = []
        for worker in self.workers:
            waitables += [worker.conn, worker.proc.sentinel]
        timeout = 1.0 if self.episode_timeout is None else min(1.0, max(0.05, self.episode_timeout / 4))
        ready = set(mp.connection.wait(waitables, timeout=timeout))
        now = time.monotonic()
        for worker in list(self.workers):
            lost = False
            if worker.conn in ready:
                try:
                    while worker.conn.poll():
                        self._handle_message(worker, worker.conn.recv())
                except (EOFError, OSError):
                    lost = True
            if worker.proc.sentinel in ready:
                lost = True
            if lost:
                self._handle_death(worker)
            elif (self.episode_timeout is not None and worker.kill_reason is None
                  and any(now - job.started > self.episode_timeout for job in worker.jobs.values())):
                worker.kill_reason = f"an episode exceeded its {self.episode_timeout:g}s timeout"
                worker.proc.kill()

    def _handle_message(self, worker: _Worker, message: tuple) -> None:
        kind = message[0]
        if kind == "ready":
            worker.ready = True
        elif kind == "started":
            job = worker.jobs.get(int(message[1]))
            if job is not None:
                job.task_type = str(message[2])
        elif kind == "done":
            record = EpisodeRecord.from_dict(message[1])
            worker.jobs.pop(record.episode_index, None)
            self.startup_failures = 0
            self.on_record(record)
        elif kind == "init_error":
            raise RunFailed(f"a worker process could not build the agent and env: {message[1]}")

    def _handle_death(self, worker: _Worker) -> None:
        worker.proc.join(timeout=5)
        reason = worker.kill_reason or exit_reason(worker.proc.exitcode)
        worker.conn.close()
        self.workers.remove(worker)
        if not worker.jobs:
            self._worker_lost(worker.proc.pid, reason, None)
        for job in sorted(worker.jobs.values(), key=lambda j: j.index, reverse=True):
            self._worker_lost(worker.proc.pid, reason, job)

    #: what a worker is called in messages (one, several)
    worker_noun, workers_noun = "worker process", "worker processes"

    def _worker_lost(self, pid: Any, reason: str, job: _Job | None) -> None:
        """A worker is gone: its episode (if any) is retried once, then recorded as failed.
        (With ``batch_size`` > 1 every episode the worker was playing counts one attempt.)"""
        noun = self.worker_noun
        if job is None:
            self.startup_failures += 1
            _say(f"envrl: {noun} {pid} died ({reason}) while idle; starting a new one")
            if self.startup_failures > self.size + 3:
                raise RunFailed(
                    f"{self.workers_noun} keep dying before playing any episode (last: {reason}); if you call "
                    f"run_evaluation from a script, put the call under `if __name__ == \"__main__\":` "
                    f"(worker processes import the main module)")
            return
        job.attempts += 1
        where = f"episode {job.index} (task {job.task_id}, seed {job.seed})"
        if job.attempts <= MAX_RETRIES:
            _say(f"envrl: {noun} {pid} died ({reason}) during {where}; "
                 f"starting a new worker and retrying that episode once")
            self.pending.appendleft(job)
            return
        _say(f"envrl: {noun} {pid} died again ({reason}) during {where}; "
             f"recording it as failed and going on")
        self.on_record(EpisodeRecord(
            run_id=self.run_id, episode_index=job.index, env_id=self.env_id, split=self.split,
            task_id=job.task_id, task_type=job.task_type, seed=job.seed, agent=self.agent_label,
            success=False, score=0.0, turns=0, valid_action_ratio=None,
            wall_time=time.monotonic() - job.started,
            error=f"{noun} died {job.attempts} times during this episode ({reason})",
            finished_at=time.time(),
        ))


# ---- Ray actors instead of worker processes (``--ray``) ---------------------------------


class _EpisodeActor:
    """A Ray actor that plays episodes exactly as a worker process does (:class:`_Slots`):
    it builds its agents and envs once and returns the records of each batch it is given."""

    def __init__(self, environ: dict[str, str], setup: _Setup) -> None:
        from envrl.ray_cluster import apply_forwarded_environment

        apply_forwarded_environment(environ)
        self.records: list[dict[str, Any]] = []
        self.slots: _Slots | None = None
        self.init_error: str | None = None
        try:
            self.slots = _Slots(setup, self._report)
        except Exception as exc:
            self.init_error = _describe(exc)

    def _report(self, kind: str, payload: Any) -> None:
        if kind == "done":
            self.records.append(payload.to_dict())

    def ready(self) -> tuple[str, Any]:
        return ("init_error", self.init_error) if self.init_error else ("ready", os.getpid())

    def play(self, jobs: list[tuple[int, str, int]]) -> list[dict[str, Any]]:
        """Play ``jobs`` (index, task id, seed), at most ``batch_size`` of them, in lockstep."""
        self.records = []
        for job in jobs:
            self.slots.start(*job)
        while self.slots.busy():
            self.slots.turn()
        return self.records

    def close(self) -> None:
        if self.slots is not None:
            self.slots.close()


@dataclass
class _ActorSlot:
    actor: Any
    ref: Any = None  # the call in flight: ready() until it answers, then play()
    pid: Any = "?"
    ready: bool = False
    jobs: list[_Job] = field(default_factory=list)
    kill_reason: str | None = None


class _RayPool(_Pool):
    """:class:`_Pool` with Ray actors instead of worker processes: the same jobs, retries,
    timeouts and records (written here, by the driver). ``worker_args`` start with the
    forwarded environment (:func:`envrl.envs.vector_ray.forwarded_environment`)."""

    worker_noun, workers_noun = "Ray actor", "Ray actors"

    def __init__(self, size: int, worker_args: tuple, on_record: Callable[[EpisodeRecord], None], *,
                 ray_address: str, **kwargs: Any) -> None:
        super().__init__(size, worker_args, on_record, start_method="spawn", **kwargs)
        self.ray_address = ray_address
        self.slots: list[_ActorSlot] = []

    def run(self, jobs: Iterable[_Job] | _JobQueue) -> None:
        import ray

        from envrl.ray_cluster import DEFAULT_NUM_CPUS, connect_ray, kill_actor, release_ray, remote_class

        try:
            owned = connect_ray(self.ray_address)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RunFailed(f"cannot connect to Ray at {self.ray_address!r}: {_one_line(exc)}") from exc
        self.actor_class = remote_class(_EpisodeActor).options(num_cpus=DEFAULT_NUM_CPUS, max_restarts=0)
        self.pending = jobs if isinstance(jobs, _JobQueue) else _JobQueue.of(jobs)
        graceful = False
        try:
            while self.pending or any(s.jobs for s in self.slots):
                busy = sum(1 for s in self.slots if s.jobs)
                while len(self.slots) < min(self.size, busy + -(-len(self.pending) // self.batch_size)):
                    slot = _ActorSlot(self.actor_class.remote(*self.worker_args))
                    slot.ref = slot.actor.ready.remote()
                    self.slots.append(slot)
                for slot in self.slots:
                    if self.pending and slot.ready and not slot.jobs:
                        while self.pending and len(slot.jobs) < self.batch_size:
                            job = self.pending.popleft()
                            job.started = time.monotonic()
                            slot.jobs.append(job)
                        slot.ref = slot.actor.play.remote([(j.index, j.task_id, j.seed) for j in slot.jobs])
                timeout = 1.0 if self.episode_timeout is None else min(1.0, max(0.05, self.episode_timeout / 4))
                refs = [s.ref for s in self.slots if s.ref is not None]
                done, _ = ray.wait(refs, num_returns=1, timeout=timeout) if refs else ([], [])
                for slot in [s for s in self.slots if s.ref in done]:
                    self._handle_reply(slot, ray.get, kill_actor)
                now = time.monotonic()
                for slot in self.slots:
                    if (self.episode_timeout is not None and slot.jobs and slot.kill_reason is None
                            and now - slot.jobs[0].started > self.episode_timeout):
                        slot.kill_reason = f"an episode exceeded its {self.episode_timeout:g}s timeout"
                        kill_actor(slot.actor)
            graceful = True
        finally:
            try:
                if graceful and self.slots:
                    closing = [s.actor.close.remote() for s in self.slots]
                    ray.wait(closing, num_returns=len(closing), timeout=5)
                for slot in self.slots:
                    kill_actor(slot.actor)
            finally:
                self.slots.clear()
                release_ray(owned)

    def _handle_reply(self, slot: _ActorSlot, get: Callable[[Any], Any], kill: Callable[[Any], None]) -> None:
        ref, slot.ref = slot.ref, None
        try:
            kind, value = ("done", get(ref)) if slot.jobs else get(ref)
        except Exception as exc:  # the actor died (or play() raised: its actor is replaced too)
            kill(slot.actor)
            self.slots.remove(slot)
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            reason = slot.kill_reason or f"{type(exc).__name__}: {lines[-1] if lines else exc!r}"
            if not slot.jobs:
                self._worker_lost(slot.pid, reason, None)
            for job in reversed(slot.jobs):
                self._worker_lost(slot.pid, reason, job)
            return
        if kind == "init_error":
            raise RunFailed(f"a Ray actor could not build the agent and env: {value}")
        if kind == "ready":
            slot.ready, slot.pid = True, value
            return
        slot.jobs = []
        self.startup_failures = 0
        for record in value:
            self.on_record(EpisodeRecord.from_dict(record))


@dataclass(frozen=True)
class _Probe:
    """What the parent learns from making the env once, before the run is registered."""

    task_ids: list[str]
    step_limit: int | None
    unplayable: dict[str, str]  # task id -> why the agent cannot play it (tasks this run would play)


def _probe_env(env_id: str, split: str, env_kwargs: Mapping[str, Any], agent: Any = None,
               episodes: int | None = None) -> _Probe:
    """Make the env once and read the split's task ids and the step limit, and ask ``agent``
    (its optional ``unplayable_tasks(env, task_ids)``) which of the tasks the run would play
    it cannot play. Bad input becomes EvaluationError (an env may reject an unknown split in
    ``gym.make`` or only when asked for its tasks); any other failure RunFailed, one line."""
    import gymnasium as gym

    what = f"cannot make {env_id} with split={split!r}"
    env = None
    try:
        env = _build_env(env_id, split, env_kwargs)
        step_limit = getattr(env.spec, "max_episode_steps", None) if env.spec is not None else None
        task_ids = [str(t) for t in env.unwrapped.task_ids]
        played = task_ids if episodes is None else task_ids[:episodes]
        check = getattr(agent, "unplayable_tasks", None)
        unplayable = dict(check(env.unwrapped, played)) if callable(check) and played else {}
        return _Probe(task_ids, step_limit, unplayable)
    except ModuleNotFoundError as exc:
        missing = exc.name or getattr(exc.__cause__, "name", None)
        if ":" in env_id and missing and env_id.startswith(missing.split(".")[0]):  # "module:id" typo
            raise EvaluationError(f"{what}: {_one_line(exc)}") from exc
        raise RunFailed(f"{what}: {_describe(exc)}") from exc
    except (ValueError, KeyError, TypeError, gym.error.Error) as exc:
        raise EvaluationError(f"{what}: {_one_line(exc)}") from exc
    except Exception as exc:  # missing data, a broken engine: one line, and nothing registered
        raise RunFailed(f"{what}: {_describe(exc)}") from exc
    finally:
        if env is not None:
            _close(env)


def _check_playable(agent_label: str, split: str, probe: _Probe, episodes: int) -> None:
    """EvaluationError naming the tasks the agent has said it cannot play: each would be
    recorded as an errored episode (and never retried), so the run is refused up front."""
    if not probe.unplayable:
        return
    played = min(episodes, len(probe.task_ids))
    shown = ", ".join(list(probe.unplayable)[:SHOWN_TASKS])
    more = len(probe.unplayable) - SHOWN_TASKS
    reasons = "; ".join(sorted(set(probe.unplayable.values())))
    raise EvaluationError(
        f"agent {agent_label!r} cannot play {len(probe.unplayable)} of the {played} tasks of split {split!r} "
        f"this run would play ({reasons}): {shown}{f' and {more} more' if more > 0 else ''}")


def _build_checked_agent(agent_spec: AgentSpec, env_short: str, agent_options: Mapping[str, Any]) -> Any:
    """The agent, built once to check the spec: a bad spec is EvaluationError, any other
    failure to build it RunFailed, both one line."""
    try:
        return _build_agent(agent_spec, env_short, agent_options)
    except ImportError as exc:
        raise EvaluationError(f"cannot load agent {agent_spec!r}: {_describe(exc)}") from exc
    except (ValueError, KeyError, LookupError) as exc:
        message = _one_line(exc)
        if not (isinstance(agent_spec, str) and agent_spec in message):
            message = f"agent {agent_spec!r}: {message}"
        raise EvaluationError(message) from exc
    except Exception as exc:
        raise RunFailed(f"cannot build agent {agent_spec!r}: {_describe(exc)}") from exc


def _check_counts(episodes: Any, workers: Any, episode_timeout: float | None, batch_size: Any, seed: Any) -> None:
    """The numeric arguments, checked before anything is built or written."""
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise EvaluationError(f"episodes must be an integer >= 1, got {episodes!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise EvaluationError(f"workers must be an integer >= 1, got {workers!r}")
    if episode_timeout is not None and episode_timeout <= 0:
        raise EvaluationError(f"episode_timeout must be > 0, got {episode_timeout!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise EvaluationError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    _check_seeds(seed, episodes)


def _missing_jobs(recorded: Mapping[int, EpisodeRecord], episodes: int, task_ids: list[str],
                  seed: int) -> _JobQueue:
    """The episodes ``0..episodes-1`` not recorded yet, as a queue that makes each job only
    when it is handed out: memory stays flat however many episodes are planned."""
    done = sum(1 for i in recorded if 0 <= i < episodes)

    def make(i: int) -> _Job:
        return _Job(index=i, task_id=task_ids[i % len(task_ids)], seed=seed + i)

    indices = (i for i in range(episodes) if i not in recorded)
    return _JobQueue(indices, episodes - done, make)


def run_evaluation(
    env_name: str,
    split: str,
    agent_spec: AgentSpec,
    episodes: int,
    workers: int = 1,
    seed: int = 0,
    run_id: str | None = None,
    runs_dir: str | os.PathLike[str] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    progress: bool = True,
    *,
    episode_timeout: float | None = None,
    start_method: str | None = None,
    ray_address: str | None = None,
    agent_options: Mapping[str, Any] | None = None,
    batch_size: int = 1,
) -> RunSummary:
    """Play episodes ``0..episodes-1`` of ``env_name``/``split`` with ``agent_spec`` and record them.

    ``env_name`` is a short name from ``envrl.envs.ENV_IDS`` ("alfworld") or a gymnasium id.
    ``agent_spec`` is a spec for ``envrl.agents.make_agent`` or a picklable callable returning
    an agent. The agent's ``env_kwargs`` attribute (if any) is merged under ``env_kwargs``
    and both go to ``gym.make`` (e.g. ``{"max_episode_steps": 20}``). The agent and env are
    built once here, to check the input and read the task list, then in each worker.

    Re-running with the same run id (by default derived from env, split, agent and seed)
    resumes: only episodes not yet recorded are played. Raises :class:`EvaluationError` on bad
    input (checked before the run is registered: seeds ``seed .. seed + episodes - 1`` must be
    in ``0 .. 2**32 - 1``; an agent with ``unplayable_tasks(env, task_ids)`` must be able to
    play every task the run would play), :class:`RunFailed` when the agent or env cannot be
    built or workers cannot start, :class:`~envrl.evaluation.store.StoreError` when the runs
    directory cannot be written, :class:`~envrl.evaluation.store.RunLocked` if another
    process writes the run, and lets KeyboardInterrupt through after closing the run cleanly.

    ``agent_options`` are an LLM agent's settings (template, history, temperature, top_p,
    max_new_tokens, back-end settings; see :class:`envrl.agents.llm.LLMOptions`).
    ``batch_size`` episodes play side by side in each worker, their actions chosen together
    (one batched generation for an LLM agent): ``workers * batch_size`` episodes at a time.

    ``ray_address`` plays the episodes on ``workers`` Ray actors instead of worker processes:
    a cluster's address, ``"auto"`` (a running cluster, else a new local instance) or
    ``"local"`` (a new local instance); see :mod:`envrl.envs.vector_ray`. Records are still
    written here, and an episode whose actor dies is retried once, as with processes.
    """
    wall_start = time.perf_counter()
    _check_counts(episodes, workers, episode_timeout, batch_size, seed)
    agent_options = {k: v for k, v in dict(agent_options or {}).items() if v is not None}
    if ray_address is not None:
        try:
            import ray  # noqa: F401
        except ImportError as exc:
            raise EvaluationError("playing on Ray needs Ray: pip install 'envrl[ray]'") from exc
    env_short, env_id = resolve_env(env_name)

    # Build the agent and the env once here: bad input fails now, with a clear message, and
    # before anything is written to the store (a run that cannot start is never registered).
    agent = _build_checked_agent(agent_spec, env_short, agent_options)
    try:
        agent_label = _agent_label(agent_spec, agent)
        merged_kwargs = dict(getattr(agent, "env_kwargs", None) or {})
        merged_kwargs.update(env_kwargs or {})
        protocol_of = getattr(agent, "protocol", None)
        agent_protocol = dict(protocol_of()) if callable(protocol_of) else {}
        probe = _probe_env(env_id, split, merged_kwargs, agent, episodes)
    finally:
        _close(agent)
        del agent
    task_ids, step_limit = probe.task_ids, probe.step_limit
    if not task_ids:
        raise EvaluationError(f"split {split!r} of {env_id} has no tasks")
    _check_playable(agent_label, split, probe, episodes)

    run_id = run_id or default_run_id(env_short, split, agent_run_name(agent_spec, agent_label), seed)
    _check_run_id(run_id)
    env_package = ENGINE_PACKAGES.get(env_short, ())
    config = {
        "env": env_short,
        "env_id": env_id,
        "split": split,
        "agent": agent_label,
        "episodes": episodes,
        "seed": seed,
        "env_kwargs": merged_kwargs,
        "step_limit": step_limit,
        "agent_options": agent_options,
        "agent_protocol": agent_protocol,
        "workers": workers,
        "batch_size": batch_size,
        "backend": "ray" if ray_address is not None else "processes",
        "task_count": len(task_ids),
        "task_ids_sha256": hashlib.sha256("\n".join(task_ids).encode("utf-8")).hexdigest(),
        "episode_rule": "episode i plays task_ids[i % task_count] with seed + i",
        "versions": dict(package_versions(("gymnasium", *env_package)), envrl=_envrl_version()),
    }
    agent_kind = agent_spec.split(":", 1)[0] if isinstance(agent_spec, str) else ""
    if agent_kind in AGENT_PACKAGES:  # recorded, not part of the env-side protocol the leaderboard compares
        config["agent_versions"] = package_versions(AGENT_PACKAGES[agent_kind])
    store = ResultStore(runs_dir)
    try:
        writer = store.open_run(run_id, config)
    except RunConfigMismatch as exc:
        raise EvaluationError(str(exc)) from exc

    bar = None
    played = 0
    try:
        jobs = _missing_jobs(writer.records, episodes, task_ids, seed)
        recorded = episodes - len(jobs)
        if jobs and recorded:
            _say(f"envrl: resuming run {run_id}: {recorded} of {episodes} episodes already "
                 f"recorded, playing the other {len(jobs)}")
        if jobs:
            from tqdm import tqdm

            bar = tqdm(total=episodes, initial=recorded, desc=run_id, unit="ep",
                       disable=not progress, file=sys.stderr, dynamic_ncols=True)
            counts = {"success": sum(1 for i, r in writer.records.items() if i < episodes and r.success),
                      "errors": 0}

            def on_record(record: EpisodeRecord) -> None:
                nonlocal played
                writer.append(record)
                played += 1
                counts["success"] += int(record.success)
                counts["errors"] += int(record.error is not None)
                bar.update(1)
                bar.set_postfix(success=f"{counts['success'] / max(1, bar.n):.0%}", errors=counts["errors"],
                                refresh=False)

            setup = _Setup(env_id=env_id, split=split, env_kwargs=merged_kwargs, agent_spec=agent_spec,
                           agent_options=agent_options, env_name=env_short, run_id=run_id, agent_label=agent_label,
                           batch_size=min(batch_size, len(jobs)))
            common = dict(run_id=run_id, env_id=env_id, split=split, agent_label=agent_label,
                          episode_timeout=episode_timeout, batch_size=setup.batch_size)
            size = min(workers, -(-len(jobs) // setup.batch_size))
            if ray_address is None:
                pool = _Pool(size, (environment_snapshot(), setup), on_record,
                             start_method=start_method or default_start_method(), **common)
            else:
                from envrl.ray_cluster import forwarded_environment

                pool = _RayPool(size, (forwarded_environment(), setup), on_record, ray_address=ray_address,
                                **common)
            pool.run(jobs)
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
            bar = None
        done = sum(1 for i in writer.records if i < episodes)
        _say(f"envrl: interrupted; {done} of {episodes} episodes of run {run_id} are recorded in "
             f"{writer.run_dir}. Run the same command again to resume.")
        raise
    finally:
        if bar is not None:
            bar.close()
        writer.close()

    records = [writer.records[i] for i in sorted(writer.records) if i < episodes]
    return RunSummary(
        run_id=run_id, run_dir=writer.run_dir, env_id=env_id, split=split, agent=agent_label,
        episodes_planned=episodes, episodes_done=len(records), episodes_played=played,
        errors=sum(1 for r in records if r.error is not None), wall_time=time.perf_counter() - wall_start,
        metrics=compute_metrics(records), records=records,
    )
