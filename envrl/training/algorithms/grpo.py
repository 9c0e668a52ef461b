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

``pi_old`` is not the sampler's log-probabilities (KV-cached generation, or the choice scored
by the acting back end), which differ from the training forward pass by float rounding, up to
~1e-3 per token under bf16 autocast: before an update's first optimizer step the loop scores
its samples once more with the loss's own forward pass, micro-batches and precision
(:meth:`~envrl.training.loop.Trainer.score_old_policy`, as verl recomputes ``old_log_prob``),
and :meth:`GRPO.loss_from_scores` stores those as ``old_logprobs``, so the ratio at the first
minibatch is exactly 1. The KL reference is scored in the same pass, through the same path, so
the KL is exactly 0 while the weights are the reference's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from envrl.training.advantages import grpo_advantages
from envrl.training.algorithms.base import Algorithm, Batch, TrainingContext
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


def check_group_size(name: str, train_config: Any) -> None:
    """Refuse groups of fewer than 2 rollouts: group-relative advantages compare a group's members."""
    if train_config.rollout.group_size < 2:
        raise ConfigError(
            f"{name} compares rollouts of the same task: rollout.group_size must be at least 2, "
            f"got {train_config.rollout.group_size}"
        )


class GRPO(Algorithm):
    name = "grpo"
    Config: ClassVar[type] = GRPOConfig
    uses_rollouts = True

    def check(self, train_config: Any) -> None:
        check_group_size(self.name, train_config)
        if self.config.norm not in ("mean_std", "mean"):
            raise ConfigError(f"algorithm.norm must be mean_std or mean, got {self.config.norm!r}")
        if self.config.episode_stats not in ("steps", "trajectories"):
            raise ConfigError(
                f"algorithm.episode_stats must be steps or trajectories, got {self.config.episode_stats!r}"
            )

    def needs_reference_model(self) -> bool:
        return self.config.kl_coef > 0

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

    def collect(self, trainer: TrainingContext, update: int) -> Batch:
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

    def compute_loss(self, trainer: TrainingContext, samples: Sequence[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        return self.loss_from_scores(trainer, samples, trainer.policy.logprobs(samples))

    def loss_from_scores(
        self, trainer: TrainingContext, samples: Sequence[Any], scores: Scores
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of ``samples`` given their scored units under the current weights (ENVRL
        scores them in one pass with its own rows and hands them here)."""
        c = self.config
        policy = trainer.policy
        # contexts built by hand (tests) may not have the attribute: they never run the pass
        scoring = getattr(trainer, "scoring_pass", None)
        if scoring is not None:
            return _record(scoring, samples, scores)
        old = _padded([s.old_logprobs for s in samples], scores.mask)
        advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=scores.mask.device)
        loss, stats = ppo_clip_loss(scores.logprobs, old, advantages, scores.mask, c.clip_eps)
        metrics = {"loss/policy": float(loss.detach()), **{f"ppo/{k}": float(v) for k, v in stats.items()}}
        entropy = masked_mean(scores.entropy, scores.mask)
        metrics["entropy"] = float(entropy.detach())
        if c.kl_coef > 0:
            if all(s.ref_logprobs is not None for s in samples):
                reference = _padded([s.ref_logprobs for s in samples], scores.mask)
            else:  # not scored by the loop's pass (a loss computed by hand): score them now
                reference = policy.reference_logprobs(samples)
            kl = kl_k3(scores.logprobs, reference, scores.mask)
            loss = loss + c.kl_coef * kl
            metrics["kl"] = float(kl.detach())
        if c.entropy_coef > 0:
            loss = loss - c.entropy_coef * entropy
        return loss, metrics


def _record(scoring: str, samples: Sequence[Any], scores: Scores) -> tuple[torch.Tensor, dict[str, float]]:
    """Store the scored units on the samples during the loop's old-policy pass: as the old
    policy's log-probs (``scoring == "old"``, keeping the sampler's in ``rollout_logprobs``) or
    as the reference's (``"reference"``). Returns a zero loss and, for the old policy, how far the
    sampler's values were from the recomputed ones (mean and largest absolute difference per unit)."""
    if scoring not in ("old", "reference"):
        raise ValueError(f"unknown scoring pass {scoring!r}; expected old or reference")
    gaps: list[float] = []
    for row, sample in enumerate(samples):
        values = scores.logprobs[row, : int(scores.mask[row].sum())].detach().tolist()
        if scoring == "reference":
            sample.ref_logprobs = values
            continue
        if sample.rollout_logprobs is None:
            sample.rollout_logprobs = list(sample.old_logprobs)
        if len(sample.rollout_logprobs) == len(values):
            gaps.extend(abs(a - b) for a, b in zip(sample.rollout_logprobs, values))
        sample.old_logprobs = values
    zero = torch.zeros((), device=scores.mask.device)
    if not gaps:
        return zero, {}
    return zero, {"old_logprob/rollout_gap": float(np.mean(gaps)), "old_logprob/rollout_gap_max": max(gaps)}


def _padded(rows: Sequence[Sequence[float]], like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(list(row), dtype=out.dtype, device=out.device)
    return out
