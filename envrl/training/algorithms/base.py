"""What every algorithm provides to the shared loop (:mod:`envrl.training.loop`).

An algorithm is a config dataclass and a class with three methods: :meth:`Algorithm.check`
refuses bad settings before anything starts, :meth:`Algorithm.collect` makes one update's
batch (rollouts and advantages, or demonstrations) and :meth:`Algorithm.compute_loss` turns
a micro-batch into a loss (a token-mean over its scored units) and the terms to log. The loop
does the rest: micro-batching, gradient accumulation, clipping, the optimizer, logging,
evaluation and checkpoints.

What an algorithm may read from the loop is :class:`TrainingContext`, a protocol that
:class:`~envrl.training.loop.Trainer` satisfies; every hook the loop calls is declared on
:class:`Algorithm` with its default, so the loop never probes an algorithm with ``getattr``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

if TYPE_CHECKING:
    from envrl.training.config import TrainConfig
    from envrl.training.policy import Policy
    from envrl.training.rollout import RolloutBatch


class TrainingContext(Protocol):
    """What algorithms read from the loop (:class:`~envrl.training.loop.Trainer` has it all)."""

    @property
    def config(self) -> TrainConfig:
        """The whole run's configuration (seed, updates, rollout, policy, ...)."""

    @property
    def policy(self) -> Policy:
        """The model being trained: acting, scoring (with gradients), the KL reference."""

    @property
    def rank(self) -> int:
        """This process's index (0 alone); seeds per-process draws."""

    @property
    def scoring_pass(self) -> str | None:
        """``"old"`` or ``"reference"`` while the loop's old-policy pass runs ``compute_loss``
        (a PPO loss then stores the scored units on the samples instead of computing a loss);
        None otherwise."""

    def play(self, update: int) -> RolloutBatch:
        """This process's rollouts for ``update`` (``rollout.groups`` tasks of ``group_size`` envs)."""
        ...


@dataclass
class Batch:
    """One update's training samples and the metrics of how they were made."""

    samples: Sequence[Any]
    metrics: dict[str, float] = field(default_factory=dict)


class Algorithm:
    """Base class: subclasses set ``name`` and ``Config`` and implement the three methods."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = object
    #: whether the loop must build rollouts (vector envs and agents) for it
    uses_rollouts: ClassVar[bool] = False

    def __init__(self, config: Any) -> None:
        self.config = config

    def check(self, train_config: Any) -> None:
        """Raise :class:`~envrl.training.config.ConfigError` for settings this algorithm cannot use."""

    def prepare(self, trainer: TrainingContext) -> None:
        """Once, after the policy is built and before the first update (load data, say). Nothing by default."""

    def needs_reference_model(self) -> bool:
        """Whether the loss has a KL term to the starting weights, so the loop keeps a frozen copy.
        By default: the config has a positive ``kl_coef`` (GRPO's and every config that extends it)."""
        return float(getattr(self.config, "kl_coef", 0.0)) > 0

    def needs_old_policy_pass(self) -> bool:
        """Whether the loss is a ratio against the policy that sampled the batch, so the loop
        re-scores each update's samples before optimising (:meth:`~envrl.training.loop.Trainer.score_old_policy`).
        By default: the algorithm plays rollouts (every rollout algorithm here is a PPO learner)."""
        return self.uses_rollouts

    def stage_starts(self, updates: int) -> list[int]:
        """The updates (0-based) at which a training stage begins; the loop restarts the learning-rate
        schedule (warmup, then decay) at each, so every stage gets a whole schedule of its own.
        One stage by default."""
        return [0]

    def depends_on_updates(self) -> bool:
        """Whether what an update does depends on the run's total number of updates (a weight or
        stage schedule over the run); such a run cannot be continued to more updates than it
        was started with. None by default."""
        return False

    def collect(self, trainer: TrainingContext, update: int) -> Batch:
        raise NotImplementedError

    def compute_loss(self, trainer: TrainingContext, samples: Sequence[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError
