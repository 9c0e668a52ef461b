"""The agent interface shared by every agent (random, expert, LLM agents), and batched acting.

An agent that can choose the actions of many episodes in one go (one batched model call)
says so by following :class:`BatchedAgent`; :func:`act_batch`, the evaluation runner and the
training rollouts ask such agents together and every other agent one by one. No caller
checks for a concrete class, so a training policy batches the same way as an LLM agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeGuard, runtime_checkable


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


@runtime_checkable
class BatchedAgent(Agent, Protocol):
    """An agent that chooses the actions of many episodes together.

    ``act_together(agents, observations, infos)`` returns one action per agent of
    ``agents``, a list of agents of this agent's type (this one among them), each in its own
    episode; it may raise, which ends every episode of the call. One call per turn is what
    lets an LLM agent answer all its episodes with one batched generation.
    """

    def act_together(
        self, agents: Sequence[Any], observations: Sequence[str], infos: Sequence[dict[str, Any]]
    ) -> list[str]:
        """One action per agent, chosen in one go."""


def is_batched(agent: Any) -> TypeGuard[BatchedAgent]:
    """Whether ``agent`` acts in batches (follows :class:`BatchedAgent`)."""
    return callable(getattr(agent, "act_together", None))


def act_batch(agents: Sequence[Agent], observations: Sequence[str], infos: Sequence[dict[str, Any]]) -> list[str]:
    """One action per env: batched agents of one type answer together in one
    ``act_together`` call (see :class:`BatchedAgent`); other agents act one by one."""
    actions: list[str] = [""] * len(agents)
    groups: dict[type, list[tuple[int, BatchedAgent]]] = {}
    for i, agent in enumerate(agents):
        if is_batched(agent):
            groups.setdefault(type(agent), []).append((i, agent))
        else:
            actions[i] = agent.act(observations[i], infos[i])
    for members in groups.values():
        batch = [agent for _, agent in members]
        together = batch[0].act_together(batch, [observations[i] for i, _ in members], [infos[i] for i, _ in members])
        for (i, _), action in zip(members, together):
            actions[i] = action
    return actions
