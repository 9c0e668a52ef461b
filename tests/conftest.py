"""Shared fixtures: the official ALFWorld samples in ../shared/data, isolated caches, TextWorld games."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
SHARED_ALFWORLD = SHARED_DATA / "alfworld"
SHARED_WEBSHOP = SHARED_DATA / "webshop"


def require_shared_data(*paths: Path) -> None:
    """Skip the calling test where the official samples in ../shared/data are missing.

    CI always has them (a copy of shared/ lies beside its clone), so there a missing sample is
    a failure, never a silent skip.
    """
    missing = [str(path) for path in paths if not path.exists()]
    if not missing:
        return
    message = f"official data samples not found: {', '.join(missing)}"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI must have ../shared/data)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def ray_temp_dir() -> str:
    """A short temporary directory for a Ray instance of the tests' own (its sockets live there,
    and a Unix socket path must stay under ~107 bytes, so pytest's long tmp paths won't do)."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="envrl-ray-")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def official_alfworld() -> Path:
    """The folder holding the official ``json_2.1.1`` samples (never copied into the repo)."""
    require_shared_data(SHARED_ALFWORLD / "json_2.1.1")
    return SHARED_ALFWORLD


@pytest.fixture()
def with_official_data(official_alfworld, monkeypatch) -> Path:
    monkeypatch.setenv("ALFWORLD_DATA", str(official_alfworld))
    return official_alfworld


@pytest.fixture(autouse=True, scope="session")
def _isolated_alfworld_home(tmp_path_factory):
    """Keep ALFWorld's import side effects (~/.cache/alfworld) and envrl's runs out of $HOME."""
    os.environ.setdefault("ENVRL_RUNS_DIR", str(tmp_path_factory.mktemp("runs")))
    yield


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A tiny random Qwen2 checkpoint with a ChatML template (tests/tiny_lm.py); skips without torch."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tiny_lm import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_lm"), chat_template=True)


@pytest.fixture(scope="session")
def tiny_checkpoint_plain(tmp_path_factory) -> Path:
    """The same tiny model with a tokenizer that has no chat template (plain-text prompts)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tiny_lm import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_lm_plain"), chat_template=False)


#: TextWorld ids per split that the fast tests play: the first game of each family
TEXTWORLD_PLAYED = 3


@pytest.fixture(scope="session")
def tw_cache(tmp_path_factory) -> Path:
    """A temporary TextWorld cache with the first ``TEXTWORLD_PLAYED`` games of every split (~20 s)."""
    from envrl.envs.textworld import generate

    cache = tmp_path_factory.mktemp("textworld-cache")
    for split in generate.SPLITS:
        generate.pregenerate(split, workers=2, limit=TEXTWORLD_PLAYED, cache_dir=cache)
    return cache


@pytest.fixture(scope="session")
def tw_custom_kwargs() -> dict:
    """``gym.make`` arguments for TextWorld's short ``custom`` quests, with the first ``valid`` game
    made in envrl's own cache (~8 s of CPU the first time on a machine, then read): the
    integration tests (TRL, OpenEnv, verifiers) all play it."""
    from envrl.envs.textworld import generate

    generate.ensure_game("tw-custom:valid:0")
    return {"families": ["custom"]}
