"""Agents: ``make_agent("random")``, ``make_agent("expert")``; all follow ``envrl.agents.base.Agent``."""

from __future__ import annotations

from envrl.agents.base import Agent, act_batch
from envrl.agents.expert import ExpertAgent
from envrl.agents.random_agent import RandomAgent

AGENTS = ("random", "expert", "expert:handcoded")


def make_agent(spec: str, env_name: str | None = None, seed: int | None = None) -> Agent:
    """Build an agent from its command-line spec.

    ``random`` and ``expert`` work on every env; ``expert:handcoded`` is ALFWorld's hand-coded
    expert (official games with traj_data.json only).
    """
    if spec == "random":
        return RandomAgent(seed=seed)
    if spec == "expert":
        return ExpertAgent()
    if spec == "expert:handcoded":
        return ExpertAgent(expert_type="handcoded")
    raise ValueError(f"unknown agent {spec!r}; choose one of {AGENTS}")


__all__ = ["Agent", "AGENTS", "ExpertAgent", "RandomAgent", "act_batch", "make_agent"]
