"""The ALFWorld text engine: TextWorld's PDDL environment, made fast without changing a byte.

The stock engine (``textworld.envs.pddl.PddlEnv``) spends ~95% of a step in its text
generator: every derivation re-parses grammar templates with TatSu and deep-copies contexts
that hold every entity of the room, once per admissible command. ``CachedGrammar`` derives
exactly the same strings with two changes of mechanism, not of meaning:

* templates and conditional queries are parsed once and memoized (they are immutable);
* contexts are copied one level deep: the derivation only rebinds names in the
  ``variables`` and ``mapping`` dicts and never mutates the entities they point to, so a
  shallow copy of those two dicts is observably the same as the stock deep copy.

``AlfredEngine`` also skips the second Fast Downward translation of the problem that the
stock engine does on the ``reset()`` right after ``load()`` (the state it would rebuild is
the freshly loaded one). Planning (``policy_commands``) is only done when asked for.

``tests/test_alfworld_engine.py`` replays walkthroughs in both engines and compares every
observation and admissible-command list byte for byte.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from typing import Any, Iterator

import textworld
from textworld.core import EnvInfos, GameState
from textworld.envs.pddl import pddl as stock_pddl
from textworld.envs.pddl.textgen import (
    ConditionalSymbol,
    ContextSensitiveGrammar,
    CSGUnknownSymbolError,
    EvalSymbol,
    ListSymbol,
    NonterminalSymbol,
    Symbol,
    TerminalSymbol,
    _parse_and_convert,
)
from textworld.logic import Rule

# ALFWorld 0.4.x says "move X to Y"; many published prompts use the older "put X in/on Y".
MOVE_TEMPLATE = 'template :: "move {o} to {r}";'
PUT_TEMPLATE = 'template :: "put {o} in/on {r}";'
COMMAND_STYLES = ("move", "put")


@functools.lru_cache(maxsize=4096)
def _parse_symbols(text: str) -> tuple[Symbol, ...]:
    """Parsed template symbols; shared and never mutated (contexts travel beside them)."""
    return tuple(_parse_and_convert(text, rule_name="symbols"))


@functools.lru_cache(maxsize=4096)
def _parse_query(expression: str) -> Rule:
    return Rule.parse_conjunctive_query(expression)


@functools.lru_cache(maxsize=4096)
def _compile(expression: str):
    return compile(expression, "<grammar>", "eval")


def _copy_context(context: dict[str, Any]) -> dict[str, Any]:
    return {
        "state": context["state"],
        "facts": context["facts"],
        "variables": dict(context["variables"]),
        "mapping": dict(context["mapping"]),
        "entity_infos": context["entity_infos"],
    }


def _query(expression: str, context: dict[str, Any]) -> list[dict[str, Any]]:
    """All contexts extended by the assignments that satisfy ``expression`` in the state."""
    rule = _parse_query(expression)
    contexts = []
    for mapping in context["state"].all_assignments(rule, context["mapping"]):
        extended = _copy_context(context)
        entity_infos = extended["entity_infos"]
        extended["variables"].update({ph.name: entity_infos[var.name] for ph, var in mapping.items()})
        extended["mapping"].update(mapping)
        contexts.append(extended)
    return contexts


class CachedGrammar(ContextSensitiveGrammar):
    """A ``ContextSensitiveGrammar`` that derives the same text as the stock one, faster."""

    @classmethod
    def from_grammar(cls, grammar: ContextSensitiveGrammar) -> "CachedGrammar":
        fast = cls()
        fast.update(grammar)
        return fast

    def _rule_symbols(self, symbol: NonterminalSymbol, context: dict[str, Any]) -> list[Symbol]:
        rules = self._rules.get(str(symbol))
        if not rules:
            raise CSGUnknownSymbolError(symbol)
        for rule in rules:
            if not rule.condition:
                return rule.rhs
            query = _parse_query(rule.condition)
            if any(True for _ in context["state"].all_assignments(query, context["mapping"])):
                return rule.rhs
        raise IndexError(f"no applicable production rule for #{symbol}#")

    def _expand(self, symbol: Symbol, context: dict[str, Any]) -> list[tuple[Symbol, dict[str, Any]]]:
        """One derivation step of a non-terminal symbol, as (symbol, context) pairs."""
        if isinstance(symbol, NonterminalSymbol):
            rhs = self._rule_symbols(symbol, context)
            return [(child, _copy_context(context)) for child in rhs]
        if isinstance(symbol, EvalSymbol):
            value = eval(_compile(symbol.expression), {}, dict(context["variables"]))
            return [(TerminalSymbol(value), context)]
        if isinstance(symbol, ConditionalSymbol):
            base = _copy_context(context)
            contexts = _query(symbol.given, base) if symbol.given else [base]
            return [(symbol.expression, _copy_context(ctx)) for ctx in contexts]
        if isinstance(symbol, ListSymbol):
            items = self._expand(symbol.symbol, context)
            if not items:
                return [(NonterminalSymbol("list_empty"), context)]
            if len(items) == 1:
                return items
            separated: list[tuple[Symbol, dict[str, Any]]] = []
            for item in items[:-1]:
                separated.append(item)
                separated.append((NonterminalSymbol("list_separator"), context))
            separated[-1] = (NonterminalSymbol("list_last_separator"), context)
            separated.append(items[-1])
            return separated
        raise NotImplementedError(f"Unknown symbol: {type(symbol)}")

    def derive(self, start: str, context: dict[str, Any] | None = None) -> str:
        context = context or {}
        stack = [(symbol, _copy_context(context)) for symbol in reversed(_parse_symbols(start))]
        derived: list[str] = []
        while stack:
            symbol, ctx = stack.pop()
            if isinstance(symbol, TerminalSymbol):
                derived.append(str(symbol))
            else:
                stack.extend(reversed(self._expand(symbol, ctx)))
        return "".join(derived)


class AlfredEngine(stock_pddl.PddlEnv):
    """``PddlEnv`` with the cached grammar and no redundant problem translation on reset."""

    def __init__(self, infos: EnvInfos | None = None) -> None:
        super().__init__(infos)
        self._fresh_state = False

    def load(self, filename_or_data) -> None:
        super().load(filename_or_data)
        self._logic.grammar = CachedGrammar.from_grammar(self._logic.grammar)
        self._fresh_state = True

    def reset(self) -> GameState:
        # Same as PddlEnv.reset, except that right after load() the freshly translated state
        # is used as is instead of translating the same problem with Fast Downward again.
        if not self._fresh_state:
            self._pddl_state = stock_pddl.pddl_logic.PddlState(
                self.downward_lib, self._game_data["pddl_problem"], self._logic
            )
        self._fresh_state = False
        self.prev_state = None
        self.state = GameState()
        self._last_action = None
        self._moves = 0
        context = {
            "state": self._pddl_state,
            "facts": list(self._pddl_state.facts),
            "variables": {},
            "mapping": {},
            "entity_infos": self._entity_infos,
        }
        self.state.feedback = self._logic.grammar.derive("#intro#", context)
        self.state.raw = self.state.feedback
        self._gather_infos()
        if "walkthrough" in self.request_infos.extras:
            self.state["extra.walkthrough"] = self.walkthrough or self._pddl_state.replan(self._entity_infos)
        return self.state

    def step(self, command: str):
        self._fresh_state = False
        return super().step(command)


def with_command_style(game: dict[str, Any], style: str) -> dict[str, Any]:
    """A copy of an ALFWorld game whose put command reads in ``style`` ("move" or "put")."""
    if style not in COMMAND_STYLES:
        raise ValueError(f"command_style must be one of {COMMAND_STYLES}, got {style!r}")
    if style == "move":
        return game
    game = dict(game)
    game["grammar"] = game["grammar"].replace(MOVE_TEMPLATE, PUT_TEMPLATE)
    game["walkthrough"] = [translate_command(a, "put") for a in game.get("walkthrough") or []]
    return game


def translate_command(command: str, style: str) -> str:
    """``move X to Y`` <-> ``put X in/on Y`` so that walkthroughs follow the chosen wording."""
    if style == "put" and command.startswith("move ") and " to " in command:
        obj, _, recep = command[len("move "):].partition(" to ")
        return f"put {obj} in/on {recep}"
    if style == "move" and command.startswith("put ") and " in/on " in command:
        obj, _, recep = command[len("put "):].partition(" in/on ")
        return f"move {obj} to {recep}"
    return command


@contextlib.contextmanager
def alfworld_import_guard() -> Iterator[None]:
    """Import ``alfworld`` modules without letting them change ``ALFWORLD_DATA``.

    ``alfworld.info`` creates ``$ALFWORLD_DATA`` (default ``~/.cache/alfworld``) and exports it
    into ``os.environ`` when first imported. envrl reads that variable to choose between official
    and built-in games, so an import must not flip the choice for the rest of the process.
    """
    saved = os.environ.get("ALFWORLD_DATA")
    if saved is None:
        os.environ["ALFWORLD_DATA"] = os.path.join(tempfile.gettempdir(), "envrl-alfworld-import")
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("ALFWORLD_DATA", None)
        else:
            os.environ["ALFWORLD_DATA"] = saved


def alfred_wrappers() -> list:
    """ALFWorld's own TextWorld wrappers: readable names ("desk 1") and the game-file info."""
    with alfworld_import_guard():
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    return [AlfredDemangler(shuffle=False), AlfredInfos]


def handcoded_expert_wrapper(env: Any) -> Any:
    """Wrap ``env`` in ALFWorld's hand-coded expert, with its drift bug fixed.

    ALFWorld 0.4's hand-coded expert tracks its inventory by looking for ``put`` in the last
    command, but the 0.4 grammar says ``move X to Y``: after its first placement it still
    believes it holds the object, so ``pick_two_obj_and_place`` never finishes. The fix
    reports placements to the expert in the wording it understands. It also reads (and
    writes) admissible commands in the ``move`` wording only, so under ``command_style="put"``
    it is shown the commands in that wording; the env translates its plan back.
    """
    with alfworld_import_guard():
        from alfworld.agents.environment.alfred_tw_env import AlfredExpert, AlfredExpertType

    class HandCodedExpert(AlfredExpert):
        def step(self, command: str):
            self.state, reward, done = textworld.core.Wrapper.step(self, command)
            self.prev_command = translate_command(str(command).strip(), "put")
            self._gather_infos()
            return self.state, reward, done

        def _gather_infos(self) -> None:
            shown = self.state["admissible_commands"]
            self.state["admissible_commands"] = [translate_command(c, "move") for c in shown]
            try:
                super()._gather_infos()
            finally:
                self.state["admissible_commands"] = shown

    return HandCodedExpert(env, expert_type=AlfredExpertType.HANDCODED)


def start_engine(infos: EnvInfos, stock: bool = False) -> textworld.Environment:
    """An unloaded ALFWorld engine (envrl's, or the stock one for comparisons)."""
    env: Any = stock_pddl.PddlEnv(infos) if stock else AlfredEngine(infos)
    for wrapper in alfred_wrappers():
        env = wrapper(env)
    return env

