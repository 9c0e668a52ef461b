"""envrl's ALFWorld against the stock ``alfworld`` text environment, side by side.

Both play the same official games (``$ALFWORLD_DATA`` or ``../shared/data/alfworld``) with
the same actions: each game's walkthrough plus a few invalid and observational commands.
Each side runs in its own fresh process, so peak memory (max RSS) is comparable. Both follow
one schedule, in three phases:

* ``cold``: every game once, never seen before (envrl starts with an empty cache);
* ``warm``: every game again, other games in between (a game seen before: an RL run's case);
* ``repeat``: right after each warm episode, the same game ``--group - 1`` more times (a GRPO
  group); the stock engine skips ``load()`` there, as it may for the same game.

A third process ("disk") plays every game once more with envrl's translations on disk only:
how a new worker process of an evaluation run starts. The script checks that every phase gave
byte-identical observations, admissible commands and won flags on both sides, then prints
reset latencies (median), steps per second with and without resets (whole episodes), peak
RSS, Fast Downward translator calls, and the ratios.

    python benchmarks/alfworld_speed.py [--data DIR] [--games N] [--group 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXTRA_ACTIONS = ["look", "inventory", "examine nothing", "go to the moon"]
PHASES = ("cold", "warm", "repeat")

# (observation, admissible commands, won) after a reset or a step
Outcome = tuple[str, list[str], bool]


def _games(data: Path, limit: int | None) -> list[Path]:
    """The official games under ``data``; with ``limit``, an evenly spread subset of them."""
    root = data / "json_2.1.1" if (data / "json_2.1.1").is_dir() else data
    games = sorted(root.glob("*/*/*/game.tw-pddl"))
    if not games:
        raise SystemExit(f"no official games under {root}")
    if limit and limit < len(games):
        games = [games[i * len(games) // limit] for i in range(limit)]
    return games


def _actions(game: Path) -> list[str]:
    with open(game, encoding="utf-8") as handle:
        walkthrough = json.load(handle)["walkthrough"]
    return EXTRA_ACTIONS[:2] + walkthrough[:-1] + EXTRA_ACTIONS[2:] + walkthrough[-1:]


# --------------------------------------------------------------------------- the two players


class StockPlayer:
    """ALFWorld's own way to play a game: ``textworld.start`` with its two wrappers, one engine
    reused across games (as ``textworld.gym`` does)."""

    def __init__(self) -> None:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

        self._start = lambda game: textworld.start(
            str(game),
            textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"]),
            wrappers=[AlfredDemangler(shuffle=False), AlfredInfos],
        )
        self._env: Any = None
        self._game: Path | None = None

    def reset(self, game: Path) -> Outcome:
        if self._env is None:
            self._env = self._start(game)
        elif game != self._game:
            self._env.load(str(game))
        self._game = game
        return self._outcome(self._env.reset())

    def step(self, action: str) -> Outcome:
        return self._outcome(self._env.step(action)[0])

    @staticmethod
    def _outcome(state: Any) -> Outcome:
        return state.feedback, list(state.admissible_commands), bool(state["won"])

    def close(self) -> None:
        if self._env is not None:
            self._env.close()


class EnvrlPlayer:
    """``envrl/ALFWorld-v0`` through Gymnasium, one env per official split."""

    def __init__(self, games: list[Path]) -> None:
        import gymnasium as gym

        import envrl  # noqa: F401

        splits = sorted({game.parents[2].name for game in games})  # json_2.1.1/<split>/<task>/<trial>
        self._envs = {
            split: gym.make("envrl/ALFWorld-v0", split=split, source="official", max_episode_steps=1000)
            for split in splits
        }
        self._task_of = {
            str(game.path): (split, game.task_id) for split, env in self._envs.items() for game in env.unwrapped.games
        }
        self._env: Any = None

    def reset(self, game: Path) -> Outcome:
        split, task_id = self._task_of[str(game)]
        self._env = self._envs[split]
        observation, info = self._env.reset(options={"task_id": task_id})
        return observation, info["admissible_actions"], bool(info["won"])

    def step(self, action: str) -> Outcome:
        observation, _, _, _, info = self._env.step(action)
        return observation, info["admissible_actions"], bool(info["won"])

    def close(self) -> None:
        for env in self._envs.values():
            env.close()


# --------------------------------------------------------------------------- measuring


class Phase:
    """Timings and a digest of everything seen in one phase of the schedule."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.reset_times: list[float] = []
        self.step_time = 0.0
        self.steps = 0

    def record(self, outcome: Outcome) -> None:
        observation, admissible, won = outcome
        self.digest.update(json.dumps([observation, admissible, won]).encode())

    def summary(self) -> dict[str, Any]:
        busy = sum(self.reset_times) + self.step_time
        return {
            "digest": self.digest.hexdigest(),
            "resets": len(self.reset_times),
            "reset_median_s": statistics.median(self.reset_times) if self.reset_times else None,
            "steps": self.steps,
            "step_time_s": self.step_time,
            "episode_steps_per_s": self.steps / busy if busy else None,
        }


def _episode(player: Any, game: Path, phase: Phase) -> None:
    """One timed reset, then the game's actions, each step timed."""
    start = time.perf_counter()
    outcome = player.reset(game)
    phase.reset_times.append(time.perf_counter() - start)
    phase.record(outcome)
    for action in _actions(game):
        start = time.perf_counter()
        outcome = player.step(action)
        phase.step_time += time.perf_counter() - start
        phase.steps += 1
        phase.record(outcome)


def _count_translations() -> Callable[[], int]:
    """Count Fast Downward translator calls in this process (both engines call it by name)."""
    import fast_downward

    translate = fast_downward.pddl2sas
    calls = [0]

    def counting(*args, **kwargs):
        calls[0] += 1
        return translate(*args, **kwargs)

    fast_downward.pddl2sas = counting
    return lambda: calls[0]


def run_side(side: str, games: list[Path], group: int) -> dict[str, Any]:
    """Play the schedule as ``side`` ("stock", "envrl", or "disk": envrl, one cold-process pass)."""
    translations = _count_translations()
    player = StockPlayer() if side == "stock" else EnvrlPlayer(games)
    phases = {name: Phase() for name in PHASES}
    if side == "disk":
        phases = {"disk": Phase()}
        for game in games:
            _episode(player, game, phases["disk"])
    else:
        for game in games:
            _episode(player, game, phases["cold"])
        for game in games:
            _episode(player, game, phases["warm"])
            for _ in range(group - 1):
                _episode(player, game, phases["repeat"])
    player.close()
    return {
        "phases": {name: phase.summary() for name, phase in phases.items()},
        "translations": translations(),
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _child(side: str, games: list[Path], group: int, queue) -> None:
    queue.put(run_side(side, games, group))


def measure(side: str, games: list[Path], group: int) -> dict[str, Any]:
    """``run_side`` in a fresh process (its own imports, caches and peak memory)."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(side, games, group, queue))
    process.start()
    while process.is_alive() or not queue.empty():
        try:
            return queue.get(timeout=1)
        except Exception:  # queue.Empty: keep waiting while the child works
            continue
    raise SystemExit(f"the {side} benchmark process failed (exit code {process.exitcode})")


# --------------------------------------------------------------------------- report


def _ratio(ours: float | None, theirs: float | None, faster_is_smaller: bool) -> str:
    if not ours or not theirs:
        return ""
    return f"{(theirs / ours if faster_is_smaller else ours / theirs):.1f}x"


def _steps_per_s(side: dict[str, Any]) -> float:
    """Steps per second of a side over all its phases, resets left out."""
    phases = [side["phases"][name] for name in PHASES]
    return sum(p["steps"] for p in phases) / sum(p["step_time_s"] for p in phases)


def report(stock: dict[str, Any], ours: dict[str, Any], disk: dict[str, Any], games: int, group: int) -> bool:
    """Print the table; return whether both sides saw the same text in every phase."""
    s, o, d = stock["phases"], ours["phases"], disk["phases"]["disk"]
    rows = [
        ("cold reset (s, median)", s["cold"]["reset_median_s"], o["cold"]["reset_median_s"], True, ".3f"),
        ("warm reset (s, median)", s["warm"]["reset_median_s"], o["warm"]["reset_median_s"], True, ".4f"),
        ("same-game reset (s, median)", s["repeat"]["reset_median_s"], o["repeat"]["reset_median_s"], True, ".4f"),
        ("reset in a new process, from disk", s["cold"]["reset_median_s"], d["reset_median_s"], True, ".4f"),
        ("steps/s (steps only)", _steps_per_s(stock), _steps_per_s(ours), False, ".1f"),
        (
            "whole episodes/cold (steps/s)",
            s["cold"]["episode_steps_per_s"],
            o["cold"]["episode_steps_per_s"],
            False,
            ".1f",
        ),
        (
            "whole episodes/warm (steps/s)",
            s["warm"]["episode_steps_per_s"],
            o["warm"]["episode_steps_per_s"],
            False,
            ".1f",
        ),
        (
            "whole episodes/same game (steps/s)",
            s["repeat"]["episode_steps_per_s"],
            o["repeat"]["episode_steps_per_s"],
            False,
            ".1f",
        ),
        ("peak RSS (MB)", stock["max_rss_mb"], ours["max_rss_mb"], None, ".0f"),
        ("translator calls", stock["translations"], ours["translations"], True, "d"),
    ]
    print(
        f"{games} official games; episodes per game: 1 cold + 1 warm + {group - 1} same-game; "
        f"{s['cold']['steps']} steps per pass of the games"
    )
    print(f"{'':36} {'stock':>10} {'envrl':>10} {'envrl/stock':>12}")
    for name, theirs, mine, smaller_better, fmt in rows:
        ratio = "" if smaller_better is None else _ratio(mine, theirs, smaller_better)
        if name == "peak RSS (MB)" and theirs:
            ratio = f"{mine / theirs:.2f}"
        print(
            f"{name:36} {format(theirs, fmt) if theirs is not None else '-':>10} "
            f"{format(mine, fmt) if mine is not None else '-':>10} {ratio:>12}"
        )
    print(
        f"(the 'from disk' row compares with stock's cold reset: a new process has nothing in memory; "
        f"that process made {disk['translations']} translator calls)"
    )
    same = {phase: s[phase]["digest"] == o[phase]["digest"] for phase in PHASES}
    same["disk"] = d["digest"] == s["cold"]["digest"]
    print(
        "observations, admissible commands and won flags identical: "
        + ", ".join(f"{phase} {'yes' if ok else 'NO'}" for phase, ok in same.items())
    )
    return all(same.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = os.environ.get("ALFWORLD_DATA") or str(
        Path(__file__).resolve().parents[2] / "shared" / "data" / "alfworld"
    )
    parser.add_argument("--data", default=default, help="official data folder (default: %(default)s)")
    parser.add_argument("--games", type=int, default=None, help="play this many of the games (default: all)")
    parser.add_argument("--group", type=int, default=2, help="episodes per game in the warm phase (default: 2)")
    args = parser.parse_args()
    if args.group < 2:
        parser.error("--group must be at least 2 (a warm episode and a same-game one)")
    os.environ["ALFWORLD_DATA"] = args.data
    games = _games(Path(args.data), args.games)
    cache = tempfile.mkdtemp(prefix="envrl-bench-cache-")
    os.environ["ENVRL_CACHE"] = cache  # envrl starts cold, and the user's cache stays as it is
    try:
        stock = measure("stock", games, args.group)
        ours = measure("envrl", games, args.group)
        disk = measure("disk", games, args.group)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if not report(stock, ours, disk, len(games), args.group):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
