"""The parts of the env contract that every envrl env must keep the same way (envs/base.py).

Episode ends are final (after ``terminated`` or ``truncated`` no step reaches the engine or
changes the outcome), ``close()`` is final, and ``reset(options=...)`` checks its argument.
Each test runs on every env, with small tasks: ALFWorld's official samples, WebShop's
built-in catalog, one generated TextWorld game, one ScienceWorld variation and a task of each
diagnostic whose expert takes more than two moves.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import TEXTWORLD_PLAYED

import envrl
from envrl.agents import make_agent
from envrl.envs.base import EPISODE_OVER_FEEDBACK, TextEnv

#: every registered env, each played on its descriptor's contract task
ENV_NAMES = tuple(envrl.envs.REGISTRY)


@pytest.fixture
def make_env(request) -> Callable[..., tuple[gym.Env, str]]:
    """``make_env(name, **kwargs)``: a made env of that family and a task id its expert wins
    (the descriptor's ``contract_task``: its split, kwargs, fixtures; None: the split's first task)."""
    made: list[gym.Env] = []

    def make(name: str, **kwargs: Any) -> tuple[gym.Env, str]:
        descriptor = envrl.envs.REGISTRY[name]
        task = descriptor.contract_task
        for fixture in task.fixtures:
            request.getfixturevalue(fixture)
        from_fixtures = {key: request.getfixturevalue(fixture) for key, fixture in task.fixture_kwargs.items()}
        env = gym.make(descriptor.env_id, split=task.split, **{**task.kwargs, **from_fixtures, **kwargs})
        made.append(env)
        return env, task.task_id or env.unwrapped.task_ids[0]

    yield make
    for env in made:
        env.close()


def _play_expert(env: gym.Env, task_id: str) -> tuple[float, dict[str, Any], list[str]]:
    """Play the expert to the end; the summed reward, the last info, the actions taken."""
    agent = make_agent("expert")
    observation, info = env.reset(options={"task_id": task_id})
    total, actions, terminated, truncated = 0.0, [], False, False
    while not (terminated or truncated):
        action = agent.act(observation, info)
        observation, reward, terminated, truncated, info = env.step(action)
        total += reward
        actions.append(action)
    assert terminated and info["success"], "the expert must win this task"
    return total, info, actions


def _assert_over(step: tuple, *, terminated: bool, truncated: bool, final: dict[str, Any]) -> None:
    observation, reward, got_terminated, got_truncated, info = step
    assert observation == EPISODE_OVER_FEEDBACK and reward == 0.0
    assert (got_terminated, got_truncated) == (terminated, truncated)
    assert info["success"] == final["success"] and info["score"] == final["score"]
    assert info["valid_action"] is False and info["admissible_actions"] == []
    assert info["task_id"] == final["task_id"]
    json.dumps(info)  # a recorder can store it


@pytest.mark.parametrize("name", ENV_NAMES)
def test_steps_after_success_change_nothing(make_env, name):
    env, task_id = make_env(name, expert_plan=True)
    _, final, actions = _play_expert(env, task_id)
    engine_steps = final["step"]
    # Actions that would undo the win (ALFWorld: take the object back), replay it, or are bad input.
    after = [*reversed(actions), *actions, "look", "", None, "x" * 5000]
    for n, action in enumerate(after, start=1):
        step = env.step(action)
        _assert_over(step, terminated=True, truncated=False, final=final)
        assert step[4]["step"] == engine_steps + n
    # A new episode starts cleanly and plays the same way.
    _, final_again, actions_again = _play_expert(env, task_id)
    assert (actions_again, final_again["success"], final_again["score"]) == (actions, True, final["score"])


@pytest.mark.parametrize("name", ENV_NAMES)
def test_steps_after_truncation_change_nothing(make_env, name):
    env, task_id = make_env(name, max_episode_steps=2, expert_plan=True)
    _, info = env.reset(options={"task_id": task_id})
    plan = list(info["expert_plan"])
    assert len(plan) > 2, "the task must take longer than the step limit"
    env.step(plan[0])
    observation, reward, terminated, truncated, final = env.step(plan[1])
    assert truncated and not terminated and not final["success"]
    # The rest of the winning plan, after the limit, must not reach the engine.
    for action in plan[2:]:
        _assert_over(env.step(action), terminated=False, truncated=True, final=final)
    # A step limit reached by a screened action (never seen by the engine) ends the episode too.
    _, start = env.reset(options={"task_id": task_id})
    env.step(None)
    assert env.step(None)[3]
    for action in plan:
        _assert_over(env.step(action), terminated=False, truncated=True, final=start)


@pytest.mark.parametrize("name", ENV_NAMES)
def test_close_is_final_and_clear(make_env, name):
    env, task_id = make_env(name)
    env.reset(options={"task_id": task_id})
    env.close()
    with pytest.raises(gym.error.ClosedEnvironmentError, match="closed; make a new env"):
        env.step("look")
    with pytest.raises(gym.error.ClosedEnvironmentError, match="closed; make a new env"):
        env.reset(seed=0)
    env.close()  # twice is harmless


@pytest.mark.parametrize("name", ENV_NAMES)
def test_options_must_be_a_dict(make_env, name):
    env, task_id = make_env(name)
    for options in ([1], "fixed_0", 3):
        with pytest.raises(TypeError, match="options must be a dict"):
            env.reset(options=options)
    observation, info = env.reset(options={"task_id": task_id})
    assert info["task_id"] == task_id


@pytest.mark.parametrize("name", ENV_NAMES)
def test_the_seed_picks_the_task_by_one_rule(make_env, name):
    """``reset(seed=s)`` plays ``task_ids[default_rng(s).integers(len(task_ids))]`` on every env."""
    env, _ = make_env(name)
    task_ids = env.unwrapped.task_ids

    def drawn(seed: int) -> int:
        return int(np.random.default_rng(seed).integers(len(task_ids)))

    seeds: list[int] = [0, 1, 7, 2**31]
    if name == "textworld":  # seeds that draw games the test cache holds (any other is generated: ~6 s)
        seeds = list(itertools.islice((seed for seed in itertools.count() if drawn(seed) < TEXTWORLD_PLAYED), 4))
    for seed in seeds:
        assert env.reset(seed=seed)[1]["task_id"] == task_ids[drawn(seed)], seed


def test_truncation_signal_is_part_of_every_id():
    for name, env_id in envrl.envs.ENV_IDS.items():
        wrappers = [w.name for w in gym.spec(env_id).additional_wrappers]
        assert wrappers == ["TruncationSignal"], name


def test_a_text_env_made_directly_still_ends_on_termination(tw_cache):
    """Without gym.make there is no step limit, but a terminated episode stays terminated."""
    from envrl.envs.textworld.env import TextWorldEnv

    env = TextWorldEnv(split="train", cache_dir=tw_cache, expert_plan=True)
    assert isinstance(env, TextEnv)
    _, final, _ = _play_expert(env, "tw-custom:train:0")
    _assert_over(env.step("look"), terminated=True, truncated=False, final=final)
    env.close()


@pytest.mark.parametrize("name", ENV_NAMES)
def test_check_text_env_passes_on_every_registered_env(make_env, name):
    env, task_id = make_env(name, expert_plan=True)
    envrl.envs.check_text_env(env, task_id)  # plays to a win, checks bad actions, the end and close()


class _KeepsPlaying(gym.Wrapper):
    """Broken on purpose: after the episode ends it passes steps on to a fresh episode."""

    def step(self, action):
        step = self.env.step(action)
        if step[4].get("task_id") and step[0] == EPISODE_OVER_FEEDBACK:
            self.env.reset(options={"task_id": step[4]["task_id"]})
            return self.env.step(action)
        return step


class _DropsAKey(gym.Wrapper):
    """Broken on purpose: its step info lacks ``step``."""

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        return observation, reward, terminated, truncated, {k: v for k, v in info.items() if k != "step"}


class _RaisesOnNone(gym.Wrapper):
    """Broken on purpose: a non-string action raises instead of getting feedback."""

    def step(self, action):
        if not isinstance(action, str):
            raise ValueError("actions must be strings")
        return self.env.step(action)


@pytest.mark.parametrize(
    "wrapper, message",
    [
        (_KeepsPlaying, r"^step\('look'\) after the episode ended returned .* it must return 'The episode is over"),
        (_DropsAKey, r"^step\(''\)'s info lacks step \(every info carries task_id, "),
        (_RaisesOnNone, r"^step\(None\) raised ValueError: actions must be strings; it must answer with feedback$"),
    ],
)
def test_check_text_env_names_the_broken_rule(wrapper, message):
    env = wrapper(gym.make("envrl/Diag-Chain-v0", split="valid", expert_plan=True))
    with pytest.raises(envrl.envs.EnvContractError, match=message):
        envrl.envs.check_text_env(env, check_close=False)
    env.close()
