"""ENVRL: the SP and ID samples and their masks, the weights' decay, the transitions used, the loss's
weighting through the shared loop (equal to the base algorithm's with both weights 0), the
configuration errors, and one tiny iteration on every env.

Most tests build their rollouts by hand (a fake ``Trainer.play``), so the loop's update runs on
known samples without playing an env; the tiny iterations play the real envs.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from envrl.agents.prompts import Turn  # noqa: E402
from envrl.training.algorithms import (  # noqa: E402
    ALGORITHMS,
    ENVRL,
    GRPO,
    GRPO_FAMILY,
    RLOO,
    ENVRLConfig,
    GRPOConfig,
    algorithm_class,
)
from envrl.training.algorithms.envrl import aux_weight, pick_transitions, transition_steps  # noqa: E402
from envrl.training.config import ConfigError, PolicyConfig, build_config  # noqa: E402
from envrl.training.loop import Trainer  # noqa: E402
from envrl.training.policy import Policy, common_prefix_length  # noqa: E402
from envrl.training.rollout import RolloutBatch, StepSample, Trajectory  # noqa: E402

INSTRUCTION = "Take the key from the chest, then go east."
#: one episode's observations s_0..s_3, actions a_0..a_2 and admissible actions at s_0..s_2
OBSERVATIONS = [
    "-= Cellar =-\nYou are in a cellar. There is a closed chest here.",
    "You open the chest, revealing a key.",
    "You take the key from the chest.",
    "-= Hall =-\nYou are in a hall.",
]
ACTIONS = ["open chest", "take key from chest", "go east"]
ADMISSIBLE = [["open chest", "go east"], ["take key from chest", "close chest"], ["go east", "look"]]


def _step(**fields: Any) -> StepSample:
    defaults: dict[str, Any] = {
        "prompt_ids": [1, 2],
        "response_ids": [3],
        "old_logprobs": [-1.0],
        "candidate_ids": None,
        "choice": None,
        "action": "look",
        "reward": 0.0,
        "observation": "O",
        "next_observation": "P",
        "anchor": "O",
        "valid": True,
        "env_valid": True,
        "done": False,
        "truncated": False,
        "group_id": 0,
        "trajectory_id": 0,
        "step": 0,
        "task_id": "t",
        "instruction": "T",
        "messages": [{"role": "user", "content": "T O"}],
    }
    return StepSample(**{**defaults, **fields})


def _policy(checkpoint: Path, history: int = 1) -> Policy:
    return Policy(PolicyConfig(model=str(checkpoint), device="cpu", template="action", history=history), "textworld")


def _episode(policy: Policy, trajectory: int, length: int, reward: float, mode: str) -> list[StepSample]:
    """``length`` steps of the episode above; the last one is done when it wins (reward > 0), else
    truncated. The RL prompts are short stand-ins (what the loop tests need is their tokens); the
    history is the policy's window, as rollouts record it."""
    steps = []
    turns: list[Turn] = []
    window = policy.config.history
    for t in range(length):
        shown = turns[-window:] if window else []
        messages = [{"role": "user", "content": f"{INSTRUCTION}\n{OBSERVATIONS[t]}"}]
        candidates, choice = None, None
        response = policy.encode_response(policy.template.format_response(ACTIONS[t]))
        if mode == "choose":
            candidates = [policy.encode_response(policy.template.format_response(a)) for a in ADMISSIBLE[t]]
            choice = ADMISSIBLE[t].index(ACTIONS[t])
        last = t == length - 1
        steps.append(
            _step(
                prompt_ids=policy.encode_prompt(messages),
                response_ids=response,
                candidate_ids=candidates,
                choice=choice,
                action=ACTIONS[t],
                reward=reward if last else 0.0,
                observation=OBSERVATIONS[t],
                next_observation=OBSERVATIONS[t + 1],
                anchor=OBSERVATIONS[t],
                done=last and reward > 0,
                truncated=last and reward == 0,
                trajectory_id=trajectory,
                step=t,
                instruction=INSTRUCTION,
                history=list(shown),
                messages=messages,
            )
        )
        turns.append(Turn(OBSERVATIONS[t], ACTIONS[t]))
    with torch.no_grad():
        scores = policy.logprobs(steps)
    for row, step in enumerate(steps):
        step.old_logprobs = scores.logprobs[row, : int(scores.mask[row].sum())].tolist()
    return steps


def _rollout(policy: Policy, mode: str) -> RolloutBatch:
    """One group of two episodes: a win in 3 steps and a 2-step episode cut short (3 transitions)."""
    samples = _episode(policy, 0, 3, 1.0, mode) + _episode(policy, 1, 2, 0.0, mode)
    trajectories = [Trajectory(0, 0, "t", 0, 3, 1.0, True, 1.0), Trajectory(0, 1, "t", 0, 2, 0.0, False, 0.0)]
    return RolloutBatch(samples=samples, trajectories=trajectories)


def _config(algo: str, checkpoint: Path, out: Path, *sets: str):
    return build_config(
        algo,
        "textworld",
        algorithm_config=algorithm_class(algo).Config,
        sets=[
            f"policy.model={checkpoint}",
            f"out={out}",
            "updates=4",
            "policy.template=action",
            "policy.history=1",
            "policy.device=cpu",
            "rollout.group_size=2",
            "eval.episodes=0",
            "optim.lr=1e-3",
            *sets,
        ],
    )


def _trainer(algo: str, checkpoint: Path, out: Path, *sets: str) -> Trainer:
    """A trainer whose rollouts are :func:`_rollout`'s (no env is played)."""
    trainer = Trainer(_config(algo, checkpoint, out, *sets))
    rollout = _rollout(trainer.policy, trainer.config.policy.action_mode)
    trainer.play = lambda update: copy.deepcopy(rollout)  # type: ignore[method-assign]
    return trainer


def _token_mean(policy: Policy, samples: list[Any]) -> float:
    """-log p over all the samples' response tokens, token mean, from plain forward passes."""
    total, count = 0.0, 0
    for sample in samples:
        ids = torch.tensor([sample.prompt_ids + sample.response_ids])
        with torch.no_grad():
            log_probs = torch.log_softmax(policy.unwrapped(input_ids=ids).logits[0].float(), dim=-1)
        start = len(sample.prompt_ids)
        total -= sum(float(log_probs[start - 1 + j, t]) for j, t in enumerate(sample.response_ids))
        count += len(sample.response_ids)
    return total / count


# ---- the auxiliary samples ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["generate", "choose"])
def test_sp_scores_the_next_observation_and_id_the_action(mode: str, tiny_checkpoint: Path) -> None:
    policy = _policy(tiny_checkpoint)
    envrl = ENVRL(ENVRLConfig(kl_coef=0.0))
    messages = [
        {"role": "system", "content": "Play the text game."},
        {"role": "user", "content": "Task: Take the key.\n\nYou open the chest, revealing a key."},
    ]
    prompt = policy.encode_prompt(messages)
    response = policy.encode_response("<action>take key from chest</action>")
    candidates = [policy.encode_response(f"<action>{a}</action>") for a in ("close chest", "take key from chest")]
    step = _step(
        prompt_ids=prompt,
        response_ids=response,
        candidate_ids=candidates if mode == "choose" else None,
        choice=1 if mode == "choose" else None,
        old_logprobs=[-1.0] if mode == "choose" else [-1.0] * len(response),
        messages=messages,
        instruction="Take the key.",
        observation="You open the chest, revealing a key.",
        action="take key from chest",
        next_observation="You take the key from the chest.",
    )
    sp, inverse = envrl.aux_samples(policy, step)
    assert (sp.kind, inverse.kind) == ("state_prediction", "inverse_dynamics")
    # the default (follow-up) prompts continue the policy's own conversation at s_t
    sp_messages = [
        *messages,
        {"role": "assistant", "content": "<action>take key from chest</action>"},
        {"role": "user", "content": "What does the environment show next?"},
    ]
    id_messages = [
        *messages,
        {"role": "assistant", "content": "<action>?</action>"},
        {"role": "user", "content": "You take the key from the chest.\n\nWhich action is the '?'?"},
    ]
    tokens = policy.tokenizer
    next_tokens = tokens("You take the key from the chest.", add_special_tokens=False)["input_ids"]
    answer = tokens("<action>take key from chest</action>", add_special_tokens=False)["input_ids"]
    # ID scores the action's tokens only: the answer's "<", "action" end its prompt (BPE merged the
    # tag's ">" with the action's "t": that token is scored), "</", "action", ">" and the end of
    # turn are dropped (tests/test_dynamics_targets.py checks the formats by hand)
    assert [tokens.decode([i]) for i in answer[:3]] == ["<", "action", ">t"]
    assert tokens.decode(answer[-3:]) == "</action>"
    assert sp.prompt_ids == policy.encode_prompt(sp_messages)
    assert inverse.prompt_ids == policy.encode_prompt(id_messages) + answer[:2]
    assert sp.prompt_ids[: len(prompt)] == prompt and inverse.prompt_ids[: len(prompt)] == prompt
    assert sp.response_ids == next_tokens + [policy.end_id]  # SP keeps its end-of-turn token
    assert inverse.response_ids == answer[2:-3]
    assert tokens.decode(inverse.response_ids) == ">take key from chest"
    with torch.no_grad():
        scores = policy.logprobs([sp, inverse], temperature=1.0)
    assert scores.mask.sum(1).tolist() == [len(next_tokens) + 1, len(answer) - 5]
    # a prompt cut to the context (its start dropped) is continued as the policy saw it
    cut = envrl.aux_samples(policy, dataclasses.replace(step, prompt_ids=prompt[4:]))
    assert [a.prompt_ids for a in cut] == [a.prompt_ids[4:] for a in (sp, inverse)]
    # the loss of a batch of this one transition: the RL term plus each weight times its token mean,
    # SP and ID scored in the step's own packed row in choose mode
    samples, metrics = envrl.attach(policy, [step], update=0, updates=4, seed=0, rank=0)
    assert metrics["aux/transitions"] == 1 and metrics["aux/samples"] == 2
    assert (metrics["weight/sp"], metrics["weight/id"]) == (0.01, 0.001)  # the defaults, from the sweep
    trainer = SimpleNamespace(policy=policy)
    with torch.no_grad():
        loss, terms = envrl.compute_loss(trainer, samples)
        rl, _ = envrl.base.compute_loss(trainer, [step])
    assert terms["loss/sp"] == pytest.approx(_token_mean(policy, [sp]), rel=1e-5)  # float32, another summation order
    assert terms["loss/id"] == pytest.approx(_token_mean(policy, [inverse]), rel=1e-5)
    assert terms["loss/rl"] == pytest.approx(float(rl), abs=1e-6)
    assert float(loss) == pytest.approx(float(rl) + 0.01 * terms["loss/sp"] + 0.001 * terms["loss/id"], abs=1e-6)


def test_the_shared_start_pair_writes_the_state_identically(tiny_checkpoint: Path) -> None:
    """The standalone pair envrl-state-prediction / envrl-inverse-dynamics (the defaults before the
    follow-up pair) writes its own state text, the same in both rows, which share it token for token."""
    policy = _policy(tiny_checkpoint)
    envrl = ENVRL(ENVRLConfig(sp_template="envrl-state-prediction", id_template="envrl-inverse-dynamics"))
    step = _step(
        instruction="Take the key.",
        history=[Turn("-= Cellar =-\nA chest.", "look"), Turn("A closed chest.", "open chest")],
        observation="You open the chest, revealing a key.",
        action="take key from chest",
        next_observation="You take the key from the chest.",
    )
    sp, inverse = envrl.aux_samples(policy, step)
    system = "A text environment's transcript: each observation, then the action after '> '. Fill in what is missing."
    state = "Task: Take the key.\n\nA closed chest.\n> open chest\n\nYou open the chest, revealing a key.\n> "
    sp_user = state + "take key from chest\n\nWhat does the environment show next?"
    id_user = state + "?\n\nYou take the key from the chest.\n\nWhich action is the '?'?"
    assert sp.prompt_ids == policy.encode_prompt(
        [{"role": "system", "content": system}, {"role": "user", "content": sp_user}]
    )
    answer = policy.encode_response("<action>take key from chest</action>")
    id_question = policy.encode_prompt([{"role": "system", "content": system}, {"role": "user", "content": id_user}])
    assert inverse.prompt_ids == id_question + answer[:2]  # "<", "action": the format text before the action
    shared = policy.tokenizer.decode(sp.prompt_ids[: common_prefix_length([sp.prompt_ids, inverse.prompt_ids])])
    assert system in shared and shared.rstrip().endswith(state.rstrip())  # up to "> " (a BPE merge aside)
    assert sp.response_ids == policy.encode_response("You take the key from the chest.")
    # the action's tokens ("<", "action" end the prompt, ">t" carries the action's "t"), the
    # closing tag and the end-of-turn token dropped
    assert inverse.prompt_ids[-2:] + inverse.response_ids == answer[:-4]
    assert policy.tokenizer.decode(inverse.response_ids) == ">take key from chest"


def test_only_format_valid_steps_that_continue_are_transitions(tiny_checkpoint: Path) -> None:
    steps = [
        _step(),
        _step(done=True),  # terminated: no next state to act on
        _step(truncated=True),
        _step(valid=False, action=""),  # the empty placeholder action was sent
        _step(env_valid=False),  # the env refused the action: still a transition (the env said so)
    ]
    assert transition_steps(steps) == [0, 4]
    envrl = ENVRL(ENVRLConfig(id=False))
    samples, metrics = envrl.attach(_policy(tiny_checkpoint), steps, update=0, updates=1, seed=0, rank=0)
    assert [len(s.aux) for s in samples] == [1, 0, 0, 0, 1]
    assert [a.kind for s in samples for a in s.aux] == ["state_prediction"] * 2
    assert metrics["aux/transitions"] == 2 and metrics["aux/samples"] == 2
    assert metrics["weight/id"] == 0.0  # switched off: logged as the weight applied
    assert [s.step for s in samples] == steps


def test_aux_fraction_draws_the_rounded_share_of_transitions_per_update(tiny_checkpoint: Path) -> None:
    # round() is Python's (half to even): 5 * 0.5 = 2.5 -> 2, 5 * 0.7 = 3.5 -> 4
    assert [len(pick_transitions(5, f, 0, 0, 0)) for f in (0.2, 0.5, 0.7, 1.0)] == [1, 2, 4, 5]
    assert pick_transitions(5, 1.0, 0, 3, 0) == [0, 1, 2, 3, 4]
    expected = sorted(int(k) for k in np.random.default_rng([7, 3, 1, 3]).choice(5, 2, replace=False))
    assert pick_transitions(5, 0.5, seed=7, update=3, rank=1) == expected
    draws = {tuple(pick_transitions(5, 0.5, 0, update, 0)) for update in range(8)}
    assert len(draws) > 1  # another update, another draw
    assert all(set(d) <= set(range(5)) and list(d) == sorted(d) for d in draws)
    # through attach: the drawn positions index the eligible steps, the same on every call
    steps = [_step(done=k == 2) for k in range(6)]  # 5 transitions, step 2 is terminal
    policy = _policy(tiny_checkpoint)
    envrl = ENVRL(ENVRLConfig(aux_fraction=0.5, sp=False))
    samples, metrics = envrl.attach(policy, steps, update=3, updates=4, seed=7, rank=1)
    eligible = [0, 1, 3, 4, 5]
    assert [i for i, s in enumerate(samples) if s.aux] == [eligible[k] for k in expected]
    assert metrics["aux/transitions"] == 2
    again, _ = envrl.attach(policy, steps, update=3, updates=4, seed=7, rank=1)
    assert [s.aux for s in again] == [s.aux for s in samples]


# ---- the weights -------------------------------------------------------------------------------


def test_the_weights_decay_on_a_cosine_or_stay_constant() -> None:
    assert aux_weight(0.4, 0, 10, "cosine") == 0.4
    assert aux_weight(0.4, 5, 10, "cosine") == 0.2  # cos(pi / 2) is 6e-17: 1 + it rounds to 1
    assert aux_weight(0.4, 10, 10, "cosine") == 0.0
    assert aux_weight(0.4, 1, 4, "cosine") == pytest.approx(0.4 * (1 + 2**-0.5) / 2, abs=1e-15)
    assert [aux_weight(0.4, t, 10, "constant") for t in (0, 5, 10)] == [0.4, 0.4, 0.4]
    envrl = ENVRL(ENVRLConfig(sp_coef=0.3, id_coef=0.2))
    assert envrl.weights(2, 4) == {"state_prediction": 0.15, "inverse_dynamics": 0.1}
    envrl.config.sp, envrl.config.decay = False, "constant"
    assert envrl.weights(2, 4) == {"state_prediction": 0.0, "inverse_dynamics": 0.2}


# ---- through the loop ----------------------------------------------------------------------------


def _parameters(trainer: Trainer) -> dict[str, Any]:
    return {name: p.detach().clone() for name, p in trainer.policy.unwrapped.named_parameters()}


def _record_gradients(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The gradients the optimizer's next step will use (after clipping), keyed like ``_parameters``."""
    grads: dict[str, torch.Tensor] = {}
    names = {id(p): name for name, p in trainer.policy.unwrapped.named_parameters()}

    def record(optimizer: Any, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    grads[names[id(p)]] = p.grad.detach().clone()

    getattr(trainer.optimizer, "optimizer", trainer.optimizer).register_step_pre_hook(record)
    return grads


@pytest.mark.parametrize("base, mode", [("grpo", "generate"), ("gigpo", "choose")])
def test_with_both_weights_zero_an_update_is_the_base_algorithms(
    base: str, mode: str, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    common = [f"policy.action_mode={mode}", "optim.micro_batch_size=2", "algorithm.entropy_coef=0.01"]
    zero = ["algorithm.sp_coef=0", "algorithm.id_coef=0", f"algorithm.base={base}"]
    envrl = _trainer("envrl", tiny_checkpoint, tmp_path / "envrl", *common, *zero)
    plain = _trainer(base, tiny_checkpoint, tmp_path / base, *common)
    start = _parameters(plain)
    grads, base_grads = _record_gradients(envrl), _record_gradients(plain)
    try:
        batch = envrl.algorithm.collect(envrl, 0)
        expected = plain.algorithm.collect(plain, 0)
        assert [s.step for s in batch.samples] == list(expected.samples)  # same steps, advantages, order
        assert batch.metrics["aux/transitions"] == 3 and batch.metrics["aux/samples"] == 6
        terms = envrl.update(batch.samples)
        base_terms = plain.update(expected.samples)
    finally:
        envrl.close()
        plain.close()
    assert any(not torch.equal(p, start[k]) for k, p in _parameters(envrl).items())  # the update moved weights
    # SP and ID ride in the steps' packed rows (longer rows, other length groups; in generate mode
    # the response becomes a packed candidate): the same computation up to float rounding. The
    # gradients are compared, not the weights after the step: Adam's first step is ~lr * sign(g),
    # so a coordinate whose gradient is ~0 moves by +-lr on either side of any rounding change
    assert grads.keys() == base_grads.keys() and grads
    scale = max(float(g.abs().max()) for g in base_grads.values())
    for key, grad in grads.items():
        assert torch.allclose(grad, base_grads[key], rtol=1e-3, atol=1e-5 * scale), key
    assert {key: terms[key] for key in base_terms} == pytest.approx(base_terms, rel=1e-5, abs=1e-7)
    assert terms["loss/rl"] == pytest.approx(terms["loss"], abs=1e-7)  # the loop logs loss through float32
    assert terms["loss/sp"] > 0 and terms["loss/id"] > 0  # the auxiliary terms were computed, weighted 0


def test_the_aux_terms_are_the_batchs_token_means_for_any_micro_batch_size(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    sets = ["algorithm.sp_coef=0.5", "algorithm.id_coef=0.25", "algorithm.decay=constant", "optim.lr=0"]
    trainer = _trainer("envrl", tiny_checkpoint, tmp_path / "out", *sets)  # lr 0: the weights stay
    try:
        batch = trainer.algorithm.collect(trainer, 0)
        aux = [a for s in batch.samples for a in s.aux]
        sp = _token_mean(trainer.policy, [a for a in aux if a.kind == "state_prediction"])
        inverse = _token_mean(trainer.policy, [a for a in aux if a.kind == "inverse_dynamics"])
        with torch.no_grad():
            rl, _ = trainer.algorithm.base.compute_loss(trainer, [s.step for s in batch.samples])
        for size in (1, 8):
            trainer.config.optim.micro_batch_size = size
            terms = trainer.update(batch.samples)
            # float32 sums in another order: agree to ~1e-6 relative (CI saw 1.4e-6 at size 1), while
            # a mean of micro-batch means would be off by percents
            assert terms["loss/sp"] == pytest.approx(sp, rel=1e-5), size
            assert terms["loss/id"] == pytest.approx(inverse, rel=1e-5), size
            # the RL term (0.018 here) cancels per-step terms of size ~1 (advantages sum to 0), so its
            # float32 error is absolute at the terms' scale: CI saw 3e-6; a mean of per-step means is ~0
            assert terms["loss/rl"] == pytest.approx(float(rl), abs=1e-4), size
            assert terms["loss"] == pytest.approx(float(rl) + 0.5 * sp + 0.25 * inverse, rel=1e-5), size
    finally:
        trainer.close()
    assert batch.metrics["weight/sp"] == 0.5 and batch.metrics["weight/id"] == 0.25


def test_the_overhead_benchmark_counts_the_attention_pairs_of_packed_rows() -> None:
    """benchmarks/envrl_overhead.py explains ENVRL's cost by the query-key pairs its rows allow:
    checked on one step by hand (a token sees the row's start and its own branch's earlier tokens)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "envrl_overhead.py"
    spec = importlib.util.spec_from_file_location("envrl_overhead", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def row(prompt, response, candidates=None):
        return SimpleNamespace(prompt_ids=prompt, response_ids=response, candidate_ids=candidates)

    step = row([1, 2, 3, 4], [], candidates=[[5], [6, 7]])
    sp = row([1, 2, 3, 4, 8, 9], [10, 11, 12])  # continues the step's prompt: joins its row (5 tokens past it)
    inverse = row([1, 2, 13, 14], [15])  # does not: a row of its own
    sample = SimpleNamespace(step=step, aux=[sp, inverse])
    # the prompt (4): 10 pairs; candidates of 1 and 2 tokens: 1*4 + 1 and 2*4 + 3
    assert bench.attention_pairs([sample], with_aux=False) == 10 + 5 + 11
    # + SP's 5 tokens past the prompt: 5*4 + 15; the ID row alone (a group of one starts at its prompt
    # but the last token, 3 tokens, then 2 more): 6 + 2*3 + 3
    assert bench.attention_pairs([sample], with_aux=True) == 10 + 5 + 11 + 35 + 15


# ---- configuration -------------------------------------------------------------------------------


def _checked(*sets: str):
    config = build_config("envrl", "textworld", algorithm_config=ENVRLConfig, sets=list(sets))
    ENVRL(config.algorithm).check(config)
    return config


@pytest.mark.parametrize(
    "sets, message",
    [
        (["algorithm.sp_coef=-0.1"], r"^algorithm.sp_coef must be a number >= 0, got -0.1$"),
        (["algorithm.id_coef=high"], r"config key 'algorithm.id_coef' in --set .* takes a float, got 'high'"),
        (["algorithm.id_coef=.nan"], r"^algorithm.id_coef must be a number >= 0, got nan$"),
        (["algorithm.aux_fraction=0"], r"^algorithm.aux_fraction must lie in \(0, 1\], got 0.0$"),
        (["algorithm.aux_fraction=1.5"], r"^algorithm.aux_fraction must lie in \(0, 1\], got 1.5$"),
        (["algorithm.base=ppo"], r"^algorithm.base must be one of grpo, gigpo, rloo, got 'ppo'$"),
        (["algorithm.decay=linear"], r"^algorithm.decay must be cosine or constant, got 'linear'$"),
        (
            ["algorithm.sp=false", "algorithm.id=false", "algorithm.base=gigpo"],
            r"^algorithm.sp and algorithm.id are both off, and that is the base algorithm: run --algo gigpo$",
        ),
        (
            ["algorithm.omega=0.5"],
            r"^algorithm.omega is a setting of gigpo only and algorithm.base is grpo: "
            r"set algorithm.base=gigpo to use it, or leave it at 1.0$",
        ),
        (
            ["algorithm.base=rloo", "algorithm.norm=mean"],
            r"^algorithm.norm is a setting of grpo and gigpo only and algorithm.base is rloo: "
            r"set algorithm.base=grpo to use it, or leave it at 'mean_std'$",
        ),
        (["algorithm.id_template=world-model"], r"id_template must be a template of kind inverse-dynamics"),
        (["rollout.group_size=1"], r"group_size must be at least 2, got 1"),  # the base algorithm's own check
    ],
)
def test_bad_settings_are_refused_in_one_sentence(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _checked(*sets)


def test_settings_of_either_base_are_taken() -> None:
    config = _checked("algorithm.clip_eps=0.3", "algorithm.base=gigpo", "algorithm.omega=0.5", "algorithm.gamma=0.9")
    assert isinstance(config.algorithm, ENVRLConfig)
    assert (config.algorithm.clip_eps, config.algorithm.omega, config.algorithm.gamma) == (0.3, 0.5, 0.9)
    envrl = ENVRL(config.algorithm)
    assert envrl.base.name == "gigpo" and envrl.base.config is config.algorithm
    shipped = _checked()  # configs/envrl/textworld.yaml: GRPO's published settings and the aux losses
    assert shipped.policy.template == "think-action" and shipped.rollout.max_steps == 50
    assert (shipped.algorithm.base, shipped.algorithm.sp_coef, shipped.algorithm.decay) == ("grpo", 0.01, "cosine")
    with pytest.raises(ConfigError, match="algorithm.sp_coef must be a number >= 0, got 'high'"):
        ENVRL(ENVRLConfig(sp_coef="high")).check(shipped)  # type: ignore[arg-type]
    assert ALGORITHMS["envrl"] is ENVRL


def test_rloo_is_a_base_and_its_advantages_are_used() -> None:
    config = _checked("algorithm.base=rloo", "algorithm.clip_eps=0.3")
    base = ENVRL(config.algorithm).base
    assert isinstance(base, RLOO) and base.config is config.algorithm and base.config.clip_eps == 0.3
    returns = [1.0, 0.0, 0.0, 1.0]  # one group of four one-step trajectories
    samples = [SimpleNamespace(reward=r, valid=True, group_id=0, trajectory_id=i) for i, r in enumerate(returns)]
    assert base.advantages(samples) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])  # leave-one-out, not GRPO's


def test_every_grpo_family_trainer_is_a_base(monkeypatch) -> None:
    """A trainer added to GRPO_FAMILY is a valid base at once; one whose settings ENVRLConfig
    cannot hold is refused by name rather than failing mid-run."""
    for name in GRPO_FAMILY:
        assert ENVRL(_checked(f"algorithm.base={name}").algorithm).base.name == name

    class Toy(GRPO):
        name = "toy"

    @dataclasses.dataclass
    class WideConfig(GRPOConfig):
        beta: float = 1.0

    class Wide(GRPO):
        name = "wide"
        Config = WideConfig

    monkeypatch.setitem(GRPO_FAMILY, "toy", Toy)
    monkeypatch.setitem(GRPO_FAMILY, "wide", Wide)
    assert isinstance(ENVRL(_checked("algorithm.base=toy").algorithm).base, Toy)
    with pytest.raises(
        ConfigError, match=r"^algorithm.base=wide reads settings ENVRLConfig lacks \(beta\): add them to ENVRLConfig$"
    ):
        _checked("algorithm.base=wide")


# ---- one tiny iteration per env -----------------------------------------------------------------

# choose mode: the tiny random model's generated responses are rarely format-valid, and only
# format-valid steps are transitions; every env's pair costs a run (~5 s): TextWorld by default
TINY_RUNS = [
    pytest.param("textworld", "grpo"),
    pytest.param("textworld", "rloo", marks=pytest.mark.slow),
    pytest.param("alfworld", "gigpo", marks=pytest.mark.slow),
    pytest.param("webshop", "grpo", marks=pytest.mark.slow),
    pytest.param("scienceworld", "gigpo", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("env, base", TINY_RUNS)
def test_one_tiny_iteration(env: str, base: str, tiny_checkpoint: Path, tmp_path: Path, tw_cache) -> None:
    from test_training_envs import tiny_config

    extra = ["policy.action_mode=choose", f"algorithm.base={base}"]
    trainer = Trainer(tiny_config("envrl", env, tiny_checkpoint, tmp_path / "out", tw_cache, *extra))
    batches = []
    collect = trainer.algorithm.collect

    def recorded(t: Any, update: int) -> Any:
        batches.append(collect(t, update))
        return batches[-1]

    trainer.algorithm.collect = recorded  # type: ignore[method-assign]
    try:
        trainer.run(progress=False)
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [row["update"] for row in rows] == [1]
    assert (rows[0]["weight/sp"], rows[0]["weight/id"]) == (0.01, 0.001)  # the first update: the start weights
    for row, batch in zip(rows, batches):
        steps = [s.step for s in batch.samples]
        # the policy's view of each state: the instruction, and the one past turn its window shows
        by_trajectory: dict[int, list[StepSample]] = {}
        for step in steps:
            by_trajectory.setdefault(step.trajectory_id, []).append(step)
        for trajectory in by_trajectory.values():
            assert trajectory[0].instruction and {s.instruction for s in trajectory} == {trajectory[0].instruction}
            assert trajectory[0].history == []
            for before, step in zip(trajectory, trajectory[1:]):
                assert [(t.observation, t.action) for t in step.history] == [(before.observation, before.action)]
        # the rollout recorded each step's prompt messages; its SP and ID rows continue that very prompt
        for sample in batch.samples:
            step = sample.step
            assert step.messages[-1]["role"] == "user" and step.observation[-40:] in step.messages[-1]["content"]
            assert trainer.policy.encode_prompt(step.messages)[-len(step.prompt_ids) :] == step.prompt_ids
            assert all(a.prompt_ids[: len(step.prompt_ids)] == step.prompt_ids for a in sample.aux)
        transitions = len(transition_steps(steps))
        assert row["aux/transitions"] == transitions and row["aux/samples"] == 2 * transitions
        assert row["valid_action_ratio"] >= 0 and row["format_valid_ratio"] == 1.0
        if transitions:
            assert row["loss/sp"] > 0 and row["loss/id"] > 0
            weighted = row["loss/rl"] + row["weight/sp"] * row["loss/sp"] + row["weight/id"] * row["loss/id"]
            assert row["loss"] == pytest.approx(weighted, rel=1e-5)
        for key in ("success_rate", "advantage/mean", "ppo/clip_fraction", "entropy", "kl"):
            assert key in row, key
    assert any(len(transition_steps([s.step for s in b.samples])) for b in batches)
    assert (tmp_path / "out" / "checkpoints" / "update-000001" / "model" / "config.json").is_file()


def test_cosine_weights_tie_a_run_to_its_total() -> None:
    """A cosine run cannot be continued to more updates (its weights would have decayed differently)."""
    assert ENVRL(_checked().algorithm).depends_on_updates()
    assert not ENVRL(_checked("algorithm.decay=constant").algorithm).depends_on_updates()
