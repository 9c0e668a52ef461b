"""ALFWorld's grammar files, parsed once and derived fast: the text side of the engine.

The stock engine (``textworld.envs.pddl.PddlEnv``) spends ~95% of a step in its text
generator: every derivation re-parses grammar templates with TatSu and deep-copies contexts
that hold every entity of the room, once per admissible command. ``CachedGrammar`` derives
exactly the same strings with two changes of mechanism, not of meaning:

* templates and conditional queries are parsed once and memoized (they are immutable);
* contexts are copied one level deep: the derivation only rebinds names in the
  ``variables`` and ``mapping`` dicts and never mutates the entities they point to, so a
  shallow copy of those two dicts is observably the same as the stock deep copy.

The stock engine also parses the game's grammar file with TatSu on every ``load()``; it depends
only on the game's text, so ``game_logic`` reuses it: the parsed grammar is kept per grammar
text, each part of the file per part text, and every rule's right-hand side per rule text:
games differ only in their task sentence.

``tests/test_alfworld_engine.py`` compares the derived text with the stock engine's byte for
byte; ``tests/test_alfworld_reset.py`` compares the parsed logic with the stock parse.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

import textworld
import textworld.logic
from tatsu.exceptions import FailedParse
from textworld.envs.pddl import pddl as stock_pddl
from textworld.envs.pddl.logic.model import ActionGrammarNode, ActionTypeNode, PddlLogicModelBuilderSemantics
from textworld.envs.pddl.logic.parser import PddlLogicParser
from textworld.envs.pddl.textgen import (
    ConditionalSymbol,
    ContextSensitiveGrammar,
    CSGUnknownSymbolError,
    EvalSymbol,
    ListSymbol,
    NonterminalSymbol,
    ProductionRule,
    Symbol,
    TerminalSymbol,
    _parse_and_convert,
)
from textworld.logic import Rule


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
    def from_grammar(cls, grammar: ContextSensitiveGrammar) -> CachedGrammar:
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


# --------------------------------------------------------------------------- game logic


@dataclass(frozen=True)
class _ParsedLogic:
    """A grammar file parsed once: its actions and its grammar rules (both read-only after)."""

    actions: dict[str, Any]  # name -> textworld.envs.pddl.logic.Action
    grammar: CachedGrammar


# TextWorld's grammar-file parser, without the source positions (parseinfo) that nothing reads
# and that cost a line index of the whole file per parse.
_GRAMMAR_PARSER = PddlLogicParser(semantics=PddlLogicModelBuilderSemantics(), parseinfo=False)
# Where a top-level part of a grammar file (an action or a grammar block) may start.
_PART_START = re.compile(r"^(?=action\s|grammar\s*::)", re.MULTILINE)


def _without_comment_lines(code: str) -> str:
    """An action's grammar block as TextWorld reads it: comment lines dropped, then JSON."""
    return "\n".join(line for line in code.split("\n") if not line.lstrip().startswith("#"))


@functools.lru_cache(maxsize=256)
def _parse_parts(text: str) -> tuple[Any, ...]:
    """The top-level parts (actions, grammar blocks) of a grammar file or a piece of one."""
    return tuple(_GRAMMAR_PARSER.parse(text, rule_name="pddlStart").parts or ())


def _grammar_parts(grammar_text: str) -> tuple[Any, ...]:
    """The parts of a grammar file, parsing each part's text once per process.

    A grammar file is a sequence of independent parts, and ALFWorld's games differ in one
    part only (the grammar block with the task sentence), so the file is cut where a line
    starts a part and each piece is parsed (and memoized) alone. A cut inside a string would
    leave a piece with an odd number of quotes or one that does not parse: then the whole file
    is parsed at once, as TextWorld does.
    """
    pieces = _PART_START.split(grammar_text)
    if all(piece.count('"') % 2 == 0 for piece in pieces):
        try:
            return tuple(part for piece in pieces for part in _parse_parts(piece))
        except FailedParse:
            pass
    return _parse_parts(grammar_text)


@functools.lru_cache(maxsize=32)
def _parse_logic(grammar_text: str) -> _ParsedLogic:
    """Parse a game's grammar file as ``GameLogic`` does, reusing what other games share.

    Each part's text goes through ``_grammar_parts`` and each rule's right-hand side through
    ``_parse_symbols``, so that only the task sentence is new in another game. Rules merge in
    file order, later ones replacing earlier ones of the same name.
    """
    converter = stock_pddl.pddl_logic._ModelConverter()
    actions: dict[str, Any] = {}
    rule_texts: dict[str, list[dict[str, Any]]] = {}
    for part in _grammar_parts(grammar_text):
        if isinstance(part, ActionTypeNode):
            action = converter.walk(part)
            actions[action.name.lower()] = action
            rule_texts.update(json.loads(_without_comment_lines(action.grammar)))
        elif isinstance(part, ActionGrammarNode):
            rule_texts.update(json.loads(converter._unescape_block(part.code)))
    grammar = CachedGrammar()
    for name, rules in rule_texts.items():
        for rule in rules:
            rhs = list(_parse_symbols(rule["rhs"]))
            grammar.add_rule(ProductionRule(name, rhs, rule.get("weight", 1), rule.get("condition", "")))
    return _ParsedLogic(actions, grammar)


def game_logic(domain: str, grammar_text: str) -> Any:
    """A fresh ``GameLogic`` for a game, without parsing a grammar file seen before.

    Fresh because a state adds the problem's types to its logic; the parsed actions and rules
    are shared (nothing writes to them). Built without ``GameLogic.__init__``, which would parse
    the grammar file again.
    """
    parsed = _parse_logic(grammar_text)
    logic = stock_pddl.pddl_logic.GameLogic.__new__(stock_pddl.pddl_logic.GameLogic)
    logic.domain = domain
    logic.grammar = CachedGrammar.from_grammar(parsed.grammar)
    logic.actions = dict(parsed.actions)
    logic.types = textworld.logic.TypeHierarchy()
    return logic
