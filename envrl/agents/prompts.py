"""Prompt templates and the one action parser shared by every LLM agent (and by training).

A template is data: a JSON file (``envrl/agents/templates/<name>.json``, or any path) whose
strings are filled with :meth:`str.format` fields. Four ship with envrl:

* ``think-action`` (the default): the task, the last k turns (observation and action), the
  current observation and the admissible actions; the model reasons inside
  ``<think>...</think>`` and gives one action inside ``<action>...</action>``;
* ``react``: the same, but the history also carries the model's own earlier thoughts, so the
  prompt is a ReAct trace (thought, action, observation) over the window;
* ``action``: the ``think-action`` prompt without the reasoning: the response is one
  ``<action>...</action>``. Small models trained from scratch and ``choose``-mode policies
  (whose response is the action alone) use it;
* ``compact``: the task, the recent turns and the observation in as few tokens as possible: no
  admissible list and no format instruction. For ``choose``-mode policies with small context
  windows (a from-scratch CPU model), whose candidates are the admissible actions themselves.

Fields a template may use: in ``user``: ``{intro}`` (the env's paragraph from ``env_intro``),
``{instruction}``, ``{history}``, ``{turn}`` (1-based), ``{observation}``, ``{admissible}``,
``{example_action}``; in ``history_turn``: ``{turn}``, ``{observation}``, ``{think}``,
``{action}``. Literal braces in a template are written ``{{`` and ``}}``. Values (observations,
actions) are inserted as they are and never formatted again, so braces in them are safe.

:func:`parse_response` is the only parser. A response is *format-valid* when it holds exactly
one complete ``<action>...</action>`` with a non-empty action and, when the template asks for
reasoning, exactly one ``<think>...</think>`` before it. Anything else (no tags, two actions,
an unclosed tag, an empty action) is counted invalid and yields no action: the agent then
sends an empty action, which every env answers with its invalid-action feedback. One other
form is read where no reasoning is required: a response without ``<action>`` that holds exactly
one ``<tool_call>{"name": "act"|"search"|"click", "arguments": {...}}</tool_call>``, the answer of
a checkpoint trained through TRL's tools (:mod:`envrl.integrations.trl`), gives that tool's
action (``act``'s text, ``search[...]``, ``click[...]``), so ``envrl eval`` scores such models too.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from envrl.agents.generation import Message

#: templates that ship with envrl, by name
BUILTIN_TEMPLATES = ("think-action", "react", "action", "compact")
DEFAULT_TEMPLATE = "think-action"

#: responses longer than this are parsed on their first MAX_PARSE_CHARS characters only
MAX_PARSE_CHARS = 32_000
#: a parsed action longer than this is refused (envs accept up to 1,024 characters)
MAX_ACTION_CHARS = 512
#: an observation longer than this is cut in the prompt (the end is kept; it says what changed)
MAX_OBSERVATION_CHARS = 8_000

_REQUIRED_KEYS = (
    "name",
    "system",
    "env_intro",
    "user",
    "history_header",
    "history_turn",
    "history_footer",
    "admissible_header",
    "admissible_item",
    "admissible_more",
    "admissible_footer",
    "max_admissible",
    "require_think",
)

#: an example action per env, shown in the format instruction
EXAMPLE_ACTIONS = {
    "alfworld": "go to cabinet 1",
    "webshop": "search[red running shoes]",
    "scienceworld": "look around",
    "textworld": "go north",
    "diag-chain": "open the left door",
    "diag-dynamics": "press the star button",
    "diag-alternatives": "press the star button",
    "diag-generalization": "take the kettle",
}


class TemplateError(ValueError):
    """A template file that cannot be used (missing keys, unknown fields, bad JSON)."""


@dataclass(frozen=True)
class Turn:
    """One past turn as the prompt shows it."""

    observation: str
    action: str
    think: str = ""


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt template (see the module docstring for its fields)."""

    name: str
    system: str
    env_intro: Mapping[str, str]
    user: str
    history_header: str
    history_turn: str
    history_footer: str
    admissible_header: str
    admissible_item: str
    admissible_more: str
    admissible_footer: str
    max_admissible: int
    require_think: bool
    description: str = ""
    source: str = field(default="", compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "") -> PromptTemplate:
        missing = [key for key in _REQUIRED_KEYS if key not in data]
        if missing:
            raise TemplateError(f"template {source or data.get('name')!r} lacks {', '.join(missing)}")
        known = set(_REQUIRED_KEYS) | {"description"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TemplateError(f"template {source!r} has unknown keys: {', '.join(unknown)}")
        template = cls(**{key: data[key] for key in known if key in data}, source=source)
        template._check()
        return template

    def _check(self) -> None:
        """Format every string once with dummy values: a misspelt field fails now, not mid-run."""
        dummy_user = dict(
            intro="", instruction="", history="", turn=1, observation="", admissible="", example_action=""
        )
        checks: list[tuple[str, str, Mapping[str, object]]] = [
            ("user", self.user, dummy_user),
            ("history_header", self.history_header, {"count": 1}),
            ("history_turn", self.history_turn, dict(turn=1, observation="", think="", action="")),
            ("admissible_header", self.admissible_header, {"count": 1}),
            ("admissible_item", self.admissible_item, {"action": ""}),
            ("admissible_more", self.admissible_more, {"count": 1}),
        ]
        for key, text, values in checks:
            try:
                text.format(**values)
            except (KeyError, IndexError, ValueError) as exc:
                raise TemplateError(
                    f"template {self.name!r}: {key} uses an unknown or malformed field ({exc})"
                ) from exc
        if not isinstance(self.max_admissible, int) or self.max_admissible < 0:
            raise TemplateError(f"template {self.name!r}: max_admissible must be an integer >= 0")

    def to_dict(self) -> dict[str, Any]:
        data = {key: getattr(self, key) for key in _REQUIRED_KEYS}
        data["env_intro"] = dict(self.env_intro)
        data["description"] = self.description
        return data

    @property
    def sha256(self) -> str:
        """Fingerprint of the template's content: runs record it, so an edited template shows."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode("utf-8")).hexdigest()

    # ---- building prompts ---------------------------------------------------------------

    def format_response(self, action: str, think: str = "") -> str:
        """The response that gives ``action`` in this template's format (what
        :func:`parse_response` reads back as ``action``): expert demonstrations and the
        candidates a ``choose``-mode policy scores are written with it."""
        if self.require_think:
            return f"<think>{think}</think><action>{action}</action>"
        return f"<action>{action}</action>"

    def build_messages(
        self,
        env_name: str,
        instruction: str,
        observation: str,
        admissible_actions: Sequence[str],
        history: Sequence[Turn],
        turn: int,
    ) -> list[Message]:
        """The chat messages for one turn: a system message and one user message."""
        intro = self.env_intro.get(env_name, self.env_intro.get("default", ""))
        user = self.user.format(
            intro=intro,
            instruction=instruction,
            history=self._history(history, turn),
            turn=turn,
            observation=clip_observation(observation),
            admissible=self._admissible(admissible_actions),
            example_action=EXAMPLE_ACTIONS.get(env_name, "look"),
        )
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]

    def messages_at(
        self,
        env_name: str,
        instruction: str,
        observation: str,
        admissible_actions: Sequence[str],
        turns: Sequence[Turn],
        window: int,
    ) -> list[Message]:
        """The messages a :class:`Conversation` with a ``window``-turn history builds at the state
        that follows ``turns`` (all the episode's earlier turns, oldest first): the last ``window``
        of them shown, turn number ``len(turns) + 1``. Recorded transitions rebuild the policy's
        prompt with it."""
        shown = list(turns[-window:]) if window > 0 else []
        return self.build_messages(env_name, instruction, observation, admissible_actions, shown, len(turns) + 1)

    def _history(self, history: Sequence[Turn], turn: int) -> str:
        if not history:
            return ""
        first = turn - len(history)
        lines = [self.history_header.format(count=len(history))]
        for offset, past in enumerate(history):
            lines.append(
                self.history_turn.format(
                    turn=first + offset,
                    observation=clip_observation(past.observation),
                    think=past.think,
                    action=past.action,
                )
            )
        lines.append(self.history_footer)
        return "".join(lines)

    def _admissible(self, actions: Sequence[str]) -> str:
        if not actions or self.max_admissible == 0:
            return ""
        shown = list(actions[: self.max_admissible])
        parts = [self.admissible_header.format(count=len(actions))]
        parts += [self.admissible_item.format(action=action) for action in shown]
        if len(actions) > len(shown):
            parts.append(self.admissible_more.format(count=len(actions) - len(shown)))
        parts.append(self.admissible_footer)
        return "".join(parts)


class Conversation:
    """The prompt side of one episode: the turns so far and the messages for the next one.

    LLM agents, training policies and the expert-data builder all build their prompts here,
    so a checkpoint is trained and evaluated on exactly the same text. ``history`` is the
    number of past turns the prompt shows (0: none).
    """

    def __init__(self, template: PromptTemplate, env_name: str, history: int) -> None:
        self.template = template
        self.env_name = env_name
        self.history = history
        self.turns: list[Turn] = []
        self.turn = 0

    def reset(self) -> None:
        self.turns = []
        self.turn = 0

    def messages(self, observation: str, info: Mapping[str, Any]) -> list[Message]:
        """The next turn's messages (this counts the turn)."""
        self.turn += 1
        shown = self.turns[-self.history :] if self.history else []
        return self.template.build_messages(
            self.env_name,
            str(info.get("instruction", "")),
            str(observation),
            [str(a) for a in info.get("admissible_actions", []) or []],
            shown,
            self.turn,
        )

    def record(self, observation: str, action: str, think: str = "") -> None:
        """Remember the turn just played: the observation acted on and the action sent."""
        self.turns.append(Turn(observation=str(observation), action=action, think=think))


def clip_observation(text: str) -> str:
    """An observation as prompts show it: its last :data:`MAX_OBSERVATION_CHARS` characters (the
    end says what changed). World-model prompts cut it the same way, so they see the policy's state."""
    text = str(text)
    if len(text) <= MAX_OBSERVATION_CHARS:
        return text
    return "[...] " + text[-MAX_OBSERVATION_CHARS:]


def load_template(name_or_path: str | Path = DEFAULT_TEMPLATE) -> PromptTemplate:
    """A built-in template by name (:data:`BUILTIN_TEMPLATES`) or a template JSON file by path."""
    name = str(name_or_path)
    if name in BUILTIN_TEMPLATES:
        # one name per joinpath: Python 3.10's Traversable.joinpath takes a single child
        builtin = resources.files("envrl.agents").joinpath("templates").joinpath(name.replace("-", "_") + ".json")
        text = builtin.read_text(encoding="utf-8")
        source = f"builtin:{name}"
    else:
        path = Path(name)
        if not path.is_file():
            raise TemplateError(
                f"unknown prompt template {name!r}: not one of {', '.join(BUILTIN_TEMPLATES)} and no such file"
            )
        text = path.read_text(encoding="utf-8")
        source = str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TemplateError(f"prompt template {source} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise TemplateError(f"prompt template {source} must be a JSON object")
    return PromptTemplate.from_dict(data, source=source)


# ---- parsing ----------------------------------------------------------------------------

_TAG = re.compile(r"<(/?)(think|action)\s*>", re.IGNORECASE)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
#: the tools of envrl's trainer adapters, read as env actions: tool -> (argument, action format)
TOOL_ACTIONS = {"act": ("action", "{}"), "search": ("query", "search[{}]"), "click": ("target", "click[{}]")}


def _tool_call_action(text: str) -> str | None:
    """The action of exactly one ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` naming
    ``act``, ``search`` or ``click`` with a text argument (the format TRL-trained checkpoints answer
    in), else None."""
    calls = _TOOL_CALL.findall(text)
    if len(calls) != 1:
        return None
    try:
        call = json.loads(calls[0])
    except json.JSONDecodeError:
        return None
    spec = TOOL_ACTIONS.get(str(call.get("name"))) if isinstance(call, dict) else None
    arguments = call.get("arguments") if spec else None
    if spec is None or not isinstance(arguments, dict) or not isinstance(arguments.get(spec[0]), str):
        return None
    return spec[1].format(arguments[spec[0]])


@dataclass(frozen=True)
class ParsedResponse:
    """What :func:`parse_response` read. ``action`` is None when the format is invalid;
    ``problem`` then says why in a few words (``"no <action> tag"``, ``"2 <action> tags"``...)."""

    action: str | None
    think: str | None
    format_valid: bool
    problem: str | None = None


def parse_response(text: str, require_think: bool = True) -> ParsedResponse:
    """Read one action (and the reasoning) from a model's response; see the module docstring."""
    text = str(text)[:MAX_PARSE_CHARS]
    blocks: dict[str, list[str]] = {"think": [], "action": []}
    problem = None
    open_tag: tuple[str, int] | None = None
    order: list[str] = []
    for match in _TAG.finditer(text):
        closing, tag = match.group(1) == "/", match.group(2).lower()
        if not closing:
            if open_tag is not None:
                problem = problem or f"<{tag}> inside <{open_tag[0]}>"
                continue
            open_tag = (tag, match.end())
        else:
            if open_tag is None or open_tag[0] != tag:
                problem = problem or f"</{tag}> without <{tag}>"
                continue
            blocks[tag].append(text[open_tag[1] : match.start()])
            order.append(tag)
            open_tag = None
    if open_tag is not None:
        problem = problem or f"unclosed <{open_tag[0]}>"
    think = blocks["think"][0].strip() if blocks["think"] else None
    actions = blocks["action"]
    if not actions and not require_think and problem is None:
        tool_action = _tool_call_action(text)  # a model trained with tools (envrl.integrations.trl)
        if tool_action is not None:
            actions = [tool_action]
    if not actions:
        return ParsedResponse(None, think, False, problem or "no <action> tag")
    if len(actions) > 1:
        return ParsedResponse(None, think, False, f"{len(actions)} <action> tags")
    action = " ".join(actions[0].split())
    if not action:
        return ParsedResponse(None, think, False, "empty <action>")
    if len(action) > MAX_ACTION_CHARS:
        return ParsedResponse(None, think, False, f"action longer than {MAX_ACTION_CHARS} characters")
    if problem is None and require_think:
        if len(blocks["think"]) != 1:
            problem = "no <think> tag" if not blocks["think"] else f"{len(blocks['think'])} <think> tags"
        elif order.index("think") > order.index("action"):
            problem = "<think> after <action>"
    if problem is not None:
        return ParsedResponse(None, think, False, problem)
    return ParsedResponse(action, think, True)
