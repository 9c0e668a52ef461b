"""RLOO: REINFORCE with a leave-one-out baseline (Kool et al., 2019; Ahmadian et al., 2024, "Back to Basics").

Each of a group's ``k`` trajectories (same task, same seed) is judged against the mean return of
the *other* ``k - 1``:

    A_i = R_i - 1/(k - 1) * sum_{j != i} R_j = R_i - (sum_j R_j - R_i) / (k - 1),

and every step of trajectory ``i`` gets ``A_i``. The baseline does not depend on ``R_i``, so the
gradient estimate stays unbiased (GRPO's group mean includes ``R_i``, and its std scaling
reweights tasks); there is no std normalisation, as in the paper. Equivalently
``A_i = k / (k - 1) * (R_i - mean(R))``. For returns ``[1, 0, 0, 1]``: ``[2/3, -2/3, -2/3, 2/3]``.

Conventions shared with GRPO (:mod:`envrl.training.advantages`): ``R_i`` is the trajectory's
total reward; a format-invalid step has ``invalid_penalty`` subtracted from its own sample's
advantage only (the baselines use the env's returns). A group whose other trajectories were all
dropped (a worker died) has no baseline: its trajectory's advantage is 0 (minus the penalty on
an invalid step), so it teaches nothing rather than its raw return; ``rollout.group_size`` below
2 is refused before the run starts.

The update is GRPO's: PPO clip on the response tokens (with one epoch and one minibatch the
ratio is exactly 1 and the clipped objective's gradient is REINFORCE's), the k3 KL to the
starting policy and the entropy bonus, on the same rollouts; only the advantage differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from envrl.training.algorithms.grpo import GRPO, check_group_size
from envrl.training.config import ConfigError


@dataclass
class RLOOConfig:
    invalid_penalty: float = 0.1  # subtracted from a format-invalid step's advantage
    clip_eps: float = 0.2
    kl_coef: float = 0.01  # 0 turns the KL term (and the reference model) off
    entropy_coef: float = 0.0


def rloo_advantages(
    rewards: ArrayLike,
    valid: ArrayLike,
    group_ids: ArrayLike,
    trajectory_ids: ArrayLike,
    *,
    invalid_penalty: float = 0.1,
) -> np.ndarray:
    """Per step sample, its trajectory's return minus the mean return of the group's other
    trajectories (a lone trajectory: 0), minus ``invalid_penalty`` on a format-invalid step.
    One entry per step sample, any order (see the module docstring)."""
    if invalid_penalty < 0:
        raise ValueError(f"invalid_penalty must be >= 0 (it is subtracted); got {invalid_penalty}")
    rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
    valid = np.asarray(valid, dtype=bool).reshape(-1)
    groups = np.asarray(group_ids).reshape(-1)
    trajectories = np.asarray(trajectory_ids).reshape(-1)
    if not len(rewards) == len(valid) == len(groups) == len(trajectories):
        raise ValueError("rewards, valid, group_ids and trajectory_ids need one entry per step sample each")
    returns: dict[Any, float] = {}
    members: dict[Any, list[Any]] = {}
    for reward, group, trajectory in zip(rewards, groups.tolist(), trajectories.tolist()):
        key = (group, trajectory)
        if key not in returns:
            returns[key] = 0.0
            members.setdefault(group, []).append(key)
        returns[key] += float(reward)
    advantage: dict[Any, float] = {}
    for keys in members.values():
        total, k = sum(returns[key] for key in keys), len(keys)
        for key in keys:
            advantage[key] = returns[key] - (total - returns[key]) / (k - 1) if k > 1 else 0.0
    out = np.array([advantage[(g, t)] for g, t in zip(groups.tolist(), trajectories.tolist())], dtype=np.float64)
    return out - invalid_penalty * ~valid


class RLOO(GRPO):
    name = "rloo"
    Config = RLOOConfig

    def check(self, train_config: Any) -> None:
        check_group_size(self.name, train_config)
        if not 0.0 < self.config.clip_eps < 1.0:
            raise ConfigError(f"algorithm.clip_eps must lie in (0, 1), got {self.config.clip_eps!r}")

    def advantages(self, samples: Sequence[Any]) -> np.ndarray:
        return rloo_advantages(
            [s.reward for s in samples],
            [s.valid for s in samples],
            [s.group_id for s in samples],
            [s.trajectory_id for s in samples],
            invalid_penalty=self.config.invalid_penalty,
        )
