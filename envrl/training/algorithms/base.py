"""What every algorithm provides to the shared loop (:mod:`envrl.training.loop`).

An algorithm is a config dataclass and a class with three methods: :meth:`Algorithm.check`
refuses bad settings before anything starts, :meth:`Algorithm.collect` makes one update's
batch (rollouts and advantages, or demonstrations) and :meth:`Algorithm.compute_loss` turns
a micro-batch into a loss (a token-mean over its scored units) and the terms to log. The loop
does the rest: micro-batching, gradient accumulation, clipping, the optimizer, logging,
evaluation and checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch


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

    def collect(self, trainer: Any, update: int) -> Batch:
        raise NotImplementedError

    def compute_loss(self, trainer: Any, samples: Sequence[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError
