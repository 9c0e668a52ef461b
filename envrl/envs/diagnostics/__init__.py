"""Diagnostic tasks: small procedurally generated text tasks, each isolating one trainer
mechanism (credit assignment, dynamics, alternatives, generalisation); see docs/diagnostics.md.

``random_success`` gives the random agent's exact expected success on a split (the mean of each
task's exact chance), which the leaderboard's random rows are checked against.
"""

from __future__ import annotations

from collections.abc import Sequence

from envrl.envs.descriptor import ContractTask, EnvDescriptor
from envrl.envs.diagnostics.base import SPLIT_KINDS, SPLIT_SIZES, SPLITS, DiagnosticEnv, Game, Outcome
from envrl.envs.diagnostics.chain import ChainEnv, chain_random_success
from envrl.envs.diagnostics.generalization import GeneralizationEnv, table_random_success
from envrl.envs.diagnostics.switchboard import AlternativesEnv, DynamicsEnv, panel_random_success

__all__ = [
    "DESCRIPTORS",
    "SPLITS",
    "SPLIT_KINDS",
    "SPLIT_SIZES",
    "AlternativesEnv",
    "ChainEnv",
    "DiagnosticEnv",
    "DynamicsEnv",
    "Game",
    "GeneralizationEnv",
    "Outcome",
    "chain_random_success",
    "panel_random_success",
    "random_success",
    "table_random_success",
]


def random_success(env: DiagnosticEnv, task_ids: Sequence[str] | None = None) -> float:
    """The random agent's exact expected success over ``task_ids`` (default: the whole split)
    of a diagnostic env (``gym.make(...).unwrapped``)."""
    if not isinstance(env, DiagnosticEnv):
        raise TypeError(f"random_success takes a diagnostic env (gym.make(...).unwrapped), got {type(env).__name__}")
    ids = list(env.task_ids if task_ids is None else task_ids)
    if not ids:
        raise ValueError("random_success needs at least one task id")
    return sum(env.task_random_success(task_id) for task_id in ids) / len(ids)


def _descriptor(name: str, cls: type, example: str, contract: ContractTask) -> EnvDescriptor:
    return EnvDescriptor(
        name=f"diag-{name}",
        env_id=f"envrl/Diag-{name.capitalize()}-v0",
        entry_point=f"{cls.__module__}:{cls.__name__}",
        # the diagnostics end every episode with their own move budget first
        max_episode_steps=200,
        split_kinds=SPLIT_KINDS,
        example_action=example,
        tool_intro="You are solving a small text puzzle. Call the act tool with one action at a time.",
        contract_task=contract,
        # envrl's own pure-Python code: envrl's version, recorded with every run, pins it
        engine_packages=(),
    )


#: the contract tasks are ones whose expert takes more than two moves
DESCRIPTORS = (
    _descriptor("chain", ChainEnv, "open the left door", ContractTask(split="train", task_id="l4/train/0")),
    _descriptor(
        "dynamics",
        DynamicsEnv,
        "press the star button",
        ContractTask(split="train", task_id="r6/train/7", kwargs={"rules": 6}),
    ),
    _descriptor(
        "alternatives", AlternativesEnv, "press the star button", ContractTask(split="train", task_id="r6/train/4")
    ),
    _descriptor(
        "generalization", GeneralizationEnv, "take the kettle", ContractTask(split="test_ood", task_id="o4/test_ood/0")
    ),
)
