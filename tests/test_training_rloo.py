"""RLOO: the leave-one-out advantage against hand-computed values, and a tiny run through the loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from envrl.training.algorithms.rloo import rloo_advantages


def test_each_trajectory_is_judged_against_the_mean_of_the_others() -> None:
    # returns [1, 0, 0, 1]: 1 - (0 + 0 + 1) / 3 = 2/3 and 0 - (1 + 0 + 1) / 3 = -2/3
    got = rloo_advantages([1, 0, 0, 1], [True] * 4, [0] * 4, [0, 1, 2, 3])
    assert got.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3], abs=1e-12)


def test_steps_share_their_trajectorys_advantage_groups_are_apart_and_invalid_steps_pay() -> None:
    # group 0: trajectory 0 earns 0 + 1 = 1, trajectory 1 earns 0, trajectory 2 earns 0.5 + 0 + 0 = 0.5
    #   A0 = 1 - (0 + 0.5) / 2 = 0.75, A1 = 0 - (1 + 0.5) / 2 = -0.75, A2 = 0.5 - (1 + 0) / 2 = 0
    # group 1: trajectory 3 earns 2, trajectory 4 earns 0: A3 = 2 - 0 = 2, A4 = 0 - 2 = -2
    # trajectory 1's only step is format-invalid: its sample pays the penalty, -0.75 - 0.1
    rows = [  # (reward, valid, group, trajectory), shuffled
        (0.0, True, 1, 4),
        (1.0, True, 0, 0),
        (0.0, True, 0, 2),
        (0.0, False, 0, 1),
        (2.0, True, 1, 3),
        (0.5, True, 0, 2),
        (0.0, True, 0, 0),
        (0.0, True, 0, 2),
    ]
    rewards, valid, groups, trajectories = zip(*rows)
    got = rloo_advantages(rewards, valid, groups, trajectories, invalid_penalty=0.1)
    assert got.tolist() == pytest.approx([-2.0, 0.75, 0.0, -0.85, 2.0, 0.0, 0.75, 0.0], abs=1e-12)


def test_it_is_grpos_centred_return_scaled_by_k_over_k_minus_1() -> None:
    returns = [3.0, 1.0, 0.0, 0.0, 1.0]  # mean 1: k / (k - 1) * (R - mean) = 1.25 * [2, 0, -1, -1, 0]
    got = rloo_advantages(returns, [True] * 5, ["task"] * 5, ["a", "b", "c", "d", "e"])
    assert got.tolist() == pytest.approx([2.5, 0.0, -1.25, -1.25, 0.0], abs=1e-12)


def test_a_lone_trajectory_has_no_baseline_and_gets_zero() -> None:
    """A group left with one trajectory (the others' workers died) teaches nothing, not its raw return."""
    got = rloo_advantages([1.0, 0.5, 1.0], [True, False, True], [0, 0, 1], [0, 0, 1], invalid_penalty=0.1)
    assert got.tolist() == pytest.approx([0.0, -0.1, 0.0], abs=1e-12)
    with pytest.raises(ValueError, match="invalid_penalty must be >= 0"):
        rloo_advantages([1.0], [True], [0], [0], invalid_penalty=-1.0)


def test_groups_of_one_and_grpo_keys_are_refused_before_the_run() -> None:
    from envrl.training.algorithms import RLOO, RLOOConfig, algorithm_class
    from envrl.training.config import ConfigError, build_config

    assert algorithm_class("rloo") is RLOO
    config = build_config("rloo", "textworld", algorithm_config=RLOOConfig, sets=["rollout.group_size=1"])
    with pytest.raises(
        ConfigError, match="rloo compares rollouts of the same task: rollout.group_size must be at least 2"
    ):
        RLOO(config.algorithm).check(config)
    with pytest.raises(ConfigError, match="unknown config key 'algorithm.norm'"):  # no std normalisation to choose
        build_config("rloo", "textworld", algorithm_config=RLOOConfig, sets=["algorithm.norm=mean"])


class OneStepVec:
    """``num_envs`` one-step episodes; env ``i`` earns ``REWARDS[i]``."""

    autoreset = False
    REWARDS = [1.0, 0.0, 0.0, 1.0]

    def __init__(self) -> None:
        self.num_envs = len(self.REWARDS)

    def _infos(self) -> dict[str, Any]:
        n = self.num_envs
        return {"admissible_actions": [["look", "open door"]] * n, "instruction": ["open the door"] * n}

    def reset(self, seed: Any = None, options: Any = None) -> tuple[list[str], dict[str, Any]]:
        return ["You see a door."] * self.num_envs, self._infos()

    def step(self, actions: list[str]) -> tuple[list[str], list[float], list[bool], list[bool], dict[str, Any]]:
        n = self.num_envs
        return ["Done."] * n, list(self.REWARDS), [True] * n, [False] * n, self._infos()

    def close(self) -> None:
        pass


def test_two_updates_run_through_the_loop(tiny_checkpoint: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from envrl.training.algorithms import RLOOConfig
    from envrl.training.config import build_config
    from envrl.training.loop import Trainer
    from envrl.training.rollout import GroupRollout

    config = build_config(
        "rloo",
        "textworld",
        algorithm_config=RLOOConfig,
        sets=[
            f"policy.model={tiny_checkpoint}",
            f"out={tmp_path / 'out'}",
            "updates=2",
            "policy.template=action",
            "policy.history=0",
            "policy.device=cpu",
            "policy.action_mode=choose",
            "rollout.groups=1",
            "rollout.group_size=4",
            "eval.episodes=0",
            "optim.lr=1e-3",
            "optim.minibatches=1",
            "optim.epochs=1",
            "optim.micro_batch_size=4",
        ],
    )
    trainer = Trainer(config)
    try:
        trainer._rollout = GroupRollout(OneStepVec(), trainer.policy.agents(4), 1, 4)
        trainer._task_ids = ["task-0"]
        trainer.run(progress=False)
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [row["update"] for row in rows] == [1, 2]
    for row in rows:  # returns [1, 0, 0, 1] every update: advantages [2/3, -2/3, -2/3, 2/3]
        assert row["advantage/mean"] == pytest.approx(0.0, abs=1e-12)
        assert row["advantage/max"] == pytest.approx(2 / 3, abs=1e-12)
        assert row["advantage/min"] == pytest.approx(-2 / 3, abs=1e-12)
        assert row["ppo/ratio_mean"] == 1.0  # one minibatch, scored before its step by the same weights
    assert rows[0]["kl"] == 0.0  # the first update starts at the reference
    assert (tmp_path / "out" / "checkpoints" / "update-000002" / "model" / "config.json").is_file()
