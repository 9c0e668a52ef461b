"""Self-reflection (SR; Zhang et al., 2025, "Agent Learning via Early Experience").

From an early-experience folder (read by :mod:`envrl.training.early_experience_data`), each rollout row is an
expert state ``s_i`` with the expert's action ``a_i`` (which led to ``s_{i+1}``) and an
alternative ``a_i^j`` (which led to ``s_i^j``). A rationale ``c_i^j`` says why ``a_i`` is the
better action given both outcomes (:mod:`envrl.training.rationales`), and the policy learns to
write it and then the expert's action at ``s_i``, from the prompt it sees there:

    L_SR = - mean over response tokens of log p_theta(c_i^j, a_i | s_i),

the response being the policy template's ``format_response(a_i, think=c_i^j)``, so the
template must carry a thought (``require_think: true``, e.g. ``think-action``). Plain expert
samples (the expert's action with an empty thought, as ``envrl data expert`` writes them for
such a template; with ``objective: choice``, that action among the admissible ones, as SFT's
choice objective) are mixed in: ``round(expert_fraction * batch_size)`` of each batch (at least
one of each kind when ``0 < expert_fraction < 1``), and

    L = L_SR + expert_weight * L_expert,

each term a token mean over its own kind's tokens in a micro-batch. Rationales come from
``DIR/rationales.parquet`` when its writer is ``algorithm.writer``; the ``contrast`` writer
(deterministic) is otherwise run in memory at start, and a model writer without a saved file
is refused, naming the command that writes one. A rationale whose response would not parse
back to the expert's action is left out (``reflection/left_out`` counts them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from envrl.agents.prompts import TemplateError, load_template, parse_response
from envrl.training.algorithms.base import Algorithm, Batch, TrainingContext
from envrl.training.algorithms.iwm import REFLECTION_STREAM, draw, kind_losses, split_count
from envrl.training.algorithms.sft import demonstration
from envrl.training.config import ConfigError
from envrl.training.early_experience_data import (
    check_env,
    check_folder,
    expert_histories,
    policy_messages,
    read_early_experience,
)


@dataclass
class SRConfig:
    data: str = ""  # an early-experience folder (expert.parquet, rollout.parquet)
    batch_size: int = 32  # samples per update
    writer: str = "contrast"  # rationale writer: contrast, or openai:MODEL / hf:PATH with a saved rationales.parquet
    expert_fraction: float = 0.5  # share of each batch that is plain expert samples
    expert_weight: float = 1.0  # L = L_SR + expert_weight * L_expert
    objective: str = "tokens"  # the expert samples' loss, as SFT's: tokens, or choice (choose-mode policies)


class SR(Algorithm):
    """SR (see the module docstring)."""

    name = "sr"
    Config = SRConfig

    def check(self, train_config: Any) -> None:
        from envrl.training.rationales import RationaleError, check_rationales

        c = self.config
        folder = check_folder(c.data, self.name)
        try:
            template = load_template(train_config.policy.template)
        except TemplateError as exc:
            raise ConfigError(str(exc)) from exc
        if not template.require_think:
            raise ConfigError(
                f"sr trains the policy to write a rationale before its action, but template {template.name!r} "
                "has no thought in its response: pick one with require_think (e.g. --set policy.template=think-action)"
            )
        if c.batch_size < 1:
            raise ConfigError("algorithm.batch_size must be at least 1")
        if not 0.0 <= c.expert_fraction < 1.0:
            raise ConfigError(f"algorithm.expert_fraction must lie in [0, 1), got {c.expert_fraction}")
        if c.batch_size < 2 and c.expert_fraction > 0:
            raise ConfigError("sr mixes expert samples into each batch: algorithm.batch_size must be at least 2")
        if c.objective not in ("tokens", "choice"):
            raise ConfigError(f"algorithm.objective must be tokens or choice, got {c.objective!r}")
        if c.expert_weight < 0:
            raise ConfigError(f"algorithm.expert_weight must be >= 0, got {c.expert_weight}")
        try:
            check_rationales(folder, c.writer)
        except RationaleError as exc:
            raise ConfigError(str(exc)) from exc

    def prepare(self, trainer: TrainingContext) -> None:
        """Read the folder, get the rationales and tokenize both pools once."""
        from envrl.training.dynamics import TargetSample
        from envrl.training.rationales import ROW_KEY, rationales_for

        policy = trainer.policy
        data = read_early_experience(self.config.data, self.name)
        check_env(data, policy.env_name)
        rationales = rationales_for(data.folder, self.config.writer, data.rollout)
        template = policy.template
        self.reflections: list[TargetSample] = []
        self.left_out = 0
        for row in data.rollout:
            rationale = rationales.get(tuple(int(row[k]) for k in ROW_KEY))
            if rationale is None:
                continue  # the writer dropped it
            response = template.format_response(str(row["expert_action"]), think=rationale)
            if parse_response(response, template.require_think).action != " ".join(str(row["expert_action"]).split()):
                self.left_out += 1
                continue
            prompt = policy.encode_prompt(policy_messages(policy, row, row["history"]))
            self.reflections.append(TargetSample(prompt, policy.encode_response(response), "reflection"))
        self.demonstrations = [
            demonstration(
                policy,
                policy_messages(policy, row, history),
                template.format_response(str(row["action"])),
                row,
                self.config.objective,
            )
            for row, history in zip(data.expert, expert_histories(data.expert))
        ]
        if not self.reflections:
            raise ConfigError(f"{data.folder} gives no reflection sample (no rollout row has a usable rationale)")
        if self.config.expert_fraction > 0 and not self.demonstrations:
            raise ConfigError(f"{data.folder} holds no expert steps to mix in")

    def collect(self, trainer: TrainingContext, update: int) -> Batch:
        c = self.config
        seed, rank = trainer.config.seed, trainer.rank
        expert = split_count(c.batch_size, c.expert_fraction)
        reflect = c.batch_size - expert
        picked = draw(self.reflections, update * reflect, reflect, seed, rank, REFLECTION_STREAM)
        metrics = {
            "epoch/reflection": (update + 1) * reflect / len(self.reflections),
            "reflection/left_out": float(self.left_out),
        }
        if expert:
            picked += draw(self.demonstrations, update * expert, expert, seed, rank)
            metrics["epoch"] = (update + 1) * expert / len(self.demonstrations)
        return Batch(picked, metrics)

    def compute_loss(self, trainer: TrainingContext, samples: Sequence[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        losses = kind_losses(trainer, samples)
        terms: dict[str, float] = {}
        total = torch.zeros((), device=trainer.policy.device)
        if "reflection" in losses:
            total = total + losses["reflection"]
            terms["loss/reflection"] = float(losses["reflection"].detach())
        if "sft" in losses:
            total = total + self.config.expert_weight * losses["sft"]
            terms["loss/sft"] = float(losses["sft"].detach())
        return total, terms
