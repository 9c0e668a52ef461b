"""Supervised fine-tuning (imitation learning) on expert demonstrations.

The baseline every agentic-RL paper starts from: maximise the likelihood of the expert's
response given the prompt the agent would see,

    L_SFT = - (1 / |Y|) * sum_{(x, y)} sum_j log p_theta(y_j | x, y_<j)

a token-mean over the responses' tokens (the end-of-turn token included, so the policy learns
to stop). ``objective: choice`` trains a ``choose``-mode policy on its decision instead: the
cross-entropy of the expert's action among the step's admissible actions,

    L_choice = - mean_{(x, a*)} log softmax_a(score(a | x) / T)[a*]

with the policy's own candidate scores (:mod:`envrl.agents.choose`). Demonstrations come from ``envrl data expert`` (a parquet dataset) or an
``envrl eval`` run of an expert (:func:`envrl.training.data.load_sft_data`); prompts are
rebuilt with the policy's own tokenizer and template, so an SFT checkpoint acts on exactly
what it was trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from envrl.training.algorithms.base import Algorithm, Batch, TrainingContext
from envrl.training.config import ConfigError
from envrl.training.losses import token_cross_entropy


@dataclass
class SFTConfig:
    data: str = ""  # an `envrl data expert` folder, or an `envrl eval` runs folder (DIR or DIR#RUN_ID)
    batch_size: int = 32  # demonstrations per update
    objective: str = "tokens"  # tokens: the response's tokens; choice: the expert action among the admissible ones


@dataclass
class Demonstration:
    """One (prompt, expert response) pair in token ids."""

    prompt_ids: list[int]
    response_ids: list[int]
    candidate_ids: list[list[int]] | None = None
    choice: int | None = None


def demonstration(policy: Any, messages: Any, response: str, row: Any, objective: str) -> Demonstration:
    """One expert step as a training sample: ``response`` given ``messages`` (``tokens``), or the
    expert's ``row["action"]`` among the row's admissible actions, each written in the policy
    template's response format (``choice``)."""
    demo = Demonstration(policy.encode_prompt(messages), policy.encode_response(response))
    if objective == "choice":
        actions = [str(a) for a in row.get("admissible_actions") or []]
        normalised = [" ".join(a.lower().split()) for a in actions]
        wanted = " ".join(str(row["action"]).lower().split())
        if wanted not in normalised:
            raise ConfigError(
                "objective choice needs each step's admissible actions with the expert's among them; "
                f"{row.get('task_id')} step {row.get('step')} lacks them"
            )
        demo.candidate_ids = [policy.encode_response(policy.template.format_response(a)) for a in actions]
        demo.choice = normalised.index(wanted)
    return demo


class SFT(Algorithm):
    name = "sft"
    Config = SFTConfig

    def check(self, train_config: Any) -> None:
        if not self.config.data:
            raise ConfigError(
                f"sft needs expert demonstrations: run `envrl data expert --env {train_config.env} --split train "
                "--episodes N --out DIR` and pass --data DIR (or an `envrl eval` runs folder of an expert)"
            )
        if self.config.batch_size < 1:
            raise ConfigError("algorithm.batch_size must be at least 1")
        if self.config.objective not in ("tokens", "choice"):
            raise ConfigError(f"algorithm.objective must be tokens or choice, got {self.config.objective!r}")

    def prepare(self, trainer: TrainingContext) -> None:
        """Load and tokenize the demonstrations once."""
        from envrl.training.data import load_sft_data

        policy = trainer.policy
        # rows are (re)built with the policy's template and history: it learns the prompts it will see
        rows = load_sft_data(self.config.data, template=policy.config.template, history=policy.config.history)
        if len(rows) == 0:
            raise ConfigError(f"{self.config.data} holds no demonstrations")
        self.demonstrations = [self._demonstration(policy, row) for row in rows]

    def _demonstration(self, policy: Any, row: Any) -> Demonstration:
        return demonstration(policy, row["messages"], row["response"], row, self.config.objective)

    def collect(self, trainer: TrainingContext, update: int) -> Batch:
        """Demonstrations ``update * batch_size ...`` of a seeded shuffle, reshuffled every epoch."""
        count = len(self.demonstrations)
        size = self.config.batch_size
        picked = []
        for position in range(update * size, (update + 1) * size):
            epoch, offset = divmod(position, count)
            order = np.random.default_rng([trainer.config.seed, epoch, trainer.rank]).permutation(count)
            picked.append(self.demonstrations[int(order[offset])])
        return Batch(picked, {"epoch": (update + 1) * size / count})

    def compute_loss(self, trainer: TrainingContext, samples: Sequence[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        scores = trainer.policy.logprobs(samples, temperature=1.0)
        loss = token_cross_entropy(scores.logprobs, scores.mask)
        return loss, {"loss/sft": float(loss.detach())}
