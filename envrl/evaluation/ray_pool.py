"""Evaluation episodes on Ray actors (``envrl eval --ray ADDRESS``), on any node of a cluster.

:class:`RayPool` is :class:`~envrl.evaluation.process_pool.WorkerPool` with Ray actors for
workers: the same loop, jobs, retries, timeouts and records (written by the caller, the
driver). What differs is how an actor is fed: it takes a batch of up to ``batch_size`` jobs
per :meth:`EpisodeActor.play` call and answers with all their records at the end, so it gets
new jobs only once the whole batch is done. An actor that dies (or whose ``play`` raises) is
killed and replaced, its episodes retried once, as with worker processes.

Ray is imported only when a pool runs; which instance it uses, and the environment variables
actors get, are :mod:`envrl.ray_cluster`'s business.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from envrl.evaluation.config import RunFailed
from envrl.evaluation.episodes import EpisodeBatch, EpisodeJob, EpisodeSetup, describe_error, error_message
from envrl.evaluation.process_pool import STOP_TIMEOUT, Job, PoolEvent, PoolWorker, WorkerPool
from envrl.evaluation.store import EpisodeRecord
from envrl.ray_cluster import (
    DEFAULT_NUM_CPUS,
    apply_forwarded_environment,
    connect_ray,
    kill_actor,
    release_ray,
    remote_class,
)


class EpisodeActor:
    """A Ray actor that plays episodes exactly as a worker process does (one
    :class:`~envrl.evaluation.episodes.EpisodeBatch`): it builds its agents and envs once and
    returns the records of each batch it is given."""

    def __init__(self, environ: dict[str, str], setup: EpisodeSetup) -> None:
        apply_forwarded_environment(environ)
        self.records: list[dict[str, Any]] = []
        self.batch: EpisodeBatch | None = None
        self.init_error: str | None = None
        try:
            self.batch = EpisodeBatch(setup, on_done=lambda record: self.records.append(record.to_dict()))
        except Exception as exc:
            self.init_error = describe_error(exc)

    def ready(self) -> tuple[str, Any]:
        """``("ready", pid)``, or ``("init_error", why)`` when the agents and envs could not be built."""
        return ("init_error", self.init_error) if self.init_error else ("ready", os.getpid())

    def play(self, jobs: list[EpisodeJob]) -> list[dict[str, Any]]:
        """Play ``jobs`` (index, task id, seed), at most ``batch_size`` of them, in lockstep;
        their records, as dicts."""
        assert self.batch is not None, "play() on an actor whose ready() said init_error"
        self.records = []
        self.batch.play(jobs)
        return self.records

    def close(self) -> None:
        if self.batch is not None:
            self.batch.close()


class ActorWorker(PoolWorker):
    """An :class:`EpisodeActor`, and its one call in flight: ``ready()`` until it answers,
    then each ``play()``."""

    def __init__(self, actor: Any) -> None:
        super().__init__()
        self.actor = actor
        self.ref: Any = actor.ready.remote()


class RayPool(WorkerPool[ActorWorker]):
    """:class:`~envrl.evaluation.process_pool.WorkerPool` on Ray actors at ``ray_address``
    (see :func:`envrl.ray_cluster.connect_ray`); each actor is handed ``environ`` (the
    caller's forwarded variables, :func:`envrl.ray_cluster.forwarded_environment`) and ``setup``."""

    worker_noun, workers_noun = "Ray actor", "Ray actors"

    def __init__(
        self,
        size: int,
        setup: EpisodeSetup,
        on_record: Callable[[EpisodeRecord], None],
        *,
        environ: dict[str, str],
        ray_address: str,
        episode_timeout: float | None = None,
    ) -> None:
        super().__init__(size, setup, on_record, episode_timeout=episode_timeout)
        self.ray_address = ray_address
        self.worker_args = (environ, setup)
        self.owned = False  # whether the Ray instance is one envrl started (see release_ray)
        self.actor_class: Any = None

    def _open(self) -> None:
        try:
            self.owned = connect_ray(self.ray_address)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RunFailed(f"cannot connect to Ray at {self.ray_address!r}: {error_message(exc)}") from exc
        self.actor_class = remote_class(EpisodeActor).options(num_cpus=DEFAULT_NUM_CPUS, max_restarts=0)

    def _start_worker(self) -> ActorWorker:
        return ActorWorker(self.actor_class.remote(*self.worker_args))

    def _capacity(self, worker: ActorWorker) -> int:
        return self.batch_size if worker.ready and not worker.jobs else 0

    def _assign(self, worker: ActorWorker, jobs: list[Job]) -> int:
        worker.ref = worker.actor.play.remote([job.as_tuple() for job in jobs])
        return len(jobs)

    def _wait(self, timeout: float) -> list[PoolEvent]:
        import ray

        refs = [w.ref for w in self.workers if w.ref is not None]
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:  # and every other answer that is in by now
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        events: list[PoolEvent] = []
        for worker in [w for w in self.workers if w.ref in ready]:
            events += self._reply(worker)
        return events

    def _kill(self, worker: ActorWorker, reason: str) -> list[PoolEvent]:
        import ray

        if worker.ref is not None and ray.wait([worker.ref], timeout=0)[0]:
            return self._reply(worker)  # its answer came in after all: its records, or how it died
        kill_actor(worker.actor)
        return [PoolEvent("lost", worker, reason)]

    def _stop_all(self, graceful: bool) -> None:
        import ray

        try:
            if graceful and self.workers:
                closing = [w.actor.close.remote() for w in self.workers]
                ray.wait(closing, num_returns=len(closing), timeout=STOP_TIMEOUT)
            for worker in self.workers:
                kill_actor(worker.actor)
        finally:
            release_ray(self.owned)

    def _reply(self, worker: ActorWorker) -> list[PoolEvent]:
        """The answer to ``worker``'s call in flight (which has arrived) as events: its
        records, its readiness, or its loss (a dead actor, or a ``play`` that raised: the
        actor is killed either way)."""
        import ray

        ref, worker.ref = worker.ref, None
        try:
            reply = ray.get(ref)
        except Exception as exc:
            kill_actor(worker.actor)
            return [PoolEvent("lost", worker, _loss_reason(exc))]
        if worker.jobs:  # the call was play(): the batch's records
            return [PoolEvent("done", worker, EpisodeRecord.from_dict(record)) for record in reply]
        kind, value = reply  # the call was ready()
        return [PoolEvent(kind, worker, value)]


def _loss_reason(exc: Exception) -> str:
    """What a failed Ray call says, in one line: its type and its message's last line (Ray's
    messages carry the remote traceback first)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else exc!r}"
