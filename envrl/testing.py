"""A tiny deterministic text env and agents for testing runners, vector envs and agents.

Importing this module registers the env as ``envrl_test/EvalFake-v0``; its full id
:data:`ENV_ID` (``envrl.testing:envrl_test/EvalFake-v0``) makes Gymnasium import this module
first, so worker processes and Ray actors can make it by id, and the agent classes pickle by
reference: no test directory needs to be on anyone's ``sys.path``.

Tasks: box-opening. The right action on task ``tK`` is ``open box tK``; ``look`` is valid and
does nothing; anything else is invalid. :class:`FakeAgent` plays ``look``, ``jump`` (invalid),
then opens the box on even-numbered tasks (success in 3 turns, 2 of 3 valid) and looks
forever on odd ones (truncated at the registered limit of :data:`MAX_STEPS` steps, 5 of 6 valid).

Failures on demand, for testing how a runner copes (all env kwargs):

* ``raise_on="t1"``: every step of task ``t1`` raises ``RuntimeError("the fake engine
  exploded")``; ``$ENVRL_FAKE_RAISE_ON`` does the same when the kwarg is not given (so a test
  can see which environment variables a worker got).
* ``die_on="t2"``: resetting to task ``t2`` SIGKILLs the process the env runs in; with
  ``die_marker=PATH`` only the first time (the file remembers), with ``die_always=True``
  every time.
* ``step_delay=seconds``: each step sleeps that long first.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

from envrl.envs.base import StepResult, TaskStart, TextEnv

__all__ = ["ENV_ID", "MAX_STEPS", "SPLITS", "FakeAgent", "FakeEnv", "KwargsAgent", "RaisingAgent"]

#: the env's Gymnasium id, with this module's name so that Gymnasium imports it first
ENV_ID = "envrl.testing:envrl_test/EvalFake-v0"
#: the registered step limit
MAX_STEPS = 6

#: split -> [(task id, task type)]
SPLITS = {
    "train": [("t0", "pick"), ("t1", "clean"), ("t2", "pick"), ("t3", "heat"), ("t4", "clean")],
    "valid": [("v0", "pick"), ("v1", "clean")],
}


class FakeEnv(TextEnv):
    """The box-opening env (see the module docstring for its tasks and failures on demand)."""

    def __init__(
        self,
        split: str = "train",
        step_delay: float = 0.0,
        die_on: str | None = None,
        die_marker: str | None = None,
        die_always: bool = False,
        raise_on: str | None = None,
        render_mode: str | None = None,
    ):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
        super().__init__(split, render_mode)
        self.step_delay = step_delay
        self.die_on = die_on
        self.die_marker = die_marker
        self.die_always = die_always
        # read from the environment so a test can see which variables a worker process got
        self.raise_on = raise_on or os.environ.get("ENVRL_FAKE_RAISE_ON")
        self._types = dict(SPLITS[split])
        self._goal = ""

    def _split_task_ids(self) -> list[str]:
        return [task for task, _ in SPLITS[self.split]]

    def _start_task(self, task_id: str) -> TaskStart:
        if task_id == self.die_on:
            first_time = self.die_marker is not None and not Path(self.die_marker).exists()
            if self.die_always or first_time:
                if self.die_marker is not None:
                    Path(self.die_marker).touch()
                os.kill(os.getpid(), signal.SIGKILL)
        self._goal = f"open box {task_id}"
        return TaskStart(
            observation=f"You see box {task_id}.",
            task_type=self._types[task_id],
            instruction=f"Open box {task_id}.",
            admissible_actions=["look", self._goal],
        )

    def _apply(self, action: str) -> StepResult:
        if self.step_delay:
            time.sleep(self.step_delay)
        if self.task_id == self.raise_on:
            raise RuntimeError("the fake engine exploded")
        admissible = ["look", self._goal]
        if action == self._goal:
            return StepResult(
                observation="The box is open.",
                reward=1.0,
                terminated=True,
                valid_action=True,
                success=True,
                score=1.0,
                admissible_actions=admissible,
            )
        if action == "look":
            return StepResult(
                observation=f"You see box {self.task_id}.",
                reward=0.0,
                terminated=False,
                valid_action=True,
                success=False,
                score=0.5,
                admissible_actions=admissible,
            )
        return StepResult(
            observation=self.INVALID_FEEDBACK,
            reward=0.0,
            terminated=False,
            valid_action=False,
            success=False,
            score=0.0,
            admissible_actions=admissible,
        )


if "envrl_test/EvalFake-v0" not in gym.registry:
    gym.register("envrl_test/EvalFake-v0", entry_point=f"{__name__}:FakeEnv", max_episode_steps=MAX_STEPS)


class FakeAgent:
    """Deterministic: look, jump, then open the box on even tasks; look forever on odd ones."""

    name = "fake"
    env_kwargs: dict[str, Any] = {}

    def __init__(self) -> None:
        self.turn = 0

    def reset(self, seed: int | None = None) -> None:
        self.turn = 0

    def act(self, observation: str, info: dict[str, Any]) -> str:
        self.turn += 1
        if self.turn == 1:
            return "look"
        if self.turn == 2:
            return "jump"
        task_number = int(info["task_id"][1:])
        return f"open box {info['task_id']}" if task_number % 2 == 0 else "look"


class RaisingAgent(FakeAgent):
    """Raises on task t1 at its second turn."""

    name = "raising"

    def act(self, observation: str, info: dict[str, Any]) -> str:
        if info["task_id"] == "t1" and self.turn == 1:
            raise ValueError("the agent is confused")
        return super().act(observation, info)


class KwargsAgent(FakeAgent):
    """Asks the runner for env kwargs, like the expert does."""

    name = "kwargs"
    env_kwargs = {"step_delay": 0.0}
