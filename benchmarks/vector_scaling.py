"""Steps per second of vector envs with 1, 2 and 4 workers, for each env and back end.

A seeded random agent picks among each env's admissible actions; every configuration plays
the same fixed number of env steps (summed over the workers) after its first reset, with
same-step autoreset starting new episodes as they end. Start-up (workers building their
envs, the first reset) is timed apart. Envs that are not registered are skipped.

    python benchmarks/vector_scaling.py                      # subprocess back end, every env
    python benchmarks/vector_scaling.py --backend both --envs webshop alfworld --json out.json
    python benchmarks/vector_scaling.py --backend ray --ray-address auto

Speed-up is steps/s over the 1-worker steps/s of the same env and back end; it cannot pass
the number of free cores (printed at the top).

TextWorld makes each game the first time it is played (seconds per game), which would swamp
the stepping, so its episodes draw from a pool of the split's first ``--textworld-pool``
games (default 6), made (or read from the cache) before anything is timed. The pool is a
Gymnasium wrapper defined here, so with ``--backend ray`` on a cluster of several machines
this file must be importable on each of them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envrl.envs import ENVIRONMENTS, REGISTRY, env_id  # noqa: E402
from envrl.envs.descriptor import EnvDescriptor  # noqa: E402
from envrl.envs.vector import make_vec  # noqa: E402

#: env -> (gym.make kwargs, default env steps per configuration): this benchmark's choices (a
#: split whose tasks are ready to play, steps enough for a steady rate), checked against the
#: registry below; an env not named here plays its default split for DEFAULT_SETTING's steps
SETTINGS = {
    "alfworld": ({"split": "valid_seen"}, 400),
    "webshop": ({"split": "test"}, 3000),
    "scienceworld": ({"split": "dev"}, 400),
    "textworld": ({"split": "valid"}, 2000),
}
DEFAULT_SETTING = ({}, 1000)


def check_settings(settings: dict[str, tuple[dict, int]], registry: dict[str, EnvDescriptor] = REGISTRY) -> None:
    """Refuse, in one sentence, a setting for an env the registry does not hold or a split the env
    lacks: a renamed env or split would otherwise drop out of the table or fail mid-run."""
    for env, (kwargs, _) in settings.items():
        if env not in registry:
            raise ValueError(
                f"vector_scaling SETTINGS names {env!r}, which is not a registered env ({', '.join(registry)})"
            )
        split = kwargs.get("split")
        if split is not None and split not in registry[env].splits:
            raise ValueError(
                f"vector_scaling SETTINGS plays {env!r} on split {split!r}, which it lacks ({', '.join(registry[env].splits)})"
            )


check_settings(SETTINGS)
POOLED_ID = "vector_scaling:vector_scaling/Pooled-v0"


class TaskPool(gym.Wrapper):
    """Episodes draw their task from the split's first ``size`` tasks (seeded like the env)."""

    def __init__(self, env: gym.Env, size: int) -> None:
        super().__init__(env)
        self.pool = list(env.unwrapped.task_ids)[:size]
        self._rng = np.random.default_rng()

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        options = dict(options or {})
        options.setdefault("task_id", self.pool[int(self._rng.integers(len(self.pool)))])
        return self.env.reset(seed=seed, options=options)


def pooled(env: str, pool: int, **kwargs) -> gym.Env:
    """Entry point of :data:`POOLED_ID`: env ``env`` made with ``kwargs``, in a :class:`TaskPool`."""
    return TaskPool(gym.make(env_id(env), **kwargs), pool)


if "vector_scaling/Pooled-v0" not in gym.registry:
    gym.register("vector_scaling/Pooled-v0", entry_point=pooled, disable_env_checker=True)


def target(env: str, pools: dict[str, int]) -> tuple[str, dict]:
    """The id and kwargs that ``make_vec`` gets for ``env``."""
    kwargs = dict(SETTINGS.get(env, DEFAULT_SETTING)[0])
    if pools.get(env):
        return POOLED_ID, {"env": env, "pool": pools[env], **kwargs}
    return env, kwargs


def warm_up(env: str, pools: dict[str, int]) -> None:
    """Reset once to each pooled task, so that games are made before anything is timed."""
    if not pools.get(env):
        return
    single = pooled(env, pools[env], **SETTINGS.get(env, DEFAULT_SETTING)[0])
    try:
        for task_id in single.pool:
            single.reset(options={"task_id": task_id})
    finally:
        single.close()


def measure(
    env: str, backend: str, workers: int, steps: int, ray_address: str | None, seed: int, pools: dict[str, int]
) -> dict:
    """Play ``steps`` env steps on ``workers`` envs; returns the numbers of one table cell."""
    name, kwargs = target(env, pools)
    extra = {"ray_address": ray_address} if backend == "ray" else {}
    start = time.perf_counter()
    vec = make_vec(name, workers, backend=backend, **extra, **kwargs)
    try:
        rng = np.random.default_rng(seed)
        _, infos = vec.reset(seed=seed)
        startup = time.perf_counter() - start
        rounds = max(1, steps // workers)
        episodes = restarts = 0
        start = time.perf_counter()
        for _ in range(rounds):
            actions = []
            for i in range(workers):
                admissible = infos["admissible_actions"][i] or []  # every envrl env lists them
                actions.append(str(admissible[rng.integers(len(admissible))]) if len(admissible) else "look")
            _, _, terminated, truncated, infos = vec.step(actions)
            episodes += int(np.sum(terminated | truncated))
            restarts += int(np.sum(infos.get("worker_restarted", np.zeros(workers, dtype=bool))))
        elapsed = time.perf_counter() - start
    finally:
        vec.close()
    return {
        "env": env,
        "backend": backend,
        "workers": workers,
        "steps": rounds * workers,
        "seconds": elapsed,
        "steps_per_s": rounds * workers / elapsed,
        "startup_s": startup,
        "episodes_ended": episodes,
        "worker_restarts": restarts,
    }


def table(results: list[dict], worker_counts: list[int]) -> str:
    header = (
        f"{'env':<13} {'backend':<10} "
        + " ".join(f"{f'{w} worker' + ('s' if w > 1 else ''):>19}" for w in worker_counts)
        + f" {'start-up (s)':>13}"
    )
    lines = [header, "-" * len(header)]
    groups: dict[tuple[str, str], dict[int, dict]] = {}
    for row in results:
        groups.setdefault((row["env"], row["backend"]), {})[row["workers"]] = row
    for (env, backend), rows in groups.items():
        base = rows.get(min(rows))["steps_per_s"] if rows else None
        cells = []
        for w in worker_counts:
            row = rows.get(w)
            if row is None:
                cells.append(f"{'-':>19}")
            else:
                cells.append(f"{row['steps_per_s']:>10.1f} ({row['steps_per_s'] / base:4.2f}x)")
        startup = max(r["startup_s"] for r in rows.values())
        lines.append(f"{env:<13} {backend:<10} " + " ".join(cells) + f" {startup:>13.1f}")
    lines.append(
        "cells: env steps per second (speed-up over the fewest workers); start-up: the slowest "
        "configuration's build + first reset"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="*", default=None, help="envs to measure (default: every registered one)")
    parser.add_argument("--backend", choices=("subprocess", "ray", "both"), default="subprocess")
    parser.add_argument("--workers", nargs="*", type=int, default=[1, 2, 4], help="worker counts (default 1 2 4)")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="env steps per configuration (default per env: "
        + ", ".join(f"{k} {v[1]}" for k, v in SETTINGS.items())
        + ")",
    )
    parser.add_argument(
        "--ray-address", default="local", help="Ray address for --backend ray/both (default: a new local instance)"
    )
    parser.add_argument(
        "--textworld-pool",
        type=int,
        default=6,
        help="TextWorld episodes draw from the split's first N games (0: the whole split)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    envs = args.envs or list(ENVIRONMENTS)
    skipped = [e for e in envs if e not in ENVIRONMENTS]
    envs = [e for e in envs if e in ENVIRONMENTS]
    backends = ["subprocess", "ray"] if args.backend == "both" else [args.backend]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"vector env scaling: {platform.python_implementation()} {platform.python_version()}, {cpus} CPUs; "
        f"envs {', '.join(envs)}" + (f" (not registered, skipped: {', '.join(skipped)})" if skipped else "")
    )

    pools = {"textworld": args.textworld_pool}
    owns_ray = False
    if "ray" in backends:
        from envrl.ray_cluster import connect_ray

        here = os.pathsep.join([str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])])
        owns_ray = connect_ray(
            args.ray_address,
            {"num_cpus": cpus, "log_to_driver": False, "runtime_env": {"env_vars": {"PYTHONPATH": here}}}
            if args.ray_address == "local"
            else None,
        )
    results = []
    try:
        for env in envs:
            steps = args.steps or SETTINGS.get(env, DEFAULT_SETTING)[1]
            warm_up(env, pools)
            for backend in backends:
                for workers in args.workers:
                    row = measure(env, backend, workers, steps, args.ray_address, args.seed, pools)
                    results.append(row)
                    print(
                        f"  {env} {backend} x{workers}: {row['steps_per_s']:.1f} steps/s "
                        f"({row['steps']} steps in {row['seconds']:.1f}s, start-up {row['startup_s']:.1f}s)",
                        flush=True,
                    )
    finally:
        if owns_ray:
            from envrl.ray_cluster import release_ray

            release_ray(owns_ray)
    print()
    print(table(results, args.workers))
    if args.json:
        payload = {
            "python": platform.python_version(),
            "cpus": cpus,
            "seed": args.seed,
            "skipped": skipped,
            "task_pools": {k: v for k, v in pools.items() if v},
            "results": results,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
