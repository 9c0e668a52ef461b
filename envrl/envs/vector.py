"""Vector environments: many envrl envs stepped together, each in a worker of its own.

One interface, two back ends::

    vec = make_vec("alfworld", 8, split="train")                     # worker processes
    vec = make_vec("alfworld", 64, backend="ray", ray_address="auto")  # Ray actors

Both return a :class:`TextVectorEnv`, a ``gymnasium.vector.VectorEnv`` with:

Batches
    Observations are a tuple of strings, rewards/terminated/truncated numpy arrays, and
    infos Gymnasium's dict of arrays, each key ``k`` with its mask ``_k`` (which envs have it).

Seeds
    ``reset(seed=s)`` seeds env ``i`` with ``s + i``; a list gives each env its own seed, so
    env ``i`` plays exactly what a single env reset with that seed plays. ``options`` is one
    dict for every env, or a list with one per env; ``options={"reset_mask": mask}`` resets
    only the envs where the boolean array ``mask`` is true (the others keep their episode).

Autoreset
    Gymnasium's ``SAME_STEP`` mode: when an episode ends, ``step`` already returns the next
    episode's first observation, and the finished episode's last observation and info are in
    ``info["final_obs"]`` / ``info["final_info"]``. Text agents always act on the observation
    they were just given, so no step is wasted on a reset.

Lost workers
    A worker that dies (SIGKILL, a segfault in an engine, the OOM killer, a killed Ray actor),
    does not answer within ``timeout`` seconds (it is then killed), or whose env raises in
    ``step`` is replaced by a new one, and its env starts a new episode; the other envs'
    episodes go on untouched. That env's ``step`` result reports the lost episode as ended:
    ``truncated=True``, reward 0, ``info["worker_restarted"] = True`` and ``info["error"]``
    (why), and ``final_obs``/``final_info`` hold the last observation and info the env gave
    (with the same two keys). The new episode is reset with a seed drawn from the vector env's
    own generator (seeded by ``reset(seed=...)``), so a run with the same failures is
    repeatable. A worker lost during ``reset`` is replaced and that reset is sent again; an
    exception raised by an env's ``reset`` (an unknown task id, say) reaches the caller as is.

Shutdown
    ``close()`` asks every worker to close its env, then kills what is left, so no process
    outlives it; vector envs still open when the interpreter exits are closed then.

The subprocess back end (:class:`SubprocessVectorEnv`) suits one machine: ALFWorld's engine
is not thread-safe, so each env gets a process, started with ``forkserver``/``spawn`` (never
plain ``fork``: safe next to threads). Workers apply a snapshot of the caller's ``os.environ``
and ``sys.path`` taken at creation (see :mod:`envrl.processes` for why) and run in a process
group of their own: Ctrl-C in a terminal reaches only the caller, which decides what stops,
and anything an env started (ScienceWorld's JVM) is killed with its worker. Workers exit
when the caller dies. The Ray back end (:mod:`envrl.envs.vector_ray`) puts one actor per env
anywhere on a Ray cluster.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import multiprocessing.connection
import multiprocessing.util  # noqa: F401  (its exit handler must be registered before ours)
import os
import pickle
import signal
import sys
import time
import traceback
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from envrl.envs import env_id
from envrl.processes import apply_environment, environment_snapshot, exit_reason, start_method

logger = logging.getLogger("envrl.vector")

BACKENDS = ("subprocess", "ray")

#: seconds a new worker may take to build its env before it counts as failed
DEFAULT_START_TIMEOUT = 300.0
#: seconds ``close()`` waits for workers to close their envs before killing them
DEFAULT_CLOSE_TIMEOUT = 5.0
#: how many new workers in a row may fail to start for one env before the vector env gives up
MAX_START_ATTEMPTS = 3
#: longest error message put in an info
MAX_ERROR_LENGTH = 500


def make_vec(name: str, num_envs: int, backend: str = "subprocess", ray_address: str | None = None, *,
             timeout: float | None = None, start_timeout: float | None = DEFAULT_START_TIMEOUT,
             num_cpus: float | None = None, ray_init_kwargs: Mapping[str, Any] | None = None,
             **env_kwargs: Any) -> TextVectorEnv:
    """``num_envs`` copies of env ``name`` (``alfworld``, or an id such as ``envrl/WebShop-v0``).

    ``backend``: ``"subprocess"`` (one worker process per env) or ``"ray"`` (one Ray actor
    per env; see :class:`envrl.envs.vector_ray.RayVectorEnv` for ``ray_address``, ``num_cpus``
    and ``ray_init_kwargs``). ``timeout``: seconds a worker may take to answer a ``reset`` or
    ``step`` before it is killed and replaced (default: no limit). ``start_timeout``: the same
    for building the env in a new worker. Other keyword arguments go to ``gym.make`` in each
    worker (``split=``, ``max_episode_steps=``, ...).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    gym_id = _resolve(name)
    if backend == "ray":
        from envrl.envs.vector_ray import RayVectorEnv

        return RayVectorEnv(gym_id, num_envs, env_kwargs, ray_address=ray_address, num_cpus=num_cpus,
                            ray_init_kwargs=ray_init_kwargs, timeout=timeout, start_timeout=start_timeout)
    if ray_address is not None or num_cpus is not None or ray_init_kwargs is not None:
        raise ValueError("ray_address, num_cpus and ray_init_kwargs only apply to backend='ray'")
    return SubprocessVectorEnv(gym_id, num_envs, env_kwargs, timeout=timeout, start_timeout=start_timeout)


def _resolve(name: str) -> str:
    """The Gymnasium id for a short name; other registered ids and ``module:id`` pass as is."""
    try:
        return env_id(name)
    except ValueError:
        if ":" in name or name in gym.registry:
            return name
        raise


# ---- what runs in a worker ---------------------------------------------------------------


class EnvHost:
    """One env inside a worker (a process or a Ray actor): the calls a vector env makes."""

    def __init__(self, gym_id: str, env_kwargs: Mapping[str, Any]) -> None:
        import envrl  # noqa: F401  (registers the ids)

        self.env = gym.make(gym_id, **dict(env_kwargs))

    def describe(self) -> dict[str, Any]:
        env = self.env
        return {"observation_space": env.observation_space, "action_space": env.action_space,
                "metadata": dict(env.metadata), "render_mode": env.render_mode, "spec": env.spec,
                "pid": os.getpid()}

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:  # same-step autoreset
            final_observation, final_info = observation, _materialized(info)
            observation, info = self.env.reset()
            info = {**info, "final_obs": final_observation, "final_info": final_info}
        return observation, float(reward), bool(terminated), bool(truncated), info

    def call(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        attribute = self.env.get_wrapper_attr(name)
        return attribute(*args, **kwargs) if callable(attribute) else attribute

    def close(self) -> None:
        self.env.close()


def _materialized(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with lazy sequences turned into lists, read now: after the autoreset it would
    be too late (ScienceWorld computes its admissible actions on first read, for the current
    step only)."""
    return {key: list(value) if isinstance(value, Sequence) and not isinstance(value, (str, bytes, tuple))
            and type(value) is not list else value for key, value in info.items()}


def _describe_exception(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or repr(exc)
    text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 3] + "..."


def _pack_exception(exc: BaseException) -> tuple[str, str, bytes | None]:
    """(one line, traceback, the pickled exception or None) to send to the caller."""
    try:
        pickled: bytes | None = pickle.dumps(exc)
    except Exception:
        pickled = None
    return _describe_exception(exc), "".join(traceback.format_exception(exc)), pickled


def _subprocess_worker(conn: Any, environ: dict[str, str], sys_path: list[str], gym_id: str,
                       env_kwargs: dict[str, Any]) -> None:
    """Entry point of a worker process: build the env, then answer requests until told to close."""
    apply_environment(environ)
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    try:
        os.setpgid(0, 0)  # a group of its own: see the module docstring
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        host = EnvHost(gym_id, env_kwargs)
    except Exception as exc:
        try:
            conn.send(("error", _pack_exception(exc)))
        except (OSError, pickle.PicklingError):
            pass
        return
    command = ""
    try:
        while command != "close":
            try:
                command, *args = conn.recv()
            except (EOFError, OSError):
                break  # the caller is gone
            try:
                reply = ("ok", getattr(host, command)(*args))
            except Exception as exc:
                reply = ("error", _pack_exception(exc))
            try:
                conn.send(reply)
            except (OSError, EOFError):
                break
            except Exception as exc:  # the result could not be pickled
                conn.send(("error", _pack_exception(exc)))
    finally:
        if command != "close":
            try:
                host.close()
            except Exception:
                pass


# ---- the caller's side -------------------------------------------------------------------


@dataclass
class _Reply:
    """A worker's answer to one request: ``ok`` (``value``), ``error`` (the env raised:
    ``value`` is the exception or None) or ``dead`` (the worker is gone or was killed)."""

    kind: str
    value: Any = None
    message: str = ""
    remote_traceback: str = ""


class WorkerLost(RuntimeError):
    """A worker could not be started or kept alive (after replacements)."""


_OPEN: weakref.WeakSet[TextVectorEnv] = weakref.WeakSet()


@atexit.register
def _close_open_vector_envs() -> None:
    for vec in list(_OPEN):
        try:
            vec.close(timeout=1.0)
        except Exception:
            pass


class TextVectorEnv(gym.vector.VectorEnv):
    """A vector of envrl envs in workers; see the module docstring for the semantics.

    Back ends implement five hooks that start, talk to and stop the worker of env ``i``:
    :meth:`_launch`, :meth:`_send`, :meth:`_gather`, :meth:`_kill` and :meth:`_close_workers`.
    """

    backend = ""

    def __init__(self, gym_id: str, num_envs: int, env_kwargs: Mapping[str, Any], *, timeout: float | None,
                 start_timeout: float | None) -> None:
        self.closed = True  # until the workers are up (close() and __del__ check it)
        if not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be an integer >= 1, got {num_envs!r}")
        for what, value in (("timeout", timeout), ("start_timeout", start_timeout)):
            if value is not None and value <= 0:
                raise ValueError(f"{what} must be > 0 or None, got {value!r}")
        self.gym_id = gym_id
        self.num_envs = int(num_envs)
        self.env_kwargs = dict(env_kwargs)
        self.timeout = timeout
        self.start_timeout = start_timeout
        #: how many times each env's worker was replaced
        self.restarts = [0] * self.num_envs
        self._observations: list[Any] = [None] * self.num_envs
        self._infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self._needs_reset = True

    def _start_all(self) -> None:
        """Start every worker and read the spaces; called by back ends at the end of ``__init__``."""
        try:
            for i in range(self.num_envs):
                self._launch(i)
            replies = self._request({i: ("describe",) for i in range(self.num_envs)}, self.start_timeout)
            for i, reply in sorted(replies.items()):
                if reply.kind != "ok":
                    self._raise_reply(i, reply, "could not build its env")
        except BaseException:
            self._close_workers(0.0)
            raise
        description = replies[0].value
        self.single_observation_space = description["observation_space"]
        self.single_action_space = description["action_space"]
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = {**description["metadata"], "autoreset_mode": AutoresetMode.SAME_STEP}
        self.render_mode = description["render_mode"]
        self.spec = description["spec"]
        self._pids = [replies[i].value["pid"] for i in range(self.num_envs)]
        self.closed = False
        _OPEN.add(self)

    # ---- back-end hooks ------------------------------------------------------------------

    def _launch(self, index: int) -> None:
        """Start a worker for env ``index`` that builds the env (the old one is gone)."""
        raise NotImplementedError

    def _send(self, index: int, command: str, *args: Any) -> None:
        """Send a request to env ``index``'s worker; the reply comes from :meth:`_gather`."""
        raise NotImplementedError

    def _gather(self, indices: Sequence[int], timeout: float | None) -> dict[int, _Reply]:
        """One reply per index; a worker with no reply in ``timeout`` seconds is killed (``dead``)."""
        raise NotImplementedError

    def _kill(self, index: int) -> None:
        """Stop env ``index``'s worker now, whatever it is doing."""
        raise NotImplementedError

    def _close_workers(self, timeout: float) -> None:
        """Ask every worker to close its env, wait up to ``timeout`` seconds, kill the rest."""
        raise NotImplementedError

    # ---- the Gymnasium API ---------------------------------------------------------------

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
              ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        self._check_open()
        seeds = self._seeds(seed)
        if isinstance(seed, (int, np.integer)):
            super().reset(seed=int(seed))
        elif seed is not None and all(s is not None for s in seeds):
            self.np_random = np.random.default_rng([int(s) for s in seeds])
        per_env, mask = self._options(options)
        indices = [i for i in range(self.num_envs) if mask[i]]
        requests = {i: ("reset", seeds[i], per_env[i]) for i in indices}
        replies = self._request(requests, self.timeout)
        lost = {i: r.message for i, r in replies.items() if r.kind == "dead"}
        if lost:  # replace those workers and send their resets again
            self._replace(lost)
            replies.update(self._request({i: requests[i] for i in lost}, self.timeout))
        infos: dict[str, Any] = {}
        failure: tuple[int, _Reply] | None = None
        for i in indices:
            reply = replies[i]
            if reply.kind != "ok":
                failure = failure or (i, reply)
                continue
            observation, info = reply.value
            self._observations[i] = observation
            self._infos[i] = dict(info)
            infos = self._add_info(infos, info, i)
        if failure is not None:
            self._needs_reset = True
            self._raise_reply(*failure, "failed to reset")
        if len(indices) == self.num_envs:
            self._needs_reset = False
        return tuple(self._observations), infos

    def step(self, actions: Sequence[Any]) -> tuple[tuple[Any, ...], np.ndarray, np.ndarray, np.ndarray,
                                                     dict[str, Any]]:
        self._check_open()
        if self._needs_reset:
            raise gym.error.ResetNeeded("call reset() before step() (a previous reset did not complete)")
        if isinstance(actions, str) or len(actions) != self.num_envs:
            raise ValueError(f"expected a sequence of {self.num_envs} actions, got {actions!r}")
        replies = self._request({i: ("step", action) for i, action in enumerate(actions)}, self.timeout)
        failed = {i: r for i, r in replies.items() if r.kind != "ok"}
        for i, reply in failed.items():
            if reply.kind == "error":  # the engine may be in a bad state: a new worker builds it again
                logger.warning("env %d raised in step (%s); replacing its worker\n%s", i, reply.message,
                               reply.remote_traceback)
                self._kill(i)
        restarted = self._restart_episodes({i: r.message for i, r in failed.items()})

        observations: list[Any] = [None] * self.num_envs
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=np.bool_)
        truncated = np.zeros(self.num_envs, dtype=np.bool_)
        infos: dict[str, Any] = {}
        for i in range(self.num_envs):
            if i in restarted:
                observation, info = restarted[i]
                message = f"episode cut short, its worker replaced: {failed[i].message}"
                final_info = {**self._infos[i], "worker_restarted": True, "error": message}
                info = {**info, "worker_restarted": True, "error": message,
                        "final_obs": self._observations[i], "final_info": final_info}
                truncated[i] = True
            else:
                observation, rewards[i], terminated[i], truncated[i], info = replies[i].value
            observations[i] = observation
            self._observations[i] = observation
            self._infos[i] = {k: v for k, v in info.items() if k not in ("final_obs", "final_info")}
            infos = self._add_info(infos, info, i)
        return tuple(observations), rewards, terminated, truncated, infos

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every env (or read the attribute, if it is not callable)."""
        self._check_open()
        replies = self._request({i: ("call", name, args, kwargs) for i in range(self.num_envs)}, self.timeout)
        for i in range(self.num_envs):
            if replies[i].kind != "ok":
                if replies[i].kind == "dead":
                    self._replace({i: replies[i].message})
                    self._needs_reset = True
                self._raise_reply(i, replies[i], f"failed in call({name!r})")
        return tuple(replies[i].value for i in range(self.num_envs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every env (through its wrappers)."""
        return self.call(name)

    @property
    def pids(self) -> list[int]:
        """The process id of each env's worker (Ray actors: on its node)."""
        return list(self._pids)

    def close_extras(self, timeout: float = DEFAULT_CLOSE_TIMEOUT, **kwargs: Any) -> None:
        _OPEN.discard(self)
        self._close_workers(timeout)

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            try:
                self.close(timeout=1.0)
            except Exception:
                pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.gym_id}, num_envs={self.num_envs})"

    # ---- internals -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise gym.error.ClosedEnvironmentError(f"{self!r} is closed")

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} seeds, got {len(seeds)}")
        return [None if s is None else int(s) for s in seeds]

    def _options(self, options: Any) -> tuple[list[dict[str, Any] | None], np.ndarray]:
        """Per-env options and the mask of envs to reset."""
        mask = np.ones(self.num_envs, dtype=np.bool_)
        if options is None or isinstance(options, Mapping):
            shared = dict(options) if options is not None else None
            if shared is not None and "reset_mask" in shared:
                mask = np.asarray(shared.pop("reset_mask"))
                if mask.shape != (self.num_envs,) or mask.dtype != np.bool_:
                    raise ValueError(f"options['reset_mask'] must be a boolean array of shape ({self.num_envs},)")
                if not mask.any():
                    raise ValueError("options['reset_mask'] must select at least one env")
                if self._needs_reset and not mask.all():
                    raise gym.error.ResetNeeded("the first reset must reset every env (no reset_mask)")
                shared = shared or None
            return [shared] * self.num_envs, mask
        per_env = list(options)
        if len(per_env) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} option dicts, got {len(per_env)}")
        return [None if o is None else dict(o) for o in per_env], mask

    def _request(self, requests: Mapping[int, tuple], timeout: float | None) -> dict[int, _Reply]:
        for i, (command, *args) in requests.items():
            self._send(i, command, *args)
        return self._gather(list(requests), timeout) if requests else {}

    def _replace(self, lost: Mapping[int, str]) -> None:
        """Start new workers for the envs in ``lost`` (index -> why the old one was lost)."""
        todo = dict(lost)
        for attempt in range(1, MAX_START_ATTEMPTS + 1):
            for i, why in todo.items():
                self.restarts[i] += 1
                logger.warning("env %d: worker %s lost (%s); starting a new one", i, self._pids[i], why)
                self._launch(i)
            replies = self._request({i: ("describe",) for i in todo}, self.start_timeout)
            failed = {}
            for i, reply in replies.items():
                if reply.kind == "ok":
                    self._pids[i] = reply.value["pid"]
                else:
                    failed[i] = reply.message
                    if reply.kind == "error":
                        self._kill(i)
            if not failed:
                return
            todo = failed
        i, why = next(iter(todo.items()))
        raise WorkerLost(f"env {i}: {MAX_START_ATTEMPTS} new workers in a row failed to start (last: {why})")

    def _restart_episodes(self, lost: Mapping[int, str]) -> dict[int, tuple[Any, dict[str, Any]]]:
        """Replace the lost workers and start a new episode in each; returns (observation, info)."""
        results: dict[int, tuple[Any, dict[str, Any]]] = {}
        todo = dict(lost)
        for _ in range(MAX_START_ATTEMPTS):
            if not todo:
                break
            self._replace(todo)
            seeds = {i: int(self.np_random.integers(2**31 - 1)) for i in sorted(todo)}
            replies = self._request({i: ("reset", seeds[i], None) for i in todo}, self.timeout)
            todo = {}
            for i, reply in replies.items():
                if reply.kind == "ok":
                    results[i] = reply.value
                else:
                    if reply.kind == "error":
                        self._kill(i)
                    todo[i] = reply.message
        if todo:
            i, why = next(iter(todo.items()))
            raise WorkerLost(f"env {i}: new workers keep failing to start an episode (last: {why})")
        return results

    def _raise_reply(self, index: int, reply: _Reply, what: str) -> None:
        if reply.kind == "error" and isinstance(reply.value, BaseException):
            exc = reply.value
            if hasattr(exc, "add_note"):
                exc.add_note(f"(raised by env {index} of {self!r}, in its worker)")
            raise exc
        raise WorkerLost(f"env {index} {what}: {reply.message}")


# ---- the subprocess back end -------------------------------------------------------------


class _Process:
    """The caller's handle on one worker process."""

    def __init__(self, ctx: Any, args: tuple) -> None:
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_subprocess_worker, args=(child_conn, *args), name="envrl-vector-worker")
        self.proc.start()
        child_conn.close()
        self.conn = parent_conn
        self.send_failed = False
        self.kill_reason: str | None = None
        self.ended = False

    def kill(self, reason: str | None = None) -> str:
        """Kill the worker and everything in its process group; returns why it ended."""
        if reason and self.kill_reason is None:
            self.kill_reason = reason
        pid = self.proc.pid
        if pid is not None and not self.ended:
            self.ended = True
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.proc.join(timeout=10)
        self.conn.close()
        return self.kill_reason or exit_reason(self.proc.exitcode)

    def receive(self) -> tuple | None:
        """The worker's pending message, or None when the pipe is closed or empty."""
        try:
            if not self.conn.closed and self.conn.poll():
                return self.conn.recv()
        except (EOFError, OSError):
            pass
        return None


class SubprocessVectorEnv(TextVectorEnv):
    """One worker process per env; see the module docstring."""

    backend = "subprocess"

    def __init__(self, gym_id: str, num_envs: int, env_kwargs: Mapping[str, Any], *, timeout: float | None = None,
                 start_timeout: float | None = DEFAULT_START_TIMEOUT, context: str | None = None) -> None:
        super().__init__(gym_id, num_envs, env_kwargs, timeout=timeout, start_timeout=start_timeout)
        method = context or start_method()
        self._ctx = mp.get_context(method)
        if method == "forkserver":
            self._ctx.set_forkserver_preload(["envrl.envs.vector"])  # workers start with it imported
        self._worker_args = (environment_snapshot(), list(sys.path), gym_id, self.env_kwargs)
        self._workers: list[_Process | None] = [None] * self.num_envs
        self._start_all()

    def _launch(self, index: int) -> None:
        old = self._workers[index]
        if old is not None:
            old.kill()
        self._workers[index] = _Process(self._ctx, self._worker_args)

    def _send(self, index: int, command: str, *args: Any) -> None:
        worker = self._workers[index]
        worker.send_failed = False
        try:
            worker.conn.send((command, *args))
        except (BrokenPipeError, ConnectionError, OSError):
            worker.send_failed = True  # it is gone; _gather reads a last message, if any, then reaps it

    def _gather(self, indices: Sequence[int], timeout: float | None) -> dict[int, _Reply]:
        replies: dict[int, _Reply] = {}
        waiting = set(indices)
        deadline = None if timeout is None else time.monotonic() + timeout
        while waiting:
            for i in [i for i in waiting if self._workers[i].send_failed]:
                replies[i] = self._reply(i, self._workers[i].receive())
                waiting.discard(i)
            if not waiting:
                break
            owners: dict[Any, int] = {}
            for i in waiting:
                owners[self._workers[i].conn] = i
                owners[self._workers[i].proc.sentinel] = i
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = mp.connection.wait(list(owners), timeout=remaining)
            if not ready:  # timed out: the silent workers are killed
                for i in waiting:
                    reason = f"no answer within {timeout:g}s, killed"
                    replies[i] = _Reply("dead", message=self._workers[i].kill(reason))
                break
            for i in {owners[handle] for handle in ready}:
                replies[i] = self._reply(i, self._workers[i].receive())
                waiting.discard(i)
        return replies

    def _reply(self, index: int, message: tuple | None) -> _Reply:
        if message is None:  # the pipe closed or the process ended without an answer
            return _Reply("dead", message=f"worker pid {self._workers[index].proc.pid} "
                                          f"{self._workers[index].kill()}")
        kind, payload = message
        if kind == "ok":
            return _Reply("ok", payload)
        line, remote_traceback, pickled = payload
        exc = None
        if pickled is not None:
            try:
                exc = pickle.loads(pickled)
            except Exception:
                exc = None
        return _Reply("error", exc, message=line, remote_traceback=remote_traceback)

    def _kill(self, index: int) -> None:
        worker = self._workers[index]
        if worker is not None:
            worker.kill()

    def _close_workers(self, timeout: float) -> None:
        live = [w for w in self._workers if w is not None and not w.conn.closed]
        for worker in live:
            try:
                worker.conn.send(("close",))
            except (BrokenPipeError, ConnectionError, OSError):
                pass
        deadline = time.monotonic() + timeout
        for worker in live:
            mp.connection.wait([worker.proc.sentinel], timeout=max(0.0, deadline - time.monotonic()))
            worker.kill()  # reaps it, and anything it left in its process group
