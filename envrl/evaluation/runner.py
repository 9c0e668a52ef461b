"""Evaluation runs: play N episodes of one env split with one agent in K workers, and record them.

Which episode plays what
    Episode ``i`` (0-based) of a run plays task ``task_ids[i % len(task_ids)]`` of the split
    (the env's fixed, ordered ``env.unwrapped.task_ids``), resetting the env with
    ``seed=seed + i`` and ``options={"task_id": ...}`` and the agent with ``seed=seed + i``.
    So a run is a pure function of (env, split, agent, seed, env kwargs, episodes), however
    many workers play it and in whatever order episodes finish.

Workers
    Episodes are played in ``workers`` separate processes (the ALFWorld engine is not
    thread-safe; :mod:`~envrl.evaluation.process_pool`), or with ``ray_address`` (``envrl
    eval --ray ADDRESS``) on Ray actors on any node of a cluster
    (:mod:`~envrl.evaluation.ray_pool`). Each worker builds its agents and envs once and
    plays ``batch_size`` episodes side by side, one batched agent call per turn
    (:mod:`~envrl.evaluation.episodes`); after an episode that raised, it rebuilds what
    raised. The records are written here, by the caller, whatever plays them.

Failures
    * An exception in the env or the agent ends that episode: it is recorded with ``error``
      set (a failure) and the run goes on.
    * A worker that dies during an episode (SIGKILL, a segfault in the engine, the OOM killer,
      or the optional ``episode_timeout``) is noticed: a message is printed, a replacement
      worker is started and the episode is played once more; if it kills its worker again it
      is recorded with ``error`` set.
    * Ctrl-C (KeyboardInterrupt) stops the workers at once and closes the run; every episode
      finished so far is on disk and KeyboardInterrupt propagates to the caller.

Resume
    Results go to a :class:`~envrl.evaluation.store.RunWriter` as they finish. The default
    run id is derived from (env, split, agent spec and label, seed), so running the same
    command again reopens the run and plays only the episodes it has not recorded, and two
    different agents never share one. Reopening a run with another setup (the identity
    fields of :class:`~envrl.evaluation.config.RunConfig`) is refused.

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

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envrl.evaluation.config import (
    AGENT_PACKAGES,
    ENGINE_PACKAGES,
    SEED_LIMIT,
    EvaluationError,
    RunConfig,
    RunFailed,
    agent_run_name,
    check_counts,
    check_run_id,
    default_run_id,
    envrl_version,
    resolve_env,
    task_list_hash,
)
from envrl.evaluation.episodes import (
    AgentSpec,
    EpisodeSetup,
    agent_label,
    build_agent,
    build_env,
    close_quietly,
    describe_error,
    error_message,
)
from envrl.evaluation.metrics import MetricsReport, compute_metrics, report_table
from envrl.evaluation.process_pool import Job, JobQueue, ProcessPool, WorkerPool, say
from envrl.evaluation.ray_pool import RayPool
from envrl.evaluation.store import EpisodeRecord, ResultStore, RunConfigMismatch, RunWriter, package_versions
from envrl.processes import environment_snapshot
from envrl.processes import start_method as default_start_method
from envrl.ray_cluster import forwarded_environment

__all__ = [
    "SEED_LIMIT",
    "AgentSpec",
    "EvaluationError",
    "RunFailed",
    "RunSummary",
    "agent_run_name",
    "default_run_id",
    "resolve_env",
    "run_evaluation",
]

#: task ids named in an error about tasks an agent cannot play
SHOWN_TASKS = 3


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
            total = {
                key: sum(int(s.get(key, 0)) for s in stats)
                for key in ("responses", "format_invalid", "failed_requests", "prompt_tokens", "completion_tokens")
            }
            share = total["format_invalid"] / total["responses"] if total["responses"] else 0.0
            lines.append(
                f"model responses: {total['responses']} ({100 * share:.1f}% format-invalid, "
                f"{total['failed_requests']} failed requests), tokens: {total['prompt_tokens']} prompt, "
                f"{total['completion_tokens']} completion"
            )
        lines += ["", report_table(self.metrics)]
        return "\n".join(lines)


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
    ``"local"`` (a new local instance); see :mod:`envrl.ray_cluster`. Records are still
    written here, and an episode whose actor dies is retried once, as with processes.
    """
    wall_start = time.perf_counter()
    _check_arguments(episodes, workers, episode_timeout, batch_size, seed, ray_address)
    agent_options = {k: v for k, v in dict(agent_options or {}).items() if v is not None}
    checked = _check_env_and_agent(env_name, split, agent_spec, agent_options, env_kwargs, episodes)
    config = _run_config(
        checked,
        agent_spec,
        agent_options,
        episodes=episodes,
        seed=seed,
        workers=workers,
        batch_size=batch_size,
        backend="processes" if ray_address is None else "ray",
    )
    run_id = run_id or default_run_id(checked.env, split, agent_run_name(agent_spec, checked.agent_label), seed)
    check_run_id(run_id)
    writer = _open_run(runs_dir, run_id, config)
    try:
        played = _play(
            writer,
            config,
            checked.task_ids,
            agent_spec,
            progress=progress,
            episode_timeout=episode_timeout,
            start_method=start_method,
            ray_address=ray_address,
        )
    except KeyboardInterrupt:
        done = sum(1 for i in writer.records if i < episodes)
        say(
            f"envrl: interrupted; {done} of {episodes} episodes of run {run_id} are recorded in "
            f"{writer.run_dir}. Run the same command again to resume."
        )
        raise
    finally:
        writer.close()
    return _summarise(writer, config, played, time.perf_counter() - wall_start)


# ---- 1. the input ----------------------------------------------------------------------------


def _check_arguments(
    episodes: Any, workers: Any, episode_timeout: float | None, batch_size: Any, seed: Any, ray_address: str | None
) -> None:
    """What can be checked before anything is built or written."""
    check_counts(episodes, workers, episode_timeout, batch_size, seed)
    if ray_address is not None:
        try:
            import ray  # noqa: F401
        except ImportError as exc:
            raise EvaluationError("playing on Ray needs Ray: pip install 'envrl[ray]'") from exc


@dataclass(frozen=True)
class _Checked:
    """What building the agent and the env once, here, found out."""

    env: str  # the short name
    env_id: str
    split: str
    agent_label: str
    env_kwargs: dict[str, Any]  # the agent's env_kwargs under the caller's
    agent_protocol: dict[str, Any]
    task_ids: list[str]
    step_limit: int | None


def _check_env_and_agent(
    env_name: str,
    split: str,
    agent_spec: AgentSpec,
    agent_options: Mapping[str, Any],
    env_kwargs: Mapping[str, Any] | None,
    episodes: int,
) -> _Checked:
    """Build the agent and the env once: bad input fails now, with a clear message, and before
    anything is written to the store (a run that cannot start is never registered)."""
    env_short, env_id = resolve_env(env_name)
    agent = _build_checked_agent(agent_spec, env_short, agent_options)
    try:
        label = agent_label(agent_spec, agent)
        merged_kwargs = dict(getattr(agent, "env_kwargs", None) or {})
        merged_kwargs.update(env_kwargs or {})
        protocol_of = getattr(agent, "protocol", None)
        agent_protocol = dict(protocol_of()) if callable(protocol_of) else {}
        probe = probe_env(env_id, split, merged_kwargs, agent, episodes)
    finally:
        close_quietly(agent)
    if not probe.task_ids:
        raise EvaluationError(f"split {split!r} of {env_id} has no tasks")
    _check_playable(label, split, probe, episodes)
    return _Checked(env_short, env_id, split, label, merged_kwargs, agent_protocol, probe.task_ids, probe.step_limit)


def _build_checked_agent(agent_spec: AgentSpec, env_short: str, agent_options: Mapping[str, Any]) -> Any:
    """The agent, built once to check the spec: a bad spec is EvaluationError, any other
    failure to build it RunFailed, both one line."""
    try:
        return build_agent(agent_spec, env_short, agent_options)
    except ImportError as exc:
        raise EvaluationError(f"cannot load agent {agent_spec!r}: {describe_error(exc)}") from exc
    except (ValueError, KeyError, LookupError) as exc:
        message = error_message(exc)
        if not (isinstance(agent_spec, str) and agent_spec in message):
            message = f"agent {agent_spec!r}: {message}"
        raise EvaluationError(message) from exc
    except Exception as exc:
        raise RunFailed(f"cannot build agent {agent_spec!r}: {describe_error(exc)}") from exc


@dataclass(frozen=True)
class EnvProbe:
    """What the parent learns from making the env once, before the run is registered."""

    task_ids: list[str]
    step_limit: int | None
    unplayable: dict[str, str]  # task id -> why the agent cannot play it (tasks this run would play)


def probe_env(
    env_id: str, split: str, env_kwargs: Mapping[str, Any], agent: Any = None, episodes: int | None = None
) -> EnvProbe:
    """Make the env once and read the split's task ids and the step limit, and ask ``agent``
    (its optional ``unplayable_tasks(env, task_ids)``) which of the tasks the run would play
    it cannot play. Bad input becomes EvaluationError (an env may reject an unknown split in
    ``gym.make`` or only when asked for its tasks); any other failure RunFailed, one line."""
    import gymnasium as gym

    what = f"cannot make {env_id} with split={split!r}"
    env = None
    try:
        env = build_env(env_id, split, env_kwargs)
        step_limit = getattr(env.spec, "max_episode_steps", None) if env.spec is not None else None
        task_ids = [str(t) for t in env.unwrapped.task_ids]
        played = task_ids if episodes is None else task_ids[:episodes]
        check = getattr(agent, "unplayable_tasks", None)
        unplayable = dict(check(env.unwrapped, played)) if callable(check) and played else {}
        return EnvProbe(task_ids, step_limit, unplayable)
    except ModuleNotFoundError as exc:
        missing = exc.name or getattr(exc.__cause__, "name", None)
        if ":" in env_id and missing and env_id.startswith(missing.split(".")[0]):  # "module:id" typo
            raise EvaluationError(f"{what}: {error_message(exc)}") from exc
        raise RunFailed(f"{what}: {describe_error(exc)}") from exc
    except (ValueError, KeyError, TypeError, gym.error.Error) as exc:
        raise EvaluationError(f"{what}: {error_message(exc)}") from exc
    except Exception as exc:  # missing data, a broken engine: one line, and nothing registered
        raise RunFailed(f"{what}: {describe_error(exc)}") from exc
    finally:
        if env is not None:
            close_quietly(env)


def _check_playable(agent_label: str, split: str, probe: EnvProbe, episodes: int) -> None:
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
        f"this run would play ({reasons}): {shown}{f' and {more} more' if more > 0 else ''}"
    )


# ---- 2. the configuration, 3. the run in the store -----------------------------------------


def _run_config(
    checked: _Checked,
    agent_spec: AgentSpec,
    agent_options: dict[str, Any],
    *,
    episodes: int,
    seed: int,
    workers: int,
    batch_size: int,
    backend: str,
) -> RunConfig:
    """The run's :class:`RunConfig`, with the versions of the packages that can change its results."""
    agent_kind = agent_spec.split(":", 1)[0] if isinstance(agent_spec, str) else ""
    return RunConfig(
        env=checked.env,
        env_id=checked.env_id,
        split=checked.split,
        agent=checked.agent_label,
        episodes=episodes,
        seed=seed,
        env_kwargs=checked.env_kwargs,
        step_limit=checked.step_limit,
        agent_options=agent_options,
        agent_protocol=checked.agent_protocol,
        workers=workers,
        batch_size=batch_size,
        backend=backend,
        task_count=len(checked.task_ids),
        task_ids_sha256=task_list_hash(checked.task_ids),
        versions=dict(package_versions(("gymnasium", *ENGINE_PACKAGES.get(checked.env, ()))), envrl=envrl_version()),
        agent_versions=package_versions(AGENT_PACKAGES[agent_kind]) if agent_kind in AGENT_PACKAGES else None,
    )


def _open_run(runs_dir: str | os.PathLike[str] | None, run_id: str, config: RunConfig) -> RunWriter:
    """Create the run, or reopen it to resume (refused when its stored setup differs)."""
    try:
        return ResultStore(runs_dir).open_run(run_id, config.to_dict())
    except RunConfigMismatch as exc:
        raise EvaluationError(str(exc)) from exc


# ---- 4. the pool, 5. playing ----------------------------------------------------------------


def missing_jobs(recorded: Mapping[int, Any], episodes: int, task_ids: list[str], seed: int) -> JobQueue:
    """The episodes ``0..episodes-1`` not recorded yet, as a queue that makes each job only
    when it is handed out: memory stays flat however many episodes are planned."""
    done = sum(1 for i in recorded if 0 <= i < episodes)

    def make(i: int) -> Job:
        return Job(index=i, task_id=task_ids[i % len(task_ids)], seed=seed + i)

    indices = (i for i in range(episodes) if i not in recorded)
    return JobQueue(indices, episodes - done, make)


def _make_pool(
    config: RunConfig,
    agent_spec: AgentSpec,
    run_id: str,
    job_count: int,
    on_record: Any,
    *,
    episode_timeout: float | None,
    start_method: str | None,
    ray_address: str | None,
) -> WorkerPool:
    """Worker processes, or Ray actors with ``ray_address``: no more of them, and no bigger
    batches, than there are episodes to play."""
    setup = EpisodeSetup(
        env_id=config.env_id,
        split=config.split,
        env_kwargs=config.env_kwargs,
        agent_spec=agent_spec,
        agent_options=config.agent_options,
        env_name=config.env,
        run_id=run_id,
        agent_label=config.agent,
        batch_size=min(config.batch_size, job_count),
    )
    size = min(config.workers, -(-job_count // setup.batch_size))
    if ray_address is None:
        return ProcessPool(
            size,
            setup,
            on_record,
            environ=environment_snapshot(),
            start_method=start_method or default_start_method(),
            episode_timeout=episode_timeout,
        )
    return RayPool(
        size,
        setup,
        on_record,
        environ=forwarded_environment(),
        ray_address=ray_address,
        episode_timeout=episode_timeout,
    )


class _Recorder:
    """Writes each finished episode to the run as it arrives, and shows progress: a bar with
    the success rate and the number of errors so far."""

    def __init__(self, writer: RunWriter, episodes: int, recorded: int, progress: bool) -> None:
        from tqdm import tqdm

        self.writer = writer
        self.played = 0
        self.successes = sum(1 for i, r in writer.records.items() if i < episodes and r.success)
        self.errors = 0
        self.bar = tqdm(
            total=episodes,
            initial=recorded,
            desc=writer.run_id,
            unit="ep",
            disable=not progress,
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def __call__(self, record: EpisodeRecord) -> None:
        self.writer.append(record)
        self.played += 1
        self.successes += int(record.success)
        self.errors += int(record.error is not None)
        self.bar.update(1)
        self.bar.set_postfix(success=f"{self.successes / max(1, self.bar.n):.0%}", errors=self.errors, refresh=False)

    def close(self) -> None:
        self.bar.close()


def _play(
    writer: RunWriter,
    config: RunConfig,
    task_ids: list[str],
    agent_spec: AgentSpec,
    *,
    progress: bool,
    **pool_options: Any,
) -> int:
    """Play the episodes the run has not recorded yet; returns how many were played."""
    jobs = missing_jobs(writer.records, config.episodes, task_ids, config.seed)
    if not jobs:
        return 0
    recorded = config.episodes - len(jobs)
    if recorded:
        say(
            f"envrl: resuming run {writer.run_id}: {recorded} of {config.episodes} episodes already "
            f"recorded, playing the other {len(jobs)}"
        )
    recorder = _Recorder(writer, config.episodes, recorded, progress)
    try:
        _make_pool(config, agent_spec, writer.run_id, len(jobs), recorder, **pool_options).run(jobs)
    finally:
        recorder.close()
    return recorder.played


# ---- 6. the summary ------------------------------------------------------------------------------


def _summarise(writer: RunWriter, config: RunConfig, played: int, wall_time: float) -> RunSummary:
    records = [writer.records[i] for i in sorted(writer.records) if i < config.episodes]
    return RunSummary(
        run_id=writer.run_id,
        run_dir=writer.run_dir,
        env_id=config.env_id,
        split=config.split,
        agent=config.agent,
        episodes_planned=config.episodes,
        episodes_done=len(records),
        episodes_played=played,
        errors=sum(1 for r in records if r.error is not None),
        wall_time=wall_time,
        metrics=compute_metrics(records),
        records=records,
    )
