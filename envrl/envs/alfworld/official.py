"""Reading (and fetching) the official ALFWorld games, ``$ALFWORLD_DATA/json_2.1.1``.

The layout is the one ``alfworld-download`` makes: ``json_2.1.1/<split>/<task folder>/<trial>/``
holding ``game.tw-pddl`` and, in the full release, ``traj_data.json`` (ALFRED's annotation,
which ALFWorld's hand-coded expert reads) and ``initial_state.pddl``.

Game selection follows ALFWorld's own loader (``AlfredTWEnv.collect_game_files``): trials
whose folder names contain ``movable`` or ``Sliced`` are skipped, as are games without a
``solvable`` key or marked unsolvable. ALFWorld only looks at folders with ``traj_data.json``;
envrl also accepts folders with ``game.tw-pddl`` alone (the task type then comes from the
folder name), which is how the training games are often shipped.

Order. The release's folders sort by task type, so a prefix of the sorted list (``--episodes
25``) would hold one or two task types only. Task ids therefore come round-robin over the task
types (in ``TASK_TYPES`` order, each type's games sorted by path), like ScienceWorld's: every
prefix holds each type about equally often, and the order is the same on every machine.

Command line. This module is ALFWorld's descriptor's ``downloader``: ``envrl data alfworld`` is
built from :data:`HELP`, :func:`add_arguments` and :func:`run` (see ``envrl.cli``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from envrl.envs.alfworld.tasks import TASK_TYPES, task_type_of

OFFICIAL_SPLITS = ("train", "valid_seen", "valid_unseen")
DATA_DIR_NAME = "json_2.1.1"

# The official release, as alfworld 0.4.2's ``alfworld-download`` fetches it.
RELEASE_FILES = {
    "json_2.1.1_json.zip": "https://github.com/alfworld/alfworld/releases/download/0.2.2/json_2.1.1_json.zip",
    "json_2.1.2_tw-pddl.zip": "https://github.com/alfworld/alfworld/releases/download/0.4.0/json_2.1.2_tw-pddl.zip",
}
# Games per split in the full release (alfworld's README); a download is checked against them.
RELEASE_GAME_COUNTS = {"train": 3553, "valid_seen": 140, "valid_unseen": 134}


class OfficialDataError(RuntimeError):
    """``ALFWORLD_DATA`` is missing, incomplete or corrupt; the message says what to do."""


@dataclass(frozen=True)
class OfficialGame:
    task_id: str
    task_type: str
    path: Path
    traj_data: Path | None


def data_root(path: str | os.PathLike | None = None) -> Path | None:
    """The ``json_2.1.1`` folder under ``path`` or ``$ALFWORLD_DATA``; None when not configured."""
    base = path if path is not None else os.environ.get("ALFWORLD_DATA")
    if not base:
        return None
    base = Path(base).expanduser()
    root = base / DATA_DIR_NAME if (base / DATA_DIR_NAME).is_dir() or base.name != DATA_DIR_NAME else base
    if not root.is_dir():
        raise OfficialDataError(
            f"ALFWORLD_DATA={base} has no {DATA_DIR_NAME}/ folder. Run `envrl data alfworld --download` "
            f"(needs internet), point ALFWORLD_DATA at a copy of the official data, or unset it to use "
            f"envrl's built-in games."
        )
    return root


def official_games(root: Path, split: str) -> list[OfficialGame]:
    """The split's playable games, round-robin over task types (see the module docstring)."""
    if split not in OFFICIAL_SPLITS:
        raise ValueError(f"unknown official ALFWorld split {split!r}; choose one of {OFFICIAL_SPLITS}")
    split_dir = root / split
    if not split_dir.is_dir():
        raise OfficialDataError(f"{split_dir} does not exist: the official data in {root} is incomplete")
    games: list[OfficialGame] = []
    skipped_corrupt: list[str] = []
    for game_file in sorted(split_dir.glob("*/*/game.tw-pddl")):
        trial_dir = game_file.parent
        relative = trial_dir.relative_to(split_dir).as_posix()
        if "movable" in relative or "Sliced" in relative:
            continue
        traj_file = trial_dir / "traj_data.json"
        try:
            task_type = _task_type(trial_dir, traj_file)
            if task_type not in TASK_TYPES:
                continue
            if not _is_solvable(game_file):
                continue
        except (OSError, ValueError, KeyError) as error:
            skipped_corrupt.append(f"{relative} ({type(error).__name__}: {error})")
            continue
        games.append(
            OfficialGame(
                task_id=f"official:{split}/{relative}",
                task_type=task_type,
                path=game_file,
                traj_data=traj_file if traj_file.is_file() else None,
            )
        )
    if skipped_corrupt:
        warnings.warn(
            f"skipped {len(skipped_corrupt)} unreadable game(s) in {split_dir}: " + "; ".join(skipped_corrupt[:5]),
            stacklevel=2,
        )
    if not games:
        raise OfficialDataError(f"no playable games in {split_dir}: the official data in {root} looks corrupt")
    return interleave_task_types(games)


def interleave_task_types(games: Sequence[OfficialGame]) -> list[OfficialGame]:
    """``games`` reordered round-robin over their task types, keeping each type's own order.

    The first game of every type (in ``TASK_TYPES`` order), then the second of every type, and
    so on; a type that runs out is skipped. So any prefix is as balanced as the split allows.
    """
    by_type: dict[str, list[OfficialGame]] = {task_type: [] for task_type in TASK_TYPES}
    for game in games:
        by_type[game.task_type].append(game)
    rows = zip_longest(*by_type.values())
    return [game for row in rows for game in row if game is not None]


def _task_type(trial_dir: Path, traj_file: Path) -> str:
    if traj_file.is_file():
        with open(traj_file, encoding="utf-8") as handle:
            return json.load(handle)["task_type"]
    return task_type_of(trial_dir.parent.name)


def _is_solvable(game_file: Path) -> bool:
    with open(game_file, encoding="utf-8") as handle:
        game = json.load(handle)
    for key in ("pddl_domain", "grammar", "pddl_problem"):
        if key not in game:
            raise KeyError(key)
    return bool(game.get("solvable", False))


def download(dest: Path | None = None, timeout: float = 30.0) -> Path:
    """Fetch and unpack the official games into ``dest`` (default ``$ALFWORLD_DATA``), then verify.

    Raises ``OfficialDataError`` with a plain explanation when the release cannot be reached.
    """
    dest = Path(dest or os.environ.get("ALFWORLD_DATA") or Path.home() / ".cache" / "alfworld").expanduser()
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as scratch:
        for name, url in RELEASE_FILES.items():
            archive = Path(scratch) / name
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response, open(archive, "wb") as out:
                    shutil.copyfileobj(response, out)
            except (urllib.error.URLError, TimeoutError, OSError) as error:
                raise OfficialDataError(
                    f"cannot download the official ALFWorld data ({url}): {error}. This machine seems to "
                    f"have no internet access; copy json_2.1.1 from a machine that has, set ALFWORLD_DATA "
                    f"to it, or leave ALFWORLD_DATA unset to use envrl's built-in games."
                ) from error
            try:
                with zipfile.ZipFile(archive) as bundle:
                    bundle.extractall(dest)
            except zipfile.BadZipFile as error:
                raise OfficialDataError(f"{url} did not give a valid zip archive: {error}") from error
    verify(dest)
    return dest


def verify(path: Path) -> dict[str, int]:
    """Count the playable games per split; raise if a split is missing or smaller than released."""
    root = data_root(path)
    assert root is not None
    counts = {split: len(official_games(root, split)) for split in OFFICIAL_SPLITS}
    short = {s: n for s, n in counts.items() if n < RELEASE_GAME_COUNTS[s]}
    if short:
        raise OfficialDataError(f"incomplete official data in {root}: {short} games (expected {RELEASE_GAME_COUNTS})")
    return counts


# ---- command line: envrl data alfworld -----------------------------------------------------

#: the line ``envrl data --help`` shows for ``envrl data alfworld``
HELP = "the official ALFWorld games"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``envrl data alfworld``."""
    parser.add_argument("--download", action="store_true", help="download it")
    parser.add_argument("--dest", default=None, help="where to put it (default $ALFWORLD_DATA, else ~/.cache/alfworld)")


def run(args: argparse.Namespace) -> int:
    """``envrl data alfworld --download``: fetch the games and say how to use them. 0 when they
    are in place, 1 when the download failed (one line: network, disk, checksum), 2 without
    ``--download``, 130 when interrupted."""
    prog = f"envrl data {args.dataset}"
    if not args.download:
        print(f"{prog}: error: nothing to do; pass --download to fetch the dataset", file=sys.stderr)
        return 2
    dest = Path(args.dest or os.environ.get("ALFWORLD_DATA") or Path.home() / ".cache" / "alfworld")
    try:
        dest = download(dest)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # network, disk, checksum: one line, not a traceback
        print(f"{prog}: error: download failed: {' '.join(str(exc).split()) or type(exc).__name__}", file=sys.stderr)
        return 1
    print(f"ALFWorld data in {dest}; use it with: export ALFWORLD_DATA={dest}")
    return 0
