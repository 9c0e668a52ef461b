"""The diagnostic scorecard: every trainer on every diagnostic task (docs/diagnostics.md), at the
smallest difficulty and larger ones, 3 seeds, a from-scratch model, on 2 cores.

Each cell is one training run from scratch and its evaluation on ``valid`` (ID) and ``test_ood``
(OOD), 60 episodes each, the same 60 tasks for every seed and method:

* ``sft``: the expert's demonstrations of the train split (1,000 episodes), ``choice`` objective;
* ``iwm`` and ``sr``: early experience built from those demonstrations, alternatives proposed by
  the seed's initial checkpoint (the agent's own policy, as in the paper), no reward;
* ``grpo``, ``gigpo``, ``envrl`` (GRPO + state prediction + inverse dynamics, cosine-decayed):
  RL from the initial checkpoint on the train split's tasks, groups of 4;
* ``grpo-from-sft`` and ``grpo-from-iwm`` (the alternatives task only): GRPO from the SFT and the
  IWM checkpoint of the same seed, the paper's claim that early experience raises RL's ceiling;
* ``envrl-no-sp``, ``envrl-no-id``, ``envrl-constant``, ``envrl-aux0.5`` (the dynamics task at its
  two smaller difficulties only): ENVRL's ablations at the start weights chosen on ``select``
  (state prediction off, inverse dynamics off, weights held at their start values, half the
  transitions in the auxiliary losses). The largest difficulty is left out for time (its ENVRL
  cells take 4-5 min each).
* ``grpo-sanity``, ``gigpo-sanity``, ``envrl-sanity`` (the smallest chain only): the RL trainers at
  ``Budget.sanity_rl_updates`` (80) instead of the grid's 40, so that the first sanity rule tells a
  trainer that learns slowly from one that does not learn (on select, GRPO and ENVRL sit at
  chance on chain 1 after 40 updates and reach 100% after 80).

Every policy acts in ``choose`` mode over the admissible actions (candidates scored by their summed
token log-probabilities) with the ``compact`` template and no history (the diagnostics'
observations are Markov; SR uses ``compact`` with a thought, ``configs/compact_think.json``, whose
thought is empty at act time), and every evaluation samples at temperature 1 (the distribution RL
trains). The model is the ``tiny`` size (64 wide, 2 layers,
~0.1M weights and a 1,024-token BPE tokenizer trained on the diagnostics' train episodes).

Intervals: the unit is the seed. Each seed evaluates the same 60 tasks, so pooling the 180
episodes as independent would be too narrow; a cell reports the mean over seeds with a 95%
Student-t interval over the 3 per-seed rates (t = 4.30, wide on purpose) and each seed's rate.
A comparison (GiGPO - GRPO, ...) is a paired difference per seed (the two methods share the
seed's initial model), with the same t interval.

Settings (learning rates, updates, ENVRL's start weights) were chosen on the ``select`` split
only (``--select``, which evaluates there and writes ``select.json``); no setting was chosen by
looking at ``valid`` or ``test_ood``.

Sanity rules, checked after the run and reported (exit status 1 when one fails): each RL trainer
learns the smallest chain to >= 90% success (ID) from scratch, at the grid's budget and at the
sanity runs' longer one (each rule reported on its own), and SFT reaches >= 90% of the expert (the
expert wins 100%) on the ID split of every diagnostic at every difficulty.

A cell that fails is recorded with its reason and the rest of the grid runs. Finished cells are
kept (``cells/*.json``), so an interrupted run resumes, and a later run with more cells adds them.

    .venv/bin/python benchmarks/scorecard.py                         # the whole grid, 2 processes
    .venv/bin/python benchmarks/scorecard.py --seeds 0 --methods sft grpo --diagnostics diag-chain
    .venv/bin/python benchmarks/scorecard.py --select                # the selection sweep

Writes ``--out`` (default ``benchmarks/results/scorecard``): ``scorecard.json``, ``scorecard.md``
and ``scorecard.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: each diagnostic's knob and the difficulties the grid runs (the smallest first)
DIFFICULTIES: dict[str, tuple[str, tuple[int, ...]]] = {
    "diag-chain": ("length", (1, 3, 6)),
    "diag-dynamics": ("rules", (2, 4, 8)),
    "diag-alternatives": ("rules", (2, 6, 10)),
    "diag-generalization": ("objects", (2, 4, 8)),
}
METHODS = ("sft", "iwm", "sr", "grpo", "gigpo", "envrl")
RL_METHODS = ("grpo", "gigpo", "envrl")
#: RL from a checkpoint of another method (alternatives task only): method -> where it starts
FROM_CHECKPOINT = {"grpo-from-sft": "sft", "grpo-from-iwm": "iwm"}
#: ENVRL's ablations (dynamics task only): method -> the ``--set`` items that differ from ``envrl``
ENVRL_ABLATIONS = {
    "envrl-no-sp": ["algorithm.sp=false"],
    "envrl-no-id": ["algorithm.id=false"],
    "envrl-constant": ["algorithm.decay=constant"],
    "envrl-aux0.5": ["algorithm.aux_fraction=0.5"],
}
#: the RL trainers at the sanity budget (``Budget.sanity_rl_updates``, the smallest chain only)
SANITY_RUNS = {f"{method}-sanity": method for method in RL_METHODS}
#: the methods that run on part of the grid only: method -> (diagnostic, difficulties; None: all)
RESTRICTED: dict[str, tuple[str, tuple[int, ...] | None]] = {
    **{method: ("diag-alternatives", None) for method in FROM_CHECKPOINT},
    **{method: ("diag-dynamics", (2, 4)) for method in ENVRL_ABLATIONS},
    **{method: ("diag-chain", (1,)) for method in SANITY_RUNS},
}
ALL_METHODS = (*METHODS, *FROM_CHECKPOINT, *ENVRL_ABLATIONS, *SANITY_RUNS)
SPLITS = {"ID": "valid", "OOD": "test_ood"}
#: SR's template: ``compact`` with a thought (in choose mode the thought is empty at act time)
THINK_TEMPLATE = Path(__file__).resolve().parent / "configs" / "compact_think.json"
T_95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}  # two-sided 95% Student t, by degrees of freedom

#: the policy's settings, shared by every cell (the choose score is a Budget field)
POLICY = [
    "policy.template=compact",
    "policy.history=0",
    "policy.action_mode=choose",
    "policy.temperature=1.0",
]


@dataclass(frozen=True)
class Budget:
    """What one cell trains with. Chosen on ``select`` (seed 0; ``benchmarks/results/scorecard/select``):
    summed candidate scores (with the mean, GRPO from scratch stayed uniform for 40 updates at every
    learning rate tried: 3e-4, 1e-3, 3e-3), RL lr 3e-3 (chain 3 + dynamics 4 on select: 100 + 47
    against 86 + 53 at 1e-2 and 47 + 46 at 1e-3), ENVRL's start weights SP 0.01 / ID 0.001
    (dynamics 4 on select: 61, against 38 at 0.1 / 0.01), and SFT's 240 updates on 1,000 expert
    episodes (120 on 200, the first grid's, left alternatives 10 at 64% on select and
    generalization 4 / 8 at 72 / 64%; 240 on 1,000 reach 100 / 95 / 73, and 100 on every other
    task). RL's 40 updates leave GRPO and ENVRL at chance on chain 1 (89% on select; 80 updates
    reach 100): the sanity rule reports that gap, as doubling RL's updates would double the
    grid's largest cost."""

    sft_updates: int = 240
    sft_lr: float = 3e-3
    world_model_updates: int = 60  # IWM's first stage, before a full SFT stage of sft_updates
    rl_updates: int = 40
    sanity_rl_updates: int = 80  # the sanity runs' (chain 1 only)
    rl_lr: float = 3e-3
    groups: int = 8
    group_size: int = 4
    sp_coef: float = 0.01
    id_coef: float = 0.001
    expert_episodes: int = 1000
    alternatives: int = 3  # k: alternatives per expert state (a chain room has only one)
    eval_episodes: int = 60
    choose_score: str = "sum"  # how choose mode scores a candidate: sum or mean of its token log-probs


#: the Budget fields each method reads (its ``--set`` items, the data it trains on, where it starts);
#: every cell also reads :data:`EVAL_FIELDS`. A cell's result records these values, so a changed
#: field reruns exactly the cells that read it.
SUPERVISED_FIELDS = ("sft_updates", "sft_lr", "expert_episodes")
RL_FIELDS = ("rl_updates", "rl_lr", "groups", "group_size")
READS: dict[str, tuple[str, ...]] = {
    "sft": SUPERVISED_FIELDS,
    "iwm": (*SUPERVISED_FIELDS, "world_model_updates", "alternatives"),
    "sr": (*SUPERVISED_FIELDS, "alternatives"),
    "grpo": RL_FIELDS,
    "gigpo": RL_FIELDS,
    "envrl": (*RL_FIELDS, "sp_coef", "id_coef"),
}
EVAL_FIELDS = ("eval_episodes", "choose_score")


def cell_budget(method: str, budget: Budget | dict[str, Any]) -> dict[str, Any]:
    """The values of the Budget fields a ``method`` cell reads: its own, and for ``grpo-from-*``
    those of the cell whose checkpoint it starts from."""
    if method in FROM_CHECKPOINT:
        fields = (*READS["grpo"], *READS[FROM_CHECKPOINT[method]])
    elif method in SANITY_RUNS:
        fields = (*(f for f in READS[SANITY_RUNS[method]] if f != "rl_updates"), "sanity_rl_updates")
    else:
        fields = READS[trainer(method)]
    values = budget if isinstance(budget, dict) else budget.__dict__
    return {name: values.get(name) for name in sorted({*fields, *EVAL_FIELDS})}


@dataclass(frozen=True)
class Cell:
    method: str
    diagnostic: str
    value: int
    seed: int
    splits: tuple[str, ...] = ("valid", "test_ood")

    @property
    def name(self) -> str:
        knob = DIFFICULTIES[self.diagnostic][0]
        return f"{self.method}-{self.diagnostic}-{knob[0]}{self.value}-s{self.seed}"

    @property
    def env_kwargs(self) -> dict[str, int]:
        return {DIFFICULTIES[self.diagnostic][0]: self.value}


@dataclass
class Paths:
    out: Path
    budget: Budget = field(default_factory=Budget)

    def model(self, seed: int) -> Path:
        return self.out / "models" / f"seed{seed}"

    # the data folders are named by the Budget fields they are built from: a finished folder is
    # kept and reused, so a changed field must lead to another folder, never to stale data

    def expert(self, cell: Cell) -> Path:
        return self.out / "data" / f"expert-{cell.diagnostic}-{cell.value}-e{self.budget.expert_episodes}"

    def early_experience(self, cell: Cell) -> Path:
        b = self.budget
        return (
            self.out / "data" / f"ee-{cell.diagnostic}-{cell.value}-e{b.expert_episodes}-k{b.alternatives}-s{cell.seed}"
        )

    def run(self, cell: Cell) -> Path:
        return self.out / "runs" / cell.name

    def cell_file(self, cell: Cell) -> Path:
        tag = "-".join(cell.splits)
        return self.out / "cells" / f"{cell.name}@{tag}.json"

    def checkpoint(self, cell: Cell, updates: int) -> Path:
        return self.run(cell) / "checkpoints" / f"update-{updates:06d}" / "model"


# ---- one cell ------------------------------------------------------------------------------------


def cell_sets(cell: Cell, paths: Paths) -> tuple[str, list[str], int]:
    """The algorithm, the ``--set`` items and the update count of one cell."""
    b = paths.budget
    kwargs = json.dumps(cell.env_kwargs)
    shared = POLICY + [
        f"policy.choose_score={b.choose_score}",
        f"out={paths.run(cell)}",
        f"seed={cell.seed}",
        f"name={cell.name}",
        f"eval.episodes={b.eval_episodes}",
        f"eval.splits={json.dumps(list(cell.splits))}",
        f"eval.env_kwargs={kwargs}",
        f"eval.runs_dir={paths.out / 'eval-runs'}",
        "eval.at_start=false",
        "eval.every=0",
        "eval.workers=1",
        f"eval.batch_size={b.eval_episodes}",
        "optim.micro_batch_size=32",
    ]
    method = cell.method
    if method in ("sft", "iwm", "sr"):
        data = paths.expert(cell) if method == "sft" else paths.early_experience(cell)
        sets = shared + [
            f"policy.model={paths.model(cell.seed)}",
            f"algorithm.data={data}",
            f"optim.lr={b.sft_lr}",
            "algorithm.batch_size=32",
            "algorithm.objective=choice",
        ]
        updates = b.sft_updates
        if method == "sr":  # SR writes a rationale before its action: the compact template with a thought
            sets.append(f"policy.template={THINK_TEMPLATE}")
        if method == "iwm":
            updates = b.world_model_updates + b.sft_updates
            sets.append(f"algorithm.world_model_fraction={b.world_model_updates / updates}")
        return method, sets, updates
    start = paths.model(cell.seed)
    if method in FROM_CHECKPOINT:
        source = Cell(FROM_CHECKPOINT[method], cell.diagnostic, cell.value, cell.seed)
        start = paths.checkpoint(source, cell_sets(source, paths)[2])
    algo = trainer(method)
    sets = shared + [
        f"policy.model={start}",
        f"rollout.env_kwargs={kwargs}",
        f"rollout.groups={b.groups}",
        f"rollout.group_size={b.group_size}",
        "rollout.backend=inline",
        "rollout.step_timeout=null",
        f"optim.lr={b.rl_lr}",
        "algorithm.kl_coef=0.0",
    ]
    if algo == "envrl":
        sets += ["algorithm.base=grpo", f"algorithm.sp_coef={b.sp_coef}", f"algorithm.id_coef={b.id_coef}"]
        sets += ENVRL_ABLATIONS.get(method, [])
    return algo, sets, b.sanity_rl_updates if method in SANITY_RUNS else b.rl_updates


def trainer(method: str) -> str:
    """The algorithm a method trains with (``grpo-from-sft`` is GRPO, ``envrl-no-id`` ENVRL, ...)."""
    if method in FROM_CHECKPOINT:
        return "grpo"
    if method in ENVRL_ABLATIONS:
        return "envrl"
    return SANITY_RUNS.get(method, method)


def one_thread() -> None:
    """Each worker process trains on one core (the pool runs ``--workers`` of them side by side)."""
    import torch

    torch.set_num_threads(1)


def run_cell(cell: Cell, paths: Paths) -> dict[str, Any]:
    """Train and evaluate one cell in this process; a failure is returned with its reason."""
    from envrl.processes import describe_exception
    from envrl.training.algorithms import algorithm_class
    from envrl.training.config import build_config
    from envrl.training.loop import train

    began = time.perf_counter()
    result: dict[str, Any] = {
        "cell": cell.__dict__ | {"splits": list(cell.splits)},
        "budget": cell_budget(cell.method, paths.budget),
        "status": "ok",
    }
    try:
        if cell.method in ("iwm", "sr"):
            build_early_experience_for(cell, paths)
        algo, sets, updates = cell_sets(cell, paths)
        config = build_config(
            algo, cell.diagnostic, algorithm_config=algorithm_class(algo).Config, sets=sets + [f"updates={updates}"]
        )
        evaluations = train(config, progress=False)
        result["rates"] = {}
        for split in cell.splits:
            found = next(v for k, v in evaluations.items() if k.endswith(f"@{updates}/{split}"))
            result["rates"][split] = {
                "successes": int(found["successes"]),
                "episodes": int(found["episodes"]),
                "turns": found.get("mean_turns"),
                "turns_success": found.get("mean_turns_success"),
            }
    except Exception as exc:  # the cell is marked failed; the grid goes on
        result |= {"status": "failed", "reason": describe_exception(exc), "traceback": traceback.format_exc()}
    result["seconds"] = round(time.perf_counter() - began, 1)
    path = paths.cell_file(cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result


# ---- what the cells need ---------------------------------------------------------------------------


def prepare(cells: Sequence[Cell], paths: Paths) -> None:
    """Initial models (per seed) and expert data (per task family), each built once and kept."""
    from envrl.training.data import collect_expert_data
    from envrl.training.scratch_model import init_model

    b = paths.budget
    for seed in sorted({c.seed for c in cells}):
        model = paths.model(seed)
        if not (model / "config.json").is_file():
            init_model(
                model,
                "tiny",
                envs=tuple(DIFFICULTIES),
                seed=seed,
                vocab_size=1024,
                tasks={name: 40 for name in DIFFICULTIES},
                overwrite=True,
            )
    for cell in cells:
        expert = paths.expert(cell)
        if not (expert / "meta.json").is_file():
            collect_expert_data(
                cell.diagnostic,
                "train",
                b.expert_episodes,
                expert,
                template="compact",
                history=0,
                env_kwargs=cell.env_kwargs,
            )


def build_early_experience_for(cell: Cell, paths: Paths) -> None:
    """The cell's early experience (per family and seed), alternatives proposed by the seed's
    initial model; built by the first cell that needs it (IWM runs in a wave before SR's)."""
    from envrl.training.early_experience import build_early_experience

    folder = paths.early_experience(cell)  # a finished build is kept, a partial one resumed
    k = 1 if cell.diagnostic == "diag-chain" else paths.budget.alternatives  # a room has one other door
    build_early_experience(
        cell.diagnostic,
        "train",
        paths.expert(cell),
        folder,
        k=k,
        proposer=f"policy:{paths.model(cell.seed)}",
        seed=cell.seed,
    )


# ---- the table ---------------------------------------------------------------------------------


def seed_interval(rates: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean over seeds and its 95% Student-t interval (clipped to [0, 1])."""
    n = len(rates)
    mean = sum(rates) / n
    if n < 2:
        return mean, mean, mean
    sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / (n - 1))
    half = T_95.get(n - 1, 1.96) * sd / math.sqrt(n)
    return mean, max(0.0, mean - half), min(1.0, mean + half)


def paired_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """The mean per-seed difference a - b and its 95% t interval (unclipped)."""
    diffs = [x - y for x, y in zip(a, b)]
    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return mean, mean, mean
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = T_95.get(n - 1, 1.96) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def summarise(results: Sequence[dict[str, Any]], seeds: Sequence[int]) -> dict[str, Any]:
    """Per (method, diagnostic, value): per-seed rates, mean and interval per split; failures named."""
    by_key: dict[str, dict[str, Any]] = {}
    for r in results:
        c = r["cell"]
        key = f"{c['method']}/{c['diagnostic']}/{c['value']}"
        entry = by_key.setdefault(
            key,
            {
                "method": c["method"],
                "diagnostic": c["diagnostic"],
                "value": c["value"],
                "seeds": {},
                "failed": {},
                "seconds": 0.0,
            },
        )
        entry["seconds"] += r["seconds"]
        if r["status"] != "ok":
            entry["failed"][str(c["seed"])] = r["reason"]
            continue
        entry["seeds"][str(c["seed"])] = {split: v["successes"] / v["episodes"] for split, v in r["rates"].items()}
    for entry in by_key.values():
        for kind, split in SPLITS.items():
            rates = [
                entry["seeds"][str(s)][split]
                for s in seeds
                if str(s) in entry["seeds"] and split in entry["seeds"][str(s)]
            ]
            if rates:
                mean, low, high = seed_interval(rates)
                entry[kind] = {"mean": mean, "ci": [low, high], "per_seed": rates}
    return by_key


def comparisons(table: dict[str, Any], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """The differences the issue asks about, paired by seed, where both cells finished on every seed."""
    wanted = []
    for diagnostic, (_, values) in DIFFICULTIES.items():
        for value in values:
            if diagnostic == "diag-chain":
                wanted.append(("gigpo", "grpo", diagnostic, value))
            wanted.append(("envrl", "grpo", diagnostic, value))
            wanted += [(m, "envrl", diagnostic, value) for m in ENVRL_ABLATIONS if runs_on(m, diagnostic, value)]
            # early experience against its imitation baseline everywhere (its own task is alternatives)
            wanted += [("iwm", "sft", diagnostic, value), ("sr", "sft", diagnostic, value)]
            if diagnostic == "diag-alternatives":
                wanted.append(("grpo-from-iwm", "grpo-from-sft", diagnostic, value))
    out = []
    for a, b, diagnostic, value in wanted:
        ea, eb = table.get(f"{a}/{diagnostic}/{value}"), table.get(f"{b}/{diagnostic}/{value}")
        if not ea or not eb:
            continue
        common = [str(s) for s in seeds if str(s) in ea["seeds"] and str(s) in eb["seeds"]]
        if not common:
            continue
        row: dict[str, Any] = {"a": a, "b": b, "diagnostic": diagnostic, "value": value, "seeds": len(common)}
        for kind, split in SPLITS.items():
            mean, low, high = paired_interval(
                [ea["seeds"][s][split] for s in common], [eb["seeds"][s][split] for s in common]
            )
            # one seed has no interval: never "resolved"
            row[kind] = {"diff": mean, "ci": [low, high], "resolved": len(common) > 1 and (low > 0 or high < 0)}
        out.append(row)
    return out


def sanity(table: dict[str, Any], budget: Budget | None = None) -> list[dict[str, Any]]:
    """The two sanity rules of the module docstring, each checked cell by cell (cells this grid
    did not run are left out)."""
    b = budget or Budget()
    smallest = DIFFICULTIES["diag-chain"][1][0]
    checks = []
    for method in RL_METHODS:
        rule = f"{method} learns diag-chain length {smallest} to >= 90% (ID)"
        checks.append(check(f"{rule} in {b.rl_updates} updates", table.get(f"{method}/diag-chain/{smallest}")))
    for method, base in SANITY_RUNS.items():
        rule = f"{base} learns diag-chain length {smallest} to >= 90% (ID) in {b.sanity_rl_updates} updates"
        checks.append(check(rule, table.get(f"{method}/diag-chain/{smallest}")))
    for diagnostic, (_, values) in DIFFICULTIES.items():
        for value in values:
            rule = f"sft reaches >= 90% of the expert (100%) on {diagnostic} {value} (ID)"
            checks.append(check(rule, table.get(f"sft/{diagnostic}/{value}")))
    return [c for c in checks if c["status"] != "not run"]


def check(rule: str, entry: dict[str, Any] | None) -> dict[str, Any]:
    """One rule on one cell's ID mean: pass, FAIL, or not run (the cell is not in this grid)."""
    if entry is None:
        return {"rule": rule, "value": None, "status": "not run", "passed": True}
    got = entry["ID"]["mean"] if "ID" in entry else None
    passed = got is not None and got >= 0.9
    return {"rule": rule, "value": got, "status": "pass" if passed else "FAIL", "passed": passed}


def layout(table: dict[str, Any]) -> tuple[list[tuple[str, int]], list[str]]:
    """The (diagnostic, value) columns and the methods that the table holds, in the grid's order."""
    present = {(e["diagnostic"], e["value"]) for e in table.values()}
    columns = sorted(present, key=lambda dv: (list(DIFFICULTIES).index(dv[0]), dv[1]))
    methods = [m for m in ALL_METHODS if any(e["method"] == m for e in table.values())]
    return columns, methods


def markdown(
    table: dict[str, Any], compare: list[dict[str, Any]], checks: list[dict[str, Any]], meta: dict[str, Any]
) -> str:
    def pct(x: float) -> str:
        return f"{100 * x:.0f}"

    columns, methods = layout(table)
    lines = [
        "# Diagnostic scorecard",
        "",
        f"Command: `{meta['command']}`; {meta['seeds']} seeds, {meta['training_minutes']:.0f} min of training on "
        f"{meta['workers']} cores (the cells' time / workers).",
        "Success % on the ID split (`valid`) / the OOD split (`test_ood`), mean over seeds [95% t interval over the",
        f"per-seed rates]; {meta['budget']['eval_episodes']} episodes per split and seed. `failed` names why a cell did not run.",
        "",
    ]
    for kind in SPLITS:
        lines += [
            f"## {kind}",
            "",
            "| method | "
            + " | ".join(f"{d.removeprefix('diag-')} {DIFFICULTIES[d][0][0]}{v}" for d, v in columns)
            + " |",
            "|---|" + "---|" * len(columns),
        ]
        for method in methods:
            cells = []
            for d, v in columns:
                entry = table.get(f"{method}/{d}/{v}")
                if entry is None:
                    cells.append("")
                elif kind in entry:
                    e = entry[kind]
                    note = f" ({len(entry['failed'])} failed)" if entry["failed"] else ""
                    if len(e["per_seed"]) < meta["seeds"]:
                        note += f" ({len(e['per_seed'])} seed{'s' if len(e['per_seed']) > 1 else ''})"
                    cells.append(f"{pct(e['mean'])} [{pct(e['ci'][0])}, {pct(e['ci'][1])}]{note}")
                else:
                    cells.append("failed: " + next(iter(entry["failed"].values()), "?")[:60])
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        "## Comparisons (paired by seed: mean difference in points [95% t interval])",
        "",
        "| a - b | task | ID | OOD |",
        "|---|---|---|---|",
    ]
    for row in compare:
        lines.append(
            f"| {row['a']} - {row['b']} | {row['diagnostic']} {row['value']} | {difference(row['ID'])} | {difference(row['OOD'])} |"
        )
    lines += ["", "## Sanity rules", ""]
    lines += [f"- {c['status']}: {c['rule']} (got {'-' if c['value'] is None else pct(c['value'])})" for c in checks]
    return "\n".join(lines) + "\n"


def difference(e: dict[str, Any]) -> str:
    """A paired difference in points with its interval, marked where the interval excludes 0."""
    mark = " **resolved**" if e["resolved"] else ""
    return f"{100 * e['diff']:+.1f} [{100 * e['ci'][0]:+.1f}, {100 * e['ci'][1]:+.1f}]{mark}"


def plot(table: dict[str, Any], out: Path) -> None:
    """One picture: a grid per split, methods down, diagnostics x difficulty across, mean success in each square."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    columns, methods = layout(table)
    fig, axes = plt.subplots(1, 2, figsize=(2 + 0.9 * len(columns) * 2, 1.5 + 0.5 * len(methods)))
    for ax, kind in zip(axes, SPLITS):
        grid = np.full((len(methods), len(columns)), np.nan)
        for i, m in enumerate(methods):
            for j, (d, v) in enumerate(columns):
                entry = table.get(f"{m}/{d}/{v}")
                if entry and kind in entry:
                    grid[i, j] = entry[kind]["mean"]
        ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        for i in range(len(methods)):
            for j in range(len(columns)):
                text = "x" if np.isnan(grid[i, j]) else f"{100 * grid[i, j]:.0f}"
                ax.text(
                    j,
                    i,
                    text,
                    ha="center",
                    va="center",
                    color="w" if np.isnan(grid[i, j]) or grid[i, j] < 0.6 else "k",
                    fontsize=8,
                )
        ax.set_xticks(
            range(len(columns)),
            [f"{d.removeprefix('diag-')[:5]} {v}" for d, v in columns],
            rotation=60,
            ha="right",
            fontsize=8,
        )
        ax.set_yticks(range(len(methods)), methods)
        ax.set_title(f"{kind} success % (mean of seeds; x: failed or not run)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


# ---- the grid --------------------------------------------------------------------------------------


def grid(args: argparse.Namespace) -> list[Cell]:
    """The cells, easiest difficulty of every diagnostic first (the sanity rules' cells), then the
    next, so that a run cut short has whole rows of the table."""
    splits = ("select",) if args.select else ("valid", "test_ood")
    levels = {d: args.values.get(d, DIFFICULTIES[d][1]) for d in args.diagnostics}
    cells = []
    for level in range(max(len(values) for values in levels.values())):
        for diagnostic, values in levels.items():
            if level >= len(values):
                continue
            for seed in args.seeds:
                for method in args.methods:
                    if runs_on(method, diagnostic, values[level]):
                        cells.append(Cell(method, diagnostic, values[level], seed, splits))
    return cells


def runs_on(method: str, diagnostic: str, value: int) -> bool:
    """Whether the grid has ``method`` on this diagnostic at this difficulty (:data:`RESTRICTED`)."""
    if method not in RESTRICTED:
        return True
    only, values = RESTRICTED[method]
    return diagnostic == only and (values is None or value in values)


def cell_key(cell: Cell) -> str:
    """A cell as its result file records it (the ``cell`` entry), comparable across runs."""
    return json.dumps(cell.__dict__ | {"splits": list(cell.splits)}, sort_keys=True)


def finished_cells(cells: Sequence[Cell], paths: Paths) -> dict[str, dict[str, Any]]:
    """The results already there, by cell: each cell's file, else its entry in ``scorecard.json``.

    The per-cell files are not committed, the table is: a fresh clone that reruns the scorecard
    resumes from the committed record and trains only the cells it lacks. A result counts only
    when the Budget fields its cell reads (:func:`cell_budget`) have this run's values, so a
    changed field reruns the cells that read it and keeps the others. A recorded cell without its
    own ``budget`` (records before it was kept per cell) has the record's ``meta.budget``."""
    recorded: dict[str, dict[str, Any]] = {}
    table = paths.out / "scorecard.json"
    if table.is_file():
        saved = json.loads(table.read_text())
        for r in saved.get("cells", []):
            if "budget" not in r:
                r = r | {"budget": cell_budget(r["cell"]["method"], saved.get("meta", {}).get("budget", {}))}
            recorded[json.dumps(r["cell"], sort_keys=True)] = r
    finished = {}
    for cell in cells:
        key, path = cell_key(cell), paths.cell_file(cell)
        wanted = cell_budget(cell.method, paths.budget)
        for found in (json.loads(path.read_text()) if path.is_file() else None, recorded.get(key)):
            if found is not None and found.get("budget") == wanted:  # the cell's own file first
                finished[key] = found
                break
    return finished


def pending(cells: Sequence[Cell], finished: dict[str, dict[str, Any]], paths: Paths) -> list[Cell]:
    """The cells to train: those not finished, and a finished SFT/IWM cell again where a
    ``grpo-from-*`` cell still to run needs its checkpoint and the checkpoint is gone."""
    todo = [c for c in cells if cell_key(c) not in finished]
    for cell in [c for c in todo if c.method in FROM_CHECKPOINT]:
        source = Cell(FROM_CHECKPOINT[cell.method], cell.diagnostic, cell.value, cell.seed, cell.splits)
        updates = cell_sets(source, paths)[2]
        if not (paths.checkpoint(source, updates) / "config.json").is_file() and source not in todo:
            todo.append(source)
    return todo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(ALL_METHODS), choices=list(ALL_METHODS))
    parser.add_argument("--diagnostics", nargs="+", default=list(DIFFICULTIES), choices=list(DIFFICULTIES))
    parser.add_argument(
        "--value", action="append", default=[], metavar="DIAG=V[,V]", help="override a diagnostic's difficulties"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="a Budget field (e.g. rl_lr=3e-4)"
    )
    parser.add_argument(
        "--select", action="store_true", help="evaluate on the select split (settings are chosen there)"
    )
    parser.add_argument("--report", action="store_true", help="only write the table from the cells already finished")
    parser.add_argument("--workers", type=int, default=2, help="cells trained at once, each in its own process")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/scorecard"))
    args = parser.parse_args()
    args.values = {}
    for item in args.value:
        name, _, values = item.partition("=")
        if name not in DIFFICULTIES:
            parser.error(f"unknown diagnostic {name!r} in --value")
        args.values[name] = tuple(int(v) for v in values.split(","))
    budget_fields = {}
    for item in args.set:
        key, _, text = item.partition("=")
        if key not in Budget.__dataclass_fields__:
            parser.error(f"unknown budget field {key!r}; choose from {', '.join(Budget.__dataclass_fields__)}")
        budget_fields[key] = type(getattr(Budget(), key))(text)
    paths = Paths(args.out.resolve(), Budget(**budget_fields))
    if args.select:
        paths.out = paths.out / "select"
    paths.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    began = time.perf_counter()
    cells = grid(args)
    if args.report:
        finished = list(finished_cells(cells, paths).values())
        saved = paths.out / "scorecard.json"
        wall = json.loads(saved.read_text())["meta"].get("wall_minutes", 0.0) * 60 if saved.is_file() else 0.0
        write(finished, args, paths, wall)  # the table is rewritten; the run it came from keeps its wall clock
        return
    prepare(cells, paths)
    finished = finished_cells(cells, paths)
    todo = pending(cells, finished, paths)
    results = [r for key, r in finished.items() if key not in {cell_key(c) for c in todo}]
    # SR reads the early experience IWM builds, and grpo-from-* start from SFT's and IWM's checkpoints
    first = [c for c in todo if c.method not in FROM_CHECKPOINT and c.method != "sr"]
    later = [c for c in todo if c.method in FROM_CHECKPOINT or c.method == "sr"]
    for wave in (first, later):
        with ProcessPoolExecutor(
            max_workers=args.workers, mp_context=get_context("spawn"), initializer=one_thread
        ) as pool:
            futures = {pool.submit(run_cell, cell, paths): cell for cell in wave}
            for n, future in enumerate(as_completed(futures), start=1):
                result = future.result()
                rates = " ".join(f"{s}={v['successes']}/{v['episodes']}" for s, v in result.get("rates", {}).items())
                print(
                    f"[{n}/{len(wave)}] {futures[future].name}: {result['status']} {rates or result.get('reason', '')} "
                    f"({result['seconds']:.0f}s)",
                    flush=True,
                )
                results.append(result)
    write(results, args, paths, time.perf_counter() - began)


def write(results: list[dict[str, Any]], args: argparse.Namespace, paths: Paths, seconds: float) -> None:
    seeds = sorted({r["cell"]["seed"] for r in results})
    table = summarise(results, seeds)
    command = "python benchmarks/scorecard.py " + " ".join(a for a in sys.argv[1:] if a != "--report")
    meta = {
        "command": command.strip(),
        "seeds": len(seeds),
        "wall_minutes": seconds / 60,
        "training_minutes": sum(r["seconds"] for r in results) / 60 / max(args.workers, 1),
        "workers": args.workers,
        "budget": paths.budget.__dict__,
    }
    if args.select:
        (paths.out / "select.json").write_text(json.dumps({"meta": meta, "table": table}, indent=2))
        for key, entry in sorted(table.items()):
            print(key, {s: v for s, v in entry["seeds"].items()}, entry["failed"] or "")
        return
    compare = comparisons(table, seeds)
    checks = sanity(table, paths.budget)
    (paths.out / "scorecard.json").write_text(
        json.dumps({"meta": meta, "table": table, "comparisons": compare, "sanity": checks, "cells": results}, indent=2)
    )
    (paths.out / "scorecard.md").write_text(markdown(table, compare, checks, meta))
    plot(table, paths.out / "scorecard.png")
    print((paths.out / "scorecard.md").read_text())
    if not all(c["passed"] for c in checks):
        sys.exit(1)


if __name__ == "__main__":
    main()
