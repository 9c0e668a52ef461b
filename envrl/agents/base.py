"""The agent interface shared by every agent (random, expert, LLM agents)."""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable


@runtime_checkable
class Agent(Protocol):
    """Plays one episode at a time: ``reset()`` at the start, ``act`` once per turn.

    ``name`` identifies the agent on the leaderboard (e.g. ``"random"``, ``"expert"``).
    """

    name: str

    def reset(self, seed: int | None = None) -> None:
        """Forget the previous episode; ``seed`` makes a stochastic agent repeatable."""

    def act(self, observation: str, info: dict[str, Any]) -> str:
        """Return the next action given the latest observation and info."""


def act_batch(agents: Sequence[Agent], observations: Sequence[str], infos: Sequence[dict[str, Any]]) -> list[str]:
    """One action per env; LLM agents override this to batch generation."""
    return [agent.act(obs, info) for agent, obs, info in zip(agents, observations, infos)]
