"""ALFWorld resets: cached translations and grammar parses give the stock engine's games, byte for
byte, translate each game once, and survive damaged or concurrently written cache entries."""

from __future__ import annotations

import json
import multiprocessing
import os
from collections import Counter
from pathlib import Path

import fast_downward
import gymnasium as gym
import pytest
import textworld
from textworld.envs.pddl import logic as stock_logic

import envrl  # noqa: F401  (registers envrl/ALFWorld-v0)
from envrl.envs.alfworld import engine as engine_lib
from envrl.envs.alfworld import grammar as grammar_lib
from envrl.envs.alfworld import translations

PROBES = ["look", "inventory", "go to the moon", "", "examine nothing"]
INFOS = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])


@pytest.fixture(scope="module")
def small_games(official_alfworld) -> list[Path]:
    """The two smallest sample games of valid_seen (cheap to translate), of different types."""
    games = sorted(
        (official_alfworld / "json_2.1.1" / "valid_seen").glob("*/*/game.tw-pddl"),
        key=lambda path: (path.stat().st_size, str(path)),
    )
    chosen = [games[0]]
    chosen += [g for g in games if g.parts[-3].split("-")[0] != games[0].parts[-3].split("-")[0]][:1]
    return chosen


@pytest.fixture()
def translator_calls(monkeypatch) -> Counter:
    """Counts Fast Downward translations ("plain" for the game state, "optimized" for the planner)."""
    calls: Counter = Counter()
    translate = fast_downward.pddl2sas

    def counting(domain, problem, verbose=False, optimize=False):
        calls["optimized" if optimize else "plain"] += 1
        return translate(domain, problem, verbose=verbose, optimize=optimize)

    monkeypatch.setattr(fast_downward, "pddl2sas", counting)
    return calls


def _outcome(state) -> tuple:
    return state.feedback, list(state.admissible_commands), bool(state["won"])


def _play(env, game: Path, load: bool = True) -> list[tuple]:
    """Every observation, admissible list and won flag of a reset and the walkthrough plus probes."""
    if load:
        env.load(str(game))
    trace = [_outcome(env.reset())]
    walkthrough = json.loads(game.read_text())["walkthrough"]
    for action in PROBES[:2] + walkthrough[:-1] + PROBES[2:] + walkthrough[-1:]:
        trace.append(_outcome(env.step(action)[0]))
    return trace


# --------------------------------------------------------------------------- same games, fewer translations


def test_cold_warm_and_disk_resets_equal_stock(small_games, tmp_path, translator_calls):
    stock = engine_lib.start_engine(INFOS, stock=True)
    expected = {game: _play(stock, game) for game in small_games}
    assert all(trace[-1][2] for trace in expected.values()), "walkthroughs must win"
    translator_calls.clear()

    cache = translations.TranslationCache(tmp_path)
    fast = engine_lib.start_engine(INFOS, translations=cache)
    for game in small_games:
        assert _play(fast, game) == expected[game]  # cold: translated now
        assert _play(fast, game, load=False) == expected[game]  # the same game again (reset only)
    for game in small_games:
        assert _play(fast, game) == expected[game]  # seen before, other games in between
    assert translator_calls == Counter(plain=len(small_games)), "one plain translation per game, no planner"
    assert cache.stats["translations"] == len(small_games)

    from_disk = translations.TranslationCache(tmp_path)  # a new process: nothing in memory
    fresh = engine_lib.start_engine(INFOS, translations=from_disk)
    for game in small_games:
        assert _play(fresh, game) == expected[game]
    assert translator_calls == Counter(plain=len(small_games)), "disk entries must be used"
    assert from_disk.stats["disk_hits"] == len(small_games)


def test_planner_is_translated_lazily_and_plans_as_stock(small_games, tmp_path, translator_calls):
    game = small_games[0]
    infos = textworld.EnvInfos(won=True, admissible_commands=True, policy_commands=True)
    stock, fast = (
        engine_lib.start_engine(infos, stock=True),
        engine_lib.start_engine(infos, translations=translations.TranslationCache(tmp_path)),
    )
    walkthrough = json.loads(game.read_text())["walkthrough"]
    plans = []
    for env in (stock, fast):
        env.load(str(game))
        state = env.reset()
        detour = next(a for a in state["admissible_commands"] if a.startswith("go to") and a != walkthrough[0])
        trace = [(_outcome(state), state["policy_commands"])]
        for action in [detour, "look"] + walkthrough[:2]:
            state = env.step(action)[0]
            trace.append((_outcome(state), state["policy_commands"]))
        plans.append(trace)
        if env is stock:
            translator_calls.clear()
    assert plans[1] == plans[0]
    assert all(plan for _, plan in plans[0]), "the planner must have planned at every step"
    assert translator_calls == Counter(plain=1, optimized=1)
    fast.reset()
    assert fast.state["policy_commands"] == plans[0][0][1]
    assert translator_calls == Counter(plain=1, optimized=1), "a reset must not translate again"


def test_env_translates_each_game_once_and_the_planner_only_off_the_walkthrough(
    official_alfworld, monkeypatch, tmp_path, translator_calls
):
    monkeypatch.setenv("ALFWORLD_DATA", str(official_alfworld))
    monkeypatch.setenv("ENVRL_CACHE", str(tmp_path))
    fresh = translations.TranslationCache()  # in tmp_path, as the engines' process-wide cache
    monkeypatch.setattr(engine_lib, "default_translations", lambda: fresh)
    env = gym.make("envrl/ALFWorld-v0", split="valid_seen", expert_plan=True)
    first, second = env.unwrapped.task_ids[:2]
    openings = set()
    for task_id in [first] * 4 + [second, first, second]:  # a GRPO group, then alternating games
        observation, info = env.reset(options={"task_id": task_id})
        openings.add((task_id, observation, tuple(info["admissible_actions"]), tuple(info["expert_plan"])))
    assert len(openings) == 2, "every reset of a game must open it identically"
    assert translator_calls == Counter(plain=2), "one translation per game; the walkthrough needs no planner"
    observation, info = env.reset(options={"task_id": first})
    detour = next(a for a in info["admissible_actions"] if a.startswith("go to") and a != info["expert_plan"][0])
    _, _, _, _, info = env.step(detour)
    assert info["expert_plan"] and translator_calls == Counter(plain=2, optimized=1)
    env.close()


def test_grammar_parse_equals_textworlds(small_games):
    for game in small_games:
        data = json.loads(game.read_text())
        grammars = [
            data["grammar"],
            engine_lib.with_command_style(data, "put")["grammar"],
            '# a comment with a " quote: cutting this file into parts is unsafe\n' + data["grammar"],
        ]
        for grammar in grammars:
            ours = grammar_lib.game_logic(data["pddl_domain"], grammar)
            theirs = stock_logic.GameLogic(data["pddl_domain"], grammar)
            assert _logic_summary(ours) == _logic_summary(theirs)


def _logic_summary(logic) -> tuple:
    actions = {name: vars(action) for name, action in logic.actions.items()}
    rules = {
        lhs: [([repr(s) for s in rule.rhs], rule.weight, rule.condition) for rule in rules]
        for lhs, rules in logic.grammar._rules.items()
    }
    return logic.domain, actions, rules


# --------------------------------------------------------------------------- the disk cache


def _damage(path: Path, how: str, other: Path) -> None:
    blob = path.read_bytes()
    if how == "truncated":
        path.write_bytes(blob[: len(blob) // 2])
    elif how == "flipped":
        path.write_bytes(blob[:-10] + bytes([blob[-10] ^ 0xFF]) + blob[-9:])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(os.urandom(4096))
    elif how == "other_game":  # intact, but another game's entry under this game's name
        path.write_bytes(other.read_bytes())


@pytest.mark.parametrize("how", ["truncated", "flipped", "empty", "garbage", "other_game"])
def test_a_damaged_entry_is_rebuilt(small_games, tmp_path, translator_calls, how):
    game, other_game = (json.loads(g.read_text()) for g in small_games)
    writer = translations.TranslationCache(tmp_path)
    expected = writer.state(game["pddl_domain"], game["pddl_problem"]).to_json()
    writer.state(other_game["pddl_domain"], other_game["pddl_problem"])
    path = writer.entry_path("state", game["pddl_domain"], game["pddl_problem"])
    _damage(path, how, writer.entry_path("state", other_game["pddl_domain"], other_game["pddl_problem"]))
    translator_calls.clear()

    reader = translations.TranslationCache(tmp_path)
    rebuilt = reader.state(game["pddl_domain"], game["pddl_problem"])
    assert rebuilt.to_json() == expected
    assert reader.stats["corrupt"] == 1 and translator_calls == Counter(plain=1)
    key = translations.translation_key(game["pddl_domain"], game["pddl_problem"])
    assert translations.decode_entry(path.read_bytes(), "state", key).to_json() == expected, "rewritten intact"


def test_a_damaged_entry_still_plays_the_stock_game(small_games, tmp_path):
    game = small_games[0]
    expected = _play(engine_lib.start_engine(INFOS, stock=True), game)
    data = json.loads(game.read_text())
    cache = translations.TranslationCache(tmp_path)
    assert _play(engine_lib.start_engine(INFOS, translations=cache), game) == expected
    _damage(cache.entry_path("state", data["pddl_domain"], data["pddl_problem"]), "flipped", Path())
    reader = translations.TranslationCache(tmp_path)
    assert _play(engine_lib.start_engine(INFOS, translations=reader), game) == expected
    assert reader.stats["corrupt"] == 1


def test_an_unwritable_cache_only_costs_speed(small_games, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    cache = translations.TranslationCache(blocker)
    env = engine_lib.start_engine(INFOS, translations=cache)
    for game in small_games:
        env.load(str(game))
        assert env.reset().feedback.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert cache.stats["translations"] == len(small_games)
    assert cache.stats["write_errors"] == 1, "after a failed write the disk is not tried again"


def _write_many(directory: str, key: str, sas: str, times: int) -> None:
    cache = translations.TranslationCache(directory)
    for _ in range(times):
        cache._write("planner", key, translations.PlannerTranslation(sas))


def test_concurrent_writers_never_expose_a_partial_entry(tmp_path):
    key, sas = "ab" + "0" * 62, os.urandom(1_000_000).hex()  # ~1 MB even compressed
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    writers = [context.Process(target=_write_many, args=(str(tmp_path), key, sas, 15)) for _ in range(3)]
    for writer in writers:
        writer.start()
    reader = translations.TranslationCache(tmp_path)
    complete = 0
    while any(writer.is_alive() for writer in writers):
        found = reader._read("planner", key)
        if found is not None:
            assert found.sas == sas
            complete += 1
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    assert reader.stats["corrupt"] == 0, f"a reader saw a partial entry ({complete} complete ones)"
    assert reader._read("planner", key).sas == sas
    leftovers = [p.name for p in reader._path("planner", key).parent.iterdir()]
    assert leftovers == [f"{key}.planner.z"], "temporary files must not be left behind"


def test_keys_follow_game_text_and_engine_versions(monkeypatch):
    key = translations.translation_key("domain", "problem")
    assert key == translations.translation_key("domain", "problem")
    assert key != translations.translation_key("domain", "problem ")
    assert key != translations.translation_key("domainp", "roblem"), "the two texts must not run together"
    monkeypatch.setattr(translations, "engine_versions", lambda: "fd0-tw0")
    assert key != translations.translation_key("domain", "problem")


def test_memory_is_a_bounded_lru(monkeypatch):
    made: Counter = Counter()

    def fake_planner(domain: str, problem: str) -> translations.PlannerTranslation:
        made[problem] += 1
        return translations.PlannerTranslation("s" * 1000)  # 2,000 bytes as the cache counts them

    monkeypatch.setitem(
        translations.TRANSLATION_KINDS, "planner", (fake_planner, translations.PlannerTranslation.from_json)
    )
    cache = translations.TranslationCache(disk=False, memory_bytes=5_000)  # room for two
    for problem in ["a", "b", "a", "c"]:  # "a" was used after "b": "b" is the one dropped for "c"
        cache.planner("d", problem)
    assert made == Counter(a=1, b=1, c=1)
    cache.planner("d", "a")
    cache.planner("d", "b")
    assert made == Counter(a=1, b=2, c=1)
    assert cache.stats["memory_hits"] == 2
