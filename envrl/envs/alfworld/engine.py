"""The ALFWorld text engine: TextWorld's PDDL environment, made fast without changing a byte.

The stock engine (``textworld.envs.pddl.PddlEnv``) spends ~95% of a step in its text
generator: every derivation re-parses grammar templates with TatSu and deep-copies contexts
that hold every entity of the room, once per admissible command. ``CachedGrammar`` derives
exactly the same strings with two changes of mechanism, not of meaning:

* templates and conditional queries are parsed once and memoized (they are immutable);
* contexts are copied one level deep: the derivation only rebinds names in the
  ``variables`` and ``mapping`` dicts and never mutates the entities they point to, so a
  shallow copy of those two dicts is observably the same as the stock deep copy.

Resets. The stock engine has Fast Downward translate the PDDL problem to SAS twice (plain,
for the game state; optimized, for the planner) on ``load()`` and again on every ``reset()``,
which is ~3/4 of a reset, and parses the game's grammar file with TatSu on every ``load()``.
Both depend only on the game's text, so ``AlfredEngine`` reuses them:

* ``TranslationCache`` keeps the translations in memory (an LRU bounded in bytes) and on
  disk under envrl's cache root (``$ENVRL_CACHE/alfworld/translations-v*``), keyed by a hash of
  the domain, the problem, the translator's and TextWorld's versions and the entry format
  (``TRANSLATION_FORMAT``). A disk entry
  carries its own checksum, key and kind: a corrupt, truncated or misplaced one is rebuilt,
  and entries are written to a temporary file that is renamed into place, so processes may
  share the cache.
* The planner's translation is only made (or read) when the planner first runs
  (``policy_commands``, ``expert_plan``): Fast Downward's ``load_sas_replan`` only stores the
  text for ``replan`` to read, so loading it later plans exactly the same.
* The parsed grammar is kept per grammar text, each part of the file per part text, and every
  rule's right-hand side per rule text: games differ only in their task sentence.

``tests/test_alfworld_engine.py`` replays walkthroughs in both engines and compares every
observation and admissible-command list byte for byte; ``tests/test_alfworld_reset.py``
checks that cached, uncached and stock resets agree and that the cache survives damage.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import sys
import tempfile
import threading
import zlib
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import textworld
import textworld.logic
from tatsu.exceptions import FailedParse
from textworld.core import EnvInfos, GameState
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
from textworld.logic import Proposition, Rule, Variable
from textworld.utils import check_flag

from envrl.cache import engine_cache

logger = logging.getLogger(__name__)

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


# --------------------------------------------------------------------------- translations

#: Bump when the content or layout of a cached translation changes: it is part of every key.
TRANSLATION_FORMAT = 1
#: Default bound of the in-memory translations of a process: ~70 official games (~1.4 MB each
#: with the planner's); beyond that, a reset reads the disk entry (~25 ms instead of ~5 ms).
MEMORY_BYTES = 96 * 2**20
_MAGIC = b"envrl-alfworld-translation\n"
_DIGEST_SIZE = 32


class CorruptEntry(ValueError):
    """A disk cache entry that cannot be trusted (truncated, damaged, or not the one asked for)."""


@functools.lru_cache(maxsize=1)
def engine_versions() -> str:
    """The versions that a translation depends on besides the game: translator and engine."""
    return "fd{}-tw{}".format(metadata.version("fast-downward-textworld"), metadata.version("textworld"))


def translation_key(domain: str, problem: str) -> str:
    """The cache key of a game's translations: its domain and problem, and the versions."""
    digest = hashlib.sha256(f"envrl-translation/{TRANSLATION_FORMAT}/{engine_versions()}\n".encode())
    for text in (domain, problem):
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


@dataclass(frozen=True)
class StateTranslation:
    """What the game state needs from Fast Downward's plain translation of a problem.

    The SAS text for the native engine, and what ``PddlState`` reads from the translator's
    parsed task: types, action parameters, objects and initial facts (as plain tuples, so that
    it can be stored as JSON).
    """

    sas: str
    types: tuple[tuple[str, tuple[str, ...]], ...]  # (name, supertype names)
    actions: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # (name, ((parameter, type), ...))
    objects: tuple[tuple[str, str], ...]  # (name, type)
    init: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # (predicate, ((argument, type), ...))

    @functools.cached_property
    def facts(self) -> tuple[Proposition, ...]:
        """The initial facts that ``PddlState`` derives from the task, in the same order."""
        return tuple(Proposition(name, [Variable(arg, type_) for arg, type_ in args]) for name, args in self.init)

    def native_facts(self, read: Callable[[], list[Proposition]]) -> tuple[Proposition, ...]:
        """The native engine's initial facts: ``read`` once (they follow from the SAS), then reused."""
        facts = self.__dict__.get("_native_facts")
        if facts is None:
            facts = tuple(read())
            object.__setattr__(self, "_native_facts", facts)  # a memo, not part of the value
        return facts

    @functools.cached_property
    def action_schemas(self) -> dict[str, _ActionSchema]:
        """The actions by name, shaped as ``PddlState`` reads the translator's (``_actions``)."""
        return {name: _ActionSchema(name, tuple(_Parameter(*p) for p in params)) for name, params in self.actions}

    @property
    def nbytes(self) -> int:
        """Rough memory use, for the LRU's bound (measured: ~1.2 MB a game on the official samples)."""
        return len(self.sas) + 1_500 * len(self.init) + 50_000

    def to_json(self) -> dict[str, Any]:
        return {
            "sas": self.sas,
            "types": self.types,
            "actions": self.actions,
            "objects": self.objects,
            "init": self.init,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StateTranslation:
        """Rebuild from ``to_json``'s output; raises ``CorruptEntry`` on any other shape."""
        try:
            translation = cls(
                sas=_text(data["sas"]),
                types=tuple((_text(n), tuple(map(_text, parents))) for n, parents in data["types"]),
                actions=tuple((_text(n), tuple(_pair(p) for p in params)) for n, params in data["actions"]),
                objects=tuple(_pair(o) for o in data["objects"]),
                init=tuple((_text(n), tuple(_pair(a) for a in args)) for n, args in data["init"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise CorruptEntry(f"malformed state translation: {error!r}") from None
        return translation


@dataclass(frozen=True)
class PlannerTranslation:
    """Fast Downward's optimized translation of a problem: what its planner searches."""

    sas: str

    @property
    def nbytes(self) -> int:
        """Rough memory use, for the LRU's bound."""
        return len(self.sas) + 1_000

    def to_json(self) -> dict[str, Any]:
        return {"sas": self.sas}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlannerTranslation:
        try:
            return cls(sas=_text(data["sas"]))
        except (KeyError, TypeError) as error:
            raise CorruptEntry(f"malformed planner translation: {error!r}") from None


@dataclass(frozen=True)
class _Parameter:
    """An action parameter as ``PddlState`` reads it (``fast_downward``'s ``TypedObject``)."""

    name: str
    type_name: str


@dataclass(frozen=True)
class _ActionSchema:
    """An action as ``PddlState`` reads it: its name and parameters."""

    name: str
    parameters: tuple[_Parameter, ...]


def _text(value: Any) -> str:
    """``value`` if it is a string: a disk entry's JSON is checked before it is trusted."""
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _pair(value: Any) -> tuple[str, str]:
    """A (name, type) pair from a disk entry's JSON."""
    first, second = value
    return _text(first), _text(second)


def _pddl2sas(domain: str, problem: str, optimize: bool) -> tuple[Any, str]:
    """Fast Downward's translator, leaving ``sys.argv`` as it was (the translator overwrites it)."""
    import fast_downward  # looked up at call time, so that tests can count the calls

    argv = sys.argv
    try:
        return fast_downward.pddl2sas(domain, problem, verbose=check_flag("TW_PDDL_DEBUG"), optimize=optimize)
    finally:
        sys.argv = argv


def translate_state(domain: str, problem: str) -> StateTranslation:
    """Translate a problem as ``PddlState`` does for the game state (not for the planner)."""
    import fast_downward

    task, sas = _pddl2sas(domain, problem, optimize=False)
    name2type = {o.name: o.type_name for o in task.objects}
    init = []
    for atom in task.init:
        if isinstance(atom, fast_downward.translate.pddl.conditions.Atom):
            if atom.predicate != "=":
                init.append((atom.predicate, tuple((arg, name2type[arg]) for arg in atom.args)))
        elif isinstance(atom, fast_downward.translate.pddl.f_expression.Assign):
            name = f"{atom.expression.value}"
            if atom.fluent.symbol != "total-cost" and not name.isdigit():  # distances are not facts
                init.append((name, tuple((arg, name2type[arg]) for arg in atom.fluent.args)))
    return StateTranslation(
        sas=sas,
        types=tuple((t.name, tuple(t.supertype_names)) for t in task.types),
        actions=tuple((a.name, tuple((p.name, p.type_name) for p in a.parameters)) for a in task.actions),
        objects=tuple(name2type.items()),
        init=tuple(init),
    )


def translate_planner(domain: str, problem: str) -> PlannerTranslation:
    """Translate a problem as ``PddlState`` does for the planner (``optimize=True``)."""
    return PlannerTranslation(_pddl2sas(domain, problem, optimize=True)[1])


_KINDS: dict[str, tuple[Callable[[str, str], Any], Callable[[dict[str, Any]], Any]]] = {
    "state": (translate_state, StateTranslation.from_json),
    "planner": (translate_planner, PlannerTranslation.from_json),
}


class TranslationCache:
    """Fast Downward translations of ALFWorld problems, in memory and on disk.

    ``directory``: where the disk entries go (default: ``translations-v<format>`` under envrl's
    ALFWorld cache, resolved at each use so that ``$ENVRL_CACHE`` is honoured); ``disk=False``
    keeps them in memory only. ``memory_bytes`` bounds the in-memory LRU. ``stats`` counts
    memory hits, disk hits, translations, rebuilt corrupt entries and failed writes.
    """

    def __init__(
        self, directory: str | os.PathLike | None = None, *, disk: bool = True, memory_bytes: int = MEMORY_BYTES
    ) -> None:
        self._directory = Path(directory) if directory is not None else None
        self.disk = disk
        self.memory_bytes = memory_bytes
        self._memory: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._memory_used = 0
        self._lock = threading.Lock()
        self._writable = True  # until a write fails: then the disk is only read (one warning)
        self.stats: Counter[str] = Counter()

    @property
    def directory(self) -> Path:
        if self._directory is not None:
            return self._directory
        return engine_cache("alfworld") / f"translations-v{TRANSLATION_FORMAT}"

    def state(self, domain: str, problem: str) -> StateTranslation:
        """The game-state translation of a problem."""
        return self._get("state", domain, problem)

    def planner(self, domain: str, problem: str) -> PlannerTranslation:
        """The planner's translation of a problem."""
        return self._get("planner", domain, problem)

    def entry_path(self, kind: str, domain: str, problem: str) -> Path:
        """Where the disk entry of ``kind`` ("state" or "planner") for a problem lives."""
        return self._path(kind, translation_key(domain, problem))

    def clear_memory(self) -> None:
        """Forget the in-memory translations (the disk entries stay)."""
        with self._lock:
            self._memory.clear()
            self._memory_used = 0

    # ---- lookup ------------------------------------------------------------------------

    def _get(self, kind: str, domain: str, problem: str) -> Any:
        key = translation_key(domain, problem)
        found = self._recall(kind, key)
        if found is not None:
            self.stats["memory_hits"] += 1
            return found
        found = self._read(kind, key) if self.disk else None
        if found is not None:
            self.stats["disk_hits"] += 1
        else:
            translate, _ = _KINDS[kind]
            found = translate(domain, problem)
            self.stats["translations"] += 1
            if self.disk and self._writable:
                self._write(kind, key, found)
        self._remember(kind, key, found)
        return found

    def _recall(self, kind: str, key: str) -> Any:
        with self._lock:
            found = self._memory.get((kind, key))
            if found is not None:
                self._memory.move_to_end((kind, key))
            return found

    def _remember(self, kind: str, key: str, translation: Any) -> None:
        """Keep ``translation``, dropping the least recently used ones beyond the bound."""
        with self._lock:
            previous = self._memory.pop((kind, key), None)
            if previous is not None:
                self._memory_used -= previous.nbytes
            self._memory[(kind, key)] = translation
            self._memory_used += translation.nbytes
            while self._memory_used > self.memory_bytes and len(self._memory) > 1:
                _, dropped = self._memory.popitem(last=False)
                self._memory_used -= dropped.nbytes

    # ---- disk --------------------------------------------------------------------------

    def _path(self, kind: str, key: str) -> Path:
        return self.directory / engine_versions() / key[:2] / f"{key}.{kind}.z"

    def _read(self, kind: str, key: str) -> Any:
        """The disk entry, or None when there is none or it is corrupt (the caller rewrites it)."""
        path = self._path(kind, key)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            logger.warning("cannot read ALFWorld translation %s (%s); translating again", path, error)
            return None
        try:
            return decode_entry(blob, kind, key)
        except CorruptEntry as error:
            self.stats["corrupt"] += 1
            logger.warning("corrupt ALFWorld translation %s (%s); translating again", path, error)
            return None

    def _write(self, kind: str, key: str, translation: Any) -> None:
        """Write an entry atomically (temp file + rename); a failure only costs the cache."""
        path = self._path(kind, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(encode_entry(translation, kind, key))
                os.replace(temporary, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(temporary)
        except OSError as error:
            self.stats["write_errors"] += 1
            self._writable = False
            logger.warning(
                "cannot write ALFWorld translations under %s (%s); this process keeps them in memory only",
                self.directory,
                error,
            )


def encode_entry(translation: StateTranslation | PlannerTranslation, kind: str, key: str) -> bytes:
    """A disk entry: magic, SHA-256 of the rest, then zlib-compressed JSON naming kind and key."""
    document = {"kind": kind, "key": key, "translation": translation.to_json()}
    payload = zlib.compress(json.dumps(document, separators=(",", ":")).encode("utf-8"), 1)
    return _MAGIC + hashlib.sha256(payload).digest() + payload


def decode_entry(blob: bytes, kind: str, key: str) -> Any:
    """The translation in a disk entry; ``CorruptEntry`` unless it is intact and the one asked for."""
    header = len(_MAGIC) + _DIGEST_SIZE
    if len(blob) <= header or not blob.startswith(_MAGIC):
        raise CorruptEntry("truncated or not a translation entry")
    payload = blob[header:]
    if hashlib.sha256(payload).digest() != blob[len(_MAGIC) : header]:
        raise CorruptEntry("checksum mismatch")
    try:
        document = json.loads(zlib.decompress(payload))
    except (zlib.error, ValueError) as error:
        raise CorruptEntry(f"undecodable: {error}") from None
    if not isinstance(document, dict) or document.get("kind") != kind or document.get("key") != key:
        raise CorruptEntry("entry of another game or kind")
    translation = document.get("translation")
    if not isinstance(translation, dict):
        raise CorruptEntry("no translation in entry")
    return _KINDS[kind][1](translation)


_DEFAULT_CACHE: TranslationCache | None = None


def default_translations() -> TranslationCache:
    """The process-wide translation cache that engines share unless given another."""
    global _DEFAULT_CACHE
    if _DEFAULT_CACHE is None:
        _DEFAULT_CACHE = TranslationCache()
    return _DEFAULT_CACHE


# --------------------------------------------------------------------------- engine


class TranslatedPddlState(stock_pddl.pddl_logic.PddlState):
    """``PddlState`` built from cached translations instead of calling the translator.

    It sets up the same facts, types and native state as the stock constructor. The planner's
    SAS is handed to Fast Downward just before the first ``replan`` (``load_sas_replan`` only
    stores the text that ``replan`` reads), so games that are never planned never need it.
    """

    def __init__(
        self,
        downward_lib: Any,
        pddl_problem: str,
        logic: Any,
        translation: StateTranslation,
        planner: Callable[[], PlannerTranslation],
    ) -> None:
        # the same attributes the stock constructor sets (PddlState's own methods read them)
        self._facts: defaultdict[str, set[Proposition]] = defaultdict(set)
        self._vars_by_name: dict[str, Any] = {}
        self._vars_by_type: defaultdict[str, set[Any]] = defaultdict(set)
        self._var_counts: Counter[str] = Counter()
        self._logic = logic
        self.downward_lib = downward_lib
        self.pddl_problem = pddl_problem
        self.task = None  # the translator's parsed task is not kept; see StateTranslation
        self.sas = translation.sas
        self._planner = planner
        self._planner_loaded = False
        self._actions = translation.action_schemas
        for name, parents in translation.types:
            with contextlib.suppress(ValueError):  # already known to this logic
                logic.types.add(textworld.logic.Type(name, list(parents)))
        downward_lib.load_sas(translation.sas.encode("utf-8"))
        self.name2type = dict(translation.objects)
        self.add_facts(translation.facts)
        self.add_facts(translation.native_facts(self._native_facts))

    def _native_facts(self) -> list[Proposition]:
        """The facts of the native engine's current state (its negated atoms left out)."""
        atoms = (stock_pddl.pddl_logic.Atom * self.downward_lib.get_state_size())()
        self.downward_lib.get_state(atoms)
        facts = [atom.get_fact(self.name2type) for atom in atoms]
        return [fact for fact in facts if not fact.is_negation]

    @property
    def sas_replan(self) -> str:
        """The planner's SAS, translated (or read from the cache) on first use."""
        return self._planner().sas

    def replan(self, infos: Any) -> list[str]:
        """``PddlState.replan``, after handing this game's planner SAS to Fast Downward once."""
        if not self._planner_loaded:
            self.downward_lib.load_sas_replan(self.sas_replan.encode("utf-8"))
            self._planner_loaded = True
        return super().replan(infos)


class AlfredEngine(stock_pddl.PddlEnv):
    """``PddlEnv`` with the cached grammar, parsed logic and translations.

    ``translations``: where translations come from (default: the process-wide cache).
    """

    def __init__(self, infos: EnvInfos | None = None, translations: TranslationCache | None = None) -> None:
        super().__init__(infos)
        self.translations = translations or default_translations()
        self._fresh_state = False

    def load(self, filename_or_data: str | os.PathLike | Mapping[str, Any]) -> None:
        # PddlEnv.load, with the grammar parse and the translation looked up instead of redone.
        if isinstance(filename_or_data, Mapping):
            data, self._game_file = filename_or_data, None
        else:
            with open(filename_or_data, encoding="utf-8") as handle:
                data = json.load(handle)
            self._game_file = filename_or_data
        self._game_data = data
        self.walkthrough = data.get("walkthrough", None)
        self._logic = game_logic(data["pddl_domain"], data["grammar"])
        self._pddl_state = self._initial_state()
        self._entity_infos = self._get_entity_infos()
        self._fresh_state = True

    def _initial_state(self) -> TranslatedPddlState:
        domain, problem = self._logic.domain, self._game_data["pddl_problem"]
        translations = self.translations
        return TranslatedPddlState(
            self.downward_lib,
            problem,
            self._logic,
            translations.state(domain, problem),
            planner=lambda: translations.planner(domain, problem),
        )

    def reset(self) -> GameState:
        # PddlEnv.reset, except that right after load() the state just built is used as is.
        if not self._fresh_state:
            self._pddl_state = self._initial_state()
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
        obj, _, recep = command[len("move ") :].partition(" to ")
        return f"put {obj} in/on {recep}"
    if style == "move" and command.startswith("put ") and " in/on " in command:
        obj, _, recep = command[len("put ") :].partition(" in/on ")
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


def start_engine(
    infos: EnvInfos, stock: bool = False, translations: TranslationCache | None = None
) -> textworld.Environment:
    """An unloaded ALFWorld engine (envrl's, or the stock one for comparisons).

    ``translations``: envrl's engine takes its translations from there (default: the
    process-wide cache).
    """
    env: Any = stock_pddl.PddlEnv(infos) if stock else AlfredEngine(infos, translations)
    for wrapper in alfred_wrappers():
        env = wrapper(env)
    return env
