"""Steps per second of the diagnostic envs through ``gym.make`` (wrappers included), with the
random agent, and the peak memory of one env (docs/diagnostics.md; the issue asks >= 5,000 steps/s).

There is no stock engine to compare with: the diagnostics are envrl's own pure-Python tasks.

    python benchmarks/diagnostics_speed.py [--steps 20000] [--out benchmarks/results/diagnostics_speed.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import tracemalloc
from pathlib import Path

import gymnasium as gym

import envrl  # noqa: F401  (registers the ids)
from envrl.agents import make_agent
from envrl.envs import ENV_IDS

DIAGNOSTICS = [name for name in ENV_IDS if name.startswith("diag-")]
MINIMUM = 5000


def measure(name: str, split: str, steps: int) -> dict[str, float]:
    """Random-agent steps/s over whole episodes (resets included) and the env's peak memory."""
    tracemalloc.start()
    env = gym.make(ENV_IDS[name], split=split)
    agent = make_agent("random", seed=0)
    observation, info = env.reset(seed=0)
    episodes, start = 0, time.perf_counter()
    for step in range(steps):
        observation, _, terminated, truncated, info = env.step(agent.act(observation, info))
        if terminated or truncated:
            episodes += 1
            observation, info = env.reset(seed=step)
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    env.close()
    return {"steps_per_s": round(steps / elapsed), "episodes": episodes, "peak_kib": round(peak / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/diagnostics_speed.json"))
    args = parser.parse_args()
    rows = []
    for name in DIAGNOSTICS:
        for split in ("train", "test_ood"):
            row = {"env": name, "split": split, **measure(name, split, args.steps)}
            rows.append(row)
            print(f"{name:20} {split:9} {row['steps_per_s']:>7} steps/s  {row['peak_kib']:>7} KiB peak (tracemalloc)")
    slow = [row for row in rows if row["steps_per_s"] < MINIMUM]
    result = {
        "command": "python benchmarks/diagnostics_speed.py",
        "steps": args.steps,
        "python": platform.python_version(),
        "note": "tracemalloc slows Python down; the steps/s are measured under it, so they are a lower bound",
        "rows": rows,
        "minimum_steps_per_s": MINIMUM,
        "all_above_minimum": not slow,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}; {'all' if not slow else 'NOT all'} >= {MINIMUM} steps/s")


if __name__ == "__main__":
    main()
