"""Early Experience at CPU scale: SFT vs IWM vs SR on the same expert data, from-scratch models.

A small-scale repetition of Zhang et al. (2025), "Agent Learning via Early Experience": the
same expert demonstrations feed imitation alone (SFT), implicit world modelling then imitation
(IWM) and self-reflection (SR), at the same batch size, and every policy is evaluated the same
way. Imitation gets the same number of updates everywhere: IWM's world-model stage comes
*before* a full SFT budget, as in the paper and the GPU recipe (IWM, then SFT from its
checkpoint), never in place of part of it (:func:`method_budget`). The task set is the CPU learning benchmark's
(``benchmarks/learning_cpu.py``): TextWorld's ``custom`` quests, expert data from the first
``--train-tasks`` (200) train games with the ``compact`` template and no history, ID
evaluation on the 34 ``valid`` custom games and OOD on the 34 ``test_ood`` ones (9-12 rooms
within 15 steps: nearly out of reach), the settings of ``configs/textworld_cpu.yaml``.

Data, built once and shared by every seed:

* ``expert-N``: ``envrl data expert`` on the first N train custom games (N = ``--train-tasks``);
  ``expert-M`` with M = N // 8 (the first M of those episodes, re-played and checked to be
  the same rows) for the data-efficiency point;
* ``ee-N-kK`` and ``ee-M-kK``: ``envrl data early-experience --proposer admissible --k K`` on
  each. K = 3 by default: 200 episodes hold ~890 expert states with ~17 admissible actions
  each, so K = 3 gives ~2,700 transitions, more than IWM's world-model stage consumes at the
  default budget (50 updates x 32 = 1,600 samples, 0.6 epoch): a larger K adds transitions
  the stage never reaches and costs build time (each alternative replays the expert prefix).
  ``admissible`` is named explicitly (the builder's default is the policy's own samples): the
  data is shared by every seed's model, and the committed results were made with it.

Per seed (``--seeds``), from one from-scratch model (``init_model(..., "tiny",
vocab_size=2048, seed=seed)``), each method trains ``--updates`` updates of ``--batch-size``
samples at learning rate ``--lr`` (the learning benchmark's SFT settings):

* ``sft``: the expert's action among the admissible ones (``algorithm.objective=choice``);
* ``iwm``: ``schedule: two_stage``: ``--wm-updates`` updates of next-state prediction on the
  early-experience transitions, then ``--updates`` updates of the same choice objective as SFT
  (the same batches: imitation draws from SFT's seed stream), ``--wm-updates + --updates`` in
  all; the learning-rate schedule restarts at the switch, as two runs would;
* ``sr``: the contrast writer, a sentence template that states both observed outcomes, *not
  reasoning* (labelled so wherever it is shown); the policy learns
  ``<think>rationale</think><action>expert action</action>`` with the template
  ``configs/compact_think.json`` (``compact``'s prompt, a thought in the response), mixed with
  plain expert samples (``--sr-expert-fraction`` of each batch) trained with the same choice
  objective as SFT (the rationale and the action after it with the token loss);
* ``sft-eighth`` and ``iwm-eighth``: SFT and IWM on the first 1/8 of the expert episodes (and
  that part's early experience), same budgets.

Evaluation: every policy in ``choose`` mode (length-normalised scores, ``choose_score:
mean``), sampling at temperature 1, on the same seeded episodes per seed, on both splits,
before (the random initialisation, shared by SFT and IWM; SR's start is evaluated with its own
template) and after. SR's candidates in choose mode are ``<think></think><action>a</action>``:
the rationale is trained but never generated at evaluation. Settings were chosen on the train
and valid splits only, never on test_ood (the data settings and learning rate are the learning
benchmark's; ``--wm-updates`` is half of ``--updates``, the world-model stage of the results
made before imitation got its full budget, and ``--sr-expert-fraction`` is SR's default, not
tuned). Intervals: 95% Wilson intervals over the episodes of all seeds pooled (they treat
seeds x 34 episodes as independent, which games shared across seeds are not); per-seed rates
are in the JSON.

    .venv/bin/python benchmarks/repro/early_experience.py             # 3 seeds: ~30-35 min on a quiet 2-core machine (estimate)
    .venv/bin/python benchmarks/repro/early_experience.py --seeds 1   # one seed (seeds can run in parallel processes)
    .venv/bin/python benchmarks/repro/early_experience.py --quick --out /tmp/ee_quick   # a smoke run, a few minutes

Writes ``--out`` (default ``benchmarks/results/early_experience``): ``results.md``,
``results.json``, ``results.png``, the data folders, each run's folder (config,
metrics.jsonl, checkpoints, ``evaluations.json``) and the evaluation runs (``runs/``).
Finished steps are kept, so an interrupted run resumes per (method, seed); a cached run made
with other settings is refused, never mixed in.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from envrl.evaluation.metrics import wilson_interval  # noqa: E402

ENV = "textworld"
ENV_KWARGS = {"families": ["custom"]}
SPLITS = {"ID": "valid", "OOD": "test_ood"}
CONFIG = ROOT / "benchmarks" / "configs" / "textworld_cpu.yaml"
THINK_TEMPLATE = ROOT / "benchmarks" / "configs" / "compact_think.json"
SR_LABEL = "SR (contrast writer: a sentence template, not reasoning)"
#: Zhang et al. (2025), Llama-3.2-3B, success rate (%): imitation, IWM, SR
PAPER = {"ALFWorld": {"sft": 78.1, "iwm": 83.6, "sr": 85.9}, "WebShop": {"sft": 41.8, "iwm": 60.2, "sr": 52.7}}
SCALE_NOTE = (
    "What this scale can show: that IWM and SR run end to end on the same data and imitation budget as SFT, and "
    "whether either moves a from-scratch 0.25M-parameter policy by more than the intervals' width (about "
    "+-9 points per method with 3 seeds x 34 games). What it cannot show: the paper's effect, a gain of 5-18 "
    "points over imitation on a pretrained 3B model whose language knowledge the world-model and reflection "
    "objectives build on; a model trained from scratch for minutes has no such knowledge, the contrast "
    "writer's rationale is a template, and SR's rationale is never generated at evaluation (choose mode "
    "scores the actions with an empty thought)."
)


@dataclass(frozen=True)
class Method:
    """One trained policy per seed: its algorithm, which data it reads and how it is labelled."""

    key: str
    algo: str
    label: str
    data: str  # "full" or "eighth": which expert episodes (and their early experience)
    own_start: bool  # evaluate its own starting point (its prompt template differs from the shared one)


METHODS = (
    Method("sft", "sft", "SFT (choice objective)", "full", True),
    Method("iwm", "iwm", "IWM (world model, then choice objective)", "full", False),
    Method("sr", "sr", SR_LABEL, "full", True),
    Method("sft-eighth", "sft", "SFT, 1/8 of the expert data", "eighth", False),
    Method("iwm-eighth", "iwm", "IWM, 1/8 of the expert data", "eighth", False),
)


# ---- data ---------------------------------------------------------------------------------------


def expert_data(out: Path, tasks: int) -> Path:
    """``envrl data expert`` on the first ``tasks`` train custom games (compact template, no history)."""
    from envrl.envs.textworld import generate
    from envrl.training.data import collect_expert_data

    folder = out / f"expert-{tasks}"
    if not (folder / "meta.json").is_file():
        ids = [t for t in generate.task_ids("train") if t.startswith("tw-custom:")][:tasks]
        collect_expert_data(
            ENV, "train", len(ids), folder, template="compact", history=0, env_kwargs=ENV_KWARGS, task_ids=ids
        )
    return folder


def check_prefix(part: Path, whole: Path) -> None:
    """The smaller expert folder must hold exactly the first episodes of the larger one (the
    expert is deterministic: episode i plays task i with seed i in both)."""
    import pyarrow.parquet as pq

    columns = ["episode", "step", "task_id", "observation", "action"]
    small = pq.read_table(part / "data.parquet", columns=columns).to_pylist()
    episodes = {row["episode"] for row in small}
    large = [r for r in pq.read_table(whole / "data.parquet", columns=columns).to_pylist() if r["episode"] in episodes]
    if small != large:
        raise SystemExit(f"{part} is not the first episodes of {whole}: remove {part} and run again")


def early_experience(out: Path, expert: Path, k: int, workers: int) -> Path:
    """``envrl data early-experience --proposer admissible --k K --seed 0`` on ``expert``."""
    from envrl.training.early_experience import build_early_experience

    folder = out / f"ee-{expert.name.split('-')[1]}-k{k}"
    return build_early_experience(
        ENV, "train", expert, folder, k=k, proposer="admissible", seed=0, workers=workers, progress=True
    )


def data_summary(expert: Path, ee: Path) -> dict[str, Any]:
    """Counts of one expert folder and its early experience."""
    meta = json.loads((expert / "meta.json").read_text())
    counts = json.loads((ee / "meta.json").read_text())["counts"]
    return {
        "expert_dir": str(expert),
        "expert_episodes": meta["kept"],
        "expert_steps": meta["rows"],
        "early_experience_dir": str(ee),
        "transitions": counts["alternatives"],
        "states_kept": counts["states_kept"],
        "states": counts["states"],
        "short_of_k": counts["short_of_k"],
    }


# ---- training -----------------------------------------------------------------------------------


def method_budget(method: Method, args: argparse.Namespace) -> dict[str, int]:
    """A method's updates: in all, of the world-model stage and of imitation. Imitation gets
    ``--updates`` for every method, so IWM adds its world-model stage in front of SFT's whole
    budget (the paper trains the world model, then runs full SFT); it never takes a share of it."""
    world_model = args.wm_updates if method.algo == "iwm" else 0
    return {"updates": world_model + args.updates, "world_model": world_model, "imitation": args.updates}


def method_sets(method: Method, args: argparse.Namespace, data: dict[str, Path]) -> list[str]:
    """The ``--set`` items of one method on top of ``configs/textworld_cpu.yaml``."""
    folder = data[f"expert-{method.data}"] if method.algo == "sft" else data[f"ee-{method.data}"]
    sets = [
        f"eval.episodes={args.eval_episodes}",
        f"eval.runs_dir={args.out / 'runs'}",
        f"eval.at_start={str(method.own_start).lower()}",
        "eval.every=0",
        f"optim.lr={args.lr}",
        f"optim.schedule={args.schedule}",
        f"algorithm.batch_size={args.batch_size}",
        f"algorithm.data={folder}",
    ]
    if method.algo in ("sft", "iwm", "sr"):
        sets.append("algorithm.objective=choice")
    if method.algo == "iwm":
        budget = method_budget(method, args)
        # IWM switches at round(fraction * updates): this fraction puts the switch at --wm-updates exactly
        fraction = budget["world_model"] / budget["updates"]
        sets += ["algorithm.schedule=two_stage", f"algorithm.world_model_fraction={fraction!r}"]
    if method.algo == "sr":
        sets += [
            f"policy.template={THINK_TEMPLATE}",
            "algorithm.writer=contrast",
            f"algorithm.expert_fraction={args.sr_expert_fraction}",
        ]
    return sets


def run_method(
    method: Method, seed: int, model: Path, args: argparse.Namespace, data: dict[str, Path]
) -> dict[str, Any]:
    """Train one method for one seed, or return its cached result (refused when made with other settings)."""
    from envrl.training.algorithms import algorithm_class
    from envrl.training.config import build_config
    from envrl.training.loop import train

    out = args.out / f"{method.key}-seed{seed}"
    sets = method_sets(method, args, data) + [
        f"policy.model={model}",
        f"out={out}",
        f"updates={method_budget(method, args)['updates']}",
        f"seed={seed}",
    ]
    cached = out / "evaluations.json"
    if cached.is_file():
        result: dict[str, Any] = json.loads(cached.read_text())
        if result.get("sets") != sets:
            raise SystemExit(f"{out} was trained with other settings; remove it or choose another --out")
        return result
    config = build_config(
        method.algo, ENV, algorithm_config=algorithm_class(method.algo).Config, files=[CONFIG], sets=sets
    )
    print(f"== {method.key} seed {seed}: {method_budget(method, args)['updates']} updates", flush=True)
    began = time.perf_counter()
    evaluations = train(config, progress=True)
    seconds = time.perf_counter() - began
    rows = metrics(out)
    updating = sum(r.get("time/collect_s", 0.0) + r.get("time/update_s", 0.0) for r in rows)
    result = {
        "sets": sets,
        "evaluations": evaluations,
        "train_seconds": seconds,
        "update_seconds": updating,
        "eval_seconds": seconds - updating,
    }
    cached.write_text(json.dumps(result, indent=2))
    return result


def metrics(folder: Path) -> list[dict[str, Any]]:
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- results ------------------------------------------------------------------------------------


def evaluation(result: dict[str, Any], update: int, split: str) -> dict[str, Any]:
    """The evaluation at ``update`` on ``split`` from a run's ``evaluations`` (keys ``<run>@<update>/<split>``)."""
    for name, value in result["evaluations"].items():
        if name.endswith(f"@{update}/{split}"):
            return dict(value)
    raise KeyError(f"no evaluation @{update}/{split}")


def pooled(evals: list[dict[str, Any]]) -> dict[str, Any]:
    """Success pooled over seeds with its Wilson interval, and the mean turns of the successes."""
    successes = sum(int(e["successes"]) for e in evals)
    episodes = sum(int(e["episodes"]) for e in evals)
    turns = [(e["mean_turns_success"], int(e["successes"])) for e in evals if e.get("mean_turns_success") is not None]
    won = sum(n for _, n in turns)
    return {
        "successes": successes,
        "episodes": episodes,
        "rate": successes / episodes if episodes else 0.0,
        "ci": wilson_interval(successes, episodes),
        "mean_turns_success": sum(t * n for t, n in turns) / won if won else None,
    }


def table(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Per row (the shared start, SR's start, each method after) and split kind: pooled and per-seed success."""
    seeds = list(results["seeds"])
    rows: dict[str, Any] = {}
    starts = {"start": ("sft", "random init (compact template; SFT and IWM, full and 1/8, start here)")}
    starts["sr-start"] = ("sr", "random init (compact-think template; SR starts here)")
    for row, (key, label) in starts.items():
        rows[row] = {"label": label, "updates": 0}
        for kind, split in SPLITS.items():
            evals = [evaluation(results["seeds"][s][key], 0, split) for s in seeds]
            rows[row][kind] = pooled(evals) | {"per_seed": per_seed(seeds, evals)}
    for method in METHODS:
        updates = method_budget(method, args)["updates"]
        rows[method.key] = {"label": method.label, "updates": updates, "data": method.data}
        for kind, split in SPLITS.items():
            evals = [evaluation(results["seeds"][s][method.key], updates, split) for s in seeds]
            rows[method.key][kind] = pooled(evals) | {"per_seed": per_seed(seeds, evals)}
    return rows


def per_seed(seeds: list[str], evals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "seed": int(s),
            "successes": int(e["successes"]),
            "episodes": int(e["episodes"]),
            "rate": float(e["success_rate"]),
            "mean_turns_success": e.get("mean_turns_success"),
            "run_id": e.get("run_id"),
        }
        for s, e in zip(seeds, evals)
    ]


def _cell(entry: dict[str, Any]) -> str:
    low, high = entry["ci"]
    return f"{100 * entry['rate']:.1f} [{100 * low:.1f}, {100 * high:.1f}] ({entry['successes']}/{entry['episodes']})"


def _turns(entry: dict[str, Any]) -> str:
    return "-" if entry["mean_turns_success"] is None else f"{entry['mean_turns_success']:.2f}"


def markdown(results: dict[str, Any], args: argparse.Namespace) -> str:
    """``results.md``: the table, the paper's numbers beside, the data, what the scale can show."""
    rows = results["table"]
    seeds = ", ".join(results["seeds"])
    data = results["data"]
    lines = [
        "# Early Experience at CPU scale: SFT vs IWM vs SR (TextWorld custom quests)",
        "",
        f"From-scratch tiny model (0.25M parameters), seeds {seeds}; every method {args.updates} updates of "
        f"imitation x {args.batch_size} samples at lr {args.lr} (IWM: {args.wm_updates} world-model updates first). Success (%) pooled over seeds with a 95% Wilson interval "
        f"(successes/episodes); ID = valid custom, OOD = test_ood custom ({args.eval_episodes} episodes per split "
        "and seed); choose mode, temperature 1; turns = mean turns of the successful episodes.",
        "",
        "| policy | expert episodes | ID success | OOD success | ID turns | OOD turns | paper ALFWorld | paper WebShop |",
        "|---|---|---|---|---|---|---|---|",
    ]
    episodes = {"full": data["full"]["expert_episodes"], "eighth": data["eighth"]["expert_episodes"]}
    for key, row in rows.items():
        paper = [f"{PAPER[env][key]:.1f}" if key in PAPER[env] else "" for env in PAPER]
        count = "-" if "start" in key else str(episodes[row["data"]])
        lines.append(
            f"| {row['label']} | {count} | {_cell(row['ID'])} | {_cell(row['OOD'])} | {_turns(row['ID'])} | "
            f"{_turns(row['OOD'])} | {paper[0]} | {paper[1]} |"
        )
    full, eighth = data["full"], data["eighth"]
    lines += [
        "",
        'Paper: Zhang et al. (2025), "Agent Learning via Early Experience", Llama-3.2-3B, success rate (%) of '
        "imitation learning (the SFT row), IWM and SR.",
        "",
        f"- Expert data: {full['expert_episodes']} episodes ({full['expert_steps']} steps) of the first "
        f"{args.train_tasks} train custom games, `compact` template, no history; 1/8: the first "
        f"{eighth['expert_episodes']} episodes ({eighth['expert_steps']} steps).",
        f"- Early experience: `--proposer admissible --k {args.k}`: {full['transitions']} transitions from "
        f"{full['states_kept']} of {full['states']} expert states ({full['short_of_k']} short of K); 1/8: "
        f"{eighth['transitions']}.",
        f"- IWM: two stages, next-state prediction for the first {args.wm_updates} updates, then the choice "
        f"objective for {args.updates}, as many as SFT's, {args.wm_updates + args.updates} in all. The learning rate "
        f"(10 warmup updates, then {args.schedule}) restarts at the switch: each stage has a whole schedule, as "
        "two runs one after the other would.",
        f"- {SR_LABEL}: template `benchmarks/configs/compact_think.json`; {args.sr_expert_fraction:.0%} of each "
        "batch plain expert samples with the choice objective, the reflections with the token loss. **The rationale "
        "is trained but not generated at evaluation**: choose mode scores `<think></think><action>a</action>`, "
        "an empty thought, for each admissible action.",
        "- Settings chosen on train/valid only, never on test_ood; `--wm-updates` (half of `--updates`) and "
        "`--sr-expert-fraction` (SR's default) are not tuned.",
        "",
        SCALE_NOTE,
        "",
        f"Wall time: {results['wall_seconds'] / 60:.1f} min this invocation (cached steps are not re-run).",
        "",
    ]
    return "\n".join(lines)


def plot(results: dict[str, Any], args: argparse.Namespace) -> None:
    """``results.png``: success after training per method and split (the shared start as a line),
    and each method's training losses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
    rows = results["table"]
    keys = [m.key for m in METHODS]
    for offset, (kind, color) in zip((-0.2, 0.2), (("ID", "tab:blue"), ("OOD", "tab:orange"))):
        rates = [rows[k][kind]["rate"] for k in keys]
        errors = [[r - rows[k][kind]["ci"][0] for k, r in zip(keys, rates)]]
        errors.append([rows[k][kind]["ci"][1] - r for k, r in zip(keys, rates)])
        axes[0].bar([i + offset for i in range(len(keys))], rates, 0.4, yerr=errors, color=color, label=kind)
        axes[0].axhline(rows["start"][kind]["rate"], color=color, linestyle=":", linewidth=1)
    labels = [rows[k]["label"].replace(" (contrast writer", "\n(contrast writer") for k in keys]
    axes[0].set_xticks(range(len(keys)), labels, rotation=20, ha="right", fontsize=7)
    axes[0].set(title="success after training (95% CI, seeds pooled; dotted: random init)", ylabel="success rate")
    axes[0].legend()
    colors = {"sft": "tab:green", "iwm": "tab:purple", "sr": "tab:red", "sft-eighth": "lime", "iwm-eighth": "violet"}
    terms = (
        ("loss/sft", "-", "imitation"),
        ("loss/world_model", "--", "world model"),
        ("loss/reflection", ":", "reflection"),
    )
    for method in METHODS:
        for seed in results["seeds"]:
            history = metrics(args.out / f"{method.key}-seed{seed}")
            for term, style, name in terms:
                points = [(r["update"], r[term]) for r in history if term in r]
                if points:
                    label = f"{method.key}: {name}" if seed == next(iter(results["seeds"])) else None
                    xs, ys = zip(*points)
                    axes[1].plot(xs, ys, style, color=colors[method.key], alpha=0.7, label=label)
    axes[1].set(
        title="training losses (imitation: choice CE, SR's token CE; others token CE)",
        xlabel="update",
        ylabel="loss",
    )
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "results.png", dpi=100)
    plt.close(fig)


# ---- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--updates",
        type=int,
        default=100,
        help="imitation updates of every method (default 100; IWM adds --wm-updates)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="samples per update, every method")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument(
        "--schedule",
        choices=("cosine", "constant"),
        default="cosine",
        help="learning rate after the 10 warmup updates, over each run (IWM: over each stage; default cosine, as SFT's)",
    )
    parser.add_argument("--train-tasks", type=int, default=200, help="expert data: the first N train custom games")
    parser.add_argument("--k", type=int, default=3, help="alternative actions per expert state")
    parser.add_argument(
        "--wm-updates",
        type=int,
        default=None,
        help="IWM: world-model updates before its imitation (default --updates / 2)",
    )
    parser.add_argument("--sr-expert-fraction", type=float, default=0.5, help="SR: share of each batch of expert steps")
    parser.add_argument("--eval-episodes", type=int, default=34, help="per split and seed (34: every custom game once)")
    parser.add_argument("--workers", type=int, default=2, help="env processes of the early-experience build")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: seed 0, 5 updates, 16 games, 4 eval episodes"
    )
    parser.add_argument("--out", type=Path, default=None, help="default benchmarks/results/early_experience[-quick]")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.updates, args.train_tasks, args.eval_episodes = [0], 5, 16, 4
    if args.wm_updates is None:
        args.wm_updates = args.updates // 2
    if args.wm_updates < 0 or args.updates < 1:
        parser.error("--updates must be at least 1 and --wm-updates at least 0")
    if args.out is None:
        args.out = ROOT / "benchmarks" / "results" / ("early_experience-quick" if args.quick else "early_experience")
    args.out = args.out.resolve()
    if args.train_tasks < 8:
        parser.error("--train-tasks must be at least 8 (1/8 of it is the data-efficiency point)")
    return args


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import envrl
    from envrl.training.scratch_model import init_model

    print(f"envrl from {Path(envrl.__file__).parent}", flush=True)
    began = time.perf_counter()
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    full = expert_data(args.out, args.train_tasks)
    eighth = expert_data(args.out, args.train_tasks // 8)
    check_prefix(eighth, full)
    timings["expert_data_s"] = time.perf_counter() - clock
    clock = time.perf_counter()
    ee_full = early_experience(args.out, full, args.k, args.workers)
    ee_eighth = early_experience(args.out, eighth, args.k, args.workers)
    timings["early_experience_s"] = time.perf_counter() - clock
    data = {"expert-full": full, "expert-eighth": eighth, "ee-full": ee_full, "ee-eighth": ee_eighth}
    results: dict[str, Any] = {
        "settings": vars(args) | {"out": str(args.out)},
        "data": {"full": data_summary(full, ee_full), "eighth": data_summary(eighth, ee_eighth)},
        "sr_label": SR_LABEL,
        "sr_evaluation": "choose mode scores <think></think><action>a</action>: the rationale is trained, not generated",
        "paper": {"model": "Llama-3.2-3B", "success_rate_percent": PAPER},
        "scale_note": SCALE_NOTE,
        "seeds": {},
    }
    for seed in args.seeds:
        model = args.out / f"model-seed{seed}"
        if not (model / "config.json").is_file():
            clock = time.perf_counter()
            init_model(
                model, "tiny", envs=(ENV,), seed=seed, env_kwargs={ENV: ENV_KWARGS}, vocab_size=2048, overwrite=True
            )
            timings[f"init_model_seed{seed}_s"] = time.perf_counter() - clock
        results["seeds"][str(seed)] = {m.key: run_method(m, seed, model, args, data) for m in METHODS}
    results["table"] = table(results, args)
    results["wall_seconds"] = time.perf_counter() - began
    results["timings"] = timings
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "results.md").write_text(markdown(results, args))
    plot(results, args)
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
