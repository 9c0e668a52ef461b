"""GRPO (Shao et al., 2024, "DeepSeekMath"), applied to multi-turn agents as verl-agent does.

For each task, ``group_size`` rollouts start from the same state (same task, same seed). A
trajectory's advantage is its return normalised within its group,

    A_i = (R_i - mean(R_group)) / (std(R_group) + eps)

and every step (every response) of the trajectory gets it (:mod:`envrl.training.advantages`
has the exact conventions). The policy is updated with the PPO clipped objective on the
response tokens, token-mean aggregated, plus a KL penalty to the frozen starting policy (the
k3 estimator) and an optional entropy bonus:

    L = - mean_t min(r_t A, clip(r_t, 1 - e, 1 + e) A) + beta * KL_k3 - c_H * H,
    r_t = pi_theta(y_t | ...) / pi_old(y_t | ...)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from envrl.training.advantages import grpo_advantages
from envrl.training.algorithms.base import Algorithm, Batch
from envrl.training.config import ConfigError
from envrl.training.losses import kl_k3, masked_mean, ppo_clip_loss
from envrl.training.policy import Scores


@dataclass
class GRPOConfig:
    norm: str = "mean_std"  # mean_std (divide by the group's std) or mean (only subtract the mean)
    episode_stats: str = "steps"  # group statistics over the group's steps (reference code) or trajectories (paper)
    invalid_penalty: float = 0.1  # subtracted from a format-invalid step's score
    clip_eps: float = 0.2
    kl_coef: float = 0.01  # 0 turns the KL term (and the reference model) off
    entropy_coef: float = 0.0


class GRPO(Algorithm):
    name = "grpo"
    Config = GRPOConfig
    uses_rollouts = True

    def check(self, train_config: Any) -> None:
        if train_config.rollout.group_size < 2:
            raise ConfigError(
                f"{self.name} compares rollouts of the same task: rollout.group_size must be at least 2, "
                f"got {train_config.rollout.group_size}"
            )
        if self.config.norm not in ("mean_std", "mean"):
            raise ConfigError(f"algorithm.norm must be mean_std or mean, got {self.config.norm!r}")
        if self.config.episode_stats not in ("steps", "trajectories"):
            raise ConfigError(
                f"algorithm.episode_stats must be steps or trajectories, got {self.config.episode_stats!r}"
            )

    def advantages(self, samples: Sequence[Any]) -> np.ndarray:
        c = self.config
        return grpo_advantages(
            [s.reward for s in samples],
            [s.valid for s in samples],
            [s.group_id for s in samples],
            [s.trajectory_id for s in samples],
            [s.step for s in samples],
            norm=c.norm,
            episode_stats=c.episode_stats,
            invalid_penalty=c.invalid_penalty,
        )

    def collect(self, trainer: Any, update: int) -> Batch:
        rollout = trainer.play(update)
        metrics = rollout.metrics()
        if not rollout.samples:
            return Batch([], metrics)
        advantages = self.advantages(rollout.samples)
        for sample, advantage in zip(rollout.samples, advantages):
            sample.advantage = float(advantage)
        metrics.update(
            {
                "advantage/mean": float(advantages.mean()),
                "advantage/std": float(advantages.std()),
                "advantage/min": float(advantages.min()),
                "advantage/max": float(advantages.max()),
            }
        )
        # a sample without tokens (a failed generation) still shaped its group's statistics above
        return Batch([s for s in rollout.samples if s.response_ids], metrics)

    def compute_loss(self, trainer: Any, samples: Sequence[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        return self.loss_from_scores(trainer, samples, trainer.policy.logprobs(samples))

    def loss_from_scores(
        self, trainer: Any, samples: Sequence[Any], scores: Scores
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of ``samples`` given their scored units under the current weights (ENVRL
        scores them in one pass with its own rows and hands them here)."""
        c = self.config
        policy = trainer.policy
        old = _padded([s.old_logprobs for s in samples], scores.mask)
        advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=scores.mask.device)
        loss, stats = ppo_clip_loss(scores.logprobs, old, advantages, scores.mask, c.clip_eps)
        metrics = {"loss/policy": float(loss.detach()), **{f"ppo/{k}": float(v) for k, v in stats.items()}}
        entropy = masked_mean(scores.entropy, scores.mask)
        metrics["entropy"] = float(entropy.detach())
        if c.kl_coef > 0:
            kl = kl_k3(scores.logprobs, policy.reference_logprobs(samples), scores.mask)
            loss = loss + c.kl_coef * kl
            metrics["kl"] = float(kl.detach())
        if c.entropy_coef > 0:
            loss = loss - c.entropy_coef * entropy
        return loss, metrics


def _padded(rows: Sequence[Sequence[float]], like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(list(row), dtype=out.dtype, device=out.device)
    return out
