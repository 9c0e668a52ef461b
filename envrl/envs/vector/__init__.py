"""Vector environments: many envrl envs stepped together, each in a worker of its own.

One interface, three back ends::

    vec = make_vec("alfworld", 8, split="train")                     # worker processes
    vec = make_vec("alfworld", 64, backend="ray", ray_address="auto")  # Ray actors
    vec = make_vec("diag-chain", 32, backend="inline")                # in this process (cheap envs)

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
    they were just given, so no step is wasted on a reset. ``make_vec(..., autoreset=False)``
    (Gymnasium's ``DISABLED`` mode) leaves ended episodes ended until the next ``reset``.

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

Back ends
    :class:`SubprocessVectorEnv` (:mod:`~envrl.envs.vector.subprocess_backend`) gives each env
    a process of its own on this machine; :class:`RayVectorEnv`
    (:mod:`~envrl.envs.vector.ray_backend`) puts one actor per env anywhere on a Ray cluster
    (Ray is optional: that module, and Ray, are imported only when first used);
    :class:`~envrl.envs.vector.inline_backend.InlineVectorEnv` keeps every env in the caller's
    process, for envs cheaper than a pipe round trip (no isolation, no ``timeout``).

The contract above, shared by the back ends, is :mod:`~envrl.envs.vector.base`
(:class:`TextVectorEnv` in the caller, :class:`EnvHost` in each worker).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from envrl.envs import env_id
from envrl.envs.vector.base import (
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_START_TIMEOUT,
    MAX_START_ATTEMPTS,
    EnvHost,
    Reply,
    TextVectorEnv,
    WorkerLost,
)
from envrl.envs.vector.subprocess_backend import SubprocessVectorEnv

if TYPE_CHECKING:
    from envrl.envs.vector.ray_backend import RayVectorEnv

__all__ = [
    "BACKENDS",
    "DEFAULT_CLOSE_TIMEOUT",
    "DEFAULT_START_TIMEOUT",
    "MAX_START_ATTEMPTS",
    "EnvHost",
    "RayVectorEnv",
    "Reply",
    "SubprocessVectorEnv",
    "TextVectorEnv",
    "WorkerLost",
    "make_vec",
]

BACKENDS = ("subprocess", "ray", "inline")


def make_vec(
    name: str,
    num_envs: int,
    backend: str = "subprocess",
    ray_address: str | None = None,
    *,
    timeout: float | None = None,
    start_timeout: float | None = DEFAULT_START_TIMEOUT,
    num_cpus: float | None = None,
    ray_init_kwargs: Mapping[str, Any] | None = None,
    autoreset: bool = True,
    **env_kwargs: Any,
) -> TextVectorEnv:
    """``num_envs`` copies of env ``name`` (``alfworld``, or an id such as ``envrl/WebShop-v0``).

    ``backend``: ``"subprocess"`` (one worker process per env) or ``"ray"`` (one Ray actor
    per env; see :class:`~envrl.envs.vector.ray_backend.RayVectorEnv` for ``ray_address``,
    ``num_cpus`` and ``ray_init_kwargs``). ``timeout``: seconds a worker may take to answer a
    ``reset`` or ``step`` before it is killed and replaced (default: no limit).
    ``start_timeout``: the same for building the env in a new worker. ``autoreset=False``
    turns same-step autoreset off: an ended episode stays ended (its env answers every further
    step with the episode-over feedback) until ``reset``, which is what training rollouts
    want (no episode is started that nobody plays). Other keyword arguments
    go to ``gym.make`` in each worker (``split=``, ``max_episode_steps=``, ...).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    gym_id = _resolve(name)
    if backend == "ray":
        from envrl.envs.vector.ray_backend import RayVectorEnv

        return RayVectorEnv(
            gym_id,
            num_envs,
            env_kwargs,
            ray_address=ray_address,
            num_cpus=num_cpus,
            ray_init_kwargs=ray_init_kwargs,
            timeout=timeout,
            start_timeout=start_timeout,
            autoreset=autoreset,
        )
    if ray_address is not None or num_cpus is not None or ray_init_kwargs is not None:
        raise ValueError("ray_address, num_cpus and ray_init_kwargs only apply to backend='ray'")
    if backend == "inline":
        from envrl.envs.vector.inline_backend import InlineVectorEnv

        return InlineVectorEnv(
            gym_id, num_envs, env_kwargs, timeout=timeout, start_timeout=start_timeout, autoreset=autoreset
        )
    return SubprocessVectorEnv(
        gym_id, num_envs, env_kwargs, timeout=timeout, start_timeout=start_timeout, autoreset=autoreset
    )


def _resolve(name: str) -> str:
    """The Gymnasium id for a short name; other registered ids and ``module:id`` pass as is."""
    try:
        return env_id(name)
    except ValueError:
        if ":" in name or name in gym.registry:
            return name
        raise


def __getattr__(name: str) -> Any:
    """``RayVectorEnv`` on first use: the Ray back end is loaded only by those who ask for it."""
    if name == "RayVectorEnv":
        from envrl.envs.vector.ray_backend import RayVectorEnv

        return RayVectorEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
