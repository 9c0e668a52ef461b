"""ENVRL at CPU scale: GRPO vs ENVRL-GRPO and GiGPO vs ENVRL-GiGPO from the same SFT checkpoints.

ENVRL (``--algo envrl``, :mod:`envrl.training.algorithms.envrl`) adds state prediction (SP,
``-log p(s' | s, a)``) and inverse dynamics (ID, ``-log p(a | s, s')``) on the rollout batch's own
transitions to GRPO's or GiGPO's loss, with cosine-decayed weights. This script compares each base
algorithm with its ENVRL version on the task set and budget of the CPU learning benchmark
(``benchmarks/learning_cpu.py``): TextWorld's ``custom`` quests, a from-scratch tiny model, choose
mode, the ``compact`` template without history (``configs/textworld_cpu.yaml``). Per seed:

1. the SFT checkpoint: ``--sft-from DIR`` takes a learning-benchmark run's
   (``DIR/sft-seed{N}/checkpoints/update-000100/model``, its configuration checked to be this
   script's SFT), else it is trained as there: ``init_model(..., "tiny", vocab_size=2048,
   seed=N)``, then SFT with the choice objective, ``--sft-updates`` (100) x 32 expert steps of the
   first ``--train-tasks`` (200) train games at lr 3e-3;
2. from that checkpoint, each RL method for ``--rl-updates`` (40) updates of ``--groups`` (8) x
   ``--group-size`` (4) rollouts at lr 3e-4, KL off (the learning benchmark's RL settings): ``grpo``,
   ``envrl-grpo`` (ENVRL, base GRPO), ``gigpo``, ``envrl-gigpo`` (``--bases grpo`` or ``gigpo``: one
   pair only). An ENVRL run takes every algorithm key of its base's resolved
   configuration (checked: the two runs differ in the ENVRL keys only), start weights
   ``--sp-coef``/``--id-coef`` (0.1: the algorithm's defaults before the sweep, now 0.01/0.001), cosine decay, ``--aux-fraction``
   of the transitions (1.0: every one, the method as defined; less is cheaper).
   With ``--sft-from``, a learning-benchmark GRPO or GiGPO run of that seed whose configuration
   matches this script's (evaluation scheduling aside) is reused rather than trained again: it is
   the same run. A run continued past this script's ``--rl-updates`` (the learning benchmark's
   ``--rl-updates 80``) is reused too, read up to ``--rl-updates``: at a constant learning rate its
   first updates are the shorter run's, bit for bit.

Measured, all into ``--out``:

* success on the 34 ``valid`` custom games (ID) and the 34 ``test_ood`` ones (OOD) after training,
  sampling at temperature 1, pooled over seeds with 95% Wilson intervals (they treat seeds x 34
  episodes as independent, which games shared across seeds are not), per seed in the JSON, and
  the mean turns of the successful episodes;
* the updates each ENVRL run needs to reach its baseline's final rollout success: both curves are
  ``metrics.jsonl``'s per-update ``success_rate`` on the train games, smoothed with a trailing
  moving average of 5 (:func:`moving_average`); the target is the baseline's smoothed value at its
  last update, and the answer the first update where the ENVRL curve reaches it, or "not reached"
  (:func:`updates_to_reach`). The paper reports ENVRL reaching GRPO's final success in 68.5% of
  the steps;
* the world-model probes (``envrl probe``, :func:`envrl.training.probes.run_probe`) of every final
  checkpoint and of the SFT start, on the expert's transitions of ``--probe-episodes`` (5) valid
  games: SP token accuracy, SP exact match, ID top-1 accuracy and its chance level, all asked in
  the prompts ENVRL trains with (``ENVRLConfig``'s ``sp_template`` and ``id_template``);
* ``--ablations`` (on the GRPO base, costly): no SP, no ID, constant weights, ``aux_fraction``
  0.25, 0.5 and 1.0 (the one ``envrl-grpo`` uses is not repeated).

``--sweep`` instead runs the start-weight grid ``sp_coef x id_coef`` over ``--sweep-values``
(0.001, 0.01, 0.1: at 0.1 the main comparison's rollouts on the train games collapsed) on the GRPO base and scores each point only on its rollout success on the train
games (``metrics.jsonl``) and its final ``valid`` success: sweep runs evaluate ``valid`` alone,
and the sweep never reads a ``test_ood`` number. It writes ``sweep.json`` and ``sweep.md``.
``--sweep-points SP:ID ...`` runs the listed points instead of the whole grid.
``--only KEY ...`` runs (or, cached, gathers) just the listed runs of the main pair and the ablations, e.g.
``--ablations --bases grpo --only grpo envrl-grpo-no-sp envrl-grpo-no-id``: each ENVRL run's base
joins it, for the updates-to-reach column.

Settings were chosen on the train and valid splits only, never on test_ood (all of them are the
learning benchmark's; the main comparison's ENVRL weights, 0.1/0.1, are the algorithm's defaults from before
the sweep, which moved them to 0.01/0.001 on train rollouts and valid success).

    .venv/bin/python benchmarks/repro/envrl_comparison.py                                   # 3 seeds: ~3.2 h on 2 shared cores (docs/envrl.md)
    .venv/bin/python benchmarks/repro/envrl_comparison.py --sft-from benchmarks/results/learning_cpu
    .venv/bin/python benchmarks/repro/envrl_comparison.py --seeds 1                         # one seed (seeds can run in parallel processes)
    .venv/bin/python benchmarks/repro/envrl_comparison.py --ablations                       # + the ablations on the GRPO base
    .venv/bin/python benchmarks/repro/envrl_comparison.py --sweep --seeds 0                 # the start-weight sweep
    .venv/bin/python benchmarks/repro/envrl_comparison.py --ablations --bases grpo --only grpo envrl-grpo-no-id
    .venv/bin/python benchmarks/repro/envrl_comparison.py --quick --out /tmp/envrl_quick    # a smoke run

Writes ``--out`` (default ``benchmarks/results/envrl``): ``results.md``, ``results.json``,
``results.png`` (and ``ablations.png``), the expert data, models and each run's folder (config,
metrics.jsonl, checkpoints, ``evaluations.json``), ``probes/`` and the evaluation runs (``runs/``,
for ``envrl leaderboard --runs-dir``). Each (method, seed) is cached: an interrupted run resumes,
a later run over all seeds only gathers, and a cached run made with other settings is refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# this file is called envrl.py: its folder (first on sys.path when run as a script) would shadow the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

from benchmarks.repro.early_experience import evaluation, metrics, per_seed, pooled  # noqa: E402

ENV = "textworld"
ENV_KWARGS = {"families": ["custom"]}
SPLITS = {"ID": "valid", "OOD": "test_ood"}
PROBE_SPLIT = "valid"
CONFIG = ROOT / "benchmarks" / "configs" / "textworld_cpu.yaml"
#: the ENVRL paper, Qwen2.5-1.5B-Instruct, success rate (%) of GRPO and ENVRL (base GRPO)
PAPER = {"ALFWorld": {"grpo": 72.8, "envrl-grpo": 77.4}, "WebShop": {"grpo": 56.8, "envrl-grpo": 67.0}}
#: the paper: ENVRL reaches GRPO's final success rate in this share of GRPO's steps
PAPER_STEPS_FRACTION = 0.685
SMOOTHING = 5
BASE_LABELS = {"grpo": "GRPO", "gigpo": "GiGPO"}
#: rollouts per RL update at the default budget (8 groups x 4)
DEFAULT_ROLLOUTS = 32
#: configuration keys that schedule or place evaluations without changing what is trained or measured
EVAL_PLUMBING = ("out", "name", "eval.every", "eval.at_start", "eval.runs_dir", "eval.workers", "eval.batch_size")
SCALE_NOTE = (
    "What this scale can show: that ENVRL runs end to end on the base algorithms' own rollouts at equal "
    "updates, what its losses and probes do on a from-scratch 0.25M-parameter model, and whether it moves "
    "success by more than the intervals' width (about +-9 points per method with 3 seeds x 34 games) or "
    "reaches the baseline's rollout success in fewer updates. What it cannot show: the paper's effect, "
    "+4.6 (ALFWorld) and +10.2 (WebShop) points over GRPO on a pretrained 1.5B model trained for 150 "
    "updates of 16 x 8 rollouts with generated actions; a tiny model choosing among admissible actions for "
    "40 updates has neither the capacity nor the language knowledge whose grounding SP and ID are meant "
    "to sharpen, and 34-game splits cannot resolve differences of a few points."
)


@dataclass(frozen=True)
class Variant:
    """One RL method trained from the SFT checkpoint of every seed (folder ``<key>-seed<N>``)."""

    key: str
    label: str
    base: str  # grpo or gigpo
    aux: tuple[tuple[str, Any], ...] | None = None  # ENVRL's own algorithm keys; None: the base itself
    splits: tuple[str, ...] = ("valid", "test_ood")

    @property
    def algo(self) -> str:
        return self.base if self.aux is None else "envrl"


def envrl_keys(args: argparse.Namespace) -> tuple[tuple[str, Any], ...]:
    """The main ENVRL runs' own keys: start weights and the share of transitions used."""
    return (("sp_coef", args.sp_coef), ("id_coef", args.id_coef), ("aux_fraction", args.aux_fraction))


def main_variants(args: argparse.Namespace) -> list[Variant]:
    """Each base of ``--bases`` (GRPO first) and its ENVRL version."""
    return [
        variant
        for base in BASE_LABELS
        if base in args.bases
        for variant in (
            Variant(base, BASE_LABELS[base], base),
            Variant(f"envrl-{base}", f"ENVRL-{BASE_LABELS[base]}", base, envrl_keys(args)),
        )
    ]


def ablation_variants(args: argparse.Namespace) -> list[Variant]:
    """ENVRL-GRPO with one part changed (a later key overrides the same key of ``envrl_keys``);
    the ``aux_fraction`` of ``envrl-grpo`` itself is not repeated."""
    keys = envrl_keys(args)
    return [
        Variant("envrl-grpo-no-sp", "ENVRL-GRPO without SP (ID only)", "grpo", (*keys, ("sp", False))),
        Variant("envrl-grpo-no-id", "ENVRL-GRPO without ID (SP only)", "grpo", (*keys, ("id", False))),
        Variant("envrl-grpo-constant", "ENVRL-GRPO, constant weights", "grpo", (*keys, ("decay", "constant"))),
    ] + [
        Variant(f"envrl-grpo-aux{f:g}", f"ENVRL-GRPO, aux_fraction {f:g}", "grpo", (*keys, ("aux_fraction", f)))
        for f in (0.25, 0.5, 1.0)
        if f != args.aux_fraction
    ]


def runnable_variants(args: argparse.Namespace) -> list[Variant]:
    """The main pair and, with ``--ablations``, the ablations: what ``--only`` may name."""
    return main_variants(args) + (ablation_variants(args) if args.ablations else [])


def selected(variants: list[Variant], args: argparse.Namespace) -> list[Variant]:
    """The variants ``--only`` keeps (all of them without it), with the base of each ENVRL one kept."""
    if args.only is None:
        return variants
    every = runnable_variants(args)
    keep = set(args.only) | {v.base for v in every if v.key in args.only and v.aux is not None}
    return [v for v in variants if v.key in keep]


def sweep_variants(args: argparse.Namespace) -> list[Variant]:
    """The start-weight grid on the GRPO base (the main runs' ``aux_fraction``); evaluated on valid only."""
    return [
        Variant(
            f"sweep-sp{sp:g}-id{idc:g}",
            f"sp_coef {sp:g}, id_coef {idc:g}",
            "grpo",
            (("sp_coef", sp), ("id_coef", idc), ("aux_fraction", args.aux_fraction)),
            ("valid",),
        )
        for sp, idc in sweep_points(args)
    ]


def sweep_points(args: argparse.Namespace) -> list[tuple[float, float]]:
    """The (sp_coef, id_coef) pairs: ``--sweep-points`` when given (off-diagonal points without the whole
    grid's cost), else every pair of ``--sweep-values``."""
    if args.sweep_points:
        return list(args.sweep_points)
    return [(sp, idc) for sp in args.sweep_values for idc in args.sweep_values]


# ---- configurations ---------------------------------------------------------------------------


def shared_sets(args: argparse.Namespace) -> list[str]:
    """The learning benchmark's task set and evaluation protocol, on top of ``configs/textworld_cpu.yaml``."""
    return [
        f"rollout.tasks={args.train_tasks}",
        f"rollout.max_steps={args.max_steps}",
        f"eval.max_steps={args.max_steps}",
        f"eval.episodes={args.eval_episodes}",
        f"eval.runs_dir={args.out / 'runs'}",
        "eval.at_start=false",
        "eval.every=0",
    ]


def rl_sets(args: argparse.Namespace) -> list[str]:
    """The learning benchmark's RL settings (both bases and ENVRL)."""
    return shared_sets(args) + [
        f"rollout.groups={args.groups}",
        f"rollout.group_size={args.group_size}",
        f"optim.lr={args.rl_lr}",
        "algorithm.kl_coef=0.0",
    ]


def sft_sets(args: argparse.Namespace, data: Path | None, seed: int, model: Path | None) -> list[str]:
    """The learning benchmark's SFT settings (``data``/``model`` None: placeholders for a comparison)."""
    return shared_sets(args) + [
        f"optim.lr={args.sft_lr}",
        "algorithm.batch_size=32",
        "algorithm.objective=choice",
        f"algorithm.data={data or ''}",
        f"policy.model={model or ''}",
        f"out={args.out / f'sft-seed{seed}'}",
        f"updates={args.sft_updates}",
        f"seed={seed}",
    ]


def build(algo: str, sets: list[str]) -> Any:
    from envrl.training.algorithms import algorithm_class
    from envrl.training.config import build_config

    return build_config(algo, ENV, algorithm_config=algorithm_class(algo).Config, files=[CONFIG], sets=sets)


def variant_sets(variant: Variant, seed: int, model: Path, args: argparse.Namespace) -> list[str]:
    """The ``--set`` items of one run. An ENVRL run repeats every algorithm key of its base's
    resolved configuration, so that the base term is computed exactly as in the base run."""
    sets = rl_sets(args) + [f"eval.splits={json.dumps(list(variant.splits))}"]
    if variant.aux is not None:
        base = build(variant.base, rl_sets(args))
        sets += [f"algorithm.{k}={json.dumps(v)}" for k, v in dataclasses.asdict(base.algorithm).items()]
        sets += [f"algorithm.base={variant.base}"]
        sets += [f"algorithm.{k}={json.dumps(v)}" for k, v in variant.aux]
    return sets + [
        f"policy.model={model}",
        f"out={args.out / f'{variant.key}-seed{seed}'}",
        f"updates={args.rl_updates}",
        f"seed={seed}",
    ]


def check_same_setting(envrl_config: Any, base_config: Any) -> None:
    """An ENVRL run must differ from its base's run in ENVRL's own keys only (the shipped
    per-algorithm YAML files could otherwise differ in a shared key)."""
    from envrl.training.config import differences

    changed = [
        key
        for key in differences(base_config.to_dict(), envrl_config.to_dict())
        if key not in ("algo", "out") and not key.startswith("algorithm.")
    ]
    changed += [
        f"algorithm.{k}"
        for k, v in dataclasses.asdict(base_config.algorithm).items()
        if getattr(envrl_config.algorithm, k) != v
    ]
    if changed:
        raise SystemExit(f"the ENVRL run differs from its base run in {', '.join(changed)}")


def training_differences(saved: dict[str, Any], ours: dict[str, Any], ignore: tuple[str, ...]) -> list[str]:
    """The keys in which a saved configuration differs from ours, evaluation plumbing and ``ignore`` aside."""
    from envrl.training.config import differences

    return [key for key in differences(saved, ours) if key not in EVAL_PLUMBING + ignore]


# ---- runs -------------------------------------------------------------------------------------


def train_run(algo: str, sets: list[str], out: Path, base_config: Any = None) -> dict[str, Any]:
    """Train one run (or resume it), or return its cached result (refused when made with other settings)."""
    from envrl.training.loop import train

    cached = out / "evaluations.json"
    if cached.is_file():
        result: dict[str, Any] = json.loads(cached.read_text())
        if result.get("sets") != sets:
            raise SystemExit(f"{out} was trained with other settings; remove it or choose another --out")
        return result | {"folder": str(out)}
    config = build(algo, sets)
    if base_config is not None:
        check_same_setting(config, base_config)
    print(f"== {out.name}: {config.updates} updates", flush=True)
    began = time.perf_counter()
    evaluations = train(config, progress=True)
    seconds = time.perf_counter() - began
    rows = metrics(out)
    updating = sum(r.get("time/collect_s", 0.0) + r.get("time/update_s", 0.0) for r in rows)
    result = {
        "sets": sets,
        "source": "trained",
        "evaluations": evaluations,
        "train_seconds": seconds,
        "update_seconds": updating,
        "eval_seconds": seconds - updating,
    }
    cached.write_text(json.dumps(result, indent=2))
    return result | {"folder": str(out)}


def reused_run(folder: Path, ours: Any, ignore: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """A learning-benchmark run in ``folder`` whose configuration is ours (evaluation plumbing and
    ``ignore`` aside), as a result; None when there is none or it differs (said why)."""
    import yaml

    if not (folder / "evaluations.json").is_file() or not (folder / "config.yaml").is_file():
        return None
    saved = yaml.safe_load((folder / "config.yaml").read_text()) or {}
    changed = training_differences(saved, ours.to_dict(), ignore)
    result = json.loads((folder / "evaluations.json").read_text())
    if changed == ["updates"] and int(saved["updates"]) > ours.updates:
        # a run continued past our budget (a constant learning rate: its first updates are the
        # shorter run's); usable when it was evaluated at our last update
        if any(name.endswith(f"@{ours.updates}/valid") for name in result["evaluations"]):
            changed = []
    if changed:
        print(f"not reusing {folder}: it differs in {', '.join(changed)}", flush=True)
        return None
    return {
        "source": str(folder),
        "evaluations": result["evaluations"],
        "train_seconds": result.get("train_seconds"),
        "folder": str(folder),
    }


def run_variant(variant: Variant, seed: int, sft_model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One RL run from the seed's SFT checkpoint: reused from ``--sft-from`` where it is the same
    run (base algorithms only), else trained or read from the cache."""
    sets = variant_sets(variant, seed, sft_model, args)
    if variant.aux is None and args.sft_from is not None:
        reused = reused_run(args.sft_from / f"{variant.key}-seed{seed}", build(variant.algo, sets))
        if reused is not None:
            return reused | {"checkpoint": _checkpoint(Path(reused["folder"]), args.rl_updates)}
    base = None
    if variant.aux is not None:
        plain = Variant(variant.base, "", variant.base, None, variant.splits)
        base = build(variant.base, variant_sets(plain, seed, sft_model, args))
    out = args.out / f"{variant.key}-seed{seed}"
    return train_run(variant.algo, sets, out, base) | {"checkpoint": _checkpoint(out, args.rl_updates)}


def _checkpoint(folder: Path, updates: int) -> str:
    return str(folder / "checkpoints" / f"update-{updates:06d}" / "model")


def expert_data(args: argparse.Namespace) -> Path:
    """``envrl data expert`` on the first ``--train-tasks`` train custom games (compact, no history)."""
    from envrl.envs.textworld import generate
    from envrl.training.data import collect_expert_data

    folder = args.out / f"expert-{args.train_tasks}"
    if not (folder / "meta.json").is_file():
        ids = [t for t in generate.task_ids("train") if t.startswith("tw-custom:")][: args.train_tasks]
        collect_expert_data(
            ENV, "train", len(ids), folder, template="compact", history=0, env_kwargs=ENV_KWARGS, task_ids=ids
        )
    return folder


def sft_run(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The seed's SFT checkpoint: ``--sft-from``'s (its configuration checked), else trained here."""
    if args.sft_from is not None:
        folder = args.sft_from / f"sft-seed{seed}"
        model = Path(_checkpoint(folder, args.sft_updates))
        if not (model / "config.json").is_file():
            raise SystemExit(f"--sft-from: {model} does not exist (run benchmarks/learning_cpu.py --seeds {seed})")
        ours = build("sft", sft_sets(args, None, seed, None))
        reused = reused_run(folder, ours, ignore=("policy.model", "algorithm.data"))
        if reused is None:
            raise SystemExit(
                f"--sft-from: {folder} is not this benchmark's SFT (see above), or has no evaluations.json"
            )
        return reused | {"checkpoint": str(model)}
    from envrl.training.scratch_model import init_model

    init = args.out / f"model-seed{seed}"
    if not (init / "config.json").is_file():
        init_model(init, "tiny", envs=(ENV,), seed=seed, env_kwargs={ENV: ENV_KWARGS}, vocab_size=2048, overwrite=True)
    out = args.out / f"sft-seed{seed}"
    result = train_run("sft", sft_sets(args, expert_data(args), seed, init), out)
    return result | {"checkpoint": _checkpoint(out, args.sft_updates)}


def probe(name: str, checkpoint: str, args: argparse.Namespace) -> dict[str, Any]:
    """``envrl probe`` of one checkpoint on ``--probe-episodes`` expert episodes of valid, cached
    in ``probes/<name>.json`` and recorded in ``runs/`` under the run's leaderboard row."""
    from envrl.training.algorithms.envrl import ENVRLConfig
    from envrl.training.probes import run_probe

    cache = args.out / "probes" / f"{name}.json"
    templates = {"sp_template": ENVRLConfig.sp_template, "id_template": ENVRLConfig.id_template}
    key = {"checkpoint": checkpoint, "split": PROBE_SPLIT, "episodes": args.probe_episodes, "seed": 0} | templates
    if cache.is_file():
        saved: dict[str, Any] = json.loads(cache.read_text())
        if all(saved.get(k) == v for k, v in key.items()):
            return saved
    began = time.perf_counter()
    record, result = run_probe(
        checkpoint,
        ENV,
        PROBE_SPLIT,
        episodes=args.probe_episodes,
        seed=0,
        env_kwargs=ENV_KWARGS,
        template="compact",
        history=0,
        sp_template=templates["sp_template"],
        id_template=templates["id_template"],
        name=name,
        runs_dir=args.out / "runs",
        device="cpu",
    )
    entry = key | dataclasses.asdict(result) | {"probe_id": record.probe_id, "seconds": time.perf_counter() - began}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(entry, indent=2))
    return entry


# ---- measures ---------------------------------------------------------------------------------


def moving_average(values: list[float], window: int = SMOOTHING) -> list[float]:
    """Trailing moving average: point i is the mean of values[max(0, i - window + 1) : i + 1]."""
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def updates_to_reach(curve: list[float], target: float) -> int | None:
    """The first update (1-based) whose value reaches ``target`` (to 1e-9), or None."""
    for i, value in enumerate(curve):
        if value >= target - 1e-9:
            return i + 1
    return None


def update_rows(folder: str | Path, updates: int) -> list[dict[str, Any]]:
    """The run's ``metrics.jsonl`` rows of updates 1..``updates``, in order (a reused learning-benchmark
    run may have been continued past this comparison's budget; its later updates are not ours)."""
    rows = [r for r in metrics(Path(folder)) if int(r["update"]) <= updates]
    return sorted(rows, key=lambda r: int(r["update"]))


def success_curve(folder: str, updates: int) -> list[float]:
    """Rollout success per update on the train games, in update order."""
    return [float(r.get("success_rate", 0.0)) for r in update_rows(folder, updates)]


def rollout_success(folder: str, last: int, updates: int) -> dict[str, Any]:
    """Rollout success over the run's last ``last`` updates (all when 0), pooled over trajectories."""
    rows = update_rows(folder, updates)
    return _pooled_rollouts(rows[-last:] if last else rows)


def rollout_blocks(folder: str, updates: int, block: int = 10) -> list[dict[str, Any]]:
    """Rollout success per ``block`` consecutive updates (1-10, 11-20, ...), pooled over trajectories:
    the shape of a curve (a collapse, a recovery) in a few numbers."""
    rows = update_rows(folder, updates)
    return [_pooled_rollouts(rows[i : i + block]) for i in range(0, len(rows), block)]


#: the per-update metrics a result keeps of each run (``curves`` in the JSON)
CURVE_KEYS = ("success_rate", "entropy", "grad_norm", "loss/sp", "loss/id", "weight/sp", "weight/id")


def curves(folder: str, updates: int) -> dict[str, list[float | None]]:
    """The run's ``CURVE_KEYS`` per update (None where a run does not log one), so that a result file
    holds its curves without the run folders."""
    rows = update_rows(folder, updates)
    return {key: [r.get(key) for r in rows] for key in CURVE_KEYS if any(key in r for r in rows)}


def _pooled_rollouts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    won = sum(float(r.get("success_rate", 0.0)) * float(r.get("trajectories", 0.0)) for r in rows)
    played = sum(float(r.get("trajectories", 0.0)) for r in rows)
    return {"successes": round(won), "episodes": round(played), "rate": won / played if played else 0.0}


def reach(envrl_folder: str, base_folder: str, updates: int) -> dict[str, Any]:
    """When the ENVRL run's smoothed rollout success reaches the baseline's final smoothed one.

    Both runs play the same rollouts at update 1 (same seed, same start), so a baseline that ends at
    or below its first update's value sets a target every run "reaches" at update 1: the measure then
    says nothing, and ``informative`` is False (``updates`` and ``fraction`` None).
    """
    base = moving_average(success_curve(base_folder, updates))
    curve = moving_average(success_curve(envrl_folder, updates))
    target = base[-1] if base else 0.0
    informative = bool(base) and target > base[0] + 1e-9
    reached = updates_to_reach(curve, target) if informative else None
    return {
        "target": target,
        "baseline_start": base[0] if base else None,
        "informative": informative,
        "updates": reached,
        "baseline_updates": len(base),
        "fraction": reached / len(base) if reached is not None and base else None,
    }


def pooled_split(results: dict[str, Any], key: str, split: str, update: int) -> dict[str, Any]:
    seeds = list(results["seeds"])
    evals = [evaluation(results["seeds"][s][key], update, split) for s in seeds]
    return pooled(evals) | {"per_seed": per_seed(seeds, evals)}


def variant_rows(results: dict[str, Any], variants: list[Variant], args: argparse.Namespace) -> dict[str, Any]:
    """Per variant: pooled success per split, rollout success, updates to reach its baseline, probes."""
    rows: dict[str, Any] = {}
    seeds = list(results["seeds"])
    for v in variants:
        row: dict[str, Any] = {"label": v.label, "base": v.base, "envrl": v.aux is not None, "aux": dict(v.aux or ())}
        for kind, split in SPLITS.items():
            if split in v.splits:
                row[kind] = pooled_split(results, v.key, split, args.rl_updates)
        folders = [results["seeds"][s][v.key]["folder"] for s in seeds]
        row["rollout_last10"] = _sum_rates([rollout_success(f, 10, args.rl_updates) for f in folders])
        row["rollout_all"] = _sum_rates([rollout_success(f, 0, args.rl_updates) for f in folders])
        per_seed_blocks = [rollout_blocks(f, args.rl_updates) for f in folders]
        row["rollout_blocks"] = [_sum_rates(list(parts)) for parts in zip(*per_seed_blocks)]
        row["curves"] = {s: curves(f, args.rl_updates) for s, f in zip(seeds, folders)}
        if v.aux is not None:
            row["reach"] = [
                {"seed": int(s)}
                | reach(results["seeds"][s][v.key]["folder"], results["seeds"][s][v.base]["folder"], args.rl_updates)
                for s in seeds
            ]
        probes = [results["seeds"][s][v.key].get("probe") for s in seeds]
        if all(probes):
            row["probe"] = _mean_probe(probes)
        rows[v.key] = row
    return rows


def _sum_rates(parts: list[dict[str, Any]]) -> dict[str, Any]:
    won, played = sum(p["successes"] for p in parts), sum(p["episodes"] for p in parts)
    return {"successes": won, "episodes": played, "rate": won / played if played else 0.0}


def _mean_probe(probes: list[dict[str, Any]]) -> dict[str, Any]:
    names = ("sp_token_accuracy", "sp_exact_match", "id_accuracy", "id_chance")
    out: dict[str, Any] = {}
    for name in names:
        values = [p[name] for p in probes if p.get(name) is not None]
        out[name] = statistics.fmean(values) if values else None
    out["transitions"] = probes[0]["transitions"]
    out["per_seed"] = probes
    return out


def timings(results: dict[str, Any], variants: list[Variant], args: argparse.Namespace) -> dict[str, Any]:
    """Measured seconds per update (the first update of a run aside: it starts the env workers)
    and per split evaluation, and what they imply for the main comparison at the default budget."""
    per_update: dict[str, float] = {}
    evals: list[float] = []
    for key, splits in [("sft", 2)] + [(v.key, len(v.splits)) for v in variants]:
        values = []
        for s in results["seeds"]:
            run = results["seeds"][s][key]
            rows = update_rows(run["folder"], args.sft_updates if key == "sft" else args.rl_updates)
            rows = rows[1:] if len(rows) > 1 else rows
            values += [r.get("time/collect_s", 0.0) + r.get("time/update_s", 0.0) for r in rows]
            if run.get("eval_seconds") is not None:  # runs trained here (not reused) evaluate once, at the end
                evals.append(run["eval_seconds"] / splits)
        if values:
            per_update[key] = statistics.median(values)
    split_eval = statistics.median(evals) if evals else None
    main = [v.key for v in main_variants(args)]
    estimate = None
    if all(k in per_update for k in ["sft", *main]) and split_eval is not None:
        # per seed: SFT (100 updates) and the main RL runs (40 updates of 8 x 4), then their evaluations and SFT's
        # (2 splits each); evaluation
        # time scaled linearly from the episodes measured to 34 (an upper bound: episodes run batched)
        rollouts = DEFAULT_ROLLOUTS / (args.groups * args.group_size)  # RL cost scaled linearly to 8 x 4
        train_s = 100 * per_update["sft"] + 40 * rollouts * sum(per_update[k] for k in main)
        eval_s = (1 + len(main)) * 2 * split_eval * 34 / max(args.eval_episodes, 1)
        estimate = {"train_min_per_seed": train_s / 60, "eval_min_per_seed_upper": eval_s / 60, "rl_runs": len(main)}
    return {"seconds_per_update": per_update, "seconds_per_split_evaluation": split_eval, "estimate": estimate}


# ---- reports ----------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _cell(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    low, high = entry["ci"]
    return f"{100 * entry['rate']:.1f} [{100 * low:.1f}, {100 * high:.1f}] ({entry['successes']}/{entry['episodes']})"


def _turns(entry: dict[str, Any] | None) -> str:
    if entry is None or entry.get("mean_turns_success") is None:
        return "-"
    return f"{entry['mean_turns_success']:.2f}"


def _reach_cell(entries: list[dict[str, Any]]) -> str:
    parts = [
        "n/a" if not e.get("informative", True) else str(e["updates"]) if e["updates"] is not None else "not reached"
        for e in entries
    ]
    return ", ".join(parts)


def _fraction_cell(entries: list[dict[str, Any]]) -> str:
    measured = [e for e in entries if e.get("informative", True)]
    fractions = [e["fraction"] for e in measured if e["fraction"] is not None]
    skipped = len(entries) - len(measured)
    note = f"; n/a on {skipped} seed(s): the baseline ended at or below its first update" if skipped else ""
    if not fractions:
        return f"not reached (0/{len(measured)} seeds){note}"
    return f"{100 * statistics.fmean(fractions):.0f}% ({len(fractions)}/{len(measured)} seeds reached){note}"


def command_line() -> str:
    """This invocation as a reader would type it (``--out`` as given), for the reports' headers."""
    return " ".join([".venv/bin/python benchmarks/repro/envrl_comparison.py", *sys.argv[1:]])


def markdown(results: dict[str, Any], args: argparse.Namespace) -> str:
    """``results.md``: success, updates to reach the baseline, probes, ablations, timings, scale note."""
    from envrl.training.algorithms.envrl import ENVRLConfig

    rows = results["table"]
    seeds = ", ".join(results["seeds"])
    lines = [
        "# ENVRL at CPU scale: "
        + ", ".join(f"{BASE_LABELS[b]} vs ENVRL-{BASE_LABELS[b]}" for b in BASE_LABELS if b in args.bases)
        + " (TextWorld custom quests)"
        + (f"; runs: {', '.join(args.only)} (--only)" if args.only else ""),
        "",
        f"From-scratch tiny model (0.25M parameters), seeds {seeds}; every RL run starts from its seed's SFT "
        f"checkpoint ({args.sft_updates} updates, choice objective) and trains {args.rl_updates} updates of "
        f"{args.groups} groups x {args.group_size} at lr {args.rl_lr:g}, KL off; ENVRL start weights sp_coef "
        f"{args.sp_coef:g}, id_coef {args.id_coef:g}, cosine decay, aux_fraction {args.aux_fraction:g}. "
        "Success (%) pooled over "
        f"seeds with a 95% Wilson interval (successes/episodes); ID = valid custom, OOD = test_ood custom "
        f"({args.eval_episodes} episodes per split and seed); choose mode, temperature 1; turns = mean turns of "
        "the successful episodes; rollout = success of the training rollouts (train games) over the last 10 "
        "updates.",
        "",
        f"Command: `{command_line()}` (the runs it reads may have been trained by separate per-seed invocations).",
        "",
        "| policy | ID success | OOD success | ID turns | OOD turns | rollout, last 10 | paper ALFWorld | paper WebShop |",
        "|---|---|---|---|---|---|---|---|",
    ]
    start = results.get("start")
    if start:
        lines.append(
            f"| SFT checkpoint (every RL run's start) | {_cell(start.get('ID'))} | {_cell(start.get('OOD'))} | "
            f"{_turns(start.get('ID'))} | {_turns(start.get('OOD'))} | - | | |"
        )
    for key, row in rows.items():
        paper = [f"{PAPER[env][key]:.1f}" if key in PAPER[env] else "" for env in PAPER]
        lines.append(
            f"| {row['label']} | {_cell(row.get('ID'))} | {_cell(row.get('OOD'))} | {_turns(row.get('ID'))} | "
            f"{_turns(row.get('OOD'))} | {_pct(row['rollout_last10']['rate'])} | {paper[0]} | {paper[1]} |"
        )
    lines += [
        "",
        "Paper: ENVRL (figures as quoted in envrl's project brief; `envrl/evaluation/reported.json`), "
        "Qwen2.5-1.5B-Instruct, GRPO and ENVRL with base GRPO.",
        "",
        "## Updates to reach the baseline's final rollout success",
        "",
        f"Rollout success per update on the train games, smoothed with a trailing moving average of {SMOOTHING}; "
        "target = the baseline's smoothed value at its last update; the first update where the ENVRL run reaches "
        "it. Both runs of a seed play the same rollouts at update 1, so where the baseline ended at or below its "
        "first update's value every run reaches the target at once: n/a. "
        f"Paper: {100 * PAPER_STEPS_FRACTION:.1f}% of GRPO's steps.",
        "",
        "| ENVRL run | baseline | baseline's first -> final value per seed | updates per seed | "
        "mean share of the baseline's updates |",
        "|---|---|---|---|---|",
    ]
    all_rows = rows | results.get("ablation_table", {})
    for row in all_rows.values():
        if row.get("reach"):
            targets = ", ".join(f"{e.get('baseline_start') or 0:.3f} -> {e['target']:.3f}" for e in row["reach"])
            lines.append(
                f"| {row['label']} | {BASE_LABELS[row['base']]} | {targets} | "
                f"{_reach_cell(row['reach'])} | {_fraction_cell(row['reach'])} |"
            )
    lines += [
        "",
        "## World-model probes (valid, expert transitions)",
        "",
        f"`envrl probe` on the transitions of {args.probe_episodes} expert episodes of valid per checkpoint; mean "
        "over seeds (per seed in the JSON). SP: teacher-forced token accuracy and exact match of the greedy next "
        "observation; ID: top-1 accuracy of the true action among the admissible ones, with its chance level; "
        f"prompts `{ENVRLConfig.sp_template}` and `{ENVRLConfig.id_template}`, the ones ENVRL trains with.",
        "",
        "| checkpoint | transitions | SP token accuracy | SP exact match | ID accuracy | ID chance |",
        "|---|---|---|---|---|---|",
    ]
    probe_rows = ([("SFT checkpoint", start["probe"])] if start and start.get("probe") else []) + [
        (row["label"], row["probe"]) for row in all_rows.values() if row.get("probe")
    ]
    for label, p in probe_rows:
        lines.append(
            f"| {label} | {p['transitions']} | {_pct(p['sp_token_accuracy'])} | {_pct(p['sp_exact_match'])} | "
            f"{_pct(p['id_accuracy'])} | {_pct(p['id_chance'])} |"
        )
    if results.get("ablation_table"):
        lines += [
            "",
            "## Ablations (GRPO base)",
            "",
            "Rollout success per 10-update block: the train games' rollouts of updates 1-10, 11-20, ..., pooled "
            "over seeds (per update and seed in the JSON's `curves`).",
            "",
            "| run | ID success | OOD success | rollout per 10-update block | updates to reach GRPO |",
            "|---|---|---|---|---|",
        ]
        shown = [rows[key] for key in ("grpo", "envrl-grpo") if key in rows]  # --only may leave one out
        for row in shown + list(results["ablation_table"].values()):
            reach_text = _reach_cell(row["reach"]) if row.get("reach") else "-"
            blocks = ", ".join(_pct(b["rate"]) for b in row["rollout_blocks"])
            lines.append(
                f"| {row['label']} | {_cell(row.get('ID'))} | {_cell(row.get('OOD'))} | {blocks} | {reach_text} |"
            )
    lines += ["", "## Time", ""] + timing_lines(results["timings"]) + ["", SCALE_NOTE, ""]
    return "\n".join(lines)


def timing_lines(t: dict[str, Any]) -> list[str]:
    lines = [
        "Measured seconds per update (median, the first update of each run aside): "
        + ", ".join(f"{k} {v:.1f}" for k, v in t["seconds_per_update"].items())
        + "."
    ]
    if t["seconds_per_split_evaluation"] is not None:
        lines.append(
            f"One split evaluation (with the run's model saving and env start) took "
            f"{t['seconds_per_split_evaluation']:.0f} s (median)."
        )
    if t["estimate"]:
        e = t["estimate"]
        lines.append(
            f"Extrapolated to the default budget (SFT 100 updates, {e['rl_runs']} RL runs x 40 updates of 8 x 4, the RL cost "
            "scaled linearly in the rollouts, evaluations of 34 games) "
            f"on this machine: ~{e['train_min_per_seed']:.0f} min of training and at most "
            f"~{e['eval_min_per_seed_upper']:.0f} min of evaluation per seed, probes aside."
        )
    return lines


def plot(results: dict[str, Any], variants: list[Variant], args: argparse.Namespace, name: str) -> None:
    """Rollout success per update (smoothed; thin: per seed, thick: mean over seeds) and the
    ENVRL runs' SP and ID losses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    colors = plt.get_cmap("tab10")
    for i, v in enumerate(variants):
        color = colors(i % 10)
        curves = []
        for s in results["seeds"]:
            folder = Path(results["seeds"][s][v.key]["folder"])
            curve = moving_average(success_curve(str(folder), args.rl_updates))
            curves.append(curve)
            axes[0].plot(range(1, len(curve) + 1), curve, color=color, alpha=0.25, linewidth=0.8)
            rows = update_rows(folder, args.rl_updates)
            for ax, term in ((axes[1], "loss/sp"), (axes[2], "loss/id")):
                points = [(r["update"], r[term]) for r in rows if term in r]
                if points:
                    xs, ys = zip(*points)
                    ax.plot(
                        xs, ys, color=color, alpha=0.7, label=v.label if s == next(iter(results["seeds"])) else None
                    )
        width = min(len(c) for c in curves)
        if width:
            mean = [statistics.fmean(c[j] for c in curves) for j in range(width)]
            axes[0].plot(range(1, width + 1), mean, color=color, linewidth=2.2, label=v.label)
    axes[0].set(
        title=f"rollout success on train (moving average of {SMOOTHING})", xlabel="update", ylabel="success rate"
    )
    axes[1].set(title="ENVRL: loss/sp (token CE of s')", xlabel="update", ylabel="nats per token")
    axes[2].set(title="ENVRL: loss/id (token CE of a)", xlabel="update", ylabel="nats per token")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / name, dpi=100)
    plt.close(fig)


def sweep_report(
    results: dict[str, Any], variants: list[Variant], args: argparse.Namespace
) -> tuple[dict[str, Any], str]:
    """``sweep.json`` and ``sweep.md``: each start-weight point's train rollout success and final
    valid success (never test_ood), beside the GRPO baseline, and the rule's recommendation."""
    grid = variant_rows(results, variants, args)
    # the GRPO reference is the main comparison's run; the sweep reads its valid evaluation only
    base = variant_rows(results, [dataclasses.replace(main_variants(args)[0], splits=("valid",))], args)["grpo"]
    main_weights = (args.sp_coef, args.id_coef)  # the rule's reference: the main comparison's point
    ref = f"{args.sp_coef:g}/{args.id_coef:g}"
    default = next((k for k, v in grid.items() if (v["aux"]["sp_coef"], v["aux"]["id_coef"]) == main_weights), None)
    best = max(grid, key=lambda k: (grid[k]["ID"]["rate"], grid[k]["rollout_last10"]["rate"]))
    if default is None:
        verdict = f"best point: {grid[best]['label']} ({ref}, the main comparison's weights, is not on this grid)"
    elif best != default and all(grid[best][m]["rate"] > grid[default][m]["rate"] for m in ("ID", "rollout_last10")):
        verdict = f"{grid[best]['label']} beats the main comparison's {ref} on both valid and train rollout success"
    else:
        verdict = "no point beats the main comparison's {ref} on both valid and train rollout success"
    data = {"settings": results["settings"], "grpo": base, "grid": grid, "best": best, "verdict": verdict}
    seeds = ", ".join(results["seeds"])
    lines = [
        "# ENVRL start-weight sweep (GRPO base, TextWorld custom quests)",
        "",
        f"Seeds {seeds}; each point {args.rl_updates} updates of {args.groups} x {args.group_size} from the seed's "
        f"SFT checkpoint, cosine decay, aux_fraction {args.aux_fraction:g}. Scored only on rollout success on the train games (metrics.jsonl) and the "
        f"final valid success ({args.eval_episodes} episodes per seed, pooled, 95% Wilson); test_ood is neither "
        "evaluated for these runs nor read. Rule: order by valid success, then by train rollout success over the "
        f"last 10 updates; change the default only if a point beats {ref} on both.",
        "",
        f"Command: `{command_line()}`.",
        "",
        "| sp_coef | id_coef | valid success | rollout, last 10 | rollout, all updates | updates to reach GRPO's final |",
        "|---|---|---|---|---|---|",
        f"| GRPO | - | {_cell(base['ID'])} | {_pct(base['rollout_last10']['rate'])} | "
        f"{_pct(base['rollout_all']['rate'])} | - |",
    ]
    for row in grid.values():
        lines.append(
            f"| {row['aux']['sp_coef']:g} | {row['aux']['id_coef']:g} | {_cell(row['ID'])} | "
            f"{_pct(row['rollout_last10']['rate'])} | {_pct(row['rollout_all']['rate'])} | {_reach_cell(row['reach'])} |"
        )
    lines += [
        "",
        f"Verdict: {verdict}. With {len(results['seeds'])} seed(s) x {args.eval_episodes} valid games a point's "
        "interval is wide; differences inside it are not evidence.",
        "",
    ]
    return data, "\n".join(lines)


# ---- main ---------------------------------------------------------------------------------------


def _weight_pair(text: str) -> tuple[float, float]:
    """``SP:ID`` -> two non-negative start weights; anything else is a usage error naming the format."""
    sp, sep, idc = text.partition(":")
    try:
        weights = (float(sp), float(idc)) if sep else None
    except ValueError:
        weights = None
    if weights is None or min(weights) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not SP:ID with two non-negative weights, e.g. 0.1:0.001")
    return weights


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sft-from", type=Path, default=None, help="a learning_cpu.py output folder to take SFT from")
    parser.add_argument("--train-tasks", type=int, default=200, help="the train split's first N custom games")
    parser.add_argument("--eval-episodes", type=int, default=34, help="per split and seed (34: every custom game once)")
    parser.add_argument("--sft-updates", type=int, default=100)
    parser.add_argument("--sft-lr", type=float, default=3e-3)
    parser.add_argument("--rl-updates", type=int, default=40)
    parser.add_argument("--rl-lr", type=float, default=3e-4)
    parser.add_argument("--groups", type=int, default=None, help="tasks per RL update (default 8; --quick 4)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=15)
    parser.add_argument(
        "--bases",
        nargs="+",
        choices=tuple(BASE_LABELS),
        default=list(BASE_LABELS),
        help="base algorithms to compare with their ENVRL version (default both; the ablations and sweep need grpo)",
    )
    # the main comparison ran at 0.1/0.1, the algorithm's defaults before the sweep moved them to 0.01/0.001
    parser.add_argument("--sp-coef", type=float, default=0.1, help="the main ENVRL runs' SP start weight")
    parser.add_argument("--id-coef", type=float, default=0.1, help="the main ENVRL runs' ID start weight")
    parser.add_argument(
        "--aux-fraction",
        type=float,
        default=1.0,
        help="share of the transitions the main ENVRL runs use (default 1.0, every one; 0.25: a cheaper variant)",
    )
    parser.add_argument("--probe-episodes", type=int, default=5, help="expert episodes of valid per probe")
    parser.add_argument("--ablations", action="store_true", help="also: no SP, no ID, constant weights, aux 0.25/0.5")
    parser.add_argument("--sweep", action="store_true", help="the start-weight sweep only (sweep.json, sweep.md)")
    # 0.1 (the algorithm's default before the sweep) made the training rollouts' success collapse on every seed of the main
    # comparison (train games only), so the grid reaches down from there rather than up
    parser.add_argument("--sweep-values", type=float, nargs="+", default=[0.001, 0.01, 0.1])
    parser.add_argument(
        "--sweep-points",
        type=_weight_pair,
        nargs="+",
        default=None,
        metavar="SP:ID",
        help="run these (sp_coef, id_coef) points instead of the --sweep-values grid, e.g. 0.1:0.001",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        metavar="KEY",
        help="run only these main/ablation runs (e.g. grpo envrl-grpo-no-id); an ENVRL run's base is kept",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: seed 0, 16 games, 2 SFT and 2 RL updates of 4 groups, 4 eval episodes, 1 probe episode",
    )
    parser.add_argument("--out", type=Path, default=None, help="default benchmarks/results/envrl[-quick]")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.train_tasks, args.sft_updates, args.rl_updates = [0], 16, 2, 2
        args.eval_episodes, args.probe_episodes = 4, 1
    if (args.ablations or args.sweep) and "grpo" not in args.bases:
        parser.error("--ablations and --sweep run on the GRPO base: keep grpo in --bases")
    if args.groups is None:
        args.groups = 4 if args.quick else 8
    if args.only is not None:
        known = [v.key for v in runnable_variants(args)]
        unknown = [k for k in args.only if k not in known]
        if unknown or args.sweep:
            parser.error(f"--only takes keys of {known} (not with --sweep); got {unknown or args.only}")
    if args.out is None:
        args.out = ROOT / "benchmarks" / "results" / ("envrl-quick" if args.quick else "envrl")
    args.out = args.out.resolve()
    if args.sft_from is not None:
        args.sft_from = args.sft_from.resolve()
    return args


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import envrl

    print(f"envrl from {Path(envrl.__file__).parent}", flush=True)
    began = time.perf_counter()
    mains = selected(main_variants(args), args)
    ablations = selected(ablation_variants(args), args) if args.ablations else []
    if args.sweep:
        variants = [mains[0], *sweep_variants(args)]
    else:
        variants = mains + ablations
    results: dict[str, Any] = {
        "settings": vars(args) | {"out": str(args.out), "sft_from": str(args.sft_from) if args.sft_from else None},
        "paper": {
            "model": "Qwen2.5-1.5B-Instruct",
            "success_rate_percent": PAPER,
            "steps_fraction": PAPER_STEPS_FRACTION,
        },
        "scale_note": SCALE_NOTE,
        "seeds": {},
    }
    for seed in args.seeds:
        sft = sft_run(seed, args)
        runs: dict[str, Any] = {"sft": sft}
        for v in variants:
            runs[v.key] = run_variant(v, seed, Path(sft["checkpoint"]), args)
        if not args.sweep:
            sft["probe"] = probe(f"sft-seed{seed}@{args.sft_updates}", sft["checkpoint"], args)
            for v in variants:
                name = f"{Path(runs[v.key]['folder']).name}@{args.rl_updates}"
                runs[v.key]["probe"] = probe(name, runs[v.key]["checkpoint"], args)
        results["seeds"][str(seed)] = runs
    results["wall_seconds"] = time.perf_counter() - began
    results["timings"] = timings(results, variants, args)
    if args.sweep:
        data, text = sweep_report(results, variants[1:], args)
        data["timings"] = results["timings"]
        data["seeds"] = {seed: {k: valid_only(r) for k, r in runs.items()} for seed, runs in results["seeds"].items()}
        (args.out / "sweep.json").write_text(json.dumps(data, indent=2))
        (args.out / "sweep.md").write_text(text)
        print(text)
        return
    results["table"] = variant_rows(results, mains, args)
    if ablations:
        results["ablation_table"] = variant_rows(results, ablations, args)
    results["start"] = start_row(results, args)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "results.md").write_text(markdown(results, args))
    plot(results, mains, args, "results.png")
    if ablations:
        plot(results, variants, args, "ablations.png")
    print((args.out / "results.md").read_text())


def valid_only(run: dict[str, Any]) -> dict[str, Any]:
    """A run's result with its valid evaluations only: what the sweep may show of the GRPO and SFT runs
    it shares with the main comparison."""
    evaluations = {k: v for k, v in run.get("evaluations", {}).items() if k.endswith(f"/{SPLITS['ID']}")}
    return run | {"evaluations": evaluations}


def start_row(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The SFT checkpoint's success (its final evaluation) and probes, pooled over seeds."""
    row: dict[str, Any] = {}
    for kind, split in SPLITS.items():
        try:
            row[kind] = pooled_split(results, "sft", split, args.sft_updates)
        except KeyError:  # a reused SFT run evaluated elsewhere
            continue
    probes = [results["seeds"][s]["sft"].get("probe") for s in results["seeds"]]
    if all(probes):
        row["probe"] = _mean_probe(probes)
    return row


if __name__ == "__main__":
    main()
