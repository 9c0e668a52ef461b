"""Built-in ALFWorld games (envrl.envs.alfworld.generate).

Fast tests generate reduced splits (``SPLIT_SIZES`` patched down) into temporary caches: the
generator, verifier and cache are the same, only the number of games differs. Properties that
hold for every candidate (floor plans, goal objects) are also checked on the full-size
candidate streams, which needs no engine. Slow tests check the three evaluation splits in full
and the first games of train (see ``full_splits``).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from envrl.envs.alfworld import generate, scenes  # noqa: E402
from envrl.envs.alfworld.generate import (  # noqa: E402
    BUILTIN_SPLITS,
    OOD_OBJECT_TYPES,
    TASK_TYPES,
    UNSEEN_FLOOR_PLANS,
    builtin_games,
)

SMALL_SIZE = 24  # > one task cycle (20), so every task type occurs
ROOT = Path(__file__).resolve().parents[1]


def _entries(cache: Path, split: str) -> list[dict]:
    manifest = cache / generate.version_name() / split / "manifest.json"
    return json.loads(manifest.read_text())["games"]


def _goal_object(task_id: str) -> str:
    return task_id.split("/")[1].split("-")[1]


def _floor_plan(task_id: str) -> int:
    return int(task_id.split("/")[1].rsplit("-", 1)[1])


@pytest.fixture(scope="session")
def small_splits(tmp_path_factory) -> tuple[Path, dict[str, list[generate.BuiltinGame]]]:
    cache = tmp_path_factory.mktemp("alfworld-cache")
    with pytest.MonkeyPatch.context() as patch:
        for split in BUILTIN_SPLITS:
            patch.setitem(generate.SPLIT_SIZES, split, SMALL_SIZE)
        games = {split: builtin_games(split, cache_dir=cache, workers=2) for split in BUILTIN_SPLITS}
    return cache, games


@pytest.fixture
def play():
    """Play a game file in TextWorld's stock PDDL engine, as ALFWorld loads it."""
    import textworld

    from envrl.envs.alfworld.engine import alfred_wrappers

    argv = list(sys.argv)  # fast_downward.pddl2sas overwrites sys.argv

    def run(path: Path, commands: list[str]) -> tuple[str, list, bool]:
        infos = textworld.EnvInfos(won=True, admissible_commands=True)
        env = textworld.start(str(path), infos, wrappers=alfred_wrappers())
        state = env.reset()
        intro, feedback = state.feedback, []
        for command in commands:
            state, _, _ = env.step(command)
            feedback.append(state.feedback)
        env.close()
        return intro, feedback, bool(state["won"])

    yield run
    sys.argv[:] = argv


def test_unknown_split_names_the_valid_ones(tmp_path):
    with pytest.raises(ValueError) as error:
        builtin_games("test", cache_dir=tmp_path)
    for split in BUILTIN_SPLITS:
        assert split in str(error.value)


def test_cache_root_follows_envrl_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ENVRL_CACHE", str(tmp_path))
    assert generate.cache_root() == tmp_path / "alfworld"
    assert generate.cache_root(tmp_path / "x") == tmp_path / "x"
    assert generate.GENERATOR_VERSION in generate.version_name()


def test_ids_and_coordinates_are_written_like_alfworld():
    assert scenes.format_coordinate(-0.64) == "-00.64"
    assert scenes.format_coordinate(3.6) == "+03.60"
    assert scenes.format_coordinate(0.0) == "00.00"
    mangled = "Cabinet_bar__minus_00_dot_33_bar__plus_02_dot_25_bar__plus_03_dot_01"
    assert scenes.mangle("Cabinet|-00.33|+02.25|+03.01") == mangled
    assert scenes.mangle(scenes.location_name(-0.5, 2.5, 0, -30)) == "loc_bar__minus_2_bar_10_bar_0_bar__minus_30"
    assert scenes.receptacle_type_of("Sink|-04.19|+00.92|+03.28|SinkBasin") == "SinkBasin"


@pytest.mark.parametrize("split", BUILTIN_SPLITS)
def test_candidate_streams_respect_the_split_rules(split):
    """Every candidate a full-size split can draw from, so every game it can contain."""
    task_types = set()
    for index in range(generate.SPLIT_SIZES[split] + 40):
        candidate = generate.make_candidate(split, index)
        assert candidate is not None
        task_types.add(candidate.goal.task_type)
        assert (candidate.floor_plan in UNSEEN_FLOOR_PLANS) == (split == "valid_unseen")
        assert (candidate.goal.object_type in OOD_OBJECT_TYPES) == (split == "ood_objects")
    assert task_types == set(TASK_TYPES)


def test_candidates_are_the_same_in_another_process():
    """Generation is a pure function of (split, index): same bytes, any hash seed."""

    def digest() -> str:
        h = hashlib.sha256()
        for split in BUILTIN_SPLITS:
            for index in range(0, 200, 7):
                h.update(json.dumps(generate.make_candidate(split, index).game).encode())
        return h.hexdigest()

    code = (
        "import sys, hashlib, json; sys.path.insert(0, sys.argv[1]);"
        "from envrl.envs.alfworld import generate as g;"
        "h = hashlib.sha256()\n"
        "for s in g.BUILTIN_SPLITS:\n"
        "    for i in range(0, 200, 7): h.update(json.dumps(g.make_candidate(s, i).game).encode())\n"
        "print(h.hexdigest())"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == digest()


def test_problems_follow_the_official_style():
    problem = generate.make_candidate("valid_seen", 3).game["pddl_problem"]  # a heat task
    for predicate in (
        "receptacleType",
        "objectType",
        "canContain",
        "pickupable",
        "isReceptacleObject",
        "openable",
        "atLocation agent1",
        "cleanable",
        "heatable",
        "coolable",
        "sliceable",
        "inReceptacle",
        "receptacleAtLocation",
        "objectAtLocation",
    ):
        assert f"({predicate} " in problem, predicate
    assert "(:domain alfred)" in problem and "- otype" in problem and "- rtype" in problem
    assert "(isHot ?o)" in problem and "Microwave" in problem


def test_every_task_type_in_every_split(small_splits):
    _, games = small_splits
    for split, split_games in games.items():
        assert len(split_games) == SMALL_SIZE
        assert {g.task_type for g in split_games} == set(TASK_TYPES), split


def test_splits_are_disjoint(small_splits):
    _, games = small_splits
    owner: dict[str, str] = {}
    for split, split_games in games.items():
        for game in split_games:
            assert game.task_id.startswith(f"builtin:{split}/")
            problem = json.loads(game.path.read_text())["pddl_problem"]
            key = hashlib.sha256(problem.split("(:objects", 1)[1].encode()).hexdigest()
            assert key not in owner, f"{game.task_id} repeats a game of {owner.get(key)}"
            owner[key] = split
            owner[game.task_id] = split


def test_held_out_rooms_and_objects(small_splits):
    cache, games = small_splits
    for split in BUILTIN_SPLITS:
        for entry in _entries(cache, split):
            assert (entry["floor_plan"] in UNSEEN_FLOOR_PLANS) == (split == "valid_unseen")
            assert (entry["object_type"] in OOD_OBJECT_TYPES) == (split == "ood_objects")
            assert entry["floor_plan"] == _floor_plan(entry["task_id"])
            assert entry["object_type"] == _goal_object(entry["task_id"])


def test_game_files_and_walkthroughs_win(small_splits, play):
    """One game of every task type, taken from every split in turn, replayed in the stock engine."""
    _, games = small_splits
    sample = []
    for i, task_type in enumerate(TASK_TYPES):
        split = BUILTIN_SPLITS[i % len(BUILTIN_SPLITS)]
        sample.append(next(g for g in games[split] if g.task_type == task_type))
    for game in sample:
        data = json.loads(game.path.read_text())
        assert list(data) == ["pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough"]
        assert data["solvable"] is True and data["walkthrough"]
        assert "UNKNOWN GOAL" not in data["grammar"]
        intro, feedback, won = play(game.path, data["walkthrough"])
        assert intro.startswith("-= Welcome to TextWorld, ALFRED! =-")
        assert "Your task is to: " in intro and "You are in the middle of a room." in intro
        assert "Nothing happens." not in feedback
        assert won, game.task_id


def test_cached_split_is_reused(small_splits):
    cache, games = small_splits
    started = time.perf_counter()
    again = builtin_games("valid_unseen", cache_dir=cache)  # no SPLIT_SIZES patch: must not regenerate
    assert time.perf_counter() - started < 2
    assert again == games["valid_unseen"]
    assert not list((cache / generate.version_name()).glob(".valid_unseen.tmp-*"))


def _generate_in_subprocess(cache: Path, split: str, size: int, seed: str = "0") -> subprocess.Popen:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from envrl.envs.alfworld import generate as g;"
        "g.SPLIT_SIZES[sys.argv[3]] = int(sys.argv[4]);"
        "print(len(g.builtin_games(sys.argv[3], cache_dir=sys.argv[2], workers=1)))"
    )
    env = dict(os.environ, PYTHONHASHSEED=seed)
    return subprocess.Popen(
        [sys.executable, "-c", code, str(ROOT), str(cache), split, str(size)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.slow  # subprocesses that each load the engine (~10 s); CI runs it
def test_generation_is_byte_identical_across_processes(tmp_path):
    runs = [
        _generate_in_subprocess(tmp_path / name, "valid_unseen", 8, seed) for name, seed in (("a", "1"), ("b", "2"))
    ]
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        assert out.strip() == "8"
    a, b = (tmp_path / name / generate.version_name() / "valid_unseen" for name in ("a", "b"))
    assert _tree(a) == _tree(b)


@pytest.mark.slow  # subprocesses that each load the engine (~10 s); CI runs it
def test_concurrent_generations_agree(tmp_path):
    runs = [_generate_in_subprocess(tmp_path, "ood_objects", 6, seed) for seed in ("3", "4")]
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        assert out.strip() == "6"
    version_dir = tmp_path / generate.version_name()
    assert [p.name for p in version_dir.iterdir() if not p.name.endswith(".lock")] == ["ood_objects"]
    assert len(_entries(tmp_path, "ood_objects")) == 6


@pytest.mark.slow  # subprocesses that each load the engine (~10 s); CI runs it
def test_killed_generation_leaves_nothing_trusted(tmp_path):
    run = _generate_in_subprocess(tmp_path, "valid_seen", 400)
    version_dir = tmp_path / generate.version_name()
    deadline = time.monotonic() + 60
    while not list(version_dir.glob(".valid_seen.tmp-*/.candidates/*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    os.killpg(run.pid, signal.SIGKILL)
    run.communicate(timeout=30)
    assert not (version_dir / "valid_seen").exists()
    assert list(version_dir.glob(".valid_seen.tmp-*"))  # the half-written copy, never trusted

    rerun = _generate_in_subprocess(tmp_path, "valid_seen", 4)
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    assert out.strip() == "4"
    assert not list(version_dir.glob(".valid_seen.tmp-*"))  # cleaned up under the lock


# --------------------------------------------------------------------------- full splits

TRAIN_PREFIX = 100  # train games generated by the slow tests (of 1,000; see full_splits)
REPLAY_EVERY = 4  # the slow replay takes every 4th game of each split


@pytest.fixture(scope="session")
def full_splits(tmp_path_factory) -> dict[str, list[generate.BuiltinGame]]:
    """The three evaluation splits in full, from envrl's own cache (the envs' tests and ``make
    demo`` read the same games, so a machine generates them once), and the first
    ``TRAIN_PREFIX`` games of train in a temporary cache. A split is the first ``SPLIT_SIZES``
    candidates that pass verification, in index order, so that prefix is exactly the full train
    split's first games; the full 1,000 cost ~9 min of CI and exercise no other code (the split
    rules of every train candidate are checked in test_candidate_streams_respect_the_split_rules)."""
    games = {split: builtin_games(split) for split in BUILTIN_SPLITS if split != "train"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(generate.SPLIT_SIZES, "train", TRAIN_PREFIX)
        games["train"] = builtin_games("train", cache_dir=tmp_path_factory.mktemp("alfworld-train-prefix"))
    return games


@pytest.mark.slow
def test_full_splits(full_splits):
    sizes = {split: len(games) for split, games in full_splits.items()}
    assert sizes == {**generate.SPLIT_SIZES, "train": TRAIN_PREFIX}
    assert generate.SPLIT_SIZES["train"] >= 1000
    ids = [g.task_id for games in full_splits.values() for g in games]
    assert len(ids) == len(set(ids))
    problems = defaultdict(set)
    for split, games in full_splits.items():
        assert {g.task_type for g in games} == set(TASK_TYPES)
        for game in games:
            problems[split].add(json.loads(game.path.read_text())["pddl_problem"].split("(:objects", 1)[1])
    for a in BUILTIN_SPLITS:
        for b in BUILTIN_SPLITS:
            if a < b:
                assert not problems[a] & problems[b], (a, b)
    train_plans = {_floor_plan(g.task_id) for g in full_splits["train"]}
    train_objects = {_goal_object(g.task_id) for g in full_splits["train"]}
    assert not train_plans & {_floor_plan(g.task_id) for g in full_splits["valid_unseen"]}
    assert not train_objects & {_goal_object(g.task_id) for g in full_splits["ood_objects"]}
    seen_plans = {_floor_plan(g.task_id) for g in full_splits["valid_seen"]}
    assert seen_plans <= set(generate.split_floor_plans("train"))


@pytest.mark.slow
def test_full_split_games_are_won_by_their_walkthroughs(full_splits):
    """Every ``REPLAY_EVERY``-th game of each split, replayed in worker processes by the stock
    engine (generation replayed every game once already: this checks the cached files)."""
    games = [game for split in BUILTIN_SPLITS for game in full_splits[split][::REPLAY_EVERY]]
    assert len(games) > 100
    assert generate.check_games(games) == []
