"""Batched acting by protocol (envrl.agents.base.BatchedAgent), not by agent class."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envrl.agents import BatchedAgent, act_batch, is_batched
from envrl.agents.llm import LLMAgent
from envrl.agents.random_agent import RandomAgent


class CountingPolicy:
    """A stand-in for a training policy: answers all its episodes in one call per turn."""

    name = "policy"
    calls: list[list[int]] = []

    def __init__(self, ident: int):
        self.ident = ident

    def reset(self, seed: int | None = None) -> None:
        pass

    def act(self, observation: str, info: dict[str, Any]) -> str:
        raise AssertionError("a batched agent in a batch must not be asked one by one")

    def act_together(
        self, agents: Sequence[CountingPolicy], observations: Sequence[str], infos: Sequence[dict[str, Any]]
    ) -> list[str]:
        CountingPolicy.calls.append([a.ident for a in agents])
        return [f"{a.ident}:{o}" for a, o in zip(agents, observations)]


class OneByOne:
    name = "single"

    def reset(self, seed: int | None = None) -> None:
        pass

    def act(self, observation: str, info: dict[str, Any]) -> str:
        return f"single:{observation}"


def test_the_protocol_not_the_class_decides():
    assert is_batched(CountingPolicy(0)) and isinstance(CountingPolicy(0), BatchedAgent)
    assert not is_batched(OneByOne()) and not is_batched(RandomAgent())
    assert callable(getattr(LLMAgent, "act_together", None))  # LLM agents follow the same protocol


def test_batched_agents_of_a_type_answer_in_one_call_and_order_is_kept():
    CountingPolicy.calls = []
    agents = [CountingPolicy(0), OneByOne(), CountingPolicy(2), CountingPolicy(3), OneByOne()]
    observations = [f"o{i}" for i in range(5)]
    actions = act_batch(agents, observations, [{} for _ in agents])
    assert actions == ["0:o0", "single:o1", "2:o2", "3:o3", "single:o4"]
    assert CountingPolicy.calls == [[0, 2, 3]]
