"""The shared training loop: collect -> advantages -> update -> log -> evaluate -> checkpoint.

Every algorithm runs here (:mod:`envrl.training.algorithms`): it supplies a batch per update
and the loss of a micro-batch; the loop owns the rest.

The update
    A batch is split into ``optim.minibatches`` minibatches (one optimizer step each) for
    ``optim.epochs`` passes; a minibatch is processed in micro-batches of
    ``optim.micro_batch_size`` samples whose gradients accumulate. Each micro-batch's loss is a
    token-mean over its own units, weighted by its share of the minibatch's units across all
    processes, so the accumulated gradient is the token-mean over the whole minibatch, the
    same for any micro-batch size and any number of processes (DDP averages gradients, hence
    the factor ``world_size``). Gradients are clipped to ``optim.max_grad_norm``; AdamW.
    Before the first step, an algorithm whose loss is a PPO ratio has the whole batch scored
    once more, micro-batch by micro-batch as the steps will score it, for the old policy's and
    the KL reference's log-probs (:meth:`Trainer.score_old_policy`): one forward pass per
    update, so that the ratio at the first minibatch is exactly 1 and the KL exactly 0.

Distributed
    Under ``accelerate launch`` each process plays its own rollouts (seeded by its rank) and
    the gradients are averaged; only the main process logs, evaluates and saves models.
    Autocast (``--mixed_precision bf16``) comes from the launcher only; a process whose
    accelerate state already holds another precision is refused (see ``Trainer``).

Evaluation
    Before the first update, every ``eval.every`` updates and after the last, the policy is
    saved as a transformers folder and evaluated on ``eval_splits()`` through the evaluation
    runner as the agent ``<run name>@<update>``, so ``envrl leaderboard`` and ``envrl serve``
    list training progress beside every other run.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envrl.evaluation.store import FileLock, RunLocked
from envrl.training.algorithms import Algorithm, algorithm_class
from envrl.training.checkpoints import check_output, checkpoint_dir, latest_checkpoint, load_state, save_state
from envrl.training.config import ConfigError, TrainConfig
from envrl.training.policy import Policy, scored_units
from envrl.training.preflight import preflight
from envrl.training.rollout import RolloutBatch


class Trainer:
    """One training run (see the module docstring); :meth:`run` trains, :meth:`close` releases."""

    def __init__(self, config: TrainConfig) -> None:
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs

        self.config = config
        if not config.out:
            raise ConfigError("no output folder: set --out DIR")
        if config.updates < 1:
            raise ConfigError("updates must be at least 1")
        self.out = Path(config.out)
        self.algorithm: Algorithm = algorithm_class(config.algo)(config.algorithm)
        self.algorithm.check(config)
        preflight(config)  # a missing checkpoint or a precision this device cannot run: one sentence, now
        # DDP's buffer broadcast before every forward would make ranks disagree on the number of
        # collective calls (a micro-batch of choose-mode and token samples runs the model twice); the model's only buffers
        # (rotary frequencies) never change, so there is nothing to broadcast.
        # Mixed precision comes from `accelerate launch --mixed_precision` (its environment variable)
        # and nothing else: left unset, accelerate would reuse whatever an earlier Accelerator in
        # this process chose (a TRL trainer's bf16, say) and silently autocast a float32 run.
        precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        try:
            self.accelerator = Accelerator(
                cpu=config.policy.device == "cpu" or not torch.cuda.is_available(),
                mixed_precision=precision,
                kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)],
            )
        except ValueError as error:  # accelerate's state is process-wide and set once
            from accelerate.state import AcceleratorState

            raise ConfigError(
                f"cannot train with mixed precision {precision!r}: an earlier Accelerator in this "
                f"process fixed it to {AcceleratorState().mixed_precision!r}; train in a fresh process"
            ) from error
        self.rank = self.accelerator.process_index
        self._lock: FileLock | None = None
        if self.accelerator.is_main_process:
            self._lock = _lock_output(self.out)
            try:
                extendable = config.optim.schedule == "constant" and not self.algorithm.depends_on_updates()
                check_output(self.out, config, extendable=extendable)
            except ConfigError:
                self._lock.release()
                raise
        self.accelerator.wait_for_everyone()
        torch.manual_seed(config.seed + self.rank)
        self.policy = Policy(config.policy, config.env)
        #: set while :meth:`score_old_policy` runs: "old" or "reference" (which model it scores with)
        self.scoring_pass: str | None = None
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.optim.lr, weight_decay=config.optim.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_schedule(config, self.algorithm.stage_starts(config.updates))
        )
        self.policy.model, self.optimizer, self.scheduler = self.accelerator.prepare(
            self.policy.model, optimizer, scheduler
        )
        # after prepare: the frozen copy then has the policy's device and autocast (see keep_reference)
        if self.algorithm.needs_reference_model():
            self.policy.keep_reference()
        if self.algorithm.needs_old_policy_pass() and self.policy.dropout() > 0:
            warnings.warn(
                f"the model applies dropout (p = {self.policy.dropout():g}) in train mode: the old-policy "
                "pass and the loss draw different masks, so the PPO ratio starts at 1 only in expectation",
                stacklevel=2,
            )
        self._rollout: Any = None
        self._task_ids: list[str] | None = None
        self.algorithm.prepare(self)

    # ---- rollouts -----------------------------------------------------------------------------

    def play(self, update: int) -> RolloutBatch:
        """This update's rollouts: ``rollout.groups`` tasks drawn from (seed, update, rank)."""
        rollout = self._rollouts()
        assert self._task_ids is not None
        c = self.config.rollout
        rng = np.random.default_rng([self.config.seed, update, self.rank])
        picks = rng.choice(len(self._task_ids), size=c.groups, replace=c.groups > len(self._task_ids))
        tasks = [(self._task_ids[int(k)], int(rng.integers(2**31))) for k in picks]
        self.policy.train_mode(False)
        try:
            return rollout.collect(tasks, agent_seed=int(rng.integers(2**31)))
        finally:
            self.policy.train_mode(True)

    def _rollouts(self) -> Any:
        if self._rollout is None:
            from envrl.envs.vector import make_vec
            from envrl.training.rollout import GroupRollout

            c = self.config.rollout
            kwargs = dict(c.env_kwargs)
            if c.max_steps:
                kwargs["max_episode_steps"] = c.max_steps
            vec = make_vec(
                self.config.env,
                c.groups * c.group_size,
                backend=c.backend,
                ray_address=c.ray_address,
                timeout=c.step_timeout,
                autoreset=False,
                split=c.split,
                **kwargs,
            )
            ids = [str(t) for t in vec.get_attr("task_ids")[0]]
            self._task_ids = ids[: c.tasks] if c.tasks else ids
            self._rollout = GroupRollout(vec, self.policy.agents(vec.num_envs), c.groups, c.group_size)
        return self._rollout

    # ---- one update ---------------------------------------------------------------------------

    def update(self, samples: Sequence[Any]) -> dict[str, float]:
        """Optimizer steps on ``samples`` (see the module docstring); returns the averaged loss terms."""
        o = self.config.optim
        terms: dict[str, list[float]] = {}
        if not samples:
            return {}
        order = np.random.default_rng([self.config.seed, len(samples), self.rank]).permutation(len(samples))
        minibatches = [[samples[int(i)] for i in minibatch] for minibatch in np.array_split(order, o.minibatches)]
        scored = self.score_old_policy(minibatches) if self.algorithm.needs_old_policy_pass() else {}
        for _ in range(o.epochs):
            for chosen in minibatches:
                loss, parts = self.minibatch_step(chosen)
                terms.setdefault("loss", []).append(loss)
                for key, value in parts.items():
                    terms.setdefault(key, []).append(value)
        return {**scored, **{key: float(np.mean(values)) for key, values in terms.items()}}

    def score_old_policy(self, minibatches: Sequence[Sequence[Any]]) -> dict[str, float]:
        """Score the update's samples with the weights they were sampled from, before any
        optimizer step, exactly as the loss will score them: the algorithm's own
        ``compute_loss`` on the very micro-batches :meth:`minibatch_step` makes, under the same
        autocast and train mode, without gradients, with :attr:`scoring_pass` set so that the
        loss stores its scored units (as the old policy's log-probs, then, where there is a KL
        term, as the reference's, with :meth:`Policy.reference_scoring`) instead of computing a
        loss. The sampler's own log-probs (KV-cached generation, bf16) differ from these by
        rounding; with these the ratio at the first minibatch is exactly 1 and the KL exactly 0
        while the weights are the reference's. Dropout would break the equality (see
        :meth:`Policy.dropout`; the models envrl makes have none). Returns the pass's metrics:
        the mean gap per unit between the sampler's and the recomputed log-probs and the largest.
        """
        chunks = [chunk for minibatch in minibatches for chunk in self._micro_batches(minibatch)]
        total = max(sum(scored_units(s) for chunk in chunks for s in chunk), 1)
        passes: list[tuple[str, Any]] = [("old", nullcontext)]
        if self.algorithm.needs_reference_model():
            passes.append(("reference", self.policy.reference_scoring))
        metrics: dict[str, float] = {}
        with torch.no_grad():
            for scoring, context in passes:
                self.scoring_pass = scoring
                try:
                    with context():
                        for chunk in chunks:
                            _, parts = self.algorithm.compute_loss(self, chunk)
                            share = sum(scored_units(s) for s in chunk) / total
                            for key, value in parts.items():
                                if not key.startswith("old_logprob/"):
                                    continue
                                if key.endswith("_max"):
                                    metrics[key] = max(metrics.get(key, value), value)
                                else:
                                    metrics[key] = metrics.get(key, 0.0) + value * share
                finally:
                    self.scoring_pass = None
        return metrics

    def _micro_batches(self, samples: Sequence[Any]) -> list[Sequence[Any]]:
        """``samples`` (one minibatch) in the micro-batches whose gradients accumulate."""
        size = self.config.optim.micro_batch_size
        return [samples[i : i + size] for i in range(0, len(samples), size)]

    def minibatch_step(self, samples: Sequence[Any]) -> tuple[float, dict[str, float]]:
        """One optimizer step over ``samples`` (this process's share of a minibatch)."""
        units = torch.tensor(float(sum(scored_units(s) for s in samples)), device=self.accelerator.device)
        total_units = float(self.accelerator.reduce(units, reduction="sum"))
        chunks = self._micro_batches(samples)
        loss_sum = 0.0
        parts: dict[str, float] = {}
        model = self.policy.model
        if not chunks:  # this process has no share: it still joins the gradient all-reduce, with zeros
            self.accelerator.backward(sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0)
        for k, chunk in enumerate(chunks):
            weight = sum(scored_units(s) for s in chunk) / max(total_units, 1.0) * self.accelerator.num_processes
            sync = k == len(chunks) - 1
            context = self.accelerator.no_sync(model) if not sync else nullcontext()
            with context:
                loss, terms = self.algorithm.compute_loss(self, chunk)
                self.accelerator.backward(loss * weight)
            loss_sum += float(loss.detach()) * weight / self.accelerator.num_processes
            for key, value in terms.items():
                parts[key] = parts.get(key, 0.0) + value * weight / self.accelerator.num_processes
        norm = self.accelerator.clip_grad_norm_(model.parameters(), self.config.optim.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        parts["grad_norm"] = float(norm) if norm is not None else 0.0
        parts["lr"] = float(self.scheduler.get_last_lr()[0])
        reduced = self.accelerator.reduce(torch.tensor(loss_sum, device=self.accelerator.device), reduction="sum")
        return float(reduced), parts

    # ---- the run ------------------------------------------------------------------------------

    def run(self, stop_after: int | None = None, progress: bool = True) -> dict[str, Any]:
        """Train to ``updates`` (resuming from the latest checkpoint in ``out``); ``stop_after``
        stops (and saves) after that many updates in all, for tests and for splitting a long run."""
        from tqdm import tqdm

        start = 0
        latest = latest_checkpoint(self.out)
        if latest is not None:
            start = load_state(self, latest[1])
        main = self.accelerator.is_main_process
        metrics = _MetricsLog(self.out, start) if main else None
        last = self.config.updates if stop_after is None else min(self.config.updates, stop_after)
        evaluations: dict[str, Any] = {}
        if start == 0 and main and self.config.eval.at_start:
            evaluations.update(self.evaluate(0))
        bar = tqdm(total=last - start, desc=f"{self.config.algo} {self.config.env}", disable=not (progress and main))
        for update in range(start, last):
            began = time.perf_counter()
            batch = self.algorithm.collect(self, update)
            collected = time.perf_counter()
            terms = self.update(batch.samples)
            tokens = sum(len(getattr(s, "prompt_ids", [])) + len(getattr(s, "response_ids", [])) for s in batch.samples)
            elapsed = time.perf_counter() - began
            row: dict[str, Any] = {
                "update": update + 1,
                **batch.metrics,
                **terms,
                "time/collect_s": collected - began,
                "time/update_s": elapsed - (collected - began),
                "tokens_per_s": tokens / max(elapsed - (collected - began), 1e-9),
            }
            done = update + 1
            every = self.config.eval.every
            if main and (done == self.config.updates or (every and done % every == 0)):
                made = self.evaluate(done)
                if made:
                    row["eval"] = made
                    evaluations.update(made)
            save = done == last or (self.config.save_every and done % self.config.save_every == 0)
            if save:
                save_state(self, done)
            if metrics is not None:
                metrics.write(row)
            bar.set_postfix(success=f"{row.get('success_rate', float('nan')):.2f}", loss=f"{row.get('loss', 0):.3f}")
            bar.update(1)
        bar.close()
        if metrics is not None:
            metrics.close()
        return evaluations

    def evaluate(self, update: int) -> dict[str, dict[str, Any]]:
        """Save the policy and evaluate it on the eval splits (leaderboard name ``<run>@<update>``)."""
        from envrl.evaluation import run_evaluation

        c = self.config
        if not c.eval.episodes:
            return {}
        model_dir = self.policy.save(checkpoint_dir(self.out, update) / "model")
        name = f"{c.run_name}@{update}"
        p = c.policy
        options = {
            "template": p.template,
            "history": p.history,
            "action_mode": p.action_mode,
            "choose_score": p.choose_score if p.action_mode == "choose" else None,
            "temperature": p.temperature if c.eval.temperature is None else c.eval.temperature,
            "top_p": p.top_p,
            "max_new_tokens": p.max_new_tokens,
            "device": "cpu" if self.accelerator.device.type == "cpu" else p.device,
            "name": name,
        }
        env_kwargs = dict(c.eval.env_kwargs)
        if c.eval.max_steps:
            env_kwargs["max_episode_steps"] = c.eval.max_steps
        results = {}
        for split in c.eval_splits():
            summary = run_evaluation(
                c.env,
                split,
                f"hf:{model_dir.resolve()}",
                c.eval.episodes,
                workers=c.eval.workers,
                seed=c.seed,
                runs_dir=c.eval.runs_dir,
                env_kwargs=env_kwargs,
                progress=False,
                agent_options=options,
                batch_size=c.eval.batch_size,
            )
            results[f"{name}/{split}"] = _summary_numbers(summary)
        return results

    def close(self) -> None:
        if self._rollout is not None:
            self._rollout.close()
            self._rollout = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def _lock_output(out: Path) -> FileLock:
    """Hold ``out/.lock`` for the run: a second process training into the same folder would
    interleave its checkpoints and metrics with this one's, so it stops at start instead."""
    out.mkdir(parents=True, exist_ok=True)
    lock = FileLock(out / ".lock")
    try:
        lock.acquire()
    except RunLocked as exc:
        raise ConfigError(f"{exc}: another training run writes there; wait for it or choose another --out") from None
    return lock


def train(config: TrainConfig, stop_after: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Run ``config`` to the end (or ``stop_after`` updates); returns the evaluations made."""
    trainer = Trainer(config)
    try:
        return trainer.run(stop_after=stop_after, progress=progress)
    finally:
        trainer.close()


def _summary_numbers(summary: Any) -> dict[str, Any]:
    """The run's overall metrics (success rate with its 95% interval, score, turns, episodes)."""
    return {"run_id": summary.run_id, **summary.metrics.overall.to_dict()}


def lr_schedule(config: TrainConfig, stage_starts: Sequence[int] = (0,)) -> Any:
    """The learning-rate multiplier per optimizer step: linear warmup, then constant, linear or cosine
    decay, restarted at each stage's first update (``stage_starts``, 0-based updates; one stage
    by default), so each stage has the whole schedule over its own updates."""
    o = config.optim
    if o.schedule not in ("constant", "linear", "cosine"):
        raise ConfigError(f"optim.schedule must be constant, linear or cosine, got {o.schedule!r}")
    steps_per_update = o.epochs * o.minibatches
    bounds = sorted({0, *stage_starts}) + [config.updates]
    stages = [(a * steps_per_update, max((b - a) * steps_per_update, 1)) for a, b in zip(bounds, bounds[1:])]

    def multiplier(step: int) -> float:
        first, total = next((s for s in reversed(stages) if step >= s[0]), stages[0])
        step -= first
        warmup = o.warmup_updates * steps_per_update
        if step < warmup:
            return (step + 1) / warmup
        if o.schedule == "constant":
            return 1.0
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return 1.0 - progress if o.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))

    return multiplier


class _MetricsLog:
    """``metrics.jsonl`` (lines past the resumed update are dropped first) and TensorBoard when installed."""

    def __init__(self, out: Path, start: int) -> None:
        self.path = out / "metrics.jsonl"
        kept = []
        if self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    if int(json.loads(line).get("update", 0)) <= start:
                        kept.append(line)
                except (ValueError, AttributeError):
                    continue
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        self.board: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.board = SummaryWriter(str(out / "tensorboard"))
        except Exception:  # tensorboard is optional
            self.board = None

    def write(self, row: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
        if self.board is not None:
            for key, value in row.items():
                if isinstance(value, int | float) and key != "update":
                    self.board.add_scalar(key, value, row["update"])

    def close(self) -> None:
        if self.board is not None:
            self.board.close()
