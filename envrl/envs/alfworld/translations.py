"""Fast Downward translations of ALFWorld problems, cached in memory and on disk.

The stock engine (``textworld.envs.pddl.PddlEnv``) has Fast Downward translate the PDDL problem
to SAS twice (plain, for the game state; optimized, for the planner) on ``load()`` and again on
every ``reset()``, which is ~3/4 of a reset. Both depend only on the game's text, so the engine
takes them from here:

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

``tests/test_alfworld_reset.py`` checks that cached, uncached and stock resets agree and that
the cache survives damage.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
import zlib
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from textworld.logic import Proposition, Variable
from textworld.utils import check_flag

from envrl.cache import engine_cache

logger = logging.getLogger(__name__)

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


#: kind -> (translate a problem, read a stored translation back): the cache looks both up here,
#: so a test can stand in a fake translator for one kind
TRANSLATION_KINDS: dict[str, tuple[Callable[[str, str], Any], Callable[[dict[str, Any]], Any]]] = {
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
            translate, _ = TRANSLATION_KINDS[kind]
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
    return TRANSLATION_KINDS[kind][1](translation)


_DEFAULT_CACHE: TranslationCache | None = None


def default_translations() -> TranslationCache:
    """The process-wide translation cache that engines share unless given another."""
    global _DEFAULT_CACHE
    if _DEFAULT_CACHE is None:
        _DEFAULT_CACHE = TranslationCache()
    return _DEFAULT_CACHE
