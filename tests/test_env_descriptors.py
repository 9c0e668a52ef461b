"""The env registry: one descriptor per registered env, checked when it is declared, and every
per-env table derived from it (so a new env cannot be missing from one silently)."""

from __future__ import annotations

import pickle

import gymnasium as gym
import pytest

import envrl.envs
from envrl.agents.prompts import EXAMPLE_ACTIONS
from envrl.envs import REGISTRY, ContractTask, DescriptorError, EnvDescriptor
from envrl.envs.descriptor import collect
from envrl.evaluation.config import ENGINE_PACKAGES
from envrl.integrations import trl as trl_adapter


def _fields(**changes):
    fields = dict(
        name="toy",
        env_id="envrl/Toy-v0",
        entry_point="envrl.testing:FakeEnv",
        max_episode_steps=5,
        split_kinds={"train": "ID", "test": "OOD"},
        example_action="look",
        tool_intro="You play a toy.",
        contract_task=ContractTask(split="train"),
    )
    fields.update(changes)
    return fields


def test_the_registry_holds_every_env_with_its_old_values():
    assert list(REGISTRY) == [
        "alfworld", "webshop", "textworld", "scienceworld",
        "diag-chain", "diag-dynamics", "diag-alternatives", "diag-generalization",
    ]  # fmt: skip
    assert envrl.envs.ENVIRONMENTS["scienceworld"] == (
        "envrl/ScienceWorld-v0",
        "envrl.envs.scienceworld.env:ScienceWorldEnv",
        100,
    )
    assert envrl.envs.SINGLE_THREAD_ENVS == {"alfworld", "textworld"}
    assert envrl.envs.SPLIT_KINDS["webshop"] == {"train": "ID", "eval": "ID", "test": "ID", "test_ood": "OOD"}
    assert dict(ENGINE_PACKAGES)["alfworld"] == ("alfworld", "textworld")
    assert EXAMPLE_ACTIONS["diag-generalization"] == "take the kettle"
    for name, d in REGISTRY.items():
        assert gym.spec(d.env_id).max_episode_steps == d.max_episode_steps, name
        assert envrl.envs.describe(d.env_id) is d


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"split_kinds": {"train": "ID", "test": "ood"}}, "split kinds must be 'ID' or 'OOD'"),
        ({"split_kinds": {"test": "OOD"}}, "has no ID split"),
        ({"split_kinds": {}}, "split_kinds is empty"),
        ({"example_action": "  "}, "example_action is empty"),
        ({"max_episode_steps": 0}, "max_episode_steps must be >= 1"),
        ({"entry_point": "envrl.testing.FakeEnv"}, "entry_point must be 'module:Class'"),
        ({"contract_task": ContractTask(split="valid")}, "contract_task's split 'valid' is not one of its splits"),
        ({"downloader": "envrl.envs.alfworld.official:download"}, "downloader must be a module name"),
        ({"corpus_tasks": 0}, "corpus_tasks must be an integer >= 1"),
        ({"corpus_tasks": True}, "corpus_tasks must be an integer >= 1"),
        ({"default_corpus_position": -1}, "default_corpus_position must be None or an integer >= 0"),
    ],
)
def test_a_descriptor_missing_a_field_fails_in_one_sentence(changes, message):
    with pytest.raises(DescriptorError, match=f"^env descriptor 'toy': {message}"):
        EnvDescriptor(**_fields(**changes))


def test_two_descriptors_cannot_claim_one_id():
    with pytest.raises(DescriptorError, match="both claim 'envrl/Toy-v0'"):
        collect([EnvDescriptor(**_fields()), EnvDescriptor(**_fields(name="toy2"))])


def test_descriptors_are_frozen():
    d = REGISTRY["alfworld"]
    with pytest.raises(AttributeError):
        d.max_episode_steps = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        d.split_kinds["train"] = "OOD"  # type: ignore[index]
    assert d.default_split == "train" and d.splits[-1] == "ood_objects"


def test_every_registered_env_has_a_trl_class_and_a_diagnostic_plays():
    assert set(trl_adapter.ENVIRONMENTS) == set(REGISTRY)
    assert trl_adapter.environment_class("envrl/Diag-Chain-v0").__name__ == "DiagChainEnvironment"
    env = pickle.loads(pickle.dumps(trl_adapter.environment_factory("diag-chain")))()
    first = env.reset(task_id="l4/train/0", seed=0)
    assert first.startswith(REGISTRY["diag-chain"].tool_intro)
    assert env.act("open the left door").startswith("You go through the door. Room 2 of 4.")
    with pytest.raises(ValueError, match="unknown environment 'nope'"):
        trl_adapter.environment_class("nope")


def test_the_agents_example_actions_are_the_descriptors():
    """Agents may not import envs (test_architecture), so prompts keep their own copy: it must agree."""
    assert EXAMPLE_ACTIONS == {name: d.example_action for name, d in REGISTRY.items()}, (
        "envrl/agents/prompts.py EXAMPLE_ACTIONS must match the env descriptors' example_action"
    )
