"""What ENVRL's auxiliary losses cost: one ENVRL update against one plain GRPO update on the same batch.

ENVRL (``--algo envrl``) adds state prediction and inverse dynamics to GRPO's loss on the
transitions the rollouts already hold; the paper presents the cost as one extra forward pass.
This script plays one rollout batch with a from-scratch model (TextWorld custom quests, the CPU
experiments' settings), then times, on that same batch, alternately:

* ``grpo``: the base algorithm's update (:meth:`Trainer.update` with ENVRL's base GRPO);
* ``envrl``: ENVRL's update (the same step samples plus their SP and ID samples,
  ``aux_fraction`` 1.0, both weights on).

Two action modes. ``--action-mode choose`` (the CPU experiments'): a step's RL sample is its
prompt plus the short admissible actions, packed in one row; ENVRL's default SP and ID rows continue
that prompt, so they join the row and add their own tokens only (the next observation, twice). ``--action-mode generate`` (the papers' setting):
the RL sample is the ``think-action`` prompt (which lists the admissible actions) plus a response
``<think>...</think><action>a</action>`` whose thought is ``--thought-tokens`` tokens long, the
length a reasoning model's thought takes. A from-scratch model writes no parseable action, and
ENVRL (rightly) takes no transition from a format-invalid step, so the batch is played in choose
mode with that template and each step's response is then rewritten as such a response for the
chosen action (old log-probs 0): the lengths are the papers', the text is filler, and only the
cost is measured.

Each update is a full optimizer step (forward, backward, clip, AdamW); the weights are restored
before every timed update so both variants see the same model. The peak memory of an update is
the largest resident set size sampled every 2 ms while it runs, less the size just before it,
after freed memory is handed back to the OS (glibc's ``malloc_trim``;
``torch.cuda.max_memory_allocated`` on a GPU). Printed and written to ``--out``/results.json:
the median time and peak of each, their ratios (ENVRL / GRPO), the positions the auxiliary
rows add (:func:`aux_positions`) and the attention pairs of both (:func:`attention_pairs`).

    .venv/bin/python benchmarks/envrl_overhead.py                 # small model (1.9M), ~3 min on 2 cores
    .venv/bin/python benchmarks/envrl_overhead.py --size tiny --repeats 3
    .venv/bin/python benchmarks/envrl_overhead.py --action-mode generate --thought-tokens 128
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIG = Path(__file__).resolve().parent / "configs" / "textworld_cpu.yaml"


class PeakRSS:
    """The largest resident set size of this process while the block runs, sampled every 2 ms."""

    def __init__(self) -> None:
        import psutil

        self.process = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self) -> PeakRSS:
        _release_freed_memory()
        self.start = self.process.memory_info().rss
        self.peak = self.start
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def extra(self) -> int:
        return self.peak - self.start


def _release_freed_memory() -> None:
    """Hand memory that was freed back to the OS (glibc keeps it otherwise), so that the resident
    size before an update is its true baseline and the peak during it counts its own allocations."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the figures then only bound the update's memory from below
        pass


def timed_update(trainer: Any, samples: list[Any], algorithm: Any, state: dict[str, Any]) -> tuple[float, int]:
    """Seconds and peak extra bytes of one update of ``algorithm`` on ``samples`` from ``state``."""
    import torch

    trainer.policy.unwrapped.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.algorithm = algorithm
    cuda = torch.cuda.is_available() and trainer.policy.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    with PeakRSS() as rss:
        began = time.perf_counter()
        trainer.update(samples)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - began
    peak = torch.cuda.max_memory_allocated() - before if cuda else rss.extra
    return seconds, peak


def as_generated(policy: Any, steps: list[Any], thought_tokens: int) -> None:
    """Rewrite choose-mode step samples in place as generate-mode ones: the response
    ``<think>`` + ``thought_tokens`` filler tokens + ``</think><action>a</action>`` and the end
    token, old log-probs 0 (see the module docstring: only the cost is measured)."""
    filler = " ".join(["so"] * thought_tokens)
    for step in steps:
        text = policy.template.format_response(step.action, think=filler)
        step.response_ids = policy.encode_response(text)
        step.old_logprobs = [0.0] * len(step.response_ids)
        step.candidate_ids, step.choice = None, None


def _joined_and_rest(sample: Any) -> tuple[list[Any], list[Any]]:
    """A sample's SP and ID rows that join its step's packed row (they continue its prompt), and
    the others, which ENVRL groups on their common start."""
    from envrl.training.policy import extends

    joined = [a for a in sample.aux if extends(a, sample.step)]
    return joined, [a for a in sample.aux if not any(a is b for b in joined)]


def aux_positions(samples: list[Any]) -> dict[str, int]:
    """What the auxiliary rows add to the forward passes: their tokens; the tokens left when each
    transition's SP and ID rows share their common start
    (:meth:`~envrl.training.policy.Policy.shared_prefix_logprobs`, the previous version); and the
    positions they add as ENVRL scores them (:meth:`~envrl.training.policy.Policy.logprobs_with_branches`):
    a row that begins with its step's prompt joins the step's packed row and adds its tokens past
    that prompt only, the others as in the second figure (packed rows of similar length add some
    padding to each)."""
    from envrl.training.policy import shared_start

    out = {"tokens": 0, "shared_prefix": 0, "added": 0}
    for sample in samples:
        step, rows = sample.step, sample.aux
        if not rows:
            continue
        lengths = [len(a.prompt_ids) + len(a.response_ids) for a in rows]
        out["tokens"] += sum(lengths)
        out["shared_prefix"] += sum(lengths) - (len(rows) - 1) * shared_start(rows)
        joined, rest = _joined_and_rest(sample)
        out["added"] += sum(len(a.prompt_ids) + len(a.response_ids) - len(step.prompt_ids) for a in joined)
        if rest:
            out["added"] += sum(len(a.prompt_ids) + len(a.response_ids) for a in rest)
            out["added"] -= (len(rest) - 1) * shared_start(rest)
    return out


def attention_pairs(samples: list[Any], with_aux: bool) -> int:
    """The query-key pairs the packed rows' masks let attention use, the RL rows alone
    (``with_aux=False``, what GRPO computes) or with the SP and ID rows as ENVRL scores them
    (joined to the step's row where they continue its prompt, else grouped on their common
    start): a row of a start of ``s`` tokens and branches of ``b_i`` tokens allows
    ``s(s+1)/2 + sum_i (b_i s + b_i(b_i+1)/2)`` pairs, each token seeing the start and its own
    branch's earlier tokens. Attention's work grows with these pairs, not with the tokens."""
    from envrl.training.policy import shared_start

    def tree(start: int, branches: list[int]) -> int:
        return start * (start + 1) // 2 + sum(b * start + b * (b + 1) // 2 for b in branches)

    total = 0
    for sample in samples:
        step = sample.step
        prompt = len(step.prompt_ids)
        branches = [len(c) for c in step.candidate_ids] if step.candidate_ids is not None else [len(step.response_ids)]
        joined, rest = _joined_and_rest(sample) if with_aux else ([], [])
        branches += [len(a.prompt_ids) + len(a.response_ids) - prompt for a in joined]
        total += tree(prompt, branches)
        if rest:
            start = shared_start(rest)
            total += tree(start, [len(a.prompt_ids) + len(a.response_ids) - start for a in rest])
    return total


def _response_tokens(step: Any) -> int:
    if step.candidate_ids is not None:
        return sum(len(c) for c in step.candidate_ids)
    return len(step.response_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("tiny", "small"), default="small")
    parser.add_argument("--repeats", type=int, default=5, help="timed updates of each variant (median reported)")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--action-mode", choices=("choose", "generate"), default="choose")
    parser.add_argument("--thought-tokens", type=int, default=128, help="generate mode: the thought's length")
    parser.add_argument("--out", type=Path, default=None, help="default benchmarks/results/envrl_overhead[_generate]")
    args = parser.parse_args()
    if args.out is None:
        suffix = "" if args.action_mode == "choose" else "_generate"
        args.out = Path(f"benchmarks/results/envrl_overhead{suffix}")

    import torch

    from envrl.training.algorithms import algorithm_class
    from envrl.training.config import build_config
    from envrl.training.loop import Trainer
    from envrl.training.scratch_model import init_model

    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="envrl-overhead-"))
    model = work / "model"
    init_model(model, args.size, envs=("textworld",), seed=0, env_kwargs={"textworld": {"families": ["custom"]}})
    sets = [
        f"policy.model={model}",
        f"out={work / 'run'}",
        "updates=10",
        f"rollout.groups={args.groups}",
        f"rollout.group_size={args.group_size}",
        "rollout.max_steps=10",
        "algorithm.base=grpo",
        "algorithm.kl_coef=0.0",
        "eval.episodes=0",
    ]
    if args.action_mode == "generate":
        sets.append("policy.template=think-action")
    config = build_config(
        "envrl", "textworld", algorithm_config=algorithm_class("envrl").Config, files=[CONFIG], sets=sets
    )
    trainer = Trainer(config)
    try:
        envrl = trainer.algorithm
        batch = envrl.collect(trainer, 0)  # ENVRL's batch: GRPO's step samples, each with its SP and ID samples
        samples = list(batch.samples)
        steps = [sample.step for sample in samples]
        if args.action_mode == "generate":
            as_generated(trainer.policy, steps, args.thought_tokens)
        state = {
            "model": copy.deepcopy(trainer.policy.unwrapped.state_dict()),
            "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
        }
        timed_update(trainer, steps, envrl.base, state)  # warm-up (allocator, kernels)
        timed_update(trainer, samples, envrl, state)
        runs: dict[str, list[tuple[float, int]]] = {"grpo": [], "envrl": []}
        for _ in range(args.repeats):  # alternate, so drift in machine load hits both alike
            runs["grpo"].append(timed_update(trainer, steps, envrl.base, state))
            runs["envrl"].append(timed_update(trainer, samples, envrl, state))
    finally:
        trainer.close()
    result: dict[str, Any] = {
        "size": args.size,
        "action_mode": args.action_mode,
        "thought_tokens": args.thought_tokens if args.action_mode == "generate" else None,
        "mean_rl_tokens": statistics.mean(len(s.prompt_ids) + _response_tokens(s) for s in steps),
        "device": str(trainer.policy.device),
        "torch_threads": torch.get_num_threads(),
        "step_samples": len(steps),
        "aux_samples": sum(len(sample.aux) for sample in samples),
        "rl_units": int(batch.metrics.get("samples", len(steps))),
        "aux_tokens": batch.metrics.get("aux/tokens"),
        "aux_positions": aux_positions(samples),
        "attention_pairs": {"grpo": attention_pairs(samples, False), "envrl": attention_pairs(samples, True)},
        "repeats": args.repeats,
    }
    for name, values in runs.items():
        result[name] = {
            "seconds": [round(s, 4) for s, _ in values],
            "median_seconds": statistics.median(s for s, _ in values),
            "peak_mib": [round(m / 2**20, 1) for _, m in values],
            "median_peak_mib": statistics.median(m for _, m in values) / 2**20,
        }
    result["time_ratio"] = result["envrl"]["median_seconds"] / result["grpo"]["median_seconds"]
    grpo_peak = result["grpo"]["median_peak_mib"]
    result["memory_ratio"] = result["envrl"]["median_peak_mib"] / grpo_peak if grpo_peak > 0 else None
    (args.out / "results.json").write_text(json.dumps(result, indent=2))
    print(
        f"{args.size} model, {args.action_mode} mode, {result['step_samples']} step samples + {result['aux_samples']} SP/ID samples, "
        f"{result['torch_threads']} threads on {result['device']}"
    )
    for name in ("grpo", "envrl"):
        r = result[name]
        print(
            f"{name:6} update {r['median_seconds']:.2f} s (median of {args.repeats}), peak +{r['median_peak_mib']:.0f} MiB"
        )
    memory = f"{result['memory_ratio']:.2f}" if result["memory_ratio"] is not None else "n/a"
    positions = result["aux_positions"]
    rl_tokens = result["mean_rl_tokens"] * len(steps)
    print(
        f"RL rows: {round(rl_tokens)} tokens; SP/ID rows: {positions['tokens']} tokens, "
        f"{positions['shared_prefix']} with each transition's common start once, {positions['added']} added to the "
        "passes as scored (in the step's packed row where they continue its prompt)"
    )
    pairs = result["attention_pairs"]
    print(
        f"attention pairs the masks allow: GRPO {pairs['grpo']}, ENVRL {pairs['envrl']} "
        f"(x{pairs['envrl'] / pairs['grpo']:.2f}); tokens x{(rl_tokens + positions['added']) / rl_tokens:.2f}"
    )
    print(f"ENVRL / GRPO: time x{result['time_ratio']:.2f}, peak memory x{memory}")


if __name__ == "__main__":
    main()
