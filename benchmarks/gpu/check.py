"""One prepared check of envrl's CUDA paths, for a short GPU session (benchmarks/gpu/README.md).

No GPU has been lent to this project yet, and a lent one comes for minutes, so everything a GPU
run needs that a CPU run never exercises is run here in one invocation, each part timed and
recorded, none able to stop the others:

* ``model``: a from-scratch Qwen2-architecture checkpoint (random weights, a BPE tokenizer trained
  on Diag-Chain text, as ``envrl model init`` builds them), ~30M parameters on GPU;
* ``bf16``: the trainer's accelerator takes the launcher's mixed precision (bf16 here, as the GPU
  recipes' ``accelerate launch --mixed_precision bf16``), keeps float32 weights, autocasts the
  forward pass, and one GRPO update runs;
* ``lora``: a LoRA policy (``policy.lora_rank``) whose KL reference is the base model with its
  adapters off: it must equal the policy before the first step, and two updates run;
* ``grpo`` and ``envrl``: two updates each on ``envrl/Diag-Chain-v0`` (inline vector envs), GRPO
  generating its responses, ENVRL choosing among the admissible actions (so its transitions are
  valid and the SP and ID losses run), with seconds per update, peak GPU memory, the losses and,
  for the first micro-batch of each update, the PPO ratio between the log-probs the rollout
  recorded and the training forward pass (clip fraction, largest absolute log-ratio);
* ``overhead``: ENVRL's cost over GRPO on one batch (benchmarks/envrl_overhead.py's timing and
  counting functions) in its generate mode: each step's response rewritten as a thought of
  ``thought_tokens`` (256 on GPU) and the action, the length a reasoning model's thought takes;
* ``eval``: the trainer's periodic evaluation (``eval.every``) on the same GPU during training.

Every stage writes ``{ok, seconds, error, figures}`` to one JSON (``--out``) and prints one line.
``--cpu`` runs the same stages in float32 at tiny sizes (under a minute on 2 cores), so the
script is known to work before a GPU is lent (tests/test_gpu_check.py runs it).

    .venv/bin/python benchmarks/gpu/check.py --out gpu_check.json          # one GPU, ~3-5 min
    .venv/bin/python benchmarks/gpu/check.py --cpu --out /tmp/check.json   # CPU, < 1 min
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ENV = "diag-chain"
STAGES = ("model", "bf16", "lora", "grpo", "envrl", "overhead", "eval")


@dataclass(frozen=True)
class Profile:
    """The sizes of one run of the check: ``gpu`` (the real one) or ``cpu`` (tiny, fp32)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    positions: int
    vocab: int
    groups: int  # tasks per update
    group_size: int
    max_steps: int  # episode step limit
    max_new_tokens: int  # generate mode
    micro_batch: int
    chain_length: int
    eval_episodes: int
    overhead_groups: int
    overhead_group_size: int
    overhead_repeats: int
    thought_tokens: int  # overhead in generate mode: the thought's length
    updates: int = 2


PROFILES = {
    # ~30M parameters: 8 layers of hidden 512 (~3.1M each) plus a 4,096-token embedding and head
    "gpu": Profile("gpu", 512, 1408, 8, 8, 2, 2048, 4096, 8, 8, 8, 64, 16, 3, 16, 8, 8, 3, 256),
    # the tests' tiny model (hidden 64, 2 layers): the whole check in well under a minute on 2 cores
    "cpu": Profile("cpu", 64, 128, 2, 4, 2, 512, 1024, 2, 2, 3, 12, 8, 2, 2, 2, 2, 1, 16),
}


@dataclass
class StageResult:
    ok: bool = False
    seconds: float = 0.0
    error: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)


class Check:
    """The stages (see the module docstring), sharing one work folder and one checkpoint."""

    def __init__(self, profile: Profile, work: Path, device: str) -> None:
        self.profile = profile
        self.work = work
        self.device = device  # cuda or cpu
        self.model: Path | None = None

    # ---- helpers -------------------------------------------------------------------------------

    def config(self, algo: str, name: str, *sets: str) -> Any:
        """A resolved config for ``algo`` on Diag-Chain with the profile's sizes, ``sets`` last."""
        from envrl.training.algorithms import algorithm_class
        from envrl.training.config import build_config

        if self.model is None:
            raise RuntimeError("no checkpoint: the model stage failed")
        p = self.profile
        base = [
            f"policy.model={self.model}",
            f"out={self.work / name}",
            f"updates={p.updates}",
            "policy.template=compact",
            "policy.history=0",
            "policy.action_mode=choose",
            "policy.temperature=1.0",
            f"policy.max_new_tokens={p.max_new_tokens}",
            f"policy.device={self.device}",
            f"rollout.env_kwargs={json.dumps({'length': p.chain_length})}",
            f"rollout.groups={p.groups}",
            f"rollout.group_size={p.group_size}",
            f"rollout.max_steps={p.max_steps}",
            "rollout.backend=inline",
            "rollout.step_timeout=null",
            f"optim.micro_batch_size={p.micro_batch}",
            "optim.lr=1e-5",
            "eval.episodes=0",
            f"eval.runs_dir={self.work / 'eval-runs'}",
        ]
        if algo == "envrl":
            base.append("algorithm.base=grpo")
        if algo in ("grpo", "envrl"):
            base.append("algorithm.kl_coef=0.0")
        return build_config(algo, ENV, algorithm_config=algorithm_class(algo).Config, sets=base + list(sets))

    def trainer(self, config: Any) -> Any:
        from envrl.training.loop import Trainer
        from envrl.training.preflight import preflight

        preflight(config)  # what a GPU run should be refused by, at start; it must pass here
        return Trainer(config)

    def reset_peak(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak(self) -> dict[str, float]:
        """Peak GPU memory since :meth:`reset_peak` (MiB), or the process's peak RSS on CPU."""
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            return {
                "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20,
                "peak_gpu_reserved_mib": torch.cuda.max_memory_reserved() / 2**20,
            }
        return {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}

    def train(self, config: Any, *, count_eval: bool = False) -> dict[str, Any]:
        """Train ``config`` to its end, watching the first micro-batch of each update; the figures."""
        self.reset_peak()
        trainer = self.trainer(config)
        watch = FirstMicroBatch(trainer)
        evals: list[float] = []
        if count_eval:
            evaluate = trainer.evaluate

            def timed_evaluate(update: int) -> Any:
                began = time.perf_counter()
                try:
                    return evaluate(update)
                finally:
                    evals.append(time.perf_counter() - began)

            trainer.evaluate = timed_evaluate
        try:
            evaluations = trainer.run(progress=False)
            device = str(trainer.policy.device)
        finally:
            trainer.close()
        rows = read_metrics(Path(config.out) / "metrics.jsonl")
        seconds = [r["time/collect_s"] + r["time/update_s"] for r in rows]
        figures: dict[str, Any] = {
            "device": device,
            "updates": len(rows),
            "seconds_per_update": statistics.mean(seconds) if seconds else None,
            "collect_seconds": [round(r["time/collect_s"], 3) for r in rows],
            "update_seconds": [round(r["time/update_s"], 3) for r in rows],
            "samples": [r.get("samples") for r in rows],
            "losses": [{k: v for k, v in r.items() if k == "loss" or k.startswith("loss/")} for r in rows],
            "first_micro_batch": watch.records,
            **self.peak(),
        }
        keys = ["kl", "entropy", "grad_norm", "success_rate", "aux/samples", "aux/tokens", "weight/sp", "weight/id"]
        keys += sorted({k for r in rows for k in r if k.startswith("old_logprob/")})  # the sampler's gap
        for key in keys:
            if any(key in r for r in rows):
                figures[key] = [r.get(key) for r in rows]
        if count_eval:
            figures["eval_seconds"] = [round(s, 3) for s in evals]
            figures["evaluations"] = evaluations
        return figures

    # ---- the stages ----------------------------------------------------------------------------

    def stage_model(self) -> dict[str, Any]:
        self.model = build_checkpoint(self.work / "model", self.profile)
        record = json.loads((self.model / "envrl_model.json").read_text(encoding="utf-8"))
        return {"parameters": record["parameters"], "vocab": record["vocab_size"], "path": str(self.model)}

    def stage_bf16(self) -> dict[str, Any]:
        import torch

        expected = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        config = self.config("grpo", "bf16", "updates=1")
        self.reset_peak()
        trainer = self.trainer(config)
        try:
            accelerator = trainer.accelerator
            weights = {str(p.dtype) for p in trainer.policy.unwrapped.parameters()}
            # accelerate casts the prepared model's outputs back to float32, so the compute dtype is
            # read inside the forward pass: the output layer's, before that cast
            seen: list[torch.dtype] = []
            head = trainer.policy.unwrapped.get_output_embeddings()
            hook = head.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
            ids = torch.tensor([[1, 5, 9, 12]], device=trainer.policy.device)
            try:
                with torch.no_grad():
                    trainer.policy.model(input_ids=ids)  # the prepared model: autocast applies
            finally:
                hook.remove()
            trainer.run(progress=False)
            device = str(trainer.policy.device)
        finally:
            trainer.close()
        rows = read_metrics(Path(config.out) / "metrics.jsonl")
        want_logits = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}.get(expected, "torch.float32")
        figures = {
            "launcher_precision": expected,
            "accelerator_precision": str(accelerator.mixed_precision),
            "weights_dtype": sorted(weights),
            "forward_logits_dtype": str(seen[0]) if seen else None,
            "device": device,
            "gpu": torch.cuda.get_device_name() if self.device == "cuda" else None,
            "bf16_supported": bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported()),
            "loss": rows[0].get("loss") if rows else None,
            "seconds_per_update": rows[0]["time/collect_s"] + rows[0]["time/update_s"] if rows else None,
            **self.peak(),
        }
        problems = []
        if figures["accelerator_precision"] != expected:
            problems.append(f"the accelerator runs {figures['accelerator_precision']}, the launcher asked {expected}")
        if weights != {"torch.float32"}:
            problems.append(f"weights are {sorted(weights)}, not float32")
        if figures["forward_logits_dtype"] != want_logits:
            problems.append(f"the output layer computed in {figures['forward_logits_dtype']}, not {want_logits}")
        if not rows or not math.isfinite(float(rows[0].get("loss", float("nan")))):
            problems.append("the update's loss is not finite")
        if problems:
            raise AssertionError("; ".join(problems))
        return figures

    def stage_lora(self) -> dict[str, Any]:
        import torch

        config = self.config("grpo", "lora", "policy.lora_rank=8", "algorithm.kl_coef=0.01", "optim.lr=1e-4")
        self.reset_peak()
        trainer = self.trainer(config)
        watch = FirstMicroBatch(trainer)
        try:
            policy = trainer.policy
            trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
            total = sum(p.numel() for p in policy.model.parameters())
            batch = trainer.algorithm.collect(trainer, 0)
            samples = [s for s in batch.samples][: self.profile.micro_batch]
            with torch.no_grad():
                scores = policy.logprobs(samples)
                reference = policy.reference_logprobs(samples)
            gap = float(((scores.logprobs - reference).abs() * scores.mask).max())
            terms = trainer.update(batch.samples)
            with torch.no_grad():
                after = float(((policy.logprobs(samples).logprobs - reference).abs() * scores.mask).max())
            device = str(policy.device)
        finally:
            trainer.close()
        figures = {
            "device": device,
            "lora_rank": 8,
            "trainable_parameters": trainable,
            "parameters": total,
            "trainable_fraction": trainable / total,
            "reference_gap_before": gap,
            "reference_gap_after": after,
            "kl_first_update": terms.get("kl"),
            "loss": terms.get("loss"),
            "first_micro_batch": watch.records,
            **self.peak(),
        }
        if not 0 < trainable < total:
            raise AssertionError(f"LoRA should train a part of the weights: {trainable} of {total}")
        if gap > 1e-3:
            raise AssertionError(f"the reference (adapters off) differs from the untrained policy by {gap:.3g}")
        if after <= gap:
            raise AssertionError("a LoRA update did not move the policy away from its reference")
        return figures

    def stage_grpo(self) -> dict[str, Any]:
        # a random model writes no parseable action, so every step is format-invalid, the group's
        # advantages are all 0 and the PPO term has no gradient: the entropy bonus gives the
        # generate-mode backward pass one
        config = self.config(
            "grpo", "grpo", "policy.action_mode=generate", "policy.template=action", "algorithm.entropy_coef=0.01"
        )
        figures = self.train(config)
        _require_updates(figures, self.profile.updates)
        if not all(norm > 0 for norm in figures.get("grad_norm", [0.0])):
            raise AssertionError(f"a generate-mode update had no gradient: grad_norm {figures.get('grad_norm')}")
        return figures

    def stage_envrl(self) -> dict[str, Any]:
        figures = self.train(self.config("envrl", "envrl"))
        _require_updates(figures, self.profile.updates)
        if not any(loss.get("loss/sp") is not None for loss in figures["losses"]):
            raise AssertionError("no update had a state-prediction loss (no valid transition)")
        return figures

    def stage_overhead(self) -> dict[str, Any]:
        import torch

        overhead = load_overhead_module()
        p = self.profile
        # the papers' setting: responses of a thought and an action (envrl_overhead.py --action-mode generate)
        sets = [
            f"rollout.groups={p.overhead_groups}",
            f"rollout.group_size={p.overhead_group_size}",
            "updates=10",
            "policy.template=think-action",
        ]
        config = self.config("envrl", "overhead", *sets)
        trainer = self.trainer(config)
        try:
            envrl = trainer.algorithm
            batch = envrl.collect(trainer, 0)
            samples = list(batch.samples)
            steps = [sample.step for sample in samples]
            overhead.as_generated(trainer.policy, steps, p.thought_tokens)
            state = {
                "model": copy.deepcopy(trainer.policy.unwrapped.state_dict()),
                "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
            }
            overhead.timed_update(trainer, steps, envrl.base, state)  # warm-up
            overhead.timed_update(trainer, samples, envrl, state)
            runs: dict[str, list[tuple[float, int]]] = {"grpo": [], "envrl": []}
            for _ in range(p.overhead_repeats):  # alternate, as envrl_overhead.py does
                runs["grpo"].append(overhead.timed_update(trainer, steps, envrl.base, state))
                runs["envrl"].append(overhead.timed_update(trainer, samples, envrl, state))
            device = str(trainer.policy.device)
        finally:
            trainer.close()
        figures: dict[str, Any] = {
            "device": device,
            "action_mode": "generate",
            "thought_tokens": p.thought_tokens,
            "step_samples": len(steps),
            "aux_samples": sum(len(s.aux) for s in samples),
            "aux_positions": overhead.aux_positions(samples),
            "attention_pairs": {
                "grpo": overhead.attention_pairs(samples, False),
                "envrl": overhead.attention_pairs(samples, True),
            },
            "repeats": p.overhead_repeats,
            "torch_threads": torch.get_num_threads(),
        }
        for name, values in runs.items():
            figures[name] = {
                "median_seconds": statistics.median(s for s, _ in values),
                "median_peak_mib": statistics.median(m for _, m in values) / 2**20,
            }
        figures["time_ratio"] = figures["envrl"]["median_seconds"] / figures["grpo"]["median_seconds"]
        grpo_peak = figures["grpo"]["median_peak_mib"]
        figures["memory_ratio"] = figures["envrl"]["median_peak_mib"] / grpo_peak if grpo_peak > 0 else None
        if figures["aux_samples"] == 0:
            raise AssertionError("the batch had no SP or ID sample")
        return figures

    def stage_eval(self) -> dict[str, Any]:
        p = self.profile
        config = self.config(
            "grpo",
            "eval",
            "eval.every=1",
            "eval.at_start=false",
            f"eval.episodes={p.eval_episodes}",
            "eval.splits=[valid]",
            f"eval.env_kwargs={json.dumps({'length': p.chain_length})}",
            f"eval.max_steps={p.max_steps}",
            "eval.workers=1",
            f"eval.batch_size={p.eval_episodes}",
        )
        figures = self.train(config, count_eval=True)
        _require_updates(figures, p.updates)
        made = figures["evaluations"]
        if len(figures["eval_seconds"]) != p.updates or len(made) != p.updates:
            raise AssertionError(f"expected an evaluation after each of {p.updates} updates, got {sorted(made)}")
        if any(r.get("episodes") != p.eval_episodes for r in made.values()):
            raise AssertionError(f"an evaluation did not play {p.eval_episodes} episodes: {made}")
        return figures


class FirstMicroBatch:
    """Records, for the first micro-batch of every update (before its first optimizer step), the
    PPO ratio between the samples' ``old_logprobs`` and a plain forward pass of the policy, and
    the loss terms (``ppo/*``) the algorithm computed for it.

    The weights are the ones the samples were drawn with, so the ratio should be 1. Where the loop
    re-scores the old log-probs in the loss's own pass (``Trainer.score_old_policy``), the
    algorithm's ``ppo/ratio_mean`` is exactly 1 and the plain pass here differs only by how rows
    are packed; where the old log-probs are the sampler's, the spread measures how far generation
    and the training pass disagree (bf16 autocast, KV cache, padding), which PPO's clip would
    treat as policy change. The loop's ``old_logprob/rollout_gap*`` metrics give the sampler's gap."""

    def __init__(self, trainer: Any) -> None:
        self.records: list[dict[str, Any]] = []
        self._pending = False
        update, compute_loss = trainer.update, trainer.algorithm.compute_loss
        clip = float(getattr(trainer.config.algorithm, "clip_eps", 0.2))

        def watched_update(samples: Sequence[Any]) -> dict[str, float]:
            self._pending = True
            return update(samples)

        def watched_loss(tr: Any, chunk: Sequence[Any]) -> Any:
            record = None
            # the loop's old-policy (and reference) scoring pass calls the loss too, storing what
            # it scores; the first micro-batch is the first call that computes a loss
            if self._pending and not getattr(tr, "scoring_pass", None):
                self._pending = False
                record = ratio_stats(tr.policy, chunk, clip)
            loss, terms = compute_loss(tr, chunk)
            if record is not None:
                record["terms"] = {k: v for k, v in terms.items() if k.startswith(("ppo/", "loss/"))}
                self.records.append(record)
            return loss, terms

        trainer.update = watched_update
        trainer.algorithm.compute_loss = watched_loss


def ratio_stats(policy: Any, chunk: Sequence[Any], clip_eps: float) -> dict[str, Any]:
    """The log-ratio ``new - old`` over the scored units of ``chunk``'s step samples (ENVRL's
    samples hold theirs in ``.step``); None figures where the samples recorded no old log-probs."""
    import torch

    steps = [s.step if hasattr(s, "aux") else s for s in chunk]
    old_rows = [list(getattr(s, "old_logprobs", None) or []) for s in steps]
    if not any(old_rows):
        return {"units": 0, "log_ratio_max_abs": None, "log_ratio_mean_abs": None, "clip_fraction": None}
    with torch.no_grad():
        scores = policy.logprobs(steps)
    mask = scores.mask.bool()
    old = torch.zeros_like(scores.logprobs)
    for i, row in enumerate(old_rows):
        if row:
            old[i, : len(row)] = torch.tensor(row, dtype=old.dtype, device=old.device)
    log_ratio = (scores.logprobs - old)[mask].float()
    outside = (log_ratio.exp() - 1.0).abs() > clip_eps
    return {
        "units": int(mask.sum()),
        "log_ratio_max_abs": float(log_ratio.abs().max()),
        "log_ratio_mean_abs": float(log_ratio.abs().mean()),
        "clip_fraction": float(outside.float().mean()),
    }


def _require_updates(figures: dict[str, Any], updates: int) -> None:
    if figures["updates"] != updates:
        raise AssertionError(f"{figures['updates']} updates logged, expected {updates}")
    for row in figures["losses"]:
        if not math.isfinite(float(row.get("loss", float("nan")))):
            raise AssertionError(f"a loss is not finite: {row}")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_overhead_module() -> Any:
    """benchmarks/envrl_overhead.py as a module (benchmarks/ is not a package)."""
    path = ROOT / "benchmarks" / "envrl_overhead.py"
    spec = importlib.util.spec_from_file_location("envrl_overhead", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def build_checkpoint(out: Path, profile: Profile) -> Path:
    """A from-scratch checkpoint of the profile's size, built as ``envrl model init`` builds one
    (:mod:`envrl.training.scratch_model`: a tokenizer trained on the env's episodes rendered through
    the policy templates, a seeded random Qwen2), with ``envrl_model.json`` recording it."""
    from envrl.training.scratch_model import ModelSize, build_model, env_corpus, train_tokenizer

    size = ModelSize(
        profile.hidden,
        profile.intermediate,
        profile.layers,
        profile.heads,
        profile.kv_heads,
        profile.positions,
        profile.vocab,
        False,
    )
    texts = env_corpus((ENV,), seed=0, env_kwargs={ENV: {"length": profile.chain_length}})
    tokenizer = train_tokenizer(texts, profile.vocab, chat_template=True, model_max_length=profile.positions)
    eot, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    model = build_model(size, len(tokenizer), 0, eos_ids=[im_end, eot], eot_id=eot)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    record = {
        "built_by": "benchmarks/gpu/check.py",
        "profile": profile.name,
        "architecture": asdict(size),
        "vocab_size": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    (out / "envrl_model.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return out


def run_stage(name: str, fn: Callable[[], dict[str, Any]]) -> StageResult:
    result = StageResult()
    began = time.perf_counter()
    try:
        result.figures = fn()
        result.ok = True
    except Exception as exc:  # one stage's failure is recorded; the others still run
        result.error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        result.figures["traceback"] = traceback.format_exc(limit=8)
    result.seconds = time.perf_counter() - began
    return result


def summary_line(name: str, result: StageResult) -> str:
    """One line per stage: status, seconds and the stage's headline figures."""
    f = result.figures
    head = f"{name:9} {'ok  ' if result.ok else 'FAIL'} {result.seconds:7.1f} s"
    if not result.ok:
        return f"{head}  {result.error}"
    parts: list[str] = []
    if "parameters" in f and name == "model":
        parts.append(f"{f['parameters'] / 1e6:.1f}M parameters, vocab {f['vocab']}")
    if name == "bf16":
        parts.append(f"accelerator {f['accelerator_precision']}, weights {','.join(f['weights_dtype'])}")
        parts.append(f"logits {f['forward_logits_dtype']}, loss {f['loss']:.4f}")
    if name == "lora":
        parts.append(
            f"trains {100 * f['trainable_fraction']:.1f}% of weights, reference gap {f['reference_gap_before']:.2g}"
        )
        parts.append(f"kl {f['kl_first_update']}")
    if f.get("seconds_per_update") is not None:
        parts.append(f"{f['seconds_per_update']:.2f} s/update")
    if f.get("grad_norm"):
        parts.append("grad norm " + ", ".join(f"{g:.3g}" for g in f["grad_norm"]))
    first = [r for r in f.get("first_micro_batch", []) if r.get("log_ratio_max_abs") is not None]
    if first:
        parts.append(
            f"first micro-batch |log ratio| max {first[0]['log_ratio_max_abs']:.3g}, clip {first[0]['clip_fraction']:.2f}"
        )
    if f.get("old_logprob/rollout_gap_max"):
        parts.append(f"sampler gap max {max(f['old_logprob/rollout_gap_max']):.3g}")
    if name == "overhead":
        parts.append(f"ENVRL/GRPO time x{f['time_ratio']:.2f} ({f['action_mode']}, {f['step_samples']} steps)")
    if name == "eval":
        rates = [r.get("success_rate") for r in f.get("evaluations", {}).values()]
        parts.append(f"{len(rates)} evaluations in {sum(f['eval_seconds']):.1f} s, success {rates}")
    for key in ("peak_gpu_mib", "peak_rss_mib"):
        if key in f:
            parts.append(f"{key} {f[key]:.0f}")
    return f"{head}  " + "; ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--cpu", action="store_true", help="float32 on CPU at tiny sizes (to test the check itself)")
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: a new temporary one)")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    parser.add_argument(
        "--mixed-precision",
        choices=("no", "bf16", "fp16"),
        default=None,
        help="the launcher's precision (default: the variable `accelerate launch` sets, else bf16 on GPU, no with --cpu)",
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=None,
        help="the sizes (default: gpu, or cpu with --cpu); --cpu --profile gpu smoke-tests the GPU sizes on CPU",
    )
    args = parser.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        parser.error(f"unknown stages {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    if "model" not in stages:
        stages.insert(0, "model")  # every other stage trains its checkpoint
    began = time.perf_counter()
    # the trainer takes its precision from the launcher's variable only (envrl/training/loop.py); set it as
    # `accelerate launch --mixed_precision bf16` would, before anything builds an Accelerator
    if args.mixed_precision is not None:
        os.environ["ACCELERATE_MIXED_PRECISION"] = args.mixed_precision
    elif args.cpu:
        os.environ["ACCELERATE_MIXED_PRECISION"] = "no"
    else:
        os.environ.setdefault("ACCELERATE_MIXED_PRECISION", "bf16")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # also the evaluation workers' loading bars
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()  # a bar per checkpoint load or save is noise here
    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu to check the script on CPU", file=sys.stderr)
        return 2
    profile = PROFILES[args.profile or ("cpu" if args.cpu else "gpu")]
    work = args.work or Path(tempfile.mkdtemp(prefix="envrl-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    check = Check(profile, work, "cpu" if args.cpu else "cuda")
    report: dict[str, Any] = {
        "profile": asdict(profile),
        "mixed_precision": os.environ["ACCELERATE_MIXED_PRECISION"],
        "device": torch.cuda.get_device_name() if not args.cpu else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "work": str(work),
        "stages": {},
    }
    for name in stages:
        result = run_stage(name, getattr(check, f"stage_{name}"))
        report["stages"][name] = asdict(result)
        print(summary_line(name, result), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")  # kept after each stage
    report["seconds"] = time.perf_counter() - began
    report["ok"] = all(s["ok"] for s in report["stages"].values())
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    failed = [n for n, s in report["stages"].items() if not s["ok"]]
    print(f"check {'ok' if not failed else 'FAILED: ' + ', '.join(failed)} in {report['seconds']:.1f} s -> {args.out}")
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
