"""ALFWorld's grounded expert (``expert:search``): it wins by searching, never reads the plan
before it has seen what the task needs, and orders receptacles by the shipped prior."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from typing import Any

import gymnasium as gym
import pytest

import envrl  # noqa: F401
from envrl.agents import make_agent
from envrl.agents.expert import ExpertAgent
from envrl.agents.grounded.alfworld import (
    PRIOR_COMMAND,
    PRIOR_PATH,
    AlfworldSearchExpert,
    ReceptaclePrior,
    build_prior,
    count_placements,
    load_prior,
    mentions,
    parse_task,
    room_receptacles,
    write_prior,
)


class PlanGuard(dict):
    """An info dict whose ``expert_plan`` may be read only once ``allowed`` is set."""

    allowed = False

    def __getitem__(self, key: str) -> Any:
        if key == "expert_plan" and not self.allowed:
            raise AssertionError("expert_plan read before the goal was seen")
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default


def _goal_seen(task_id: str, observations: list[str]) -> bool:
    """Whether the observations so far show every object the task (named in its id) needs."""
    task_type, obj, _, target = task_id.split("/")[1].split("-")[:4]
    text = " ".join(observations)
    needs = {obj.lower(): 2 if task_type == "pick_two_obj_and_place" else 1}
    if task_type == "look_at_obj_in_light":
        needs[target.lower()] = 1
    return all(len(set(re.findall(rf"\b{name} \d+", text))) >= n for name, n in needs.items())


def _play_guarded(env: Any, agent: Any, task_id: str) -> tuple[list[str], dict[str, Any]]:
    """Play one game, refusing any read of the plan before the goal is seen; the actions and last info."""
    observation, info = env.reset(options={"task_id": task_id})
    agent.reset(seed=0)
    observations, actions = [observation], []
    done = False
    while not done:
        guarded = PlanGuard(info)
        guarded.allowed = _goal_seen(task_id, observations)
        actions.append(agent.act(observation, guarded))
        observation, _, terminated, truncated, info = env.step(actions[-1])
        observations.append(observation)
        done = terminated or truncated
    return actions, info


# one valid_seen game of each task type: task id -> turns the search expert takes
GAMES = {
    "builtin:valid_seen/pick_and_place_simple-Candle-None-Toilet-406/g0117": 6,
    "builtin:valid_seen/pick_clean_then_place_in_recep-SoapBar-None-CounterTop-418/g0113": 7,
    "builtin:valid_seen/pick_two_obj_and_place-Candle-None-Drawer-421/g0062": 9,
    "builtin:valid_seen/look_at_obj_in_light-AlarmClock-None-DeskLamp-303/g0085": 6,
    "builtin:valid_seen/pick_heat_then_place_in_recep-Egg-None-GarbageCan-29/g0075": 6,
    "builtin:valid_seen/pick_cool_then_place_in_recep-WineBottle-None-DiningTable-23/g0016": 7,
}


@pytest.fixture(scope="module")
def env():
    environment = gym.make("envrl/ALFWorld-v0", split="valid_seen", source="builtin", expert_plan=True)
    yield environment
    environment.close()


def test_make_agent_builds_it():
    agent = make_agent("expert:search", "alfworld")
    assert isinstance(agent, AlfworldSearchExpert)
    assert agent.name == "expert:search" and agent.env_kwargs == {"expert_plan": True}


@pytest.mark.parametrize("task_id", sorted(GAMES))
def test_wins_by_searching_without_reading_the_plan_early(env, task_id):
    actions, info = _play_guarded(env, AlfworldSearchExpert(), task_id)
    assert info["success"] and info["task_id"] == task_id
    assert len(actions) == GAMES[task_id] <= 50


def test_searches_the_likeliest_receptacle_first_then_follows_the_plan(env):
    task_id = "builtin:valid_seen/pick_clean_then_place_in_recep-SoapBar-None-CounterTop-418/g0113"
    actions, info = _play_guarded(env, AlfworldSearchExpert(), task_id)
    # soapbar rates: sinkbasin 73/317 > toilet 48/216 > ...; the soapbar lies on the toilet
    assert actions == [
        "go to sinkbasinbasin 1",
        "go to toilet 1",
        "take soapbar 2 from toilet 1",
        "go to sinkbasinbasin 1",
        "clean soapbar 2 with sinkbasinbasin 1",
        "go to countertop 1",
        "move soapbar 2 to countertop 1",
    ]


def test_the_guard_catches_an_early_read(env):
    with pytest.raises(AssertionError, match="before the goal was seen"):
        _play_guarded(env, ExpertAgent(), next(iter(GAMES)))


def test_opens_closed_receptacles_and_keeps_searching_after_one_of_two():
    agent = AlfworldSearchExpert(ReceptaclePrior({"cd": {"drawer": [3, 4], "safe": [1, 2], "desk": [1, 4]}}))
    intro = "you see a desk 1, a drawer 2, a drawer 1, and a safe 1.\n\nYour task is to: put two cd in desk."
    moves = ["go to desk 1", "go to drawer 1", "go to drawer 2", "go to safe 1"]
    info: dict[str, Any] = {"instruction": "put two cd in desk.", "admissible_actions": moves + ["open drawer 2"]}
    assert agent.act(intro, info) == "go to drawer 2"  # rate 3/4, first of the ties in the description
    assert agent.act("You arrive at drawer 2. The drawer 2 is closed.", info) == "open drawer 2"
    assert agent.act("You open the drawer 2. The drawer 2 is open. In it, you see a cd 1.", info) == "go to drawer 1"
    assert not agent.found
    assert agent.act("You arrive at drawer 1. On the drawer 1, you see nothing.", info) == "go to safe 1"
    info["expert_plan"] = ["take cd 2 from safe 1"]
    assert agent.act("You arrive at safe 1. On the safe 1, you see a cd 2.", info) == "take cd 2 from safe 1"
    assert agent.found


def test_says_why_it_stops():
    agent = AlfworldSearchExpert(ReceptaclePrior({}))
    info: dict[str, Any] = {"instruction": "put a mug in desk.", "admissible_actions": ["go to desk 1"]}
    assert agent.act("you see a desk 1.\n\nYour task is to: put a mug in desk.", info) == "go to desk 1"
    with pytest.raises(RuntimeError, match="searched every receptacle without seeing mug"):
        agent.act("You arrive at desk 1. On the desk 1, you see nothing.", info)
    agent.reset()
    with pytest.raises(RuntimeError, match="needs an env made with expert_plan=True"):
        agent.act("you see a mug 1.\n\nYour task is to: put a mug in desk.", info)
    agent.reset()
    info["expert_plan"] = []
    with pytest.raises(RuntimeError, match="expert_plan is empty"):
        agent.act("you see a mug 1.\n\nYour task is to: put a mug in desk.", info)


@pytest.mark.parametrize(
    ("instruction", "wanted", "last"),
    [
        ("put a clean soapbar in countertop.", {"soapbar": 1}, {"countertop"}),
        ("cool some bread and put it in countertop.", {"bread": 1}, {"countertop", "fridge"}),
        ("put a hot cup in cabinet.", {"cup": 1}, {"cabinet"}),
        ("find two cd and put them in safe.", {"cd": 2}, {"safe"}),
        ("examine the alarmclock with the desklamp.", {"alarmclock": 1, "desklamp": 1}, set()),
        ("put some basketball on desk.", {"basketball": 1}, {"desk"}),
    ],
)
def test_parse_task(instruction, wanted, last):
    task = parse_task(instruction)
    assert dict(task.wanted) == wanted and task.search_last == last


def test_parse_task_refuses_other_sentences():
    with pytest.raises(ValueError, match="not an ALFWorld task sentence"):
        parse_task("slice an apple.")


def test_mentions_and_room_receptacles():
    intro = "you see a cabinet 2, a cabinet 1, and a sinkbasinbasin 1.\n\nYour task is to: put a mug 1 in x."
    assert room_receptacles(intro) == ["cabinet 2", "cabinet 1", "sinkbasinbasin 1"]
    assert mentions("On the desk 1, you see a cd 3, a cd 3, and a pen 1.") == ["desk 1", "cd 3", "pen 1"]


PROBLEM = """(:init
        (receptacleType Desk_bar_1 DeskType)
        (receptacleType Drawer_bar_1 DrawerType)
        (receptacleType Drawer_bar_2 DrawerType)
        (objectType Cd_bar_1 CDType)
        (objectType Cd_bar_2 CDType)
        (objectType Pen_bar_1 PenType)
        (objectType Window_bar_1 WindowType)
        (inReceptacle Cd_bar_1 Drawer_bar_1)
        (inReceptacle Cd_bar_2 Drawer_bar_1)
        (inReceptacle Pen_bar_1 Desk_bar_1)
        )
(:goal (exists (?r - receptacle) (receptacleType ?r DeskType)))"""


def test_count_placements():
    counts = count_placements([PROBLEM, PROBLEM.replace("Pen_bar_1 Desk_bar_1", "Pen_bar_1 Drawer_bar_2")])
    # two rooms; the window lies in no receptacle, so it counts for nothing
    assert counts == {
        "cd": {"desk": [0, 2], "drawer": [2, 4]},
        "pen": {"desk": [1, 2], "drawer": [1, 4]},
    }


def test_prior_order_ties_and_last():
    prior = ReceptaclePrior(
        {"mug": {"cabinet": [1, 4], "desk": [1, 2], "sinkbasin": [1, 4]}, "lamp": {"sinkbasin": [1, 8]}}
    )
    rooms = ["cabinet 2", "sinkbasinbasin 1", "shelf 1", "desk 1", "cabinet 1"]
    assert prior.type_of("sinkbasinbasin 1") == "sinkbasin" and prior.type_of("shelf 1") == "shelf"
    assert prior.order(rooms, ["mug"]) == ["desk 1", "cabinet 2", "sinkbasinbasin 1", "cabinet 1", "shelf 1"]
    desk_last = ["cabinet 2", "sinkbasinbasin 1", "cabinet 1", "shelf 1", "desk 1"]
    assert prior.order(rooms, ["mug"], last={"desk"}) == desk_last
    # two wanted types add up: the sink basin (1/4 + 1/8) now comes before the cabinets (1/4)
    both = ["desk 1", "sinkbasinbasin 1", "cabinet 2", "cabinet 1", "shelf 1"]
    assert prior.order(rooms, ["mug", "lamp"]) == both


def test_shipped_prior_loads_and_orders_as_its_counts_say():
    prior = load_prior()
    data = json.loads(PRIOR_PATH.read_text())
    assert data["source"] == "initial states of the 1000 built-in ALFWorld train games"
    assert prior.counts["soapbar"]["sinkbasin"] == [73, 317] and prior.counts["soapbar"]["toilet"] == [48, 216]
    assert prior.counts["soapbar"]["towelholder"] == [0, 222]
    assert Fraction(73, 317) > Fraction(48, 216)
    # cabinet 81/415 < toilet 48/216 < sinkbasin 73/317; towelholder 0/222
    room = ["towelholder 1", "cabinet 1", "toilet 1", "sinkbasinbasin 1"]
    assert prior.order(room, ["soapbar"]) == ["sinkbasinbasin 1", "toilet 1", "cabinet 1", "towelholder 1"]


def test_build_prior_counts_the_game_files_it_is_given(tmp_path):
    paths = []
    for index, problem in enumerate([PROBLEM, PROBLEM.replace("Pen_bar_1 Desk_bar_1", "Pen_bar_1 Drawer_bar_2")]):
        paths.append(tmp_path / f"game{index}.json")
        paths[-1].write_text(json.dumps({"pddl_problem": problem}))
    prior = build_prior(paths, source="two rooms")
    assert prior["source"] == "two rooms" and prior["command"] == PRIOR_COMMAND
    assert prior["counts"] == count_placements(json.loads(p.read_text())["pddl_problem"] for p in paths)
    write_prior(prior, tmp_path / "prior.json")
    assert '"desk": [0, 2]' in (tmp_path / "prior.json").read_text()  # a cell on one line
    assert load_prior(tmp_path / "prior.json").counts == prior["counts"]


@pytest.mark.slow
def test_shipped_prior_is_the_train_splits(monkeypatch):
    from envrl.envs.alfworld.env import split_games

    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    games = split_games("train", source="builtin")
    counted = build_prior([game.path for game in games], source="train")["counts"]
    assert counted == json.loads(PRIOR_PATH.read_text())["counts"]
