"""Implicit world modeling (IWM; Zhang et al., 2025, "Agent Learning via Early Experience").

Early experience is what the agent learns from states the expert visited and actions it did
not take. An early-experience folder holds the expert's steps (``expert.parquet``: states
``s_i`` and actions ``a_i``) and, for each expert state, alternatives ``a_i^j`` played from
it and what they led to (``rollout.parquet``: ``s_i^j``). IWM first teaches the policy's own
model the env's dynamics on that rollout data, next-state prediction as a token
cross-entropy on the next observation's tokens (and the end-of-turn token),

    L_WM = - mean over rollout tokens of log p_theta(s_i^j | s_i, a_i^j),

then imitates the expert exactly as SFT does (:mod:`envrl.training.algorithms.sft`, the same
``objective``). ``schedule: two_stage`` (the paper's) gives the first
``round(world_model_fraction * updates)`` updates to ``L_WM`` and the rest to imitation;
``mixed`` puts both in every update's batch (``round(world_model_fraction * batch_size)``
world-model samples, at least one of each kind) and minimises

    L = L_SFT + world_model_weight * L_WM,

each term a token mean over its own kind's units in a micro-batch (exactly the batch's when a
micro-batch holds the whole minibatch). Either way the run has ``updates`` updates of
``batch_size`` samples, so it compares with SFT at equal updates. ``expert_transitions: true``
also gives the world model the expert's own transitions ``(s_i, a_i, s_{i+1})`` (the paper
trains it on the rollout data alone). Logged: ``loss/world_model`` and ``loss/sft`` (each where
its kind is in the batch), ``stage`` (1: world model, 2: imitation, 0: mixed) and the epochs
of each pool (``epoch/world_model``, and ``epoch`` as SFT logs it).

Prompts are rebuilt from the rows with the policy's template and history window (the
imitation prompts exactly as :class:`~envrl.agents.prompts.Conversation` builds them when the
policy acts; the world-model prompts with :mod:`envrl.training.dynamics`), so the data need
not have been built with the policy's template. Reading the folder is
:mod:`envrl.training.early_experience_data`'s; this module also holds the batch drawing that SR
(:mod:`envrl.training.algorithms.sr`) shares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from envrl.agents.prompts import TemplateError
from envrl.training.algorithms.base import Batch, TrainingContext
from envrl.training.algorithms.sft import SFT, SFTConfig
from envrl.training.config import ConfigError
from envrl.training.early_experience import EXPERT_FILE, ROLLOUT_FILE
from envrl.training.early_experience_data import (
    check_env,
    check_folder,
    expert_histories,
    policy_messages,
    read_early_experience,
)
from envrl.training.losses import token_cross_entropy

#: the seed streams of the sample pools (imitation uses SFT's own, so its batches are SFT's)
_WORLD_MODEL_STREAM = 1
REFLECTION_STREAM = 2


def draw(pool: Sequence[Any], start: int, count: int, seed: int, rank: int, stream: int | None = None) -> list[Any]:
    """Samples ``start .. start + count - 1`` of a seeded shuffle of ``pool``, reshuffled every
    epoch (SFT's rule; ``stream`` gives another pool its own shuffles)."""
    orders: dict[int, np.ndarray] = {}
    picked = []
    for position in range(start, start + count):
        epoch, offset = divmod(position, len(pool))
        if epoch not in orders:
            key = [seed, epoch, rank] if stream is None else [seed, epoch, rank, stream]
            orders[epoch] = np.random.default_rng(key).permutation(len(pool))
        picked.append(pool[int(orders[epoch][offset])])
    return picked


def split_count(batch_size: int, fraction: float) -> int:
    """How many of a mixed batch's ``batch_size`` samples are the auxiliary kind: ``round(fraction * batch_size)``,
    at least one of each kind when ``0 < fraction < 1``."""
    count = round(fraction * batch_size)
    if 0.0 < fraction < 1.0:
        count = min(max(count, 1), batch_size - 1)
    return count


def kind_losses(trainer: TrainingContext, samples: Sequence[Any]) -> dict[str, torch.Tensor]:
    """The token cross-entropy of each kind of sample in ``samples`` (``sft`` for demonstrations),
    one forward pass for all; only the kinds present."""
    scores = trainer.policy.logprobs(samples, temperature=1.0)
    kinds = [getattr(sample, "kind", "sft") for sample in samples]
    losses = {}
    for kind in dict.fromkeys(kinds):
        rows = torch.tensor([k == kind for k in kinds], device=scores.mask.device, dtype=scores.mask.dtype)
        losses[kind] = token_cross_entropy(scores.logprobs, scores.mask * rows.unsqueeze(-1))
    return losses


@dataclass
class IWMConfig(SFTConfig):
    """SFT's settings (``data`` is an early-experience folder here) and the world model's."""

    schedule: str = "two_stage"  # two_stage: world model, then imitation; mixed: both in every batch
    world_model_fraction: float = 0.5  # two_stage: share of the updates; mixed: share of each batch
    world_model_weight: float = 1.0  # mixed: L = L_SFT + weight * L_WM
    template: str = "world-model"  # the state-prediction prompt: a built-in name or a JSON file
    expert_transitions: bool = False  # also train the world model on the expert's own transitions


class IWM(SFT):
    """IWM (see the module docstring): SFT's imitation, after or beside next-state prediction."""

    name = "iwm"
    Config = IWMConfig

    def check(self, train_config: Any) -> None:
        from envrl.training.dynamics import load_world_model_template

        c = self.config
        check_folder(c.data, self.name)
        if c.batch_size < 1:
            raise ConfigError("algorithm.batch_size must be at least 1")
        if c.objective not in ("tokens", "choice"):
            raise ConfigError(f"algorithm.objective must be tokens or choice, got {c.objective!r}")
        if c.schedule not in ("two_stage", "mixed"):
            raise ConfigError(f"algorithm.schedule must be two_stage or mixed, got {c.schedule!r}")
        if not 0.0 <= c.world_model_fraction <= 1.0:
            raise ConfigError(f"algorithm.world_model_fraction must lie in [0, 1], got {c.world_model_fraction}")
        if c.schedule == "mixed" and c.batch_size < 2 and 0.0 < c.world_model_fraction < 1.0:
            raise ConfigError(
                "a mixed schedule holds both kinds in each batch: algorithm.batch_size must be at least 2"
            )
        if c.world_model_weight < 0:
            raise ConfigError(f"algorithm.world_model_weight must be >= 0, got {c.world_model_weight}")
        try:
            template = load_world_model_template(c.template)
        except TemplateError as exc:
            raise ConfigError(str(exc)) from exc
        if template.kind != "state-prediction":
            raise ConfigError(
                f"algorithm.template must be a state-prediction template; {c.template!r} is {template.kind}"
            )

    def prepare(self, trainer: TrainingContext) -> None:
        """Read the folder and tokenize both pools once: demonstrations and world-model samples."""
        from envrl.training.dynamics import load_world_model_template, state_prediction_sample

        policy = trainer.policy
        data = read_early_experience(self.config.data, self.name)
        check_env(data, policy.env_name)
        template = load_world_model_template(self.config.template)
        histories = expert_histories(data.expert)
        self.demonstrations = [
            self._demonstration(policy, self._imitation_row(policy, row, history))
            for row, history in zip(data.expert, histories)
        ]
        transitions = [
            (row["instruction"], row["history"], row["observation"], row["action"], row["next_observation"])
            for row in data.rollout
        ]
        if self.config.expert_transitions:
            transitions += [
                (row["instruction"], history, row["observation"], row["action"], row["next_observation"])
                for row, history in zip(data.expert, histories)
            ]
        self.world_model = [state_prediction_sample(policy, template, *t) for t in transitions]
        if self.config.world_model_fraction > 0 and not self.world_model:
            raise ConfigError(f"{data.folder / ROLLOUT_FILE} holds no transitions for the world model")
        if self.config.world_model_fraction < 1 and not self.demonstrations:
            raise ConfigError(f"{data.folder / EXPERT_FILE} holds no expert steps to imitate")

    @staticmethod
    def _imitation_row(policy: Any, row: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The row as SFT reads it, its prompt and response rebuilt with the policy's template."""
        response = policy.template.format_response(str(row["action"]))
        return {**row, "messages": policy_messages(policy, row, history), "response": response}

    def switch_update(self, updates: int) -> int:
        """two_stage: the first imitation update (0-based); the updates before it train the world model."""
        return round(self.config.world_model_fraction * updates)

    def depends_on_updates(self) -> bool:
        """two_stage switches to imitation at a fraction of the run's total."""
        return self.config.schedule == "two_stage"

    def stage_starts(self, updates: int) -> list[int]:
        """two_stage: the world model and imitation each get their own learning-rate schedule, as
        two separate runs would (the paper trains the stages one after the other); imitation does
        not inherit the world model's decayed rate."""
        switch = self.switch_update(updates)
        return [0, switch] if self.config.schedule == "two_stage" and 0 < switch < updates else [0]

    def collect(self, trainer: TrainingContext, update: int) -> Batch:
        c = self.config
        seed, rank, size = trainer.config.seed, trainer.rank, c.batch_size
        if c.schedule == "two_stage":
            switch = self.switch_update(trainer.config.updates)
            if update < switch:
                picked = draw(self.world_model, update * size, size, seed, rank, _WORLD_MODEL_STREAM)
                return Batch(picked, {"stage": 1, "epoch/world_model": (update + 1) * size / len(self.world_model)})
            done = update - switch
            picked = draw(self.demonstrations, done * size, size, seed, rank)
            return Batch(picked, {"stage": 2, "epoch": (done + 1) * size / len(self.demonstrations)})
        world = split_count(size, c.world_model_fraction)
        metrics: dict[str, float] = {"stage": 0}
        picked = []
        if size - world:
            picked += draw(self.demonstrations, update * (size - world), size - world, seed, rank)
            metrics["epoch"] = (update + 1) * (size - world) / len(self.demonstrations)
        if world:
            picked += draw(self.world_model, update * world, world, seed, rank, _WORLD_MODEL_STREAM)
            metrics["epoch/world_model"] = (update + 1) * world / len(self.world_model)
        return Batch(picked, metrics)

    def compute_loss(self, trainer: TrainingContext, samples: Sequence[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        losses = kind_losses(trainer, samples)
        terms: dict[str, float] = {}
        total = torch.zeros((), device=trainer.policy.device)
        if "sft" in losses:
            total = total + losses["sft"]
            terms["loss/sft"] = float(losses["sft"].detach())
        if "state_prediction" in losses:
            weight = self.config.world_model_weight if self.config.schedule == "mixed" else 1.0
            total = total + weight * losses["state_prediction"]
            terms["loss/world_model"] = float(losses["state_prediction"].detach())
        return total, terms
