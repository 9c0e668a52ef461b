"""envrl's ALFWorld engine against TextWorld's stock PDDL engine: byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import textworld

from envrl.envs.alfworld import engine as engine_lib
from envrl.envs.alfworld.tasks import TASK_TYPES

PROBES = ["look", "inventory", "go to the moon", "", "examine nothing"]


def _sample_games(root: Path, per_type: int) -> list[Path]:
    games = sorted((root / "json_2.1.1").glob("*/*/*/game.tw-pddl"))
    chosen = []
    for task_type in TASK_TYPES:
        chosen += [g for g in games if g.parts[-3].startswith(task_type)][:per_type]
    return chosen


def _trace(env, game: Path) -> list:
    """Every observation, admissible list and won flag along the walkthrough plus probes."""
    env.load(str(game))
    state = env.reset()
    trace = [(state.feedback, state.admissible_commands, state.won)]
    walkthrough = json.loads(game.read_text())["walkthrough"]
    for action in PROBES[:2] + walkthrough[:-1] + PROBES[2:] + walkthrough[-1:]:
        state, _, _ = env.step(action)
        trace.append((state.feedback, state.admissible_commands, state.won))
    return trace


def _compare(games: list[Path]) -> None:
    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
    stock = engine_lib.start_engine(infos, stock=True)
    fast = engine_lib.start_engine(infos)
    for game in games:
        expected, actual = _trace(stock, game), _trace(fast, game)
        assert actual == expected, game
        assert actual[-1][2] is True, f"walkthrough did not win {game}"


def test_same_text_as_stock_engine_on_two_games(official_alfworld):
    """Two task types (the stock engine takes ~4.5 s a game); all six in the slow test below."""
    _compare(_sample_games(official_alfworld, per_type=1)[:2])


@pytest.mark.slow
def test_same_text_as_stock_engine_on_every_fifth_sample_game(official_alfworld):
    """Every fifth official sample game (12 of 60: every task type, both splits; the stock engine
    takes ~4.5 s a game, so all 60 took 4.5 min of CI)."""
    games = sorted((official_alfworld / "json_2.1.1").glob("*/*/*/game.tw-pddl"))[::5]
    assert len(games) >= 12 and len({g.parts[-3].split("-")[0] for g in games}) == 6
    _compare(games)


def test_put_wording_swaps_only_the_put_command(official_alfworld):
    game = _sample_games(official_alfworld, per_type=1)[0]
    data = json.loads(game.read_text())
    put = engine_lib.with_command_style(data, "put")
    assert engine_lib.PUT_TEMPLATE in put["grammar"] and engine_lib.MOVE_TEMPLATE not in put["grammar"]
    assert put["walkthrough"][-1].startswith(("put ", "use ")) or "move" not in put["walkthrough"][-1]
    assert data["grammar"].count("template ::") == put["grammar"].count("template ::")
    assert engine_lib.translate_command("move cup 1 to countertop 2", "put") == "put cup 1 in/on countertop 2"
    assert engine_lib.translate_command("put cup 1 in/on countertop 2", "move") == "move cup 1 to countertop 2"
    assert engine_lib.translate_command("go to desk 1", "put") == "go to desk 1"
    with pytest.raises(ValueError):
        engine_lib.with_command_style(data, "place")
