"""One tiny training iteration of every algorithm on every env; exact resume; the leaderboard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from envrl.training.algorithms import algorithm_class  # noqa: E402
from envrl.training.config import build_config  # noqa: E402
from envrl.training.loop import Trainer, train  # noqa: E402


def env_settings(env: str, tw_cache: Path) -> tuple[list[str], dict[str, Any], str]:
    """(--set items, gym.make kwargs, split) that keep each env small and fast in tests."""
    if env == "textworld":
        kwargs = {"cache_dir": str(tw_cache), "families": ["custom"]}
        return [f"rollout.env_kwargs={json.dumps(kwargs)}", "rollout.tasks=1"], kwargs, "train"
    if env == "scienceworld":
        kwargs = {"task": "4-2", "java_heap": "256m"}
        return [f"rollout.env_kwargs={json.dumps(kwargs)}", "rollout.split=dev"], kwargs, "dev"
    if env == "alfworld":
        return ["rollout.split=valid_seen", "rollout.tasks=2"], {}, "valid_seen"
    return ["rollout.tasks=2"], {}, "train"


def tiny_config(algo: str, env: str, model: Path, out: Path, tw_cache: Path, *extra: str):
    sets, _, _ = env_settings(env, tw_cache)
    return build_config(
        algo,
        env,
        algorithm_config=algorithm_class(algo).Config,
        sets=[
            f"policy.model={model}",
            f"out={out}",
            "updates=1",
            "policy.template=action",
            "policy.history=1",
            "policy.max_new_tokens=8",
            "policy.device=cpu",
            "rollout.groups=1",
            "rollout.group_size=2",
            "rollout.max_steps=2",
            "eval.episodes=0",
            "optim.lr=1e-3",
            "algorithm.kl_coef=0.01" if algo != "sft" else "algorithm.batch_size=4",
            *sets,
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def expert_data(tmp_path_factory, tw_cache):
    """``expert_data(env)``: one expert episode of ``env``, as `envrl data expert` writes it (made once)."""
    from envrl.training.data import collect_expert_data

    made: dict[str, Path] = {}

    def get(env: str) -> Path:
        if env not in made:
            _, kwargs, split = env_settings(env, tw_cache)
            folder = tmp_path_factory.mktemp(f"data-{env}")
            collect_expert_data(env, split, 1, folder, agent="expert", template="action", history=1, env_kwargs=kwargs)
            made[env] = folder
        return made[env]

    return get


ALGOS_AND_ENVS = [
    pytest.param(algo, env, marks=[pytest.mark.slow] if (algo, env) == ("sft", "scienceworld") else [])
    for algo in ("sft", "grpo", "gigpo")
    for env in ("textworld", "alfworld", "webshop", "scienceworld")
]


# SFT on ScienceWorld is slow only for its data (a JVM and a gold path): its update is SFT's on any env
@pytest.mark.parametrize("algo, env", ALGOS_AND_ENVS)
def test_one_tiny_iteration(algo: str, env: str, tiny_checkpoint: Path, tmp_path: Path, tw_cache, expert_data) -> None:
    mode = "choose" if algo == "gigpo" else "generate"  # both action modes, on every env
    extra = [f"policy.action_mode={mode}"]
    if algo == "sft":
        extra.append(f"algorithm.data={expert_data(env)}")
    config = tiny_config(algo, env, tiny_checkpoint, tmp_path / "out", tw_cache, *extra)
    train(config, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [row["update"] for row in rows] == [1]
    row = rows[0]
    assert torch.isfinite(torch.tensor(row["loss"]))
    if algo == "sft":
        assert row["loss/sft"] > 0
    else:
        assert row["trajectories"] + row["dropped_trajectories"] == 2
        assert 2 <= row["samples"] <= 4  # 2 episodes of at most 2 steps
        for key in ("success_rate", "return", "turns", "advantage/mean", "ppo/clip_fraction", "entropy", "kl"):
            assert key in row, key
        if mode == "choose":
            assert row["format_valid_ratio"] == 1.0  # choose mode always answers with an admissible action
    model = tmp_path / "out" / "checkpoints" / "update-000001" / "model"
    assert (model / "config.json").is_file() and (model / "tokenizer.json").is_file()


def test_sft_on_the_choice(tiny_checkpoint: Path, tmp_path: Path, tw_cache, expert_data) -> None:
    """objective=choice: the loss is -log p(expert action | admissible actions), one unit per step."""
    extra = [f"algorithm.data={expert_data('textworld')}", "algorithm.objective=choice", "policy.action_mode=choose"]
    config = tiny_config("sft", "textworld", tiny_checkpoint, tmp_path / "out", tw_cache, *extra)
    trainer = Trainer(config)
    try:
        demos = trainer.algorithm.demonstrations
        assert demos and all(d.candidate_ids and d.candidate_ids[d.choice] == d.response_ids for d in demos)
        with torch.no_grad():
            loss, _ = trainer.algorithm.compute_loss(trainer, demos)
            scores = trainer.policy.logprobs(demos, temperature=1.0)
        assert scores.mask.sum(1).tolist() == [1.0] * len(demos)
        assert float(loss) == pytest.approx(-float(scores.logprobs[:, 0].mean()), abs=1e-6)
    finally:
        trainer.close()


def _weights(out: Path, update: int) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(out / "checkpoints" / f"update-{update:06d}" / "model" / "model.safetensors"))


@pytest.mark.parametrize("mode", ["choose", pytest.param("generate", marks=pytest.mark.slow)])
def test_a_resumed_run_continues_bit_for_bit(mode: str, tiny_checkpoint: Path, tmp_path: Path, tw_cache) -> None:
    # an entropy bonus gives every update a gradient, even when a batch has no success (all advantages 0)
    settings = [f"policy.action_mode={mode}", "save_every=1", "algorithm.entropy_coef=0.01"]
    straight = tiny_config("grpo", "textworld", tiny_checkpoint, tmp_path / "a", tw_cache, "updates=2", *settings)
    train(straight, progress=False)
    split = tiny_config("grpo", "textworld", tiny_checkpoint, tmp_path / "b", tw_cache, "updates=2", *settings)
    train(split, stop_after=1, progress=False)
    assert not (tmp_path / "b" / "checkpoints" / "update-000002").exists()
    train(split, progress=False)  # a new process would do the same: everything comes from the folder
    # a run of 1 update continued to 2 (its constant schedule does not depend on the total)
    short = tiny_config("grpo", "textworld", tiny_checkpoint, tmp_path / "c", tw_cache, "updates=1", *settings)
    train(short, progress=False)
    train(tiny_config("grpo", "textworld", tiny_checkpoint, tmp_path / "c", tw_cache, "updates=2", *settings))
    a = _weights(tmp_path / "a", 2)
    assert any(not torch.equal(a[k], _weights(tmp_path / "a", 1)[k]) for k in a)  # it did learn something
    strip = ("time/", "tokens_per_s")
    lines_a = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    clean = [{k: v for k, v in json.loads(x).items() if not k.startswith(strip)} for x in lines_a]
    for other in ("b", "c"):
        b = _weights(tmp_path / other, 2)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), other
        lines_b = (tmp_path / other / "metrics.jsonl").read_text().splitlines()
        assert clean == [{k: v for k, v in json.loads(x).items() if not k.startswith(strip)} for x in lines_b]


@pytest.mark.slow  # ~16 s: two evaluation runs in worker processes
def test_evaluations_reach_the_leaderboard(tiny_checkpoint: Path, tmp_path: Path, tw_cache) -> None:
    from envrl.evaluation.leaderboard import leaderboard

    runs = tmp_path / "runs"
    config = tiny_config(
        "grpo",
        "textworld",
        tiny_checkpoint,
        tmp_path / "demo-run",
        tw_cache,
        "eval.episodes=1",
        "eval.splits=[valid]",
        f"eval.runs_dir={runs}",
        "policy.action_mode=choose",
    )
    evaluations = train(config, progress=False)
    assert set(evaluations) == {"demo-run@0/valid", "demo-run@1/valid"}
    table = leaderboard(str(runs), "text")
    assert "demo-run@0" in table and "demo-run@1" in table


def test_a_dead_env_worker_drops_its_trajectory(tiny_checkpoint: Path, tmp_path: Path, tw_cache) -> None:
    """Kill one env's worker mid-rollout: the batch goes on, that trajectory is counted as dropped."""
    import os
    import signal

    config = tiny_config("grpo", "textworld", tiny_checkpoint, tmp_path / "out", tw_cache, "rollout.max_steps=3")
    trainer = Trainer(config)
    try:
        rollout = trainer._rollouts()
        original_step = rollout.vec.step
        calls = {"n": 0}

        def step_and_kill(actions):
            calls["n"] += 1
            if calls["n"] == 2:
                os.kill(rollout.vec.pids[0], signal.SIGKILL)
            return original_step(actions)

        rollout.vec.step = step_and_kill
        batch = trainer.play(0)
    finally:
        trainer.close()
    assert batch.dropped == 1
    assert {s.trajectory_id for s in batch.samples} == {1}
