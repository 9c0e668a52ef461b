"""World-model prompts: what a policy's own model is asked when it learns the env's dynamics.

Two auxiliary objectives train the policy's model on transitions ``(s, a, s')`` instead of on
its actions:

* state prediction, ``-log p(s' | s, a)``: IWM's first stage (Early Experience, Zhang et al.,
  2025) and ENVRL's SP loss; the target is the next observation as the env wrote it;
* inverse dynamics, ``-log p(a | s, s')``: ENVRL's ID loss; the target is the action's tokens
  only. The answer is written in the policy template's response format (what
  :func:`~envrl.agents.prompts.parse_response` reads), so the model names actions exactly as it
  does when it acts, but the format's text is not scored: the response is tokenized once, whole
  (as the policy writes it), the tokens before the action's (``<action>``, or
  ``<think></think><action>``) end the prompt, and the tokens after it (``</action>`` and the
  end-of-turn token) are dropped, which changes no scored token's log-prob in a causal model.
  Where BPE merged the action's first or last character with a tag's into one token (``>t`` of
  ``<action>take``), that token is scored as the action's
  (:meth:`~envrl.training.policy.Policy.encode_response_span`).

Both are token cross-entropies on the target's tokens, never on the prompt's; state prediction's
target also ends with the end-of-turn token (:meth:`~envrl.training.policy.Policy.encode_response`),
which the action is not followed by. The prompts are templates (data, like the agents'
templates): a JSON file with a ``kind``
(``state-prediction`` or ``inverse-dynamics``), a ``system`` string and a ``user`` string
with :meth:`str.format` fields, and a ``history_turn`` string for each past turn. Two such pairs
ship with envrl: ``world-model`` (state prediction, IWM's) and ``inverse-dynamics``, each with its
own system message; and ``envrl-state-prediction`` and ``envrl-inverse-dynamics``, which write
the system message and the state ``s`` identically and differ only after it, so that the two
rows of a transition share that prefix token for token and are computed once for both
(:meth:`~envrl.training.policy.Policy.shared_prefix_logprobs`). ENVRL's defaults are follow-ups
(below). A path loads any other.
``s`` is shown as the policy sees it: the task, the last ``policy.config.history`` turns and
the current observation (cut like the policy's prompt), so the world model and the policy read
the same view of the state. The texts are short on purpose: from-scratch CPU
models have 512 positions.

Fields: ``user`` takes ``{instruction}``, ``{history}``, ``{observation}`` and ``{action}``
(state prediction) or ``{next_observation}`` (inverse dynamics), and must use the latter;
``history_turn`` takes ``{observation}`` and ``{action}``. Literal braces are ``{{`` and ``}}``.

Follow-up templates
    A template with ``"form": "follow-up"`` (:class:`FollowUpTemplate`) writes no state of its
    own: it continues the policy's own conversation at ``s_t`` (its prompt messages, as the
    rollout recorded them) with two more turns, an ``assistant`` turn that closes the policy's
    turn and a ``user`` turn, and the target is the assistant's answer to it:

    * state prediction: the assistant turn gives the action taken (``{response}``, the action
      in the policy template's response format), the user turn asks what follows, the target
      is ``s_{t+1}``;
    * inverse dynamics: the assistant turn hides the action (``{hidden_response}``, the response
      format with ``?`` for the action), the user turn shows ``{next_observation}`` and asks
      which action it was, the target is the action ``a_t`` in the answer that gives it (its
      format's text before the action ends the prompt, as above).

    So both rows begin with the policy's prompt token for token (the tokens after it are
    appended to the prompt the policy saw, cut or not; :func:`follow_up_prompt_ids`), and
    ENVRL scores them as two more branches of the step's own packed row: ``s_t`` costs nothing
    more than the policy already spends on it. ENVRL's defaults are the pair
    ``follow-up-state-prediction`` and ``follow-up-inverse-dynamics``. ``assistant`` takes
    ``{response}`` (state prediction, which must use it) or ``{hidden_response}`` (inverse
    dynamics, which must not show the response); ``user`` takes ``{next_observation}``
    (inverse dynamics, which must use it; a state-prediction user turn must not show its target).
"""

from __future__ import annotations

import string
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envrl.agents.generation import Message
from envrl.agents.prompts import TemplateError, Turn, clip_observation
from envrl.training.templates import load_template

#: built-in world-model templates, by name -> file in envrl/training/templates
BUILTIN_WORLD_MODEL_TEMPLATES = {
    "world-model": "world_model.json",
    "inverse-dynamics": "inverse_dynamics.json",
    "envrl-state-prediction": "envrl_state_prediction.json",
    "envrl-inverse-dynamics": "envrl_inverse_dynamics.json",
    "follow-up-state-prediction": "follow_up_state_prediction.json",
    "follow-up-inverse-dynamics": "follow_up_inverse_dynamics.json",
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
        template = cls(**_template_fields("world-model template", data, _KEYS, _USER_FIELDS, source), source=source)
        template._check()
        return template

    def _check(self) -> None:
        """Every field known and the target's counterpart used: a typo fails at load, not mid-run."""
        allowed = _USER_FIELDS[self.kind]
        for key, text, fields in (("user", self.user, allowed), ("history_turn", self.history_turn, _TURN_FIELDS)):
            used = _fields_used("world-model template", self.name, key, text)
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


#: the fields a follow-up template's turns may use, per kind and turn
_FOLLOW_UP_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "state-prediction": {"assistant": ("response",), "user": ()},
    "inverse-dynamics": {"assistant": ("hidden_response",), "user": ("next_observation",)},
}
#: per kind, the turn and the field it must use
_FOLLOW_UP_REQUIRED = {"state-prediction": ("assistant", "response"), "inverse-dynamics": ("user", "next_observation")}
_FOLLOW_UP_KEYS = ("name", "kind", "form", "assistant", "user")
#: the action a follow-up's ``{hidden_response}`` shows in the response format
HIDDEN_ACTION = "?"


@dataclass(frozen=True)
class FollowUpTemplate:
    """A world-model prompt that continues the policy's conversation (see "Follow-up templates"
    in the module docstring)."""

    name: str
    kind: str
    assistant: str
    user: str
    description: str = ""
    source: str = field(default="", compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "") -> FollowUpTemplate:
        fields = _template_fields("follow-up template", data, _FOLLOW_UP_KEYS, _FOLLOW_UP_FIELDS, source)
        fields.pop("form")  # what made it a follow-up; not a field of its own
        template = cls(**fields, source=source)
        template._check()
        return template

    def _check(self) -> None:
        """Every field known, the kind's required one used, the target never shown."""
        for turn, allowed in _FOLLOW_UP_FIELDS[self.kind].items():
            used = _fields_used("follow-up template", self.name, turn, getattr(self, turn))
            unknown = sorted(used - set(allowed))
            if unknown:
                raise TemplateError(
                    f"follow-up template {self.name!r}: its {turn} turn uses {', '.join(unknown)}, which "
                    f"{self.kind} follow-ups may not show (allowed: {', '.join(allowed) or 'none'})"
                )
        turn, name = _FOLLOW_UP_REQUIRED[self.kind]
        if "{" + name + "}" not in getattr(self, turn):
            raise TemplateError(
                f"follow-up template {self.name!r}: {self.kind} follow-ups must show {{{name}}} in their {turn} turn"
            )

    def state_prediction_messages(self, state_messages: Sequence[Message], response: str) -> list[Message]:
        """The prompt of ``-log p(s' | s, a)``: the policy's messages at ``s``, its turn closed with
        ``response`` (the action in its response format), then the user turn."""
        self._require("state-prediction")
        return self._messages(state_messages, self.assistant.format(response=response), self.user.format())

    def inverse_dynamics_messages(
        self, state_messages: Sequence[Message], next_observation: str, hidden_response: str
    ) -> list[Message]:
        """The prompt of ``-log p(a | s, s')``: the policy's messages at ``s``, its turn closed
        with ``hidden_response`` (the action hidden), then the user turn showing ``s'``."""
        self._require("inverse-dynamics")
        user = self.user.format(next_observation=clip_observation(str(next_observation)))
        return self._messages(state_messages, self.assistant.format(hidden_response=hidden_response), user)

    def _require(self, kind: str) -> None:
        if self.kind != kind:
            raise TemplateError(f"follow-up template {self.name!r} is a {self.kind} template, not {kind}")

    @staticmethod
    def _messages(state_messages: Sequence[Message], assistant: str, user: str) -> list[Message]:
        if not state_messages:
            raise TemplateError("a follow-up template continues the policy's prompt messages, and none were given")
        return [
            *(dict(m) for m in state_messages),
            {"role": "assistant", "content": assistant},
            {"role": "user", "content": user},
        ]


#: either form of world-model template
AnyWorldModelTemplate = WorldModelTemplate | FollowUpTemplate


def _template_fields(
    label: str, data: Mapping[str, Any], keys: Sequence[str], kinds: Collection[str], source: str
) -> dict[str, Any]:
    """A template file's fields, once its keys (``keys``, plus an optional ``description``) and
    its ``kind`` (one of ``kinds``) are checked; one-line TemplateErrors naming ``label``."""
    missing = [key for key in keys if key not in data]
    if missing:
        raise TemplateError(f"{label} {source!r} lacks {', '.join(missing)}")
    unknown = sorted(set(data) - {*keys, "description"})
    if unknown:
        raise TemplateError(f"{label} {source!r} has unknown keys: {', '.join(unknown)}")
    if data["kind"] not in kinds:
        raise TemplateError(f"{label} {source!r}: kind must be {' or '.join(kinds)}, got {data['kind']!r}")
    return {key: data[key] for key in (*keys, "description") if key in data}


def _fields_used(label: str, name: str, key: str, text: str) -> set[str]:
    """The :meth:`str.format` fields ``text`` uses; a TemplateError when it is malformed."""
    try:
        return {part for _, part, _, _ in string.Formatter().parse(text) if part is not None}
    except ValueError as exc:
        raise TemplateError(f"{label} {name!r}: {key} is malformed ({exc})") from exc


_TURN_FIELDS = ("observation", "action")


def _turn_fields(turn: HistoryTurn) -> tuple[str, str]:
    if isinstance(turn, Turn):
        return turn.observation, turn.action
    return str(turn["observation"]), str(turn["action"])


def load_world_model_template(name_or_path: str | Path = "world-model") -> AnyWorldModelTemplate:
    """A built-in world-model template by name (:data:`BUILTIN_WORLD_MODEL_TEMPLATES`) or a JSON
    file by path: a :class:`FollowUpTemplate` when its ``form`` is ``follow-up``."""
    data, source = load_template(
        name_or_path, builtins=BUILTIN_WORLD_MODEL_TEMPLATES, label="world-model template", error=TemplateError
    )
    if data.get("form") == "follow-up":
        return FollowUpTemplate.from_dict(data, source=source)
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


def follow_up_prompt_ids(
    policy: Any, state_messages: Sequence[Message], state_ids: Sequence[int] | None, messages: Sequence[Message]
) -> list[int]:
    """A follow-up prompt's tokens: ``state_ids`` (the prompt the policy saw at ``s``, cut to its
    context or not) followed by the tokens ``messages`` add to ``state_messages``, so the row
    begins with the policy's prompt token for token. Without ``state_ids``, or under a chat
    template that renders earlier turns differently once more follow (then the row shares
    nothing with the policy's and is scored on its own), the encoding of ``messages``."""
    full = policy.encode_prompt(messages)
    if state_ids is None:
        return full
    base = policy.encode_prompt(state_messages)
    if full[: len(base)] != base:
        return full
    return list(state_ids) + full[len(base) :]


def state_prediction_messages(
    template: AnyWorldModelTemplate,
    response_template: Any,
    history: int | None,
    instruction: str,
    history_turns: Sequence[HistoryTurn],
    observation: str,
    action: str,
    state_messages: Sequence[Message] = (),
) -> list[Message]:
    """The prompt of ``-log p(s' | s, action)`` in either form: a follow-up of ``state_messages``
    (the policy's prompt at ``s``; ``response_template`` writes the action as the policy would)
    or the template's own state text (the last ``history`` turns)."""
    if isinstance(template, FollowUpTemplate):
        return template.state_prediction_messages(state_messages, response_template.format_response(str(action)))
    return template.state_prediction_messages(instruction, history_turns, observation, action, history=history)


def inverse_dynamics_messages(
    template: AnyWorldModelTemplate,
    response_template: Any,
    history: int | None,
    instruction: str,
    history_turns: Sequence[HistoryTurn],
    observation: str,
    next_observation: str,
    state_messages: Sequence[Message] = (),
) -> list[Message]:
    """The prompt of ``-log p(a | s, next_observation)`` in either form (as :func:`state_prediction_messages`)."""
    if isinstance(template, FollowUpTemplate):
        hidden = response_template.format_response(HIDDEN_ACTION)
        return template.inverse_dynamics_messages(state_messages, next_observation, hidden)
    return template.inverse_dynamics_messages(
        instruction, history_turns, observation, next_observation, history=history
    )


def state_prediction_sample(
    policy: Any,
    template: AnyWorldModelTemplate,
    instruction: str,
    history_turns: Sequence[HistoryTurn],
    observation: str,
    action: str,
    next_observation: str,
    *,
    state_messages: Sequence[Message] = (),
    state_ids: Sequence[int] | None = None,
) -> TargetSample:
    """``-log p(next_observation | s, action)`` on ``policy``'s tokenizer, with its history window;
    a follow-up template continues ``state_messages`` (the policy's prompt at ``s``, whose tokens
    were ``state_ids``)."""
    state = (instruction, history_turns, observation, action)
    messages = state_prediction_messages(template, policy.template, policy.config.history, *state, state_messages)
    prompt = _prompt_ids(policy, template, messages, state_messages, state_ids)
    return TargetSample(prompt, policy.encode_response(str(next_observation)), "state_prediction")


def inverse_dynamics_sample(
    policy: Any,
    template: AnyWorldModelTemplate,
    instruction: str,
    history_turns: Sequence[HistoryTurn],
    observation: str,
    next_observation: str,
    action: str,
    *,
    state_messages: Sequence[Message] = (),
    state_ids: Sequence[int] | None = None,
) -> TargetSample:
    """``-log p(action | s, next_observation)`` on the action's tokens only: the answer is the
    action in the policy template's response format, tokenized whole, its tokens before the
    action appended to the prompt and those after it (the closing tag, the end-of-turn token)
    dropped (see the module docstring); a follow-up template continues ``state_messages`` as for
    state prediction."""
    state = (instruction, history_turns, observation, next_observation)
    messages = inverse_dynamics_messages(template, policy.template, policy.config.history, *state, state_messages)
    prompt = _prompt_ids(policy, template, messages, state_messages, state_ids)
    text, start, end = action_span(policy.template, str(action))
    if end == start:
        raise ValueError("an inverse-dynamics target needs an action: the empty one has no tokens to score")
    ids, first, last = policy.encode_response_span(text, start, end)
    return TargetSample(prompt + ids[:first], ids[first:last], "inverse_dynamics")


#: what :func:`action_span` formats to find where a response format puts its action
_ACTION_MARK = "\x00"


def action_span(response_template: Any, action: str) -> tuple[str, int, int]:
    """The response that gives ``action`` in ``response_template``'s format
    (:meth:`~envrl.agents.prompts.PromptTemplate.format_response`) and the characters
    ``[start, end)`` of it that are the action."""
    before, mark, after = response_template.format_response(_ACTION_MARK).partition(_ACTION_MARK)
    if not mark:
        raise TemplateError(f"prompt template {response_template.name!r} writes responses without their action")
    return before + action + after, len(before), len(before) + len(action)


def _prompt_ids(
    policy: Any,
    template: AnyWorldModelTemplate,
    messages: Sequence[Message],
    state_messages: Sequence[Message],
    state_ids: Sequence[int] | None,
) -> list[int]:
    if isinstance(template, FollowUpTemplate):
        return follow_up_prompt_ids(policy, state_messages, state_ids, messages)
    return policy.encode_prompt(messages)
