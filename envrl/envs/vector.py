"""Vector environments: many envrl envs stepped together, each in its own process.

ALFWorld's engine is not thread-safe, so the back end is Gymnasium's ``AsyncVectorEnv``
(one subprocess per env, started with ``forkserver``/``spawn`` so that it is safe next to
threads), without shared memory since observations are strings. Text spaces batch into
tuples of strings and infos into dicts of object arrays, as Gymnasium does for any space.

Autoreset is Gymnasium's ``SAME_STEP`` mode: when an episode ends, ``step`` already returns
the next episode's first observation, and the finished episode's last observation and info
are in ``info["final_obs"]`` / ``info["final_info"]``. That suits text agents, which always
act on the observation they were just given. Seeds: ``reset(seed=s)`` seeds env ``i`` with
``s + i``; a list gives each env its own seed.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from envrl.envs import env_id
from envrl.processes import apply_environment, environment_snapshot, start_method


def make_vec(name: str, num_envs: int, **env_kwargs: Any) -> gym.vector.AsyncVectorEnv:
    """``num_envs`` copies of env ``name`` (``alfworld`` or its id), one subprocess each."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    gym_id = env_id(name)
    environ = environment_snapshot()

    def factory() -> gym.Env:
        apply_environment(environ)
        import envrl  # noqa: F401  (registers the ids in the worker process)

        return gym.make(gym_id, **env_kwargs)

    return gym.vector.AsyncVectorEnv(
        [factory] * num_envs,
        shared_memory=False,
        context=start_method(),
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
