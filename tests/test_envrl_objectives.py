"""ENVRL's auxiliary objectives are a table: a row added to it is built, checked, weighed, scored and
logged by the loss with no other edit."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from envrl.training.algorithms import envrl as envrl_module  # noqa: E402
from envrl.training.algorithms.envrl import (  # noqa: E402
    ENVRL,
    OBJECTIVES,
    ENVRLConfig,
    Objective,
    inverse_dynamics_row,
    state_prediction_row,
)
from envrl.training.config import ConfigError, PolicyConfig  # noqa: E402
from envrl.training.dynamics import AnyWorldModelTemplate, TargetSample, state_prediction_sample  # noqa: E402
from envrl.training.policy import Policy  # noqa: E402
from envrl.training.rollout import StepSample  # noqa: E402


def test_the_shipped_table_is_sp_then_id() -> None:
    assert [(r.kind, r.name, r.template_kind, r.switch, r.coef, r.template, r.decay) for r in OBJECTIVES] == [
        ("state_prediction", "sp", "state-prediction", "sp", "sp_coef", "sp_template", "decay"),
        ("inverse_dynamics", "id", "inverse-dynamics", "id", "id_coef", "id_template", "decay"),
    ]
    assert [r.build for r in OBJECTIVES] == [state_prediction_row, inverse_dynamics_row]


# ---- a toy objective, added in the test -----------------------------------------------------------


def echo_row(policy: Any, template: AnyWorldModelTemplate, step: StepSample) -> TargetSample:
    """A toy objective: after the action, repeat the observation the policy acted on."""
    sample = state_prediction_sample(
        policy, template, step.instruction, step.history, step.observation, step.action, step.observation
    )
    return dataclasses.replace(sample, kind="echo")


ECHO = Objective("echo", "echo", "state-prediction", echo_row, "echo", "echo_coef", "echo_template", "echo_decay")


@dataclasses.dataclass
class EchoConfig(ENVRLConfig):
    """ENVRL's config with the toy objective's keys (a real row adds them to ENVRLConfig)."""

    echo: bool = True
    echo_coef: float = 0.5
    echo_template: str = "envrl-state-prediction"  # its own state text: scored in the extra pass
    echo_decay: str = "constant"


@pytest.fixture
def with_echo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envrl_module, "OBJECTIVES", (*OBJECTIVES, ECHO))


def _step(policy: Policy) -> StepSample:
    messages = [
        {"role": "system", "content": "Play the text game."},
        {"role": "user", "content": "Task: Take the key.\n\nYou open the chest, revealing a key."},
    ]
    response = policy.encode_response("<action>take key from chest</action>")
    return StepSample(
        prompt_ids=policy.encode_prompt(messages),
        response_ids=response,
        old_logprobs=[-1.0] * len(response),
        candidate_ids=None,
        choice=None,
        action="take key from chest",
        reward=1.0,
        observation="You open the chest, revealing a key.",
        next_observation="You take the key from the chest.",
        anchor="You open the chest, revealing a key.",
        valid=True,
        env_valid=True,
        done=False,
        truncated=False,
        group_id=0,
        trajectory_id=0,
        step=0,
        task_id="t",
        instruction="Take the key.",
        messages=messages,
    )


def _token_sum(policy: Policy, sample: TargetSample) -> tuple[float, int]:
    """-log p of the sample's response tokens, summed, from one plain forward pass, and their number."""
    ids = torch.tensor([sample.prompt_ids + sample.response_ids])
    with torch.no_grad():
        log_probs = torch.log_softmax(policy.unwrapped(input_ids=ids).logits[0].float(), dim=-1)
    start = len(sample.prompt_ids)
    return -sum(float(log_probs[start - 1 + j, t]) for j, t in enumerate(sample.response_ids)), len(sample.response_ids)


@pytest.mark.usefixtures("with_echo")
def test_a_row_added_to_the_table_is_built_weighed_scored_and_logged(tiny_checkpoint: Path) -> None:
    policy = Policy(PolicyConfig(model=str(tiny_checkpoint), device="cpu", template="action", history=1), "textworld")
    envrl = ENVRL(EchoConfig(kl_coef=0.0))
    step = _step(policy)
    assert envrl.kinds == ["state_prediction", "inverse_dynamics", "echo"]
    sp, inverse, echo = envrl.aux_samples(policy, step)
    assert echo.kind == "echo"
    # the toy's prompt is its template's own state text (the action shown), its target s_t itself
    system = "A text environment's transcript: each observation, then the action after '> '. Fill in what is missing."
    user = (
        "Task: Take the key.\n\nYou open the chest, revealing a key.\n> take key from chest\n\n"
        "What does the environment show next?"
    )
    assert echo.prompt_ids == policy.encode_prompt(
        [{"role": "system", "content": system}, {"role": "user", "content": user}]
    )
    assert echo.response_ids == policy.encode_response("You open the chest, revealing a key.")
    # weighed: its own coefficient and schedule (constant), logged under its name; SP's and ID's unchanged
    samples, metrics = envrl.attach(policy, [step], update=2, updates=4, seed=0, rank=0)
    assert metrics["aux/samples"] == 3
    assert metrics["weight/echo"] == 0.5
    assert (metrics["weight/sp"], metrics["weight/id"]) == (0.005, 0.0005)  # cosine at t = T / 2
    assert envrl.weights(2, 4)["echo"] == 0.5
    # scored: the loss adds 0.5 times its token mean, which one plain forward pass gives
    trainer = SimpleNamespace(policy=policy)
    with torch.no_grad():
        loss, terms = envrl.compute_loss(trainer, samples)
    total, count = _token_sum(policy, echo)
    assert count == len(echo.response_ids) and count > 0
    assert terms["loss/echo"] == pytest.approx(total / count, rel=1e-5)  # float32, another summation order
    expected = terms["loss/rl"] + 0.005 * terms["loss/sp"] + 0.0005 * terms["loss/id"] + 0.5 * terms["loss/echo"]
    assert float(loss) == pytest.approx(expected, abs=1e-6)
    # the row's term is the batch's token mean: rl_units / (its tokens * the micro-batch's rl units) times its sum
    assert samples[0].scale.per_token["echo"] == len(step.response_ids) / count
    assert not math.isclose(terms["loss/echo"], terms["loss/sp"])  # another target, another value


@pytest.mark.usefixtures("with_echo")
def test_the_rows_config_keys_are_checked(tiny_checkpoint: Path) -> None:
    with pytest.raises(ConfigError, match=r"^algorithm.echo_coef must be a number >= 0, got -1$"):
        ENVRL(EchoConfig(echo_coef=-1)).check(None)
    with pytest.raises(ConfigError, match=r"^algorithm.echo_decay must be cosine or constant, got 'step'$"):
        ENVRL(EchoConfig(echo_decay="step")).check(None)
    with pytest.raises(ConfigError, match="algorithm.echo_template must be a template of kind state-prediction"):
        ENVRL(EchoConfig(echo_template="inverse-dynamics")).template("echo")
    with pytest.raises(ConfigError, match=r"^algorithm.sp and algorithm.id and algorithm.echo are all off"):
        ENVRL(EchoConfig(sp=False, id=False, echo=False)).check(None)
    # off: not built, weighed 0
    envrl = ENVRL(EchoConfig(echo=False))
    assert envrl.kinds == ["state_prediction", "inverse_dynamics"] and envrl.weights(0, 4)["echo"] == 0.0
    # on with a constant schedule while SP and ID decay: the run still depends on its length
    assert envrl.depends_on_updates()
    assert not ENVRL(EchoConfig(decay="constant")).depends_on_updates()
