"""``envrl/ALFWorld-v0`` on official sample games: the env contract, experts, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import envrl  # noqa: F401
from envrl.agents import make_agent
from envrl.envs.alfworld.official import OfficialDataError
from envrl.envs.base import INFO_KEYS, MAX_ACTION_LENGTH


def _play(env, agent, task_id):
    observation, info = env.reset(options={"task_id": task_id})
    agent.reset(seed=0)
    terminated = truncated = False
    while not (terminated or truncated):
        observation, reward, terminated, truncated, info = env.step(agent.act(observation, info))
    return reward, info


@pytest.mark.parametrize("split", ["train", "valid_seen"])
def test_check_env_official(with_official_data, split):
    env = gym.make("envrl/ALFWorld-v0", split=split)
    check_env(env.unwrapped, skip_render_check=True)
    observation, info = env.reset(seed=3)
    assert observation.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert "Your task is to: " in observation
    assert set(INFO_KEYS) <= set(info)
    assert info["task_id"].startswith(f"official:{split}/")
    assert info["instruction"] and info["instruction"] in observation
    assert env.spec.max_episode_steps == 50


def test_planner_expert_wins_every_sample_game(with_official_data):
    agent = make_agent("expert")
    for split in ("train", "valid_seen"):
        env = gym.make("envrl/ALFWorld-v0", split=split, **agent.env_kwargs)
        assert len(env.unwrapped.task_ids) == 30
        for task_id in env.unwrapped.task_ids:
            reward, info = _play(env, agent, task_id)
            assert reward == 1.0 and info["success"], task_id
            assert info["score"] == 1.0


@pytest.mark.slow
def test_handcoded_expert_wins_every_game_with_traj_data(with_official_data):
    # ALFWorld 0.4.2's hand-coded expert loses pick_two_obj_and_place games under the "move"
    # grammar; envrl fixes its inventory tracking (engine.handcoded_expert_wrapper).
    agent = make_agent("expert:handcoded")
    env = gym.make("envrl/ALFWorld-v0", split="valid_seen", max_episode_steps=100, **agent.env_kwargs)
    for task_id in env.unwrapped.task_ids:
        reward, info = _play(env, agent, task_id)
        assert reward == 1.0, task_id


def test_expert_replans_after_a_detour(with_official_data):
    agent = make_agent("expert")
    env = gym.make("envrl/ALFWorld-v0", split="valid_seen", **agent.env_kwargs)
    task_id = env.unwrapped.task_ids[-1]  # a pick_two_obj_and_place game
    observation, info = env.reset(options={"task_id": task_id})
    detour = next(a for a in info["admissible_actions"] if a.startswith("go to") and a != info["expert_plan"][0])
    observation, _, _, _, info = env.step(detour)
    assert info["expert_plan"] and info["expert_plan"][0] != detour
    terminated = truncated = False
    while not (terminated or truncated):
        observation, reward, terminated, truncated, info = env.step(agent.act(observation, info))
    assert info["success"]


def test_put_wording_option(with_official_data):
    agent = make_agent("expert")
    env = gym.make("envrl/ALFWorld-v0", split="valid_seen", command_style="put", **agent.env_kwargs)
    task_id = next(t for t in env.unwrapped.task_ids if "pick_and_place_simple" in t)
    observation, info = env.reset(options={"task_id": task_id})
    assert info["expert_plan"][-1].startswith("put ") and " in/on " in info["expert_plan"][-1]
    for action in info["expert_plan"][:-1]:
        observation, _, _, _, info = env.step(action)
    moved = info["expert_plan"][-1].replace("put ", "move ", 1).replace(" in/on ", " to ")
    assert moved not in info["admissible_actions"]
    observation, reward, terminated, _, info = env.step(info["expert_plan"][-1])
    assert reward == 1.0 and terminated


@pytest.mark.parametrize(
    "action",
    ["", " ", "x" * (1 << 20), "go to désk 1 ✓", "go to desk 1\x00\x1b[2J", "\n\t\r", "GO TO DESK 1"],
)
def test_bad_actions_give_feedback(with_official_data, action):
    env = gym.make("envrl/ALFWorld-v0", split="valid_seen")
    observation, info = env.reset(seed=0)
    before = info["admissible_actions"]
    observation, reward, terminated, truncated, info = env.step(action)
    assert info["valid_action"] is False
    assert reward == 0.0 and not terminated and not truncated
    assert observation == "Nothing happens." or observation.startswith("Invalid action")
    assert len(observation) < 200
    assert info["admissible_actions"] == before
    if len(action) > MAX_ACTION_LENGTH:
        assert str(MAX_ACTION_LENGTH) in observation


def test_non_string_action_gives_feedback(with_official_data):
    env = gym.make("envrl/ALFWorld-v0", split="valid_seen")
    env.reset(seed=0)
    observation, _, _, _, info = env.step(None)
    assert info["valid_action"] is False and "expected text" in observation


def test_unknown_task_id_is_a_clear_error(with_official_data):
    env = gym.make("envrl/ALFWorld-v0", split="valid_seen")
    with pytest.raises(ValueError, match="unknown task id 'nope'"):
        env.reset(options={"task_id": "nope"})
    with pytest.raises(ValueError, match="unknown ALFWorld split"):
        gym.make("envrl/ALFWorld-v0", split="test")


def test_missing_or_corrupt_official_data(tmp_path, monkeypatch, official_alfworld):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "missing"))
    env = gym.make("envrl/ALFWorld-v0", split="valid_seen")
    with pytest.raises(OfficialDataError, match="no json_2.1.1"):
        env.reset(seed=0)
    # a copy of the samples with one corrupt and one truncated game: those are skipped, loudly
    root = tmp_path / "data" / "json_2.1.1" / "valid_seen"
    games = sorted((official_alfworld / "json_2.1.1" / "valid_seen").glob("*/*"))[:3]
    for trial in games:
        target = root / trial.parent.name / trial.name
        target.mkdir(parents=True)
        for item in trial.iterdir():
            (target / item.name).write_bytes(item.read_bytes())
    first = root / games[0].parent.name / games[0].name / "game.tw-pddl"
    first.write_text("{not json")
    second = root / games[1].parent.name / games[1].name / "game.tw-pddl"
    second.write_text(json.dumps({"solvable": True}))
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "data"))
    env = gym.make("envrl/ALFWorld-v0", split="valid_seen")
    with pytest.warns(UserWarning, match="skipped 2 unreadable"):
        task_ids = env.unwrapped.task_ids
    assert len(task_ids) == 1
    # official data configured + a built-in-only split: refused rather than mixed
    with pytest.raises(ValueError, match="built-in"):
        gym.make("envrl/ALFWorld-v0", split="ood_objects").reset(seed=0)


TRAJECTORY_SCRIPT = """
import json, sys, gymnasium as gym, envrl
from envrl.agents import make_agent
env = gym.make("envrl/ALFWorld-v0", split="valid_seen")
agent = make_agent("random", seed=7)
observation, info = env.reset(seed=11)
trace = [observation]
for _ in range(15):
    observation, reward, terminated, truncated, info = env.step(agent.act(observation, info))
    trace.append(observation)
print(json.dumps([info["task_id"], trace]))
"""


def test_same_seed_same_trajectory_in_two_processes(with_official_data):
    runs = [
        subprocess.run([sys.executable, "-c", TRAJECTORY_SCRIPT], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    task_id, trace = json.loads(runs[0])
    assert len(trace) == 16 and task_id.startswith("official:valid_seen/")


def test_seed_picks_task_deterministically(with_official_data):
    env = gym.make("envrl/ALFWorld-v0", split="valid_seen")
    picks = [env.reset(seed=s)[1]["task_id"] for s in (1, 2, 3, 4, 1)]
    assert picks[0] == picks[-1] and len(set(picks)) > 2  # the seed decides, and seeds differ


def test_replaying_a_task_gives_the_same_episode(with_official_data):
    env = gym.make("envrl/ALFWorld-v0", split="valid_seen", expert_plan=True)
    task_id = env.unwrapped.task_ids[0]
    episodes = []
    for _ in range(2):
        observation, info = env.reset(options={"task_id": task_id})
        trace = [observation, info["admissible_actions"], info["expert_plan"]]
        for action in ["look", info["admissible_actions"][0]]:
            observation, _, _, _, info = env.step(action)
            trace += [observation, info["admissible_actions"]]
        episodes.append(trace)
    assert episodes[0] == episodes[1]


@pytest.mark.slow
def test_handcoded_expert_with_put_wording(with_official_data):
    agent = make_agent("expert:handcoded")
    env = gym.make(
        "envrl/ALFWorld-v0", split="valid_seen", command_style="put", max_episode_steps=100, **agent.env_kwargs
    )
    for task_id in [t for t in env.unwrapped.task_ids if "pick_two" in t][:2]:
        reward, info = _play(env, agent, task_id)
        assert reward == 1.0, task_id


@pytest.mark.parametrize("split", ["valid_seen", "valid_unseen", "ood_objects"])
def test_check_env_builtin(monkeypatch, split):
    """Built-in games (generated once, then cached like in ``make demo``). Not train: its 1,000
    games take ~9 min to generate on 2 cores, and its generation is checked on a prefix
    (tests/test_alfworld_generate.py)."""
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    agent = make_agent("expert")
    env = gym.make("envrl/ALFWorld-v0", split=split, **agent.env_kwargs)
    check_env(env.unwrapped, skip_render_check=True)
    task_ids = env.unwrapped.task_ids
    assert all(t.startswith(f"builtin:{split}/") for t in task_ids)
    observation, info = env.reset(seed=1)
    assert observation.startswith("-= Welcome to TextWorld, ALFRED! =-") and info["instruction"]
    for task_id in task_ids[:: max(1, len(task_ids) // 6)]:
        reward, info = _play(env, agent, task_id)
        assert reward == 1.0, task_id


def test_engine_import_leaves_alfworld_data_unset(monkeypatch):
    # alfworld.info exports ALFWORLD_DATA on import; that must not turn later envs official.
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    first = gym.make("envrl/ALFWorld-v0", split="valid_seen")
    first.reset(seed=0)
    import os

    assert "ALFWORLD_DATA" not in os.environ
    second = gym.make("envrl/ALFWorld-v0", split="valid_unseen")
    assert second.reset(seed=0)[1]["task_id"].startswith("builtin:valid_unseen/")
