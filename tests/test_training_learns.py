"""The RL update path learns: GRPO and GiGPO in choose mode on a one-step bandit.

No env is played: a group of 8 one-step episodes samples an action from the current policy
(the same ``HFBackend.choose`` that rollouts use) and earns 1 for the target action, 0 for
the others. Everything after the rollout is the real thing: advantages, the choose-mode
log-probabilities, the PPO loss, the optimizer. A sign error, a mismatched old log-prob or an
advantage attached to the wrong sample would keep the target's probability where it starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from envrl.agents.choose import candidate_scores, score_candidates  # noqa: E402
from envrl.agents.generation import SamplingConfig  # noqa: E402
from envrl.training.algorithms import algorithm_class  # noqa: E402
from envrl.training.config import build_config  # noqa: E402
from envrl.training.loop import Trainer  # noqa: E402
from envrl.training.rollout import RolloutBatch, StepSample, Trajectory  # noqa: E402

MESSAGES = [{"role": "user", "content": "Task: open the door.\nYou see a door."}]
ACTIONS = ["go north", "open door", "look", "take key", "go south"]
TARGET = 1
GROUP = 8


def _bandit_trainer(algo: str, checkpoint: Path, out: Path) -> Trainer:
    config = build_config(
        algo,
        "textworld",
        algorithm_config=algorithm_class(algo).Config,
        sets=[
            f"policy.model={checkpoint}",
            f"out={out}",
            "updates=12",
            "policy.template=action",
            "policy.history=0",
            "policy.device=cpu",
            "policy.action_mode=choose",
            "policy.choose_score=mean",
            f"rollout.group_size={GROUP}",
            "rollout.groups=1",
            "eval.episodes=0",
            "optim.lr=3e-3",
            "algorithm.kl_coef=0.0",
        ],
    )
    trainer = Trainer(config)
    policy = trainer.policy
    texts = [policy.template.format_response(a) for a in ACTIONS]

    def play(update: int) -> RolloutBatch:
        seeds = [1000 * update + i for i in range(GROUP)]
        generations = policy.backend.choose([MESSAGES] * GROUP, [texts] * GROUP, policy.sampling, seeds, "mean")
        batch = RolloutBatch()
        for i, g in enumerate(generations):
            reward = float(g.choice == TARGET)
            batch.samples.append(
                StepSample(
                    prompt_ids=g.prompt_token_ids or [],
                    response_ids=g.token_ids or [],
                    old_logprobs=[float(g.choice_logprob or 0.0)],
                    candidate_ids=g.candidate_token_ids,
                    choice=g.choice,
                    action=ACTIONS[g.choice or 0],
                    reward=reward,
                    observation="You see a door.",
                    next_observation="",
                    anchor="You see a door.",
                    valid=True,
                    env_valid=True,
                    done=True,
                    truncated=False,
                    group_id=0,
                    trajectory_id=i,
                    step=0,
                    task_id="bandit",
                )
            )
            batch.trajectories.append(Trajectory(0, i, "bandit", 0, 1, reward, reward > 0, reward))
        return batch

    trainer.play = play  # type: ignore[method-assign]
    return trainer


def _target_probability(trainer: Trainer) -> float:
    policy = trainer.policy
    generation = policy.backend.choose(
        [MESSAGES],
        [[policy.template.format_response(a) for a in ACTIONS]],
        SamplingConfig(temperature=1.0, seed=0),
        score="mean",
    )[0]
    with torch.no_grad():
        grid = score_candidates(
            policy.unwrapped, generation.prompt_token_ids, generation.candidate_token_ids, policy.backend.pad_id
        )
        scores = candidate_scores(grid, generation.candidate_token_ids, "mean")
    return float(torch.softmax(scores, 0)[TARGET])


@pytest.mark.parametrize("algo", ["grpo", "gigpo"])
def test_rl_raises_the_probability_of_the_rewarded_action(algo: str, tiny_checkpoint: Path, tmp_path: Path) -> None:
    trainer = _bandit_trainer(algo, tiny_checkpoint, tmp_path / algo)
    try:
        before = _target_probability(trainer)
        successes = []
        for update in range(trainer.config.updates):
            batch = trainer.algorithm.collect(trainer, update)
            successes.append(batch.metrics["success_rate"])
            trainer.update(batch.samples)
        after = _target_probability(trainer)
    finally:
        trainer.close()
    assert before < 0.4  # a from-scratch model starts near the uniform 1/5
    assert after > 0.7, (before, after)
    assert sum(successes[-4:]) / 4 > sum(successes[:4]) / 4
