"""Built-in TextWorld games, made by TextWorld's own generator on first use and cached.

Task ids
--------
``tw-<family>:<split>:<index>``, e.g. ``tw-custom:train:17``. A split interleaves its
families: position ``i`` of a split is family ``FAMILIES[i % 3]``, index ``i // 3``, so
``train`` (1,000 ids) holds ``tw-custom:train:0..333``, ``tw-goal:train:0..332`` and
``tw-cooking:train:0..332``; ``select``, ``valid`` and ``test_ood`` hold 100 ids each
(34/33/33). The family is the task type (``info["task_type"]``):

* ``custom``: TextWorld's random quest generator (``textworld.generator.make_game``, the
  ``tw-make custom`` game); the objective spells out every step of the quest.
* ``goal``: the same generator, but the objective states only the quest's last action
  (``GrammarOptions.only_last_action``), so the agent has to find the way itself.
* ``cooking``: TextWorld's ``tw-cooking`` challenge: read the cookbook, fetch, cook and cut
  the ingredients, prepare and eat the meal (a point per recipe step).

Splits: ``train`` to train on; ``select`` (in-distribution) to choose settings on (learning
rates, updates, checkpoints, ...), so that ``valid`` (in-distribution) stays the reported ID
split, never looked at while choosing; ``test_ood`` (out-of-distribution) is reported too.

Settings (``PROFILES``): ``train``, ``select`` and ``valid`` share the in-distribution profile,
``test_ood`` has larger worlds and longer quests, with no overlap in rooms or quest length:

=========== ================================== =======================================
family      train, select, valid               test_ood
=========== ================================== =======================================
custom/goal 3-6 rooms, 2 x rooms + 0-3 objects, 9-12 rooms, 2 x rooms + 0-3 objects,
            quest length 3-6                   quest length 9-12
cooking     1-2 ingredients (1-2 to fetch),    3-4 ingredients (all to fetch),
            1 or 6 rooms; open/cook/cut each   9 or 12 rooms; open, cook and cut always
            on with probability 1/2
=========== ================================== =======================================

Every cooking game uses the cooking challenge's ``train`` foods: the OOD shift is size only.

Seeds: attempt ``a`` of a game draws its settings (``random.Random(seed)``) and is made by
TextWorld with ``GameOptions.seeds = seed``, where
``seed = SPLIT_SEED_NO[split] * 10**6 + family_no * 10**5 + index * 100 + a``
(``family_no``: the position in ``FAMILIES``; ``SPLIT_SEED_NO``: train 1, valid 2, test_ood 3,
select 4: the first three are their positions + 1 in the splits' original order, and ``select``,
added later, got the next number, so no earlier game changed). Seeds of different splits are
therefore disjoint by construction. An attempt is kept if TextWorld makes it and its
walkthrough verifies: the generator's walkthrough is played in the compiled game, dropping the
commands that are not admissible where they come (cooking walkthroughs open doors that are
already open); what is left must have at most ``MAX_WALKTHROUGH`` commands and, replayed from
a fresh start, win the game with the full score, every command admissible, the game neither
won before the first command nor lost on the way. That walkthrough is stored and is what the
expert plays. Otherwise the next attempt is tried (at most ``MAX_ATTEMPTS``). Which attempt
is kept depends only on the id, so a game is a pure function of its id.

TextWorld's cooking generator iterates over sets of strings, so its output depends on
Python's string hashing: games are therefore always generated in a child process with
``PYTHONHASHSEED=0``, and the hash algorithm (``sys.hash_info.algorithm``) is part of the
cache key next to the TextWorld version (Python 3.11+ use siphash13; 3.10's siphash24 gives
other cooking games).

Cache: ``$ENVRL_CACHE/textworld`` or ``~/.cache/envrl/textworld``, then
``<version>/<family>-<split>-<settings digest>/<index>/`` holding ``game.z8``, TextWorld's
``game.json`` and envrl's ``meta.json`` (settings, seed, walkthrough, sizes). A game is built
in a temporary directory beside its final one and renamed into place when complete, under an
exclusive per-game file lock, so parallel workers never race and a killed generation leaves
nothing that is trusted later. Inform 7 stamps the compile date into ``game.z8`` (its serial
number, shown only by the blocked ``version`` command); ``game.json`` is the same byte for byte
on every machine.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from envrl.cache import engine_cache

logger = logging.getLogger(__name__)

# Bump whenever a generated byte may change: it names the cache directory.
GENERATOR_VERSION = "1"
FAMILIES = ("custom", "goal", "cooking")
SPLITS = ("train", "select", "valid", "test_ood")  # the leaderboard's order (envrl.envs.SPLIT_KINDS)
SPLIT_SIZES = {"train": 1000, "select": 100, "valid": 100, "test_ood": 100}
SPLIT_PROFILE = {"train": "id", "select": "id", "valid": "id", "test_ood": "ood"}
# The millions digit of a split's seeds. Never renumber one: it would change every game of that
# split. train/valid/test_ood were the only splits at first (1, 2, 3); select came later (4).
SPLIT_SEED_NO = {"train": 1, "valid": 2, "test_ood": 3, "select": 4}
MAX_WALKTHROUGH = 45  # leaves slack under the default step limit of 50
MAX_ATTEMPTS = 20  # (seeds reserve 100 attempts per game)
FROTZ_SEED = 20240  # the Z-machine's random seed when playing (0 would mean "unseeded")
HASH_SEED = "0"  # PYTHONHASHSEED of the generating child process

PROFILES: dict[tuple[str, str], dict[str, Any]] = {
    ("custom", "id"): {"rooms": [3, 6], "extra_objects": [0, 3], "quest_length": [3, 6]},
    ("custom", "ood"): {"rooms": [9, 12], "extra_objects": [0, 3], "quest_length": [9, 12]},
    ("goal", "id"): {"rooms": [3, 6], "extra_objects": [0, 3], "quest_length": [3, 6]},
    ("goal", "ood"): {"rooms": [9, 12], "extra_objects": [0, 3], "quest_length": [9, 12]},
    ("cooking", "id"): {"recipe": [1, 2], "take_all": False, "go": [1, 6], "skill_probability": 0.5, "foods": "train"},
    ("cooking", "ood"): {"recipe": [3, 4], "take_all": True, "go": [9, 12], "skill_probability": 1.0, "foods": "train"},
}


class TaskIdError(ValueError):
    """A task id that names no built-in TextWorld game."""


@dataclass(frozen=True)
class GameFiles:
    """A generated, verified game in the cache."""

    task_id: str
    directory: Path
    meta: dict[str, Any]

    @property
    def path(self) -> Path:
        """The compiled game (``game.json`` lies beside it, as TextWorld expects)."""
        return self.directory / "game.z8"

    @property
    def walkthrough(self) -> list[str]:
        return list(self.meta["walkthrough"])


# --------------------------------------------------------------------------- ids and settings


def task_ids(split: str) -> list[str]:
    """The split's task ids in their fixed order (families interleaved)."""
    _check_split(split)
    return [f"tw-{FAMILIES[i % len(FAMILIES)]}:{split}:{i // len(FAMILIES)}" for i in range(SPLIT_SIZES[split])]


def family_size(family: str, split: str) -> int:
    position = FAMILIES.index(family)
    return len(range(position, SPLIT_SIZES[split], len(FAMILIES)))


def parse_task_id(task_id: str) -> tuple[str, str, int]:
    """``(family, split, index)`` of a valid task id; :class:`TaskIdError` otherwise."""
    try:
        prefix, split, number = str(task_id).split(":")
        family = prefix[len("tw-") :] if prefix.startswith("tw-") else ""
        index = int(number)
        valid = (
            family in FAMILIES and split in SPLITS and number == str(index) and 0 <= index < family_size(family, split)
        )
    except ValueError:
        valid = False
    if not valid:
        raise TaskIdError(
            f"unknown TextWorld task id {task_id!r}: ids look like 'tw-custom:train:17' "
            f"(families {', '.join(FAMILIES)}; splits {', '.join(f'{s} ({SPLIT_SIZES[s]} ids)' for s in SPLITS)})"
        )
    return family, split, index


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown TextWorld split {split!r}; choose one of {SPLITS}")


def profile(family: str, split: str) -> dict[str, Any]:
    return PROFILES[(family, SPLIT_PROFILE[split])]


def seed_of(family: str, split: str, index: int, attempt: int) -> int:
    """TextWorld's seed for one attempt; disjoint across splits, families and games."""
    if not 0 <= index < 1000 or not 0 <= attempt < 100:
        raise ValueError(f"index {index} or attempt {attempt} out of range")
    _check_split(split)
    return SPLIT_SEED_NO[split] * 10**6 + FAMILIES.index(family) * 10**5 + index * 100 + attempt


def draw_settings(family: str, split: str, index: int, attempt: int) -> dict[str, Any]:
    """The concrete settings of one attempt, drawn from the split's profile with its seed."""
    rng = random.Random(seed_of(family, split, index, attempt))
    spec = profile(family, split)
    if family in ("custom", "goal"):
        rooms = rng.randint(*spec["rooms"])
        return {
            "rooms": rooms,
            "objects": 2 * rooms + rng.randint(*spec["extra_objects"]),
            "quest_length": rng.randint(*spec["quest_length"]),
        }
    recipe = rng.randint(*spec["recipe"])
    take = recipe if spec["take_all"] else rng.randint(1, recipe)
    go = rng.choice(spec["go"])
    p = spec["skill_probability"]
    skills = {name: rng.random() < p for name in ("open", "cook", "cut")}
    return {"recipe": recipe, "take": take, "go": go, **skills, "drop": False, "recipe_seed": 0, "split": spec["foods"]}


# --------------------------------------------------------------------------- cache


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    return engine_cache("textworld", cache_dir)


def version_name() -> str:
    """Cache directory name: the generator, TextWorld's version and Python's string hashing."""
    return f"gen-v{GENERATOR_VERSION}-textworld{metadata.version('textworld')}-{sys.hash_info.algorithm}"


def settings_digest(family: str, split: str) -> str:
    text = json.dumps(
        {"profile": profile(family, split), "max_walkthrough": MAX_WALKTHROUGH, "frotz_seed": FROTZ_SEED},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def game_directory(task_id: str, cache_dir: str | os.PathLike | None = None) -> Path:
    family, split, index = parse_task_id(task_id)
    group = f"{family}-{split}-{settings_digest(family, split)}"
    return cache_root(cache_dir) / version_name() / group / f"{index:04d}"


def read_game(task_id: str, cache_dir: str | os.PathLike | None = None) -> GameFiles | None:
    """The cached game of ``task_id`` if it was completely generated, else None."""
    directory = game_directory(task_id, cache_dir)
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    if meta.get("task_id") != task_id or meta.get("version") != version_name():
        return None
    if not (directory / "game.z8").is_file() or not (directory / "game.json").is_file():
        return None
    return GameFiles(task_id, directory, meta)


def ensure_game(task_id: str, cache_dir: str | os.PathLike | None = None) -> GameFiles:
    """The game of ``task_id``, generated and verified first if it is not cached yet."""
    game = read_game(task_id, cache_dir)
    if game is not None:
        return game
    directory = game_directory(task_id, cache_dir)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with _game_lock(directory) as exclusive:
        game = read_game(task_id, cache_dir)  # another process may have finished meanwhile
        if game is None:
            if exclusive:  # nobody else is generating this game: leftovers are from killed runs
                for leftover in directory.parent.glob(f".{directory.name}.tmp-*"):
                    shutil.rmtree(leftover, ignore_errors=True)
            _generate_into(task_id, directory)
            game = read_game(task_id, cache_dir)
    if game is None:
        raise RuntimeError(f"generating {task_id} left no complete game in {directory}")
    return game


@contextlib.contextmanager
def _game_lock(directory: Path) -> Iterator[bool]:
    """An exclusive lock per game; yields whether it is real.

    Where ``fcntl`` is missing (Windows) it is not, and the atomic rename alone keeps the cache
    consistent (two processes may then both generate the game; the second copy is discarded).
    """
    try:
        import fcntl
    except ImportError:
        yield False
        return
    with open(directory.parent / f".{directory.name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _generate_into(task_id: str, directory: Path) -> None:
    """Build the game in a child process (fixed hash seed), then rename it into place."""
    tmp = directory.parent / f".{directory.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYTHONHASHSEED=HASH_SEED)
    package_parent = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "envrl.envs.textworld.generate", "--build", task_id, "--out", str(tmp)]
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"generating TextWorld game {task_id} failed:\n{result.stderr[-4000:]}")
        publish(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(tmp: Path, final: Path) -> None:
    """Move a finished game directory ``tmp`` to ``final`` in one rename, so no reader sees half
    a game; when another process published ``final`` first, its copy stays and ``tmp`` is left
    for the caller to discard."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not (final / "meta.json").is_file():
            raise
        logger.info("another process published %s first; discarding this copy", final)


# --------------------------------------------------------------------------- building (child process)


def build_game(task_id: str, out_dir: Path) -> dict[str, Any]:
    """Make, compile and verify the game of ``task_id`` into ``out_dir``; returns its meta."""
    import textworld
    from textworld.generator import CouldNotCompileGameError, QuestGenerationError

    family, split, index = parse_task_id(task_id)
    out_dir.mkdir(parents=True, exist_ok=False)
    rejected: list[dict[str, Any]] = []
    started = time.perf_counter()
    for attempt in range(MAX_ATTEMPTS):
        seed = seed_of(family, split, index, attempt)
        settings = draw_settings(family, split, index, attempt)
        try:
            game = _make_game(family, settings, seed)
        except QuestGenerationError as error:
            rejected.append({"attempt": attempt, "reason": f"no quest: {error}"[:200]})
            continue
        walkthrough = list(game.metadata.get("walkthrough") or game.walkthrough or [])
        if not walkthrough:
            rejected.append({"attempt": attempt, "reason": "no walkthrough"})
            continue
        options = textworld.GameOptions()
        options.path = str(out_dir / "game.z8")
        options.force_recompile = True
        try:
            textworld.generator.compile_game(game, options)
        except CouldNotCompileGameError as error:
            rejected.append({"attempt": attempt, "reason": f"Inform 7 failed: {error}"[:200]})
            continue
        played = admissible_walkthrough(out_dir / "game.z8", walkthrough)
        if len(played) > MAX_WALKTHROUGH:
            rejected.append({"attempt": attempt, "reason": f"walkthrough of {len(played)} commands"})
            continue
        problem = replay_walkthrough(out_dir / "game.z8", played)
        if problem is not None:
            rejected.append({"attempt": attempt, "reason": problem})
            continue
        with contextlib.suppress(OSError):
            (out_dir / "game.ni").unlink()  # the Inform 7 source; not needed to play
        meta = {
            "task_id": task_id,
            "version": version_name(),
            "family": family,
            "split": split,
            "index": index,
            "attempt": attempt,
            "seed": seed,
            "settings": settings,
            "objective": game.objective,
            "walkthrough": played,
            "generator_walkthrough": walkthrough,
            "max_score": game.max_score,
            "sizes": game_sizes(game, played),
            "game_json_sha256": hashlib.sha256((out_dir / "game.json").read_bytes()).hexdigest(),
            "rejected": rejected,
            "seconds": round(time.perf_counter() - started, 2),
        }
        (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        return meta
    raise RuntimeError(f"no attempt of {task_id} made a winnable game: {rejected[-3:]}")


def _make_game(family: str, settings: dict[str, Any], seed: int):
    import textworld
    import textworld.challenges

    options = textworld.GameOptions()
    options.seeds = seed
    if family == "cooking":
        make = textworld.challenges.CHALLENGES["tw-cooking"][1]
        return make(settings=dict(settings), options=options)
    options.nb_rooms = settings["rooms"]
    options.nb_objects = settings["objects"]
    options.quest_length = settings["quest_length"]
    options.quest_breadth = 1
    options.grammar.only_last_action = family == "goal"
    return textworld.generator.make_game(options)


def game_sizes(game, walkthrough: list[str]) -> dict[str, int]:
    kinds = [info.type for info in game.infos.values()]
    return {
        "rooms": sum(kind == "r" for kind in kinds),
        "objects": sum(kind not in ("r", "d", "P", "I") for kind in kinds),
        "quests": len(game.quests),
        "walkthrough_length": len(walkthrough),
    }


def _start(path: Path):
    import textworld

    infos = textworld.EnvInfos(admissible_commands=True, score=True, max_score=True, won=True, lost=True)
    env = textworld.start(str(path), infos)
    env.seed(FROTZ_SEED)
    return env, env.reset()


def admissible_walkthrough(path: Path, walkthrough: list[str]) -> list[str]:
    """The generator's walkthrough without the commands that are not admissible where played.

    TextWorld's cooking walkthroughs open doors again that are already open ("That's already
    open."); such commands are dropped, so that the expert only plays admissible commands.
    Whether what is left still wins is checked by :func:`replay_walkthrough`.
    """
    env, state = _start(path)
    try:
        kept = []
        for command in walkthrough:
            if state["won"] or state["lost"]:
                break
            if command in state["admissible_commands"]:
                kept.append(command)
                state, _, _ = env.step(command)
        return kept
    finally:
        env.close()


def replay_walkthrough(path: Path, walkthrough: list[str]) -> str | None:
    """None if ``walkthrough`` wins the compiled game with the full score, else what went wrong."""
    env, state = _start(path)
    try:
        if state["won"] or state["lost"]:
            return "over before the first command"
        for number, command in enumerate(walkthrough):
            if state["won"] or state["lost"]:
                return f"over before command {number}"
            if command not in state["admissible_commands"]:
                return f"command {number} ({command!r}) not admissible"
            state, _, _ = env.step(command)
        if not state["won"] or state["lost"] or state["score"] != state["max_score"]:
            return f"not won (score {state['score']}/{state['max_score']})"
        return None
    finally:
        env.close()


# --------------------------------------------------------------------------- command line


def pregenerate(
    split: str, workers: int = 2, limit: int | None = None, cache_dir: str | os.PathLike | None = None
) -> list[GameFiles]:
    """Generate the games of ``split`` (the first ``limit`` ids), ``workers`` at a time."""
    ids = task_ids(split)[:limit]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:  # each game is its own process
        return list(pool.map(lambda task_id: ensure_game(task_id, cache_dir), ids))


def main(argv: list[str] | None = None) -> None:
    """``python -m envrl.envs.textworld.generate [SPLIT ...]``: fill the cache, timing each split."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("splits", nargs="*", metavar="SPLIT", help=f"default: all of {', '.join(SPLITS)}")
    parser.add_argument("--limit", type=int, default=None, help="only the first N ids of each split")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--build", metavar="TASK_ID", help=argparse.SUPPRESS)  # the child process
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build:
        if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
            parser.error(f"--build must run with PYTHONHASHSEED={HASH_SEED} (see the module docstring)")
        meta = build_game(args.build, args.out)
        print(json.dumps({"task_id": meta["task_id"], "attempt": meta["attempt"], "seconds": meta["seconds"]}))
        return
    for split in args.splits:
        if split not in SPLITS:
            parser.error(f"unknown split {split!r}; the splits are {', '.join(SPLITS)}")
    for split in args.splits or SPLITS:
        started = time.perf_counter()
        games = pregenerate(split, workers=args.workers, limit=args.limit, cache_dir=args.cache_dir)
        print(f"{split}: {len(games)} games in {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
