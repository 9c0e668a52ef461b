"""The expert: plays the environment's own plan (``info["expert_plan"]``).

For WebShop it is the oracle (search the goal product, pick the best options, buy). For
ALFWorld the plan is the game's planner walkthrough, replanned by Fast Downward if the
episode leaves it, or ALFWorld's hand-coded expert (``expert_type="handcoded"``). The agent
asks the env for the plan through ``env_kwargs``, which evaluation runs pass to ``gym.make``.
"""

from __future__ import annotations

from typing import Any


class ExpertAgent:
    name = "expert"

    def __init__(self, expert_type: str = "planner"):
        # only ALFWorld has expert types; other envs take the default plan
        self.env_kwargs: dict[str, Any] = {"expert_plan": True}
        if expert_type != "planner":
            self.env_kwargs["expert_type"] = expert_type

    def reset(self, seed: int | None = None) -> None:
        pass

    def act(self, observation: str, info: dict[str, Any]) -> str:
        plan = info.get("expert_plan")
        if plan is None:
            raise RuntimeError("the expert needs an env made with expert_plan=True (see ExpertAgent.env_kwargs)")
        # An empty plan means the task is already done (or the planner found no way): wait.
        return plan[0] if plan else "look"
