"""envrl's ScienceWorld against the stock ``scienceworld.ScienceWorldEnv``, side by side.

A first process asks envrl's engine for the gold action sequences of the chosen variations
(default: the first train variation of one task per family, 1-1 ... 10-1). Then each side
plays exactly those actions (an unknown command first, then the gold path) in a fresh
process of its own:

* ``stock``: ``ScienceWorldEnv.load`` + ``reset`` + ``step``, which also computes look,
  inventory, task description and the ~500 valid actions on every step;
* ``envrl lazy``: ``envrl/ScienceWorld-v0`` with the default ``admissible="lazy"``, where
  the valid actions are never read;
* ``envrl eager``: ``admissible="eager"``, valid actions after every step, as stock.

The stock JVM runs with ``JAVA_TOOL_OPTIONS`` set to the heap, GC and hash-code options that
envrl uses (``-Xmx512m -XX:+UseSerialGC -XX:hashCode=2``): with Java's default hash codes the
stock engine does not repeat itself (see envrl/envs/scienceworld/engine.py), so no two runs
could be compared byte for byte. ``--stock-java-defaults`` runs stock as installed instead,
for its speed and memory (identity is then reported, not required).

Checks: both envrl sides equal stock in every observation, score and done flag, and eager
also in every valid-action list. Prints steps/s, CPU time per step (Python plus JVM: robust
on a busy machine), seconds per reset, JVM start time, the JVMs' peak RSS, and the ratios.
In the tasks with a bee hive (5-x, 10-x) envrl computes the valid actions after every step
in both modes, as stock does (see envrl/envs/scienceworld/env.py), so "lazy" saves nothing
there; ``--tasks`` picks other tasks.

    python benchmarks/scienceworld_speed.py [--tasks all|1-1,boil,...] [--variations 1]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import resource
import time

STOCK_JAVA_TOOL_OPTIONS = "-Xmx512m -XX:+UseSerialGC -XX:+UnlockExperimentalVMOptions -XX:hashCode=2"
FAMILY_TASKS = ["1-1", "2-1", "3-1", "4-1", "5-1", "6-1", "7-1", "8-1", "9-1", "10-1"]
FIRST_ACTION = "fly to the moon"  # not a command: both sides must answer it the same way


def _jvm_peak_rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _cpu_seconds(pid: int) -> float:
    """CPU time of this Python process plus the JVM ``pid``: robust to a busy machine."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        jvm = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        jvm = 0.0
    return time.process_time() + jvm


def _record(digest, observation: str, score: int, done: bool) -> None:
    digest.update(json.dumps([observation, int(score), bool(done)]).encode())


# ---- the sides ---------------------------------------------------------------------------


def _prepare(episodes: list[tuple[str, int]], simplifications: str) -> list[dict]:
    from envrl.envs.scienceworld.engine import Engine
    from envrl.envs.scienceworld.tasks import find_task

    engine = Engine()
    plans = []
    for key, variation in episodes:
        task = find_task(key)
        gold = engine.load(task.name, variation, simplifications, gold_path=True) or []
        plans.append({"id": task.id, "name": task.name, "variation": variation, "actions": [FIRST_ACTION, *gold]})
    engine.close()
    return plans


def _run_stock(plans: list[dict], simplifications: str, rounds: int, java_defaults: bool) -> dict:
    if not java_defaults:
        os.environ["JAVA_TOOL_OPTIONS"] = STOCK_JAVA_TOOL_OPTIONS
    from scienceworld import ScienceWorldEnv

    start = time.perf_counter()
    env = ScienceWorldEnv("", envStepLimit=10**9)
    start_s = time.perf_counter() - start
    pid = env._gateway.java_process.pid
    digests, admissible = [], hashlib.sha256()
    reset_time = step_time = cpu = 0.0
    steps = resets = 0
    for _ in range(rounds):
        for plan in plans:
            digest = hashlib.sha256()
            start = time.perf_counter()
            env.load(plan["name"], plan["variation"], simplifications)
            observation, info = env.reset()
            reset_time += time.perf_counter() - start
            resets += 1
            _record(digest, observation, info["score"], False)
            admissible.update(json.dumps(info["valid"]).encode())
            cpu -= _cpu_seconds(pid)
            for action in plan["actions"]:
                start = time.perf_counter()
                observation, _, done, info = env.step(action)
                step_time += time.perf_counter() - start
                steps += 1
                _record(digest, observation, info["score"], done)
                admissible.update(json.dumps(info["valid"]).encode())
                if done:  # a gold path can go on past the end; envrl's episodes end there
                    break
            cpu += _cpu_seconds(pid)
            digests.append(digest.hexdigest())
    rss = _jvm_peak_rss_mb(pid)
    env.close()
    return _result(digests, admissible, steps, step_time, cpu, resets, reset_time, start_s, rss)


def _run_envrl(plans: list[dict], simplifications: str, rounds: int, admissible_mode: str) -> dict:
    from envrl.envs.scienceworld.env import ScienceWorldEnv

    env = ScienceWorldEnv(
        split="train",
        task=sorted({p["id"] for p in plans}),
        simplifications=simplifications,
        admissible=admissible_mode,
    )
    digests, admissible = [], hashlib.sha256()
    reset_time = step_time = cpu = 0.0
    steps = resets = 0
    start_s = 0.0
    for _ in range(rounds):
        for plan in plans:
            digest = hashlib.sha256()
            start = time.perf_counter()
            observation, info = env.reset(options={"task_id": f"{plan['id']}:{plan['variation']}"})
            reset_time += time.perf_counter() - start
            if not start_s:  # the first reset started the JVM; stock starts it in its constructor
                start_s = env.engine.start_seconds
                reset_time -= start_s
            resets += 1
            _record(digest, observation, info["raw_score"], False)
            if admissible_mode == "eager":
                admissible.update(json.dumps(list(info["admissible_actions"])).encode())
            cpu -= _cpu_seconds(env.engine.pid)
            for action in plan["actions"]:
                start = time.perf_counter()
                observation, _, terminated, _, info = env.step(action)
                step_time += time.perf_counter() - start
                steps += 1
                _record(digest, observation, info["raw_score"], terminated)
                if admissible_mode == "eager":
                    admissible.update(json.dumps(list(info["admissible_actions"])).encode())
                if terminated:
                    break
            cpu += _cpu_seconds(env.engine.pid)
            digests.append(digest.hexdigest())
    rss = _jvm_peak_rss_mb(env.engine.pid)
    env.close()
    return _result(digests, admissible, steps, step_time, cpu, resets, reset_time, start_s, rss)


def _result(digests, admissible, steps, step_time, cpu, resets, reset_time, start_s, jvm_rss) -> dict:
    return {
        "digests": digests,
        "admissible": admissible.hexdigest(),
        "steps": steps,
        "steps_per_s": steps / step_time,
        "cpu_ms_per_step": 1000 * cpu / steps,
        "reset_s": reset_time / resets,
        "start_s": start_s,
        "jvm_peak_rss_mb": jvm_rss,
        "python_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _child(function, args, queue) -> None:
    queue.put(function(*args))


def _in_process(function, *args):
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(function, args, queue))
    process.start()
    while process.is_alive() or not queue.empty():
        try:
            return queue.get(timeout=1)
        except Exception:  # queue.Empty: keep waiting while the child works
            continue
    raise SystemExit(f"the benchmark process for {function.__name__} failed (exit code {process.exitcode})")


def _episodes(tasks: str, variations: int) -> list[tuple[str, int]]:
    from envrl.envs.scienceworld.tasks import all_tasks, find_task, split_variations

    keys = [t.id for t in all_tasks()] if tasks == "all" else (FAMILY_TASKS if not tasks else tasks.split(","))
    return [(key, v) for key in keys for v in split_variations(find_task(key).name, "train")[:variations]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tasks",
        default="",
        help="'all', or task ids/names separated by commas (default: one per family, 1-1 ... 10-1)",
    )
    parser.add_argument("--variations", type=int, default=1, help="first N train variations per task")
    parser.add_argument("--simplifications", default="", help="ScienceWorld simplifications (default none)")
    parser.add_argument("--rounds", type=int, default=1, help="times to play every episode")
    parser.add_argument(
        "--stock-java-defaults",
        action="store_true",
        help="run stock with Java's default options (identity then is not required)",
    )
    args = parser.parse_args()

    plans = _in_process(_prepare, _episodes(args.tasks, args.variations), args.simplifications)
    stock = _in_process(_run_stock, plans, args.simplifications, args.rounds, args.stock_java_defaults)
    lazy = _in_process(_run_envrl, plans, args.simplifications, args.rounds, "lazy")
    eager = _in_process(_run_envrl, plans, args.simplifications, args.rounds, "eager")

    print(
        f"{len(plans)} gold paths x {args.rounds} round(s), {stock['steps']} steps per side "
        f"(simplifications: {args.simplifications or 'none'}; stock JVM: "
        f"{'Java defaults' if args.stock_java_defaults else STOCK_JAVA_TOOL_OPTIONS})"
    )
    print(f"{'':12} {'steps/s':>9} {'CPU ms/step':>12} {'reset s':>8} {'JVM start s':>12} {'JVM peak RSS MB':>16}")
    for name, r in (("stock", stock), ("envrl lazy", lazy), ("envrl eager", eager)):
        print(
            f"{name:12} {r['steps_per_s']:9.1f} {r['cpu_ms_per_step']:12.1f} {r['reset_s']:8.3f} "
            f"{r['start_s']:12.2f} {r['jvm_peak_rss_mb']:16.0f}"
        )
    print(
        f"step speed-up (steps/s): lazy {lazy['steps_per_s'] / stock['steps_per_s']:.1f}x, "
        f"eager {eager['steps_per_s'] / stock['steps_per_s']:.1f}x   "
        f"CPU per step: lazy {stock['cpu_ms_per_step'] / lazy['cpu_ms_per_step']:.1f}x less, "
        f"eager {stock['cpu_ms_per_step'] / eager['cpu_ms_per_step']:.1f}x less   "
        f"JVM memory ratio: {lazy['jvm_peak_rss_mb'] / max(stock['jvm_peak_rss_mb'], 1):.2f}"
    )

    names = [p["id"] for p in plans] * args.rounds
    eager_same = eager["digests"] == stock["digests"] and eager["admissible"] == stock["admissible"]
    lazy_differs = sorted({n for n, a, b in zip(names, lazy["digests"], stock["digests"]) if a != b})
    print(f"eager == stock (observations, scores, done flags, valid actions): {eager_same}")
    print(
        f"lazy == stock (observations, scores, done flags): {not lazy_differs}"
        + (f" (differs in {', '.join(lazy_differs)})" if lazy_differs else "")
    )
    if not args.stock_java_defaults and (not eager_same or lazy_differs):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
