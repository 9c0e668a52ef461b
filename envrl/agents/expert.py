"""The expert: plays the environment's own plan (``info["expert_plan"]``).

For WebShop it is the oracle (search the goal product, pick the best options, buy). For
ALFWorld the plan is the game's planner walkthrough, replanned by Fast Downward if the
episode leaves it, or ALFWorld's hand-coded expert (``expert_type="handcoded"``). The agent
asks the env for the plan through ``env_kwargs``, which evaluation runs pass to ``gym.make``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: why the hand-coded expert cannot play a game (it reads ALFRED's annotation of the game)
NEEDS_TRAJ_DATA = "ALFWorld's hand-coded expert needs traj_data.json beside the game; the planner expert plays any game"


class ExpertAgent:
    name = "expert"

    def __init__(self, expert_type: str = "planner"):
        # only ALFWorld has expert types; other envs take the default plan
        self.expert_type = expert_type
        self.env_kwargs: dict[str, Any] = {"expert_plan": True}
        if expert_type != "planner":
            self.env_kwargs["expert_type"] = expert_type
            # its own name, so that its runs get their own run ids and leaderboard rows
            self.name = f"expert:{expert_type}"

    def reset(self, seed: int | None = None) -> None:
        pass

    def act(self, observation: str, info: dict[str, Any]) -> str:
        plan = info.get("expert_plan")
        if plan is None:
            raise RuntimeError("the expert needs an env made with expert_plan=True (see ExpertAgent.env_kwargs)")
        # An empty plan means the task is already done (or the planner found no way): wait.
        return plan[0] if plan else "look"

    def unplayable_tasks(self, env: Any, task_ids: Sequence[str]) -> dict[str, str]:
        """The tasks of ``task_ids`` this expert cannot play in ``env`` (task id -> why).

        The hand-coded expert reads ``traj_data.json`` beside each game, which most official
        games lack (the training games, and all but a few of the validation ones in some
        releases); the evaluation runner asks before a run starts, rather than recording
        each such game as an errored episode. The planner plays every game."""
        if self.expert_type != "handcoded":
            return {}
        games = getattr(env, "games", None)
        if games is None:
            return {}
        lacking = {game.task_id for game in games if not getattr(game, "has_traj_data", True)}
        return {task_id: NEEDS_TRAJ_DATA for task_id in task_ids if task_id in lacking}
