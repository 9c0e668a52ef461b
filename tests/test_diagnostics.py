"""The diagnostic tasks (docs/diagnostics.md): determinism, the expert wins at every difficulty,
the random agent's exact success against hand-computed values and against played episodes,
and bad input (knob, split, task id, actions)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import envrl  # noqa: F401  (registers the ids)
from envrl.agents import make_agent
from envrl.envs import ENV_IDS, SPLIT_KINDS
from envrl.envs.diagnostics import (
    SPLITS,
    ChainEnv,
    chain_random_success,
    panel_random_success,
    random_success,
    table_random_success,
)
from envrl.envs.diagnostics.generalization import HELD_OUT_NAMES, TRAIN_NAMES
from envrl.envs.diagnostics.switchboard import wiring

DIAGNOSTICS = {
    "diag-chain": ("length", (1, 2, 8, 32)),
    "diag-dynamics": ("rules", (2, 4, 8, 12)),
    "diag-alternatives": ("rules", (2, 6, 12)),
    "diag-generalization": ("objects", (2, 4, 16)),
}


def play(env: gym.Env, agent, task_id: str) -> tuple[list[str], list[str], dict]:
    observation, info = env.reset(options={"task_id": task_id})
    observations, actions, done = [observation], [], False
    while not done:
        action = agent.act(observation, info)
        observation, _, terminated, truncated, info = env.step(action)
        observations.append(observation)
        actions.append(action)
        done = terminated or truncated
    return observations, actions, info


@pytest.mark.parametrize("name", DIAGNOSTICS)
def test_the_expert_wins_every_task_at_every_difficulty(name):
    knob, values = DIAGNOSTICS[name]
    expert = make_agent("expert")
    for value in values:
        for split in ("train", "test_ood"):
            env = gym.make(ENV_IDS[name], split=split, expert_plan=True, **{knob: value})
            for task_id in env.unwrapped.task_ids[:40]:
                plan = env.reset(options={"task_id": task_id})[1]["expert_plan"]
                _, actions, info = play(env, expert, task_id)
                assert info["success"] and info["score"] == 1.0, (value, task_id)
                assert actions == plan and info["moves_left"] >= 0  # the first plan, within the budget
            env.close()


@pytest.mark.parametrize("name", DIAGNOSTICS)
def test_a_task_plays_the_same_in_every_env_and_the_splits_differ(name):
    random_agent = make_agent("random", seed=5)
    first = gym.make(ENV_IDS[name], split="valid")
    second = gym.make(ENV_IDS[name], split="valid")
    task_id = first.unwrapped.task_ids[17]
    random_agent.reset(seed=5)
    played = play(first, random_agent, task_id)
    random_agent.reset(seed=5)
    assert play(second, random_agent, task_id)[:2] == played[:2]
    starts = {split: gym.make(ENV_IDS[name], split=split).reset(seed=1)[1]["task_id"] for split in SPLITS}
    assert [task.split("/")[1] for task in starts.values()] == list(SPLITS)
    assert SPLIT_KINDS[name] == {"train": "ID", "select": "ID", "valid": "ID", "test_ood": "OOD"}


def test_the_chain_text_and_the_chute():
    env = gym.make("envrl/Diag-Chain-v0", split="train", length=2, expert_plan=True)
    observation, info = env.reset(options={"task_id": "l2/train/0"})
    assert observation.startswith("Room 1 of 2. The sign on the wall shows ")
    assert info["admissible_actions"] == ["open the left door", "open the right door"]
    right = info["expert_plan"][0]
    wrong = next(a for a in info["admissible_actions"] if a != right)
    observation, reward, terminated, _, info = env.step(wrong.upper())  # case does not matter
    assert info["valid_action"] and reward == 0.0 and not terminated
    assert "slide back to the first room" in observation and "Room 1 of 2" in observation
    observation, _, _, _, info = env.step(right)
    assert "Room 2 of 2" in observation and info["score"] == 0.5 and info["moves_left"] == 4
    observation, reward, terminated, _, info = env.step(info["expert_plan"][0])
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    assert observation.endswith("You escaped!")


def test_the_panel_texts_follow_the_family_wiring():
    wires = wiring(4)
    assert wiring(4) is wires and len(set(wires.buttons)) == 4 and sorted(wires.lights) == sorted(wires.panel)
    env = gym.make("envrl/Diag-Dynamics-v0", split="train", rules=4, expert_plan=True)
    observation, info = env.reset(options={"task_id": "r4/train/3"})
    assert observation.startswith("A panel with four buttons (")
    off = observation.split("Lights still off: ")[1].rstrip(".").split(", ")
    button = wires.buttons[wires.lights.index(off[0])]
    assert info["expert_plan"][0] == f"press the {button} button"
    # a light that is on turns off, and the observation says which one
    on_light = next(light for light in wires.panel if light not in off)
    on_button = wires.buttons[wires.lights.index(on_light)]
    observation, _, _, _, _ = env.step(f"press  the {on_button}   button")
    assert observation.startswith(f"You press the {on_button} button. The {on_light} light turns off. ")
    assert on_light in observation.split("Lights still off: ")[1]


def test_alternatives_id_tasks_stay_on_the_narrow_path_and_ood_tasks_leave_it():
    wires = wiring(6)
    narrow = set(wires.panel[:3])
    for split, leaves in (("train", False), ("valid", False), ("test_ood", True)):
        env = gym.make("envrl/Diag-Alternatives-v0", split=split, expert_plan=True)
        for task_id in env.unwrapped.task_ids[:100]:
            observation, _ = env.reset(options={"task_id": task_id})
            off = set(observation.split("Lights still off: ")[1].rstrip(".").split(", "))
            assert bool(off - narrow) == leaves, task_id


def test_generalization_ood_uses_only_held_out_names_and_larger_tables():
    assert not set(TRAIN_NAMES) & set(HELD_OUT_NAMES)
    for split, names, size, targets in (("train", TRAIN_NAMES, 4, (1, 2)), ("test_ood", HELD_OUT_NAMES, 8, (3,))):
        env = gym.make("envrl/Diag-Generalization-v0", split=split, objects=4)
        for task_id in env.unwrapped.task_ids[:50]:
            _, info = env.reset(options={"task_id": task_id})
            table = [action.removeprefix("take the ") for action in info["admissible_actions"]]
            assert len(table) == size and set(table) <= set(names)
            assert info["instruction"].count(" and ") + info["instruction"].count(",") + 1 in targets


def test_random_success_closed_forms_against_hand_computed_values():
    # chain of 1 room, 3 moves: fail only by three wrong doors in a row
    assert chain_random_success(1) == 1 - 0.5**3
    # 2 rooms, 6 moves: win = sum over the first time both doors are right in a row; 43/64
    assert chain_random_success(2) == 43 / 64
    assert chain_random_success(2, moves=2) == 0.25 and chain_random_success(3, moves=2) == 0.0
    assert chain_random_success(4, room=3, moves=1) == 0.5
    # panel of 2, one light off, 4 presses: right (1/2); or wrong, then (2 off) right, then 1 off ...
    # P = 1/2 + 1/2 * 1 * 1/2 = 3/4 (from 2 off every press turns one on)
    assert panel_random_success(2, 1) == 0.75
    assert panel_random_success(3, 1, presses=1) == pytest.approx(1 / 3)
    # table: 1 target of 2, 4 moves: miss three times in a row to fail
    assert table_random_success(2, 1) == 1 - 0.5**4
    assert table_random_success(3, 2, moves=2) == pytest.approx(2 / 3 * 1 / 2)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("diag-chain", {"length": 2}),
        ("diag-dynamics", {"rules": 4}),
        ("diag-alternatives", {"rules": 6}),
        ("diag-generalization", {"objects": 4}),
    ],
)
def test_the_random_agent_wins_at_its_exact_rate(name, kwargs):
    """Played episodes against ``random_success`` (a 4.5-sigma band over 1,500 episodes)."""
    env = gym.make(ENV_IDS[name], split="train", **kwargs)
    agent = make_agent("random", seed=0)
    task_ids = env.unwrapped.task_ids[:1500]
    wins = sum(play(env, agent, task_id)[2]["success"] for task_id in task_ids)
    expected = random_success(env.unwrapped, task_ids)
    sigma = np.sqrt(expected * (1 - expected) / len(task_ids))
    assert abs(wins / len(task_ids) - expected) < 4.5 * sigma, (wins, expected)


def test_the_budget_ends_the_episode_as_failed_and_bad_actions_cost_a_move():
    env = gym.make("envrl/Diag-Chain-v0", split="train", length=1)
    _, info = env.reset(options={"task_id": "l1/train/0"})
    observation, reward, terminated, truncated, info = env.step("dance")
    assert observation == "Nothing happens." and not info["valid_action"] and info["moves_left"] == 2
    env.step("x" * 2000)  # screened by the base class: no move spent
    env.step("")
    observation, reward, terminated, truncated, info = env.step("fly")
    assert terminated and not truncated and not info["success"] and reward == 0.0
    assert observation == "Nothing happens. Your torch burns out." and info["admissible_actions"] == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"length": 0}, "ChainEnv's length must be an integer from 1 to 32, got 0"),
        ({"length": 33}, "from 1 to 32, got 33"),
        ({"length": 2.0}, "got 2.0"),
        ({"length": True}, "got True"),
        ({"split": "test"}, "unknown ChainEnv split 'test'; choose one of train, select, valid, test_ood"),
    ],
)
def test_bad_knobs_and_splits_fail_at_make_in_one_sentence(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        gym.make("envrl/Diag-Chain-v0", **kwargs)
    with pytest.raises(ValueError, match="rules must be an integer from 2 to 12"):
        gym.make("envrl/Diag-Dynamics-v0", rules=13)
    with pytest.raises(TypeError):
        gym.make("envrl/Diag-Chain-v0", rules=4)  # another env's knob


def test_unknown_task_ids_are_refused():
    env = ChainEnv(split="valid", length=3)
    with pytest.raises(ValueError, match="unknown task id 'l4/valid/0'"):
        env.reset(options={"task_id": "l4/valid/0"})
    with pytest.raises(ValueError, match="unknown task id"):
        random_success(env, ["l3/train/0"])
    assert len(env.task_ids) == 200 and env.task_ids[0] == "l3/valid/0"
