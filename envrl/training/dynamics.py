"""World-model prompts: what a policy's own model is asked when it learns the env's dynamics.

Two auxiliary objectives train the policy's model on transitions ``(s, a, s')`` instead of on
its actions:

* state prediction, ``-log p(s' | s, a)``: IWM's first stage (Early Experience, Zhang et al.,
  2025) and ENVRL's SP loss; the target is the next observation as the env wrote it;
* inverse dynamics, ``-log p(a | s, s')``: ENVRL's ID loss; the target is the action, written
  in the policy template's response format (what :func:`~envrl.agents.prompts.parse_response`
  reads), so the model names actions exactly as it does when it acts.

Both are token cross-entropies on the target's tokens plus the end-of-turn token
(:meth:`~envrl.training.policy.Policy.encode_response`), never on the prompt's. The prompts
are templates (data, like the agents' templates): a JSON file with a ``kind``
(``state-prediction`` or ``inverse-dynamics``), a ``system`` string and a ``user`` string
with :meth:`str.format` fields, and a ``history_turn`` string for each past turn. Two pairs ship
with envrl: ``world-model`` (state prediction, IWM's) and ``inverse-dynamics``, each with its own
system message; and ENVRL's ``envrl-state-prediction`` and ``envrl-inverse-dynamics``, which
write the system message and the state ``s`` identically and differ only after it, so that the
two rows of a transition share that prefix token for token and ENVRL computes it once
(:meth:`~envrl.training.policy.Policy.shared_prefix_logprobs`). A path loads any other.
``s`` is shown as the policy sees it: the task, the last ``policy.config.history`` turns and
the current observation (cut like the policy's prompt), so the world model and the policy read
the same view of the state. The texts are short on purpose: from-scratch CPU
models have 512 positions.

Fields: ``user`` takes ``{instruction}``, ``{history}``, ``{observation}`` and ``{action}``
(state prediction) or ``{next_observation}`` (inverse dynamics), and must use the latter;
``history_turn`` takes ``{observation}`` and ``{action}``. Literal braces are ``{{`` and ``}}``.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from envrl.agents.generation import Message
from envrl.agents.prompts import TemplateError, Turn, clip_observation

#: built-in world-model templates, by name -> file in envrl/training/templates
BUILTIN_WORLD_MODEL_TEMPLATES = {
    "world-model": "world_model.json",
    "inverse-dynamics": "inverse_dynamics.json",
    "envrl-state-prediction": "envrl_state_prediction.json",
    "envrl-inverse-dynamics": "envrl_inverse_dynamics.json",
}

#: the fields ``user`` may use, per kind; the last one is the one it must use
_USER_FIELDS = {
    "state-prediction": ("instruction", "history", "observation", "action"),
    "inverse-dynamics": ("instruction", "history", "observation", "next_observation"),
}
_KEYS = ("name", "kind", "system", "user", "history_turn")

#: a past turn as the data stores it ({"observation", "action"}) or as prompts keep it
HistoryTurn = Mapping[str, Any] | Turn


@dataclass(frozen=True)
class WorldModelTemplate:
    """A world-model prompt template (see the module docstring)."""

    name: str
    kind: str
    system: str
    user: str
    history_turn: str
    description: str = ""
    source: str = field(default="", compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "") -> WorldModelTemplate:
        missing = [key for key in _KEYS if key not in data]
        if missing:
            raise TemplateError(f"world-model template {source!r} lacks {', '.join(missing)}")
        unknown = sorted(set(data) - {*_KEYS, "description"})
        if unknown:
            raise TemplateError(f"world-model template {source!r} has unknown keys: {', '.join(unknown)}")
        if data["kind"] not in _USER_FIELDS:
            raise TemplateError(
                f"world-model template {source!r}: kind must be {' or '.join(_USER_FIELDS)}, got {data['kind']!r}"
            )
        template = cls(**{key: data[key] for key in (*_KEYS, "description") if key in data}, source=source)
        template._check()
        return template

    def _check(self) -> None:
        """Every field known and the target's counterpart used: a typo fails at load, not mid-run."""
        allowed = _USER_FIELDS[self.kind]
        for key, text, fields in (("user", self.user, allowed), ("history_turn", self.history_turn, _TURN_FIELDS)):
            try:
                used = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
            except ValueError as exc:
                raise TemplateError(f"world-model template {self.name!r}: {key} is malformed ({exc})") from exc
            unknown = sorted(used - set(fields))
            if unknown:
                raise TemplateError(
                    f"world-model template {self.name!r}: {key} uses unknown fields {', '.join(unknown)} "
                    f"(known: {', '.join(fields)})"
                )
        if "{" + allowed[-1] + "}" not in self.user:
            raise TemplateError(f"world-model template {self.name!r}: a {self.kind} prompt must show {{{allowed[-1]}}}")

    def state_prediction_messages(
        self,
        instruction: str,
        history_turns: Sequence[HistoryTurn],
        observation: str,
        action: str,
        *,
        history: int | None = None,
    ) -> list[Message]:
        """The prompt of ``-log p(s' | s, a)``: the state ``s`` (task, the last ``history``
        turns, or all given when None, and ``observation``) and ``action``."""
        self._require("state-prediction")
        return self._messages(instruction, history_turns, observation, history, action=action)

    def inverse_dynamics_messages(
        self,
        instruction: str,
        history_turns: Sequence[HistoryTurn],
        observation: str,
        next_observation: str,
        *,
        history: int | None = None,
    ) -> list[Message]:
        """The prompt of ``-log p(a | s, s')``: the state ``s`` (as for state prediction) and
        the observation that followed."""
        self._require("inverse-dynamics")
        return self._messages(
            instruction, history_turns, observation, history, next_observation=clip_observation(str(next_observation))
        )

    def _require(self, kind: str) -> None:
        if self.kind != kind:
            raise TemplateError(f"world-model template {self.name!r} is a {self.kind} template, not {kind}")

    def _messages(
        self,
        instruction: str,
        history_turns: Sequence[HistoryTurn],
        observation: str,
        history: int | None,
        **target_side: str,
    ) -> list[Message]:
        turns = list(history_turns)
        if history is not None:
            turns = turns[-history:] if history > 0 else []
        shown = "".join(
            self.history_turn.format(observation=clip_observation(str(obs)), action=str(act))
            for obs, act in (_turn_fields(turn) for turn in turns)
        )
        user = self.user.format(
            instruction=str(instruction), history=shown, observation=clip_observation(str(observation)), **target_side
        )
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]


_TURN_FIELDS = ("observation", "action")


def _turn_fields(turn: HistoryTurn) -> tuple[str, str]:
    if isinstance(turn, Turn):
        return turn.observation, turn.action
    return str(turn["observation"]), str(turn["action"])


def load_world_model_template(name_or_path: str | Path = "world-model") -> WorldModelTemplate:
    """A built-in world-model template by name (:data:`BUILTIN_WORLD_MODEL_TEMPLATES`) or a JSON file by path."""
    name = str(name_or_path)
    if name in BUILTIN_WORLD_MODEL_TEMPLATES:
        file = resources.files("envrl.training").joinpath("templates").joinpath(BUILTIN_WORLD_MODEL_TEMPLATES[name])
        text, source = file.read_text(encoding="utf-8"), f"builtin:{name}"
    else:
        path = Path(name)
        if not path.is_file():
            raise TemplateError(
                f"unknown world-model template {name!r}: not one of "
                f"{', '.join(BUILTIN_WORLD_MODEL_TEMPLATES)} and no such file"
            )
        text, source = path.read_text(encoding="utf-8"), str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TemplateError(f"world-model template {source} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise TemplateError(f"world-model template {source} must be a JSON object")
    return WorldModelTemplate.from_dict(data, source=source)


# ---- token samples ----------------------------------------------------------------------------


@dataclass
class TargetSample:
    """A prompt and a target response, scored by token cross-entropy over the response only
    (:meth:`~envrl.training.policy.Policy.logprobs` reads it like a demonstration). ``kind``
    names the objective (``state_prediction``, ``inverse_dynamics``, ``reflection``), so a
    batch that mixes objectives can weigh each one."""

    prompt_ids: list[int]
    response_ids: list[int]
    kind: str
    candidate_ids: list[list[int]] | None = None
    choice: int | None = None


def state_prediction_sample(
    policy: Any,
    template: WorldModelTemplate,
    instruction: str,
    history_turns: Sequence[HistoryTurn],
    observation: str,
    action: str,
    next_observation: str,
) -> TargetSample:
    """``-log p(next_observation | s, action)`` on ``policy``'s tokenizer, with its history window."""
    messages = template.state_prediction_messages(
        instruction, history_turns, observation, action, history=policy.config.history
    )
    return TargetSample(
        policy.encode_prompt(messages), policy.encode_response(str(next_observation)), "state_prediction"
    )


def inverse_dynamics_sample(
    policy: Any,
    template: WorldModelTemplate,
    instruction: str,
    history_turns: Sequence[HistoryTurn],
    observation: str,
    next_observation: str,
    action: str,
) -> TargetSample:
    """``-log p(action | s, next_observation)``, the action in the policy template's response format."""
    messages = template.inverse_dynamics_messages(
        instruction, history_turns, observation, next_observation, history=policy.config.history
    )
    response = policy.encode_response(policy.template.format_response(str(action)))
    return TargetSample(policy.encode_prompt(messages), response, "inverse_dynamics")
