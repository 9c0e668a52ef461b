"""The PPO ratio is exactly 1 and the KL exactly 0 at an update's first minibatch, in float32 and bf16.

The rollouts are the real thing (:meth:`Trainer.play`, the policy's agents, KV-cached
generation or choose-mode scoring under the accelerator's autocast) on a stand-in vector env
of two-step episodes, so that the old log-probs the loss sees went through every step a run
takes. Only the env is fake: envs do not matter to the numbers here, and a real one costs
seconds per game.

Why the loop re-scores: under bf16 autocast the sampler's log-probs are ~1e-3 away from the
training pass's (measured below), and a reference copied before ``accelerator.prepare`` scores
in float32 while the policy autocasts. Both would make the first step's ratio and KL noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from envrl.training.algorithms import algorithm_class  # noqa: E402
from envrl.training.config import build_config  # noqa: E402
from envrl.training.loop import Trainer  # noqa: E402

ACTIONS = ["go north", "open door", "look", "take key"]


class TwoStepVec:
    """``num_envs`` envs of two-step episodes; env ``i`` earns ``i % 2`` per step (advantages != 0)."""

    autoreset = False

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self.steps = [0] * num_envs

    def _infos(self) -> dict[str, Any]:
        n = self.num_envs
        return {
            "admissible_actions": [list(ACTIONS)] * n,
            "instruction": ["open the door"] * n,
            "valid_action": [True] * n,
            "success": [False] * n,
            "score": [0.0] * n,
        }

    def reset(self, seed: Any = None, options: Any = None) -> tuple[list[str], dict[str, Any]]:
        self.steps = [0] * self.num_envs
        return ["You see a door."] * self.num_envs, self._infos()

    def step(self, actions: list[str]) -> tuple[list[str], list[float], list[bool], list[bool], dict[str, Any]]:
        self.steps = [s + 1 for s in self.steps]
        observations = [f"You see a key {s}." for s in self.steps]
        rewards = [float(i % 2) for i in range(self.num_envs)]
        done = [s >= 2 for s in self.steps]
        return observations, rewards, done, [False] * self.num_envs, self._infos()

    def close(self) -> None:
        pass


@pytest.fixture(params=["no", "bf16"])
def precision(request, monkeypatch) -> Any:
    """The launcher's precision (``accelerate launch --mixed_precision``), in a fresh accelerate state."""
    from accelerate.state import AcceleratorState

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", request.param)
    AcceleratorState._reset_state(reset_partial_state=True)
    yield request.param
    AcceleratorState._reset_state(reset_partial_state=True)


def _trainer(algo: str, mode: str, checkpoint: Path, out: Path, *extra: str) -> Trainer:
    from envrl.training.rollout import GroupRollout

    config = build_config(
        algo,
        "textworld",
        algorithm_config=algorithm_class(algo).Config,
        sets=[
            f"policy.model={checkpoint}",
            f"out={out}",
            "updates=1",
            "policy.template=action",
            "policy.history=1",
            "policy.max_new_tokens=6",
            "policy.device=cpu",
            f"policy.action_mode={mode}",
            "policy.temperature=1.0",
            "rollout.groups=1",
            "rollout.group_size=4",
            "optim.minibatches=2",
            "optim.micro_batch_size=2",
            "optim.epochs=1",
            "optim.lr=1e-2",
            "algorithm.kl_coef=0.05",
            "eval.episodes=0",
            *extra,
        ],
    )
    trainer = Trainer(config)
    vec = TwoStepVec(4)
    trainer._rollout = GroupRollout(vec, trainer.policy.agents(4), 1, 4)
    trainer._task_ids = ["task-0"]
    return trainer


def _capture(monkeypatch, trainer: Trainer) -> list[Any]:
    """Every PPO and KL call of the loss, with a marker ``"step"`` where each minibatch starts."""
    import envrl.training.algorithms.grpo as grpo

    calls: list[Any] = []
    ppo, kl = grpo.ppo_clip_loss, grpo.kl_k3

    def ppo_spy(logprobs, old, advantages, mask, clip_eps):
        loss, stats = ppo(logprobs, old, advantages, mask, clip_eps)
        calls.append(("ppo", (logprobs - old).detach()[mask.bool()], {k: float(v) for k, v in stats.items()}))
        return loss, stats

    def kl_spy(logprobs, reference, mask):
        value = kl(logprobs, reference, mask)
        calls.append(("kl", float(value.detach())))
        return value

    monkeypatch.setattr(grpo, "ppo_clip_loss", ppo_spy)
    monkeypatch.setattr(grpo, "kl_k3", kl_spy)
    step = trainer.minibatch_step

    def marked(samples):
        calls.append("step")
        return step(samples)

    monkeypatch.setattr(trainer, "minibatch_step", marked)
    return calls


def _minibatches(calls: list[Any]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for call in calls:
        if call == "step":
            out.append([])
        else:
            out[-1].append(call)
    return out


CASES = [
    ("grpo", "generate", ()),
    ("grpo", "choose", ()),
    ("gigpo", "choose", ()),
    # choose mode: every step is format-valid, so ENVRL's SP and ID rows join the steps' packed rows
    ("envrl", "choose", ()),
    # the reference is the base model with the adapters off; the adapters start as a no-op (B = 0)
    ("grpo", "generate", ("policy.lora_rank=4", "policy.lora_alpha=8")),
]


@pytest.mark.parametrize("algo, mode, extra", CASES, ids=[f"{a}-{m}{'-lora' if e else ''}" for a, m, e in CASES])
def test_the_first_minibatch_has_ratio_one_and_kl_zero(
    algo: str, mode: str, extra: tuple[str, ...], precision: str, tiny_checkpoint: Path, tmp_path: Path, monkeypatch
) -> None:
    trainer = _trainer(algo, mode, tiny_checkpoint, tmp_path / "out", *extra)
    try:
        assert trainer.accelerator.mixed_precision == precision
        calls = _capture(monkeypatch, trainer)
        batch = trainer.algorithm.collect(trainer, 0)
        assert len(batch.samples) == 8  # 4 episodes of 2 steps
        terms = trainer.update(batch.samples)
    finally:
        trainer.close()
    first, second = _minibatches(calls)
    ppo_first = [c for c in first if c[0] == "ppo"]
    assert len(ppo_first) == 2  # minibatch of 4 samples, micro-batches of 2
    for _, log_ratio, stats in ppo_first:
        assert log_ratio.numel() > 0
        assert torch.equal(log_ratio, torch.zeros_like(log_ratio))  # exactly, not approximately
        assert stats["clip_fraction"] == 0.0 and stats["ratio_mean"] == 1.0 and stats["approx_kl"] == 0.0
    assert [c[1] for c in first if c[0] == "kl"] == [0.0, 0.0]
    # after the first optimizer step the same old log-probs no longer match: they are the
    # pre-update policy's, not refreshed per minibatch
    assert any(not torch.equal(c[1], torch.zeros_like(c[1])) for c in second if c[0] == "ppo")
    assert "old_logprob/rollout_gap" in terms and terms["old_logprob/rollout_gap_max"] >= 0.0
    for sample in batch.samples:
        step = sample if isinstance(sample.step, int) else sample.step  # ENVRL wraps each step sample
        assert step.rollout_logprobs is not None and len(step.rollout_logprobs) == len(step.old_logprobs)
        assert step.ref_logprobs == step.old_logprobs  # the reference is the starting weights


def test_under_bf16_the_samplers_log_probs_and_an_early_reference_copy_are_off(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch
) -> None:
    """The facts the old-policy pass and the reference's placement answer: with bf16 autocast the
    KV-cached sampler's token log-probs differ from the training pass's by > 1e-4 (about 1e-3 on
    this model), and a reference copied before ``accelerator.prepare`` (float32, no autocast)
    differs from the policy at the same weights by as much; in float32 the sampler is within 1e-5."""
    from accelerate.state import AcceleratorState
    from transformers import AutoModelForCausalLM

    gaps = {}
    for mode in ("no", "bf16"):
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", mode)
        AcceleratorState._reset_state(reset_partial_state=True)
        trainer = _trainer("grpo", "generate", tiny_checkpoint, tmp_path / mode)
        try:
            batch = trainer.algorithm.collect(trainer, 0)
            trainer.score_old_policy([batch.samples])
            gaps[mode] = max(
                abs(a - b) for s in batch.samples for a, b in zip(s.rollout_logprobs or [], s.old_logprobs)
            )
            if mode == "bf16":
                # the starting weights as a module accelerate never patched: what a copy made
                # before prepare is
                early = AutoModelForCausalLM.from_pretrained(tiny_checkpoint).eval()
                with torch.no_grad():
                    plain = trainer.policy.logprobs(batch.samples, model=early)
                    policy = trainer.policy.logprobs(batch.samples)
                diff = (plain.logprobs - policy.logprobs)[policy.mask.bool()].abs().max()
                assert float(diff) > 1e-4
        finally:
            trainer.close()
            AcceleratorState._reset_state(reset_partial_state=True)
    assert gaps["bf16"] > 1e-4
    assert gaps["no"] < 1e-5
