"""Reading and fetching the official ALFWorld data, and the order of the task ids."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import gymnasium as gym
import pytest

import envrl  # noqa: F401  (registers envrl/ALFWorld-v0)
from envrl.envs.alfworld import generate, official
from envrl.envs.alfworld.tasks import TASK_TYPES


def test_sample_splits_parse_with_task_types(official_alfworld):
    root = official.data_root(official_alfworld)
    for split in ("train", "valid_seen"):
        games = official.official_games(root, split)
        assert len(games) == 30
        assert {g.task_type for g in games} == set(TASK_TYPES)
        assert all(g.task_id.startswith(f"official:{split}/") for g in games)
    assert all(g.traj_data is None for g in official.official_games(root, "train"))
    assert all(g.traj_data is not None for g in official.official_games(root, "valid_seen"))


def test_verify_reports_an_incomplete_copy(official_alfworld):
    # the samples hold 30 games per split, far fewer than the release: verification must say so
    with pytest.raises(official.OfficialDataError):
        official.verify(official_alfworld)


def test_download_without_network_says_so(tmp_path, monkeypatch):
    # port 9 on loopback refuses connections, like a machine with no route to the release
    monkeypatch.setattr(official, "RELEASE_FILES", {"json.zip": "http://127.0.0.1:9/json.zip"})
    with pytest.raises(official.OfficialDataError, match="no internet access"):
        official.download(tmp_path / "alfworld", timeout=5)
    assert not any((tmp_path / "alfworld").rglob("*.zip")), "no partial archive may be left behind"


# --------------------------------------------------------------------------- order


def _imbalance(task_types: list[str]) -> int:
    """The largest gap between two task types' counts over all prefixes of ``task_types``."""
    counts = Counter({task_type: 0 for task_type in set(task_types)})
    worst = 0
    for task_type in task_types:
        counts[task_type] += 1
        worst = max(worst, max(counts.values()) - min(counts.values()))
    return worst


def test_official_ids_are_round_robin_over_task_types(official_alfworld):
    root = official.data_root(official_alfworld)
    for split in ("train", "valid_seen"):
        games = official.official_games(root, split)
        assert [g.task_type for g in games[: len(TASK_TYPES)]] == list(TASK_TYPES)
        assert _imbalance([g.task_type for g in games]) <= 1, "every prefix must be balanced"
        by_path = sorted(games, key=lambda g: g.path)
        for task_type in TASK_TYPES:  # each type keeps its own (path) order
            assert [g for g in games if g.task_type == task_type] == [g for g in by_path if g.task_type == task_type]
        assert games == official.official_games(root, split), "the order must be deterministic"


def test_env_episodes_prefix_covers_every_task_type(with_official_data):
    env = gym.make("envrl/ALFWorld-v0", split="valid_seen")
    first = env.unwrapped.games[: 2 * len(TASK_TYPES)]
    assert Counter(g.task_type for g in first) == Counter({t: 2 for t in TASK_TYPES})
    env.close()


def test_interleaving_uneven_task_types():
    def game(task_type: str, n: int) -> official.OfficialGame:
        return official.OfficialGame(f"official:x/{task_type}-{n}", task_type, Path(f"{task_type}-{n}"), None)

    simple, look, two = TASK_TYPES[0], TASK_TYPES[1], TASK_TYPES[5]
    games = [game(look, 1), game(simple, 1), game(simple, 2), game(two, 1), game(simple, 3), game(two, 2)]
    ordered = official.interleave_task_types(games)
    assert [g.task_id.split("/")[1] for g in ordered] == [
        f"{simple}-1",
        f"{look}-1",
        f"{two}-1",
        f"{simple}-2",
        f"{two}-2",
        f"{simple}-3",
    ]


def test_builtin_order_already_mixes_task_types():
    # Built-in games are kept in the order of their candidates, whose task types cycle through
    # generate.TASK_CYCLE (20 long, every type in it): a prefix follows the split's own mix of
    # types instead of being one type, so it needs no reordering (and keeps its ids).
    for split in generate.BUILTIN_SPLITS:
        types = [generate.make_candidate(split, index).goal.task_type for index in range(len(generate.TASK_CYCLE))]
        assert set(types) == set(TASK_TYPES), split
        assert max(Counter(types).values()) <= 4, split
