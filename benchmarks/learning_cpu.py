"""The CPU learning benchmark: SFT, then GRPO and GiGPO, with a from-scratch model on TextWorld quests.

The task set is TextWorld's ``custom`` family (short quests in 3-6 rooms whose objective spells
out every step; ``env_kwargs={"families": ["custom"]}``): training on the first
``--train-tasks`` (200) games of the train split, in-distribution (ID) evaluation on the 34
``valid`` custom games and out-of-distribution (OOD) on the 34 ``test_ood`` custom games
(9-12 rooms, quests of 9-12 steps, with the same 15-step limit: nearly out of reach). For each seed:

1. ``envrl model init --size tiny`` (a from-scratch 0.25M-parameter Qwen2 and a BPE tokenizer
   trained on TextWorld episodes), seeded;
2. SFT on the expert's demonstrations of the train games (``envrl data expert``, 200 episodes)
   with the ``choice`` objective (the expert's action among the admissible ones), evaluated
   before (the random initialisation) and after;
3. GRPO and GiGPO, each from that seed's SFT checkpoint, under the same budget (updates,
   8 groups of 4), evaluated after; their "before" is the SFT checkpoint.

Every policy acts in ``choose`` mode (it samples among the admissible actions by their
length-normalised scores) with the ``compact`` prompt template and no history, so that the
prompt fits the tiny model's 512 positions (settings: ``configs/textworld_cpu.yaml``, shared
with ``make demo``). Every evaluation samples at temperature 1 (the distribution RL trains)
on the same episodes (seeded). The committed settings were chosen on the train and valid splits
(before TextWorld had a ``select`` split), never on test_ood; new settings are chosen with
``--select``, which evaluates on the 34 ``select`` custom games alone (ID, the same profile; no
test_ood) and writes under ``<out>/select``, so that valid stays the reported ID split.
Intervals: 95% Wilson intervals over the episodes of all seeds pooled (they treat the 3 x 34
episodes as independent, which games shared across seeds are not); per-seed rates are in the
JSON too.

    .venv/bin/python benchmarks/learning_cpu.py                  # 3 seeds; see the README for the time
    .venv/bin/python benchmarks/learning_cpu.py --seeds 1        # one seed (seeds can run in parallel processes)
    .venv/bin/python benchmarks/learning_cpu.py --rl-updates 80  # continue finished RL runs to 80 updates
    .venv/bin/python benchmarks/learning_cpu.py --seeds 0 --rl-updates 2 --sft-updates 20   # a quick look
    .venv/bin/python benchmarks/learning_cpu.py --select --rl-lr 1e-3   # try a setting: select only

Writes ``--out`` (default ``benchmarks/results/learning_cpu``): ``results.json``,
``curves.png`` and each run's folder (config, metrics.jsonl, checkpoints). Finished steps are
kept, so an interrupted run resumes where it stopped, and a final run over all seeds only
gathers the finished ones into the table. A larger ``--rl-updates`` continues finished RL runs
(their learning rate is constant, so the result is the longer run's, bit for bit) and the table
keeps every evaluated update.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envrl.evaluation.metrics import wilson_interval  # noqa: E402

ENV = "textworld"
ENV_KWARGS = {"families": ["custom"]}
SPLITS = {"ID": "valid", "OOD": "test_ood"}  # what the benchmark reports
SELECT_SPLITS = {"ID": "select"}  # --select: where settings are chosen (valid and test_ood are not played)


def splits(args: argparse.Namespace) -> dict[str, str]:
    return SELECT_SPLITS if args.select else SPLITS


CONFIG = Path(__file__).resolve().parent / "configs" / "textworld_cpu.yaml"


def settings(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each method's ``--set`` items on top of ``configs/textworld_cpu.yaml`` (shared with ``make demo``)."""
    shared = [
        f"rollout.tasks={args.train_tasks}",
        f"rollout.max_steps={args.max_steps}",
        f"eval.max_steps={args.max_steps}",
        f"eval.episodes={args.eval_episodes}",
        f"eval.runs_dir={args.out / 'runs'}",
    ]
    if args.select:
        shared.append(f"eval.splits=[{', '.join(splits(args).values())}]")
    rl = shared + [
        f"rollout.groups={args.groups}",
        f"rollout.group_size={args.group_size}",
        f"optim.lr={args.rl_lr}",
        f"optim.minibatches={args.rl_minibatches}",
        f"optim.epochs={args.rl_epochs}",
        "algorithm.kl_coef=0.0",
        "eval.at_start=false",
        "eval.every=0",
    ]
    sft = shared + [f"optim.lr={args.sft_lr}", "algorithm.batch_size=32", "algorithm.objective=choice"]
    return {"sft": sft, "grpo": rl, "gigpo": rl}


def run_method(algo: str, seed: int, model: Path, args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """Train one method for one seed (resuming a finished or partial run) and return its evaluations."""
    from envrl.training.algorithms import algorithm_class
    from envrl.training.config import build_config
    from envrl.training.loop import train

    out = args.out / f"{algo}-seed{seed}"
    updates = args.sft_updates if algo == "sft" else args.rl_updates
    sets = settings(args)[algo] + extra + [f"policy.model={model}", f"out={out}", f"updates={updates}", f"seed={seed}"]
    config = build_config(algo, ENV, algorithm_config=algorithm_class(algo).Config, files=[CONFIG], sets=sets)
    cached = out / "evaluations.json"
    earlier: dict[str, Any] = {"evaluations": {}, "train_seconds": 0.0}
    if cached.is_file():
        earlier = json.loads(cached.read_text())
        if any(name.endswith(f"@{updates}/{splits(args)['ID']}") for name in earlier["evaluations"]):
            return earlier
    # a finished run of fewer updates (constant learning rate) is continued to ``updates``;
    # its earlier evaluations stay beside the new ones
    began = time.perf_counter()
    evaluations = train(config, progress=True)
    result = {
        "evaluations": earlier["evaluations"] | evaluations,
        "train_seconds": earlier["train_seconds"] + time.perf_counter() - began,
    }
    cached.write_text(json.dumps(result, indent=2))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--train-tasks", type=int, default=200, help="the train split's first N custom games")
    parser.add_argument("--eval-episodes", type=int, default=34, help="per split (34: every custom game once)")
    parser.add_argument("--size", choices=("tiny", "small"), default="tiny", help="model size (envrl model init)")
    parser.add_argument("--sft-updates", type=int, default=100)
    parser.add_argument("--sft-lr", type=float, default=3e-3)
    parser.add_argument("--rl-updates", type=int, default=40)
    # 1e-3 (the first setting) raised GRPO's policy entropy by 0.2-0.4 nats per update over its first
    # updates from the SFT checkpoint, and its train rollouts' success fell on 2 of 3 seeds: a fresh
    # AdamW moves every weight by about lr per step, which the noisy RL gradient makes a random walk
    parser.add_argument("--rl-lr", type=float, default=3e-4)
    parser.add_argument("--rl-minibatches", type=int, default=1, help="optimizer steps per pass over a batch")
    parser.add_argument("--rl-epochs", type=int, default=1, help="passes over each update's rollouts")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/learning_cpu"))
    parser.add_argument(
        "--select", action="store_true", help="evaluate on the select split only (settings are chosen there)"
    )
    args = parser.parse_args()
    args.out = (args.out / "select" if args.select else args.out).resolve()
    args.out.mkdir(parents=True, exist_ok=True)

    import envrl
    from envrl.training.data import collect_expert_data
    from envrl.training.scratch_model import init_model

    print(f"envrl from {Path(envrl.__file__).parent}", flush=True)
    began = time.perf_counter()
    data = args.out / "expert-data"
    if not (data / "meta.json").is_file():
        from envrl.envs.textworld import generate

        ids = [t for t in generate.task_ids("train") if t.startswith("tw-custom:")][: args.train_tasks]
        collect_expert_data(
            ENV, "train", len(ids), data, template="compact", history=0, env_kwargs=ENV_KWARGS, task_ids=ids
        )
    results: dict[str, Any] = {"settings": vars(args) | {"out": str(args.out)}, "seeds": {}}
    for seed in args.seeds:
        model = args.out / f"model-seed{seed}"
        if not (model / "config.json").is_file():
            init_model(
                model, args.size, envs=(ENV,), seed=seed, env_kwargs={ENV: ENV_KWARGS}, vocab_size=2048, overwrite=True
            )
        sft = run_method("sft", seed, model, args, [f"algorithm.data={data}"])
        sft_model = args.out / f"sft-seed{seed}" / "checkpoints" / f"update-{args.sft_updates:06d}" / "model"
        seed_results = {"sft": sft}
        for algo in ("grpo", "gigpo"):
            seed_results[algo] = run_method(algo, seed, sft_model, args, [])
        results["seeds"][str(seed)] = seed_results
    results["table"] = table(results, args)
    results["wall_seconds"] = time.perf_counter() - began
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    plot(results, args)
    print_table(results["table"])


def _rate(evaluations: dict[str, Any], suffix: str) -> tuple[int, int]:
    for name, value in evaluations.items():
        if name.endswith(suffix):
            return int(value["successes"]), int(value["episodes"])
    raise KeyError(suffix)


def table(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Per method and split kind: success before and after, pooled over seeds, with Wilson intervals."""
    rows: dict[str, Any] = {}
    for algo in ("sft", "grpo", "gigpo"):
        for kind, split in splits(args).items():
            before = after = (0, 0)
            per_seed = []
            for seed, seed_results in results["seeds"].items():
                evaluations = seed_results[algo]["evaluations"]
                if algo == "sft":
                    b = _rate(evaluations, f"@0/{split}")
                else:  # RL starts from the SFT checkpoint: its "before" is SFT's "after"
                    b = _rate(seed_results["sft"]["evaluations"], f"@{args.sft_updates}/{split}")
                updates = args.sft_updates if algo == "sft" else args.rl_updates
                a = _rate(evaluations, f"@{updates}/{split}")
                before = (before[0] + b[0], before[1] + b[1])
                after = (after[0] + a[0], after[1] + a[1])
                per_seed.append({"seed": seed, "before": b[0] / b[1], "after": a[0] / a[1]})
            rows[f"{algo}/{kind}"] = {
                "before": before[0] / before[1],
                "before_ci": wilson_interval(*before),
                "after": after[0] / after[1],
                "after_ci": wilson_interval(*after),
                "episodes": after[1],
                "per_seed": per_seed,
                "by_update": by_update(results, algo, split),
            }
    return rows


def by_update(results: dict[str, Any], algo: str, split: str) -> dict[str, Any]:
    """Pooled success at every update that all seeds evaluated (a run continued to more updates keeps
    its earlier evaluations), so the table can show the curve, not only its end."""
    found: dict[int, list[tuple[int, int]]] = {}
    for seed_results in results["seeds"].values():
        for name, value in seed_results[algo]["evaluations"].items():
            run, _, evaluated = name.rpartition("/")
            if evaluated == split:
                update = int(run.rpartition("@")[2])
                found.setdefault(update, []).append((int(value["successes"]), int(value["episodes"])))
    out = {}
    for update, rates in sorted(found.items()):
        if len(rates) == len(results["seeds"]):
            won, played = sum(r[0] for r in rates), sum(r[1] for r in rates)
            out[str(update)] = {"rate": won / played, "ci": wilson_interval(won, played), "episodes": played}
    return out


def print_table(rows: dict[str, Any]) -> None:
    print(f"{'method':8} {'split':4} {'before':>22} {'after':>22}   at each evaluated update")
    for key, row in rows.items():
        algo, kind = key.split("/")
        b, a = row["before_ci"], row["after_ci"]
        curve = "  ".join(f"@{u}: {100 * v['rate']:.1f}" for u, v in row["by_update"].items())
        print(
            f"{algo:8} {kind:4} {100 * row['before']:6.1f} [{100 * b[0]:4.1f}, {100 * b[1]:4.1f}]"
            f"   {100 * row['after']:6.1f} [{100 * a[0]:4.1f}, {100 * a[1]:4.1f}]   {curve}"
        )


def plot(results: dict[str, Any], args: argparse.Namespace) -> None:
    """Training curves (rollout success per update for GRPO/GiGPO, SFT loss) and before/after bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    window = 10  # one update plays 8 of the 200 train games: a single point is mostly which 8
    for algo, color in (("grpo", "tab:blue"), ("gigpo", "tab:orange")):
        curves = []
        for seed in results["seeds"]:
            rates = [r.get("success_rate", 0.0) for r in _metrics(args.out / f"{algo}-seed{seed}")]
            axes[1].plot(range(1, len(rates) + 1), rates, color=color, alpha=0.12, linewidth=0.8)
            curves.append(rates)
        length = min(len(c) for c in curves)
        mean = [sum(c[i] for c in curves) / len(curves) for i in range(length)]
        smooth = [
            sum(mean[max(0, i - window + 1) : i + 1]) / len(mean[max(0, i - window + 1) : i + 1]) for i in range(length)
        ]
        axes[1].plot(
            range(1, length + 1), smooth, color=color, linewidth=2.2, label=f"{algo} (mean of seeds, last {window})"
        )
    for seed in results["seeds"]:
        rows = _metrics(args.out / f"sft-seed{seed}")
        axes[0].plot([r["update"] for r in rows], [r.get("loss", 0) for r in rows], color="tab:green", alpha=0.7)
    axes[0].set(title="SFT loss (per seed)", xlabel="update", ylabel="cross-entropy of the expert action")
    axes[1].set(title="rollout success on train (thin: per seed and update)", xlabel="update", ylabel="success rate")
    axes[1].legend(loc="upper left")
    labels, befores, afters, errs_b, errs_a = [], [], [], [], []
    for key, row in results["table"].items():
        labels.append(key)
        befores.append(row["before"])
        afters.append(row["after"])
        errs_b.append([row["before"] - row["before_ci"][0], row["before_ci"][1] - row["before"]])
        errs_a.append([row["after"] - row["after_ci"][0], row["after_ci"][1] - row["after"]])
    x = range(len(labels))
    axes[2].bar([i - 0.2 for i in x], befores, 0.4, yerr=list(zip(*errs_b)), label="before")
    axes[2].bar([i + 0.2 for i in x], afters, 0.4, yerr=list(zip(*errs_a)), label="after")
    axes[2].set_xticks(list(x), labels, rotation=30, ha="right")
    axes[2].set(title="evaluation success (95% CI, seeds pooled)", ylabel="success rate")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(args.out / "curves.png", dpi=100)


def _metrics(folder: Path) -> list[dict[str, Any]]:
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    main()
