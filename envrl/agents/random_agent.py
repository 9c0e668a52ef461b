"""The random baseline: a uniform choice among the admissible actions, seeded."""

from __future__ import annotations

from typing import Any

import numpy as np


class RandomAgent:
    """Picks uniformly among ``info["admissible_actions"]``; repeatable given the seed.

    With no admissible actions (an env that does not list them) it says ``look``.
    """

    name = "random"
    env_kwargs: dict[str, Any] = {}

    def __init__(self, seed: int | None = None):
        self._rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self._rng = np.random.default_rng(seed)

    def act(self, observation: str, info: dict[str, Any]) -> str:
        actions = info.get("admissible_actions") or []
        if not actions:
            return "look"
        return str(actions[int(self._rng.integers(len(actions)))])
