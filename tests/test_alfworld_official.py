"""Reading and fetching the official ALFWorld data."""

from __future__ import annotations

import pytest

from envrl.envs.alfworld import official
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
