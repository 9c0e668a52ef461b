"""envrl's ALFWorld against the stock ``alfworld`` text environment, side by side.

Both play the same official games (``$ALFWORLD_DATA`` or ``../shared/data/alfworld``) with
the same actions: each game's walkthrough plus a few invalid and observational commands.
Each side runs in its own fresh process, so peak memory (max RSS) is comparable. The script
checks that both sides saw byte-identical observations and admissible commands, then prints
steps per second, seconds per reset, peak RSS and the ratios.

    python benchmarks/alfworld_speed.py [--data DIR] [--rounds 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import resource
import time
from pathlib import Path

EXTRA_ACTIONS = ["look", "inventory", "examine nothing", "go to the moon"]


def _games(data: Path) -> list[Path]:
    root = data / "json_2.1.1" if (data / "json_2.1.1").is_dir() else data
    games = sorted(root.glob("*/*/*/game.tw-pddl"))
    if not games:
        raise SystemExit(f"no official games under {root}")
    return games


def _actions(game: Path) -> list[str]:
    with open(game, encoding="utf-8") as handle:
        walkthrough = json.load(handle)["walkthrough"]
    return EXTRA_ACTIONS[:2] + walkthrough[:-1] + EXTRA_ACTIONS[2:] + walkthrough[-1:]


def _run_stock(games: list[Path], rounds: int) -> dict:
    """ALFWorld's own way to play a game: ``textworld.start`` with its two wrappers."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
    env = None
    digest = hashlib.sha256()
    reset_time = step_time = 0.0
    steps = resets = 0
    for _ in range(rounds):
        for game in games:
            start = time.perf_counter()
            if env is None:
                env = textworld.start(str(game), infos, wrappers=[AlfredDemangler(shuffle=False), AlfredInfos])
            else:  # one engine reused across games, as textworld.gym does
                env.load(str(game))
            state = env.reset()
            reset_time += time.perf_counter() - start
            resets += 1
            digest.update(state.feedback.encode() + json.dumps(state.admissible_commands).encode())
            for action in _actions(game):
                start = time.perf_counter()
                state, _, _ = env.step(action)
                step_time += time.perf_counter() - start
                steps += 1
                digest.update(state.feedback.encode() + json.dumps(state.admissible_commands).encode())
    env.close()
    return _result(digest, steps, step_time, resets, reset_time)


def _run_envrl(games: list[Path], rounds: int) -> dict:
    import gymnasium as gym

    import envrl  # noqa: F401

    splits = sorted({game.parents[2].name for game in games})  # json_2.1.1/<split>/<task>/<trial>
    envs = {split: gym.make("envrl/ALFWorld-v0", split=split, source="official", max_episode_steps=1000)
            for split in splits}
    task_of = {str(game.path): (split, game.task_id) for split, env in envs.items()
               for game in env.unwrapped.games}
    digest = hashlib.sha256()
    reset_time = step_time = 0.0
    steps = resets = 0
    for _ in range(rounds):
        for game in games:
            split, task_id = task_of[str(game)]
            env = envs[split]
            start = time.perf_counter()
            observation, info = env.reset(options={"task_id": task_id})
            reset_time += time.perf_counter() - start
            resets += 1
            digest.update(observation.encode() + json.dumps(info["admissible_actions"]).encode())
            for action in _actions(game):
                start = time.perf_counter()
                observation, _, _, _, info = env.step(action)
                step_time += time.perf_counter() - start
                steps += 1
                digest.update(observation.encode() + json.dumps(info["admissible_actions"]).encode())
    for env in envs.values():
        env.close()
    return _result(digest, steps, step_time, resets, reset_time)


def _result(digest, steps: int, step_time: float, resets: int, reset_time: float) -> dict:
    return {
        "digest": digest.hexdigest(),
        "steps": steps,
        "steps_per_s": steps / step_time,
        "reset_s": reset_time / resets,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _child(side: str, games: list[Path], rounds: int, queue) -> None:
    queue.put((_run_stock if side == "stock" else _run_envrl)(games, rounds))


def measure(side: str, games: list[Path], rounds: int) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(side, games, rounds, queue))
    process.start()
    while process.is_alive() or not queue.empty():
        try:
            return queue.get(timeout=1)
        except Exception:  # queue.Empty: keep waiting while the child works
            continue
    raise SystemExit(f"the {side} benchmark process failed (exit code {process.exitcode})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = os.environ.get("ALFWORLD_DATA") or str(Path(__file__).resolve().parents[2] / "shared" / "data" / "alfworld")
    parser.add_argument("--data", default=default, help="official data folder (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=1, help="times to play every game")
    args = parser.parse_args()
    os.environ["ALFWORLD_DATA"] = args.data
    games = _games(Path(args.data))
    stock = measure("stock", games, args.rounds)
    ours = measure("envrl", games, args.rounds)
    print(f"{len(games)} official games x {args.rounds} round(s), {stock['steps']} steps per side")
    print(f"{'':8} {'steps/s':>9} {'reset s':>8} {'max RSS MB':>11}")
    for name, r in (("stock", stock), ("envrl", ours)):
        print(f"{name:8} {r['steps_per_s']:9.1f} {r['reset_s']:8.3f} {r['max_rss_mb']:11.1f}")
    identical = stock["digest"] == ours["digest"]
    print(f"step speed-up: {ours['steps_per_s'] / stock['steps_per_s']:.1f}x   "
          f"reset speed-up: {stock['reset_s'] / ours['reset_s']:.1f}x   "
          f"memory ratio: {ours['max_rss_mb'] / stock['max_rss_mb']:.2f}")
    print(f"observations and admissible commands identical: {identical}")
    if not identical:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
