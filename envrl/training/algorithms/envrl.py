"""ENVRL: GRPO, GiGPO or RLOO, plus the env's dynamics learned by the policy's own model on the same rollouts.

The rollout batch of the base algorithm (``algorithm.base``: any trainer of
:data:`~envrl.training.algorithms.grpo_family.GRPO_FAMILY`, i.e. :mod:`~envrl.training.algorithms.grpo`,
:mod:`~envrl.training.algorithms.gigpo` or :mod:`~envrl.training.algorithms.rloo`) already holds
transitions ``(s_t, a_t, s_{t+1})``.
ENVRL adds two token cross-entropies on them to the base algorithm's loss, with no extra
sampling and no separate model:

    L(t) = L_RL + lambda_SP(t) * L_SP + lambda_ID(t) * L_ID

* state prediction (SP), ``-log p(s_{t+1} | s_t, a_t)``: the target is the next observation's
  tokens (and the end-of-turn token), the prompt the ``follow-up-state-prediction`` template;
* inverse dynamics (ID), ``-log p(a_t | s_t, s_{t+1})``: the target is the action's tokens
  only, the prompt the ``follow-up-inverse-dynamics`` template. The answer is written in the
  policy template's response format (as the policy writes it when it acts), tokenized whole:
  its format text before the action (``<action>``, ``<think></think><action>``) ends the
  prompt, the closing tag and the end-of-turn token are not scored
  (:func:`~envrl.training.dynamics.inverse_dynamics_sample`).

Both default prompts are follow-ups (:mod:`envrl.training.dynamics`): they continue the policy's
own prompt at ``s_t`` (the messages and tokens :class:`~envrl.training.rollout.StepSample`
recorded) with its turn closed by the action (SP) or by ``?`` standing for it (ID) and one more
question, so ``s_t`` is exactly what the policy saw, token for token. Other templates
(``sp_template``, ``id_template``) may write their own view of ``s_t`` instead, from the step's
instruction, history window and observation. Each weight decays from its start value
``lambda_0`` (``sp_coef``, ``id_coef``) over the run, ``decay: cosine`` giving

    lambda(t) = lambda_0 * 0.5 * (1 + cos(pi * t / T)),

``t`` the 0-based update being computed and ``T`` the run's ``updates``; ``decay: constant``
keeps ``lambda_0``: the dynamics shape the representation early, the reward has the last word.

Objectives, a table
    SP and ID are the two rows of :data:`OBJECTIVES` (:class:`Objective`): its sample kind and
    short name, the template kind its prompt must be, the function that turns a transition into
    its scored sample, and the config keys of its switch, start weight, template and schedule.
    Building, checking, weighing, scoring and logging all loop over the rows, so another
    auxiliary objective is one more row (with its config keys and its template), and nothing
    else changes.

Transitions
    A step is a transition for the auxiliary losses when its episode goes on after it (neither
    done nor truncated, so ``s_{t+1}`` is a state the policy acts on next) and its response
    gave an action (format-valid: an invalid response sent the empty placeholder action, which
    ID would teach the model to write). Of the batch's ``n`` such steps, ``round(aux_fraction * n)``
    are used, drawn without replacement from ``numpy.random.default_rng([seed, update, rank, 3])``
    (the trailing stream number keeps the draw apart from the rollouts' task draw, which uses
    ``[seed, update, rank]``), so a run and its resumed copy use the same ones.

Scored with the RL rows
    Each sample of the batch is a :class:`ENVRLSample`: the base algorithm's step sample and the
    auxiliary samples of its transition (none when the step is not used). :meth:`ENVRL.compute_loss`
    scores a micro-batch's steps and their auxiliary rows together
    (:meth:`~envrl.training.policy.Policy.logprobs_with_branches`) and hands the steps' scores to
    the base algorithm's ``loss_from_scores`` (so the RL term is the base algorithm's, on exactly
    the micro-batches it would see). In choose mode a step is one packed row, its prompt then
    the admissible actions, in generate mode its prompt then its response (packed only when rows
    join it); the default SP and ID rows begin with that prompt, so they join the row as two more
    branches and add only their own tokens (the closing turn, the question, ID's format text
    before the action, and the target): no extra forward pass, and ``s_t`` is computed once for
    all three objectives. Rows that do not begin with the step's prompt (other templates) are
    scored in one more pass, a transition's rows as one packed row with their common start once
    (:meth:`~envrl.training.policy.Policy.shared_prefix_logprobs`). Either way each row's tokens
    are scored exactly as if it ran alone, up to float rounding.

Weighting
    The loop weighs a micro-batch's loss by its share of the minibatch's scored units
    (:func:`~envrl.training.policy.scored_units`). An :class:`ENVRLSample` counts its step's
    units only, so the RL term is exactly the base algorithm's token mean: the batch is the
    base algorithm's, sample for sample, in the same order (the loop's shuffle depends on the
    batch's length) and with the same units. Counting the auxiliary tokens as units instead
    would dilute the RL term, and an auxiliary sample as a separate batch entry of 0 units
    would lose its gradient whenever a micro-batch held no RL sample. The auxiliary terms are
    token means over the whole batch: a micro-batch returns its kind's summed token loss times
    ``rl_units(batch) / (aux_tokens(batch, kind) * rl_units(micro-batch))``, which the loop's
    weight ``rl_units(micro-batch) / rl_units(minibatch)`` turns into the sum over the batch's
    tokens of that kind divided by their number, exactly when a minibatch is the batch
    (``optim.minibatches: 1``, one process) and in expectation otherwise, for any micro-batch
    size. A micro-batch without auxiliary samples adds nothing to their term, which is right:
    the term is a sum over tokens. The logged ``loss/sp`` and ``loss/id`` are these token means.

Configuration
    :class:`ENVRLConfig` extends :class:`~envrl.training.algorithms.gigpo.GiGPOConfig` (a superset
    of GRPO's and RLOO's), so one flat dataclass takes every key of every base from YAML and
    ``--set algorithm.KEY=VALUE``; the base algorithm runs on this very config object (it reads
    only its own keys). A base's key that the chosen base does not read must keep its default
    (with ``base: grpo`` GiGPO's ``omega`` and ``gamma``; with ``base: rloo`` GRPO's ``norm`` and
    ``episode_stats`` too): a changed one would otherwise be silently ignored. ``sp: false``,
    ``id: false``, ``decay: constant`` and ``aux_fraction`` are the ablations.

Logged per update: the base algorithm's terms (``loss/policy``, ``ppo/*``, ``entropy``, ``kl``),
``loss/rl`` (its whole loss), ``loss/sp`` and ``loss/id`` (where the batch has such samples),
``weight/sp`` and ``weight/id`` (the weights applied, 0 for a loss switched off),
``aux/transitions``, ``aux/samples`` and ``aux/tokens`` (the loop's ``tokens_per_s`` counts the
RL samples' tokens only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from envrl.agents.prompts import TemplateError
from envrl.training.algorithms.base import Algorithm, Batch, TrainingContext
from envrl.training.algorithms.gigpo import GiGPOConfig
from envrl.training.algorithms.grpo import GRPO
from envrl.training.algorithms.grpo_family import GRPO_FAMILY
from envrl.training.config import ConfigError
from envrl.training.dynamics import (
    AnyWorldModelTemplate,
    TargetSample,
    inverse_dynamics_sample,
    load_world_model_template,
    state_prediction_sample,
)
from envrl.training.policy import scored_units
from envrl.training.rollout import StepSample

#: the base algorithms, by ``algorithm.base``: every trainer built on GRPO
BASES: Mapping[str, type[GRPO]] = GRPO_FAMILY
DECAYS = ("cosine", "constant")
#: the seed stream of the transitions' draw (see the module docstring)
_AUX_STREAM = 3


@dataclass
class ENVRLConfig(GiGPOConfig):
    """Every base algorithm's settings (GiGPO's, which hold GRPO's and RLOO's) and the auxiliary losses'."""

    base: str = "grpo"  # a name in BASES: grpo, gigpo or rloo
    sp: bool = True  # state prediction, -log p(s' | s, a)
    id: bool = True  # inverse dynamics, -log p(a | s, s')
    # start weights, from the CPU sweep (docs/envrl.md section 4; tiny from-scratch model, choose mode):
    # 0.1/0.1 collapsed the policy on every seed (the ID term does it), 0.01/0.01 cost 10 points of
    # valid success, 0.01/0.001 kept GRPO's level (39.2% vs 42.2%, 3 seeds): the best point tried
    sp_coef: float = 0.01
    id_coef: float = 0.001
    decay: str = "cosine"  # cosine (to 0 over the run) or constant
    aux_fraction: float = 1.0  # share of the batch's transitions used by the auxiliary losses, in (0, 1]
    # the prompts, built-in names or JSON files; the default pair continues the policy's own prompt,
    # so that the rows join the step's packed row in choose mode (see the module docstring)
    sp_template: str = "follow-up-state-prediction"
    id_template: str = "follow-up-inverse-dynamics"


@dataclass(frozen=True)
class AuxScale:
    """What one update's auxiliary samples are weighed with (shared by the batch's samples).

    ``weights``: lambda(t) per enabled kind; ``per_token``: the batch's RL units per token of
    that kind (only kinds the batch holds), the factor that makes a micro-batch's summed token
    loss into its share of the batch's token mean (see the module docstring).
    """

    weights: Mapping[str, float]
    per_token: Mapping[str, float]


@dataclass
class ENVRLSample:
    """A base-algorithm step sample and the auxiliary samples of its transition.

    It shows the loop the step's own tokens (``prompt_ids``, ``response_ids``, ``candidate_ids``,
    ``choice``), so it counts the step's units only.
    """

    step: StepSample
    aux: list[TargetSample]
    scale: AuxScale

    @property
    def prompt_ids(self) -> list[int]:
        return self.step.prompt_ids

    @property
    def response_ids(self) -> list[int]:
        return self.step.response_ids

    @property
    def candidate_ids(self) -> list[list[int]] | None:
        return self.step.candidate_ids

    @property
    def choice(self) -> int | None:
        return self.step.choice


def aux_weight(coef: float, update: int, updates: int, decay: str) -> float:
    """``lambda(t)`` for update ``t = update`` of ``T = updates``: ``coef * 0.5 * (1 + cos(pi t / T))``
    (cosine) or ``coef`` (constant)."""
    if decay == "constant":
        return float(coef)
    if decay != "cosine":
        raise ValueError(f"decay must be one of {', '.join(DECAYS)}, got {decay!r}")
    return float(coef) * 0.5 * (1.0 + math.cos(math.pi * update / updates))


def transition_steps(steps: Sequence[StepSample]) -> list[int]:
    """The positions of ``steps`` that are transitions for the auxiliary losses: not terminal
    (neither done nor truncated) and format-valid."""
    return [i for i, s in enumerate(steps) if not (s.done or s.truncated) and s.valid]


def pick_transitions(count: int, fraction: float, seed: int, update: int, rank: int) -> list[int]:
    """``round(fraction * count)`` of ``range(count)``, in increasing order, drawn without
    replacement from ``default_rng([seed, update, rank, 3])``; all of them when ``fraction`` is 1."""
    if fraction >= 1.0:
        return list(range(count))
    size = round(fraction * count)
    rng = np.random.default_rng([seed, update, rank, _AUX_STREAM])
    return sorted(int(k) for k in rng.choice(count, size=size, replace=False))


#: what builds one auxiliary sample: the policy, the objective's prompt template and the step
SampleBuilder = Callable[[Any, AnyWorldModelTemplate, StepSample], TargetSample]


@dataclass(frozen=True)
class Objective:
    """One auxiliary objective of ENVRL, a row of :data:`OBJECTIVES`: everything the loss needs
    to know of it, so that a new objective is a row (and its template), not an edit of the loss.

    ``kind``: the :class:`~envrl.training.dynamics.TargetSample` ``kind`` its samples carry;
    ``name``: its short name, in the logs (``loss/NAME``, ``weight/NAME``) and in messages;
    ``template_kind``: the world-model template kind its prompt must be;
    ``build``: turns a transition (a rollout step) into its scored sample;
    ``switch``, ``coef``, ``template``: the config keys that turn it on, give its start weight
    ``lambda_0`` and name its prompt template; ``decay``: the config key of its schedule
    (:func:`aux_weight`).
    """

    kind: str
    name: str
    template_kind: str
    build: SampleBuilder
    switch: str
    coef: str
    template: str
    decay: str = "decay"


def state_prediction_row(policy: Any, template: AnyWorldModelTemplate, step: StepSample) -> TargetSample:
    """SP's sample of a transition, ``-log p(s_{t+1} | s_t, a_t)``, ``s_t`` as the policy saw it."""
    return state_prediction_sample(
        policy,
        template,
        step.instruction,
        step.history,
        step.observation,
        step.action,
        step.next_observation,
        state_messages=step.messages,
        state_ids=step.prompt_ids,
    )


def inverse_dynamics_row(policy: Any, template: AnyWorldModelTemplate, step: StepSample) -> TargetSample:
    """ID's sample of a transition, ``-log p(a_t | s_t, s_{t+1})`` on the action's tokens only
    (:func:`~envrl.training.dynamics.action_span`)."""
    return inverse_dynamics_sample(
        policy,
        template,
        step.instruction,
        step.history,
        step.observation,
        step.next_observation,
        step.action,
        state_messages=step.messages,
        state_ids=step.prompt_ids,
    )


#: ENVRL's auxiliary objectives, in the order they are built, scored, weighed and logged
OBJECTIVES: tuple[Objective, ...] = (
    Objective("state_prediction", "sp", "state-prediction", state_prediction_row, "sp", "sp_coef", "sp_template"),
    Objective("inverse_dynamics", "id", "inverse-dynamics", inverse_dynamics_row, "id", "id_coef", "id_template"),
)


def _setting_names(config_class: type) -> set[str]:
    """The keys of a config dataclass."""
    return {f.name for f in fields(config_class)}


def _unread_base_setting(config: ENVRLConfig) -> str:
    """Why ``config`` cannot run on its base, in one sentence ('' when it can): the base reads a
    key ENVRLConfig lacks (it must be added there), or a key that only other bases read was
    changed from its default (the chosen base would silently ignore it)."""
    base = BASES[config.base]
    lacking = sorted(_setting_names(base.Config) - _setting_names(ENVRLConfig))
    if lacking:
        missing = ", ".join(lacking)
        return f"algorithm.base={config.base} reads settings ENVRLConfig lacks ({missing}): add them to ENVRLConfig"
    for f in fields(ENVRLConfig):
        readers = [name for name, algo in BASES.items() if f.name in _setting_names(algo.Config)]
        if readers and config.base not in readers and getattr(config, f.name) != f.default:
            return (
                f"algorithm.{f.name} is a setting of {' and '.join(readers)} only and algorithm.base is "
                f"{config.base}: set algorithm.base={readers[0]} to use it, or leave it at {f.default!r}"
            )
    return ""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class ENVRL(Algorithm):
    """ENVRL (see the module docstring): the base algorithm's loss plus weighted SP and ID losses."""

    name = "envrl"
    Config = ENVRLConfig
    uses_rollouts = True

    def __init__(self, config: ENVRLConfig) -> None:
        super().__init__(config)
        self._templates: dict[str, AnyWorldModelTemplate] = {}

    @property
    def base(self) -> GRPO:
        """The base algorithm, running on this config (it reads its own keys only)."""
        if self.config.base not in BASES:
            raise ConfigError(f"algorithm.base must be one of {', '.join(BASES)}, got {self.config.base!r}")
        return BASES[self.config.base](self.config)

    @property
    def objectives(self) -> tuple[Objective, ...]:
        """Every auxiliary objective, on or off: the rows of :data:`OBJECTIVES` (read when asked,
        so a row added to the table is used at once)."""
        return OBJECTIVES

    @property
    def enabled(self) -> list[Objective]:
        """The objectives switched on, in the table's order."""
        return [row for row in self.objectives if getattr(self.config, row.switch)]

    @property
    def kinds(self) -> list[str]:
        """The enabled auxiliary kinds, in the table's order (SP first)."""
        return [row.kind for row in self.enabled]

    def _names(self) -> dict[str, str]:
        """Each objective's short name, by kind."""
        return {row.kind: row.name for row in self.objectives}

    def check(self, train_config: Any) -> None:
        c = self.config
        base = self.base
        for key in dict.fromkeys(row.coef for row in self.objectives):
            value = getattr(c, key)
            if not _is_number(value) or value < 0:
                raise ConfigError(f"algorithm.{key} must be a number >= 0, got {value!r}")
        if not _is_number(c.aux_fraction) or not 0.0 < c.aux_fraction <= 1.0:
            raise ConfigError(f"algorithm.aux_fraction must lie in (0, 1], got {c.aux_fraction!r}")
        for key in dict.fromkeys(row.decay for row in self.objectives):
            if getattr(c, key) not in DECAYS:
                raise ConfigError(f"algorithm.{key} must be cosine or constant, got {getattr(c, key)!r}")
        if not self.enabled:
            switches = " and ".join(f"algorithm.{row.switch}" for row in self.objectives)
            every = "both" if len(self.objectives) == 2 else "all"
            raise ConfigError(f"{switches} are {every} off, and that is the base algorithm: run --algo {c.base}")
        problem = _unread_base_setting(c)
        if problem:
            raise ConfigError(problem)
        for kind in self.kinds:
            self.template(kind)
        base.check(train_config)

    def template(self, kind: str) -> AnyWorldModelTemplate:
        """The prompt template of an auxiliary kind (loaded on first use, checked to be of its kind)."""
        if kind not in self._templates:
            row = next(row for row in self.objectives if row.kind == kind)
            key, expected = row.template, row.template_kind
            name = getattr(self.config, key)
            try:
                template = load_world_model_template(name)
            except TemplateError as exc:
                raise ConfigError(str(exc)) from exc
            if template.kind != expected:
                raise ConfigError(f"algorithm.{key} must be a template of kind {expected}; {name!r} is {template.kind}")
            self._templates[kind] = template
        return self._templates[kind]

    def depends_on_updates(self) -> bool:
        """The cosine weights decay over the run's total (``T``)."""
        return any(getattr(self.config, row.decay) != "constant" for row in self.objectives)

    def weights(self, update: int, updates: int) -> dict[str, float]:
        """``lambda(update)`` per auxiliary kind (0 for a kind switched off)."""
        c = self.config
        return {
            row.kind: aux_weight(
                getattr(c, row.coef) if getattr(c, row.switch) else 0.0, update, updates, getattr(c, row.decay)
            )
            for row in self.objectives
        }

    def aux_samples(self, policy: Any, step: StepSample) -> list[TargetSample]:
        """The enabled auxiliary samples of one transition, prompts built from the policy's view of
        ``s_t`` (a follow-up template continues the step's own prompt)."""
        return [row.build(policy, self.template(row.kind), step) for row in self.enabled]

    def attach(
        self, policy: Any, steps: Sequence[StepSample], update: int, updates: int, seed: int, rank: int
    ) -> tuple[list[ENVRLSample], dict[str, float]]:
        """The batch's samples, each step with the auxiliary samples of its transition when it is
        drawn (see the module docstring), and the metrics of the draw."""
        eligible = transition_steps(steps)
        chosen = {eligible[k] for k in pick_transitions(len(eligible), self.config.aux_fraction, seed, update, rank)}
        aux = [self.aux_samples(policy, step) if i in chosen else [] for i, step in enumerate(steps)]
        rl_units = sum(scored_units(step) for step in steps)
        tokens: dict[str, int] = {}
        for sample in (a for row in aux for a in row):
            tokens[sample.kind] = tokens.get(sample.kind, 0) + len(sample.response_ids)
        weights = self.weights(update, updates)
        names = self._names()
        scale = AuxScale(
            weights={kind: weights[kind] for kind in self.kinds},
            per_token={kind: rl_units / count for kind, count in tokens.items() if count},
        )
        samples = [ENVRLSample(step, row, scale) for step, row in zip(steps, aux)]
        flat = [a for row in aux for a in row]
        metrics = {
            **{f"weight/{names[kind]}": value for kind, value in weights.items()},
            "aux/transitions": float(len(chosen)),
            "aux/samples": float(len(flat)),
            "aux/tokens": float(sum(len(a.prompt_ids) + len(a.response_ids) for a in flat)),
        }
        return samples, metrics

    def collect(self, trainer: TrainingContext, update: int) -> Batch:
        batch = self.base.collect(trainer, update)
        c = trainer.config
        samples, metrics = self.attach(trainer.policy, list(batch.samples), update, c.updates, c.seed, trainer.rank)
        return Batch(samples, {**batch.metrics, **metrics})

    def compute_loss(self, trainer: TrainingContext, samples: Sequence[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        steps = [s.step for s in samples]
        # one pass: the steps' units and their transitions' SP and ID rows, each scored in its
        # step's packed row where it begins with the step's prompt (see the module docstring)
        scores, branches = trainer.policy.logprobs_with_branches(steps, [s.aux for s in samples])
        loss, base_terms = self.base.loss_from_scores(trainer, steps, scores)
        terms = {"loss/rl": float(loss.detach()), **base_terms}
        if not samples:
            return loss, terms
        scale: AuxScale = samples[0].scale
        aux = [a for s in samples for a in s.aux]
        # a kind the batch holds is logged from every micro-batch (0 where it has none of it): the
        # loop's weighted sum of the micro-batches' values is then the batch's token mean
        present = [kind for kind in scale.weights if kind in scale.per_token]
        names = self._names()
        if not aux:
            return loss, {**terms, **{f"loss/{names[kind]}": 0.0 for kind in present}}
        logprobs = [row for group in branches for row in group]
        units = sum(scored_units(step) for step in steps)
        for kind in present:
            sums = [row.sum() for row, a in zip(logprobs, aux) if a.kind == kind]
            token_sum = -torch.stack(sums).sum() if sums else torch.zeros((), device=logprobs[0].device)
            term = token_sum * (scale.per_token[kind] / units)
            loss = loss + scale.weights[kind] * term
            terms[f"loss/{names[kind]}"] = float(term.detach())
        return loss, terms
