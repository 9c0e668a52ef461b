"""``envrl/ScienceWorld-v0``: ScienceWorld's 30 science tasks on the real simulator.

The engine is scienceworld 1.2.3's Scala simulator, one JVM per env (see ``engine.py``).

Task ids are ``"<task id>:<variation>"``, e.g. ``"1-1:17"`` (boil, variation 17); ``"boil:17"``
is accepted as an alias in ``options={"task_id": ...}``. ``task=`` picks one task (name or id),
several (a list), or all 30 (None: the split then spans all tasks, in id order). Splits are
ScienceWorld's variation splits: train, dev, and test (held-out variations, OOD).

Observations, scores and done flags are the stock ``scienceworld.ScienceWorldEnv``'s:
``reset`` loads the variation and returns the answer to ``look around``; an episode ends
when the task is completed or failed. Scores: the engine's score is -100 (failed) or 0..100;
``info["score"]`` is that score clipped at 0 and divided by 100 (a failed task scores 0, as
published ScienceWorld results count it), ``reward`` is the change of ``info["score"]``, and
``info["raw_score"]`` keeps the engine's number. The first observation can already carry a
few points (``info["score"]`` at reset), so rewards sum to the final minus the first score,
as the stock env's do. ``success`` = the task was completed.

``info["admissible_actions"]`` is ScienceWorld's list of valid action-object combinations
(~500 strings). Computing it costs about as much as a step or more, so by default
(``admissible="lazy"``) it is a :class:`LazyAdmissibleActions`: a real ``list`` whose contents
are asked from the engine only when it is first read, then kept (``json.dumps(info)``, ``+``,
``==``, pickling and copying all work as on a plain list). Read it before the next ``step`` or
``reset``: the engine can only compute the list of its current state, so a first read after
that raises :class:`StaleAdmissibleActionsError` (with a deterministic engine, unless the env
is back in the same state: same task, variation and actions). ``admissible="eager"``
computes a plain list after every step, as the stock env does.

Random draws: computing the list draws from the simulator's global random generator, the
one that moves bees. The stock env computes it after every step, so in its worlds the bees'
flights, pollination and ScienceWorld's gold paths assume those draws. envrl keeps exactly
the stock dynamics: in the four tasks with a bee hive (5-1, 5-2, 10-1, 10-2, see
``tasks.BEE_HIVE_TASKS``) it computes the list after every step as stock does, whatever
``admissible`` says (the list comes for free there); in the other 26 tasks, where nothing
else depends on those draws, a lazy read restores the generator, so reading or not never
changes the world. Either way observations equal the stock env's step for step.

Determinism: by default (``deterministic=True``) the same task id and actions give the same
observations in any process and after any history; see ``engine.DETERMINISTIC_JAVA_OPTIONS``
for why the stock engine does not.

``info["valid_action"]`` is False when the engine did not understand the input ("No known
action matches that input." or "Unknown action..."); an ambiguous request, which asks for a
number, counts as understood. With ``expert_plan=True``, ``info["expert_plan"]`` holds the rest
of ScienceWorld's gold action sequence for the variation; a step that follows it removes its
first action, any other step leaves it as it is (ScienceWorld has no planner to replan).
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial, wraps
from typing import Any, SupportsIndex

from envrl.envs.base import StepResult, TaskStart, TextEnv
from envrl.envs.scienceworld.engine import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_JAVA_HEAP,
    MIN_JAVA_HEAP_FOR_GOLD_PATHS,
    Engine,
    EngineDiedError,
    EngineJavaError,
    EngineOptions,
    ScienceWorldError,
    check_java_heap,
)
from envrl.envs.scienceworld.tasks import (
    SPLITS,
    Task,
    all_tasks,
    find_task,
    format_task_id,
    normalize_simplifications,
    parse_task_id,
    split_variations,
)

#: the engine's answers to input it could not parse
INVALID_PREFIXES = ("No known action matches that input.", "Unknown action.")
ADMISSIBLE_MODES = ("lazy", "eager")
FIRST_ACTION = "look around"  # what the stock env's reset() plays

__all__ = ["ScienceWorldEnv", "LazyAdmissibleActions", "StaleAdmissibleActionsError", "EngineDiedError"]


class StaleAdmissibleActionsError(RuntimeError):
    """A lazy admissible-action list was first read after the env had left the state it describes."""


def _fill_first(method: Callable[..., Any]) -> Callable[..., Any]:
    """``list.<method>`` run after the lazy list has filled its own storage.

    list's C methods read the storage directly; until the first read it is empty, so every
    reading method must fill it first.
    """

    @wraps(method)
    def read(self: LazyAdmissibleActions, *args: Any, **kwargs: Any) -> Any:
        self._materialise()
        return method(self, *args, **kwargs)

    return read


def _fill_then_change(method: Callable[..., Any]) -> Callable[..., Any]:
    """``list.<method>`` that changes the list: fill it first, then forget its engine state.

    A changed list no longer holds what the engine would compute for ``state``, so it must
    not compare equal to an unread list of that state without looking at the contents.
    """

    @wraps(method)
    def change(self: LazyAdmissibleActions, *args: Any, **kwargs: Any) -> Any:
        self._materialise()
        self.state = None
        return method(self, *args, **kwargs)

    return change


def _fill_both(method: Callable[..., Any]) -> Callable[..., Any]:
    """A comparison or concatenation of two lists: list's C code reads both storages."""

    @wraps(method)
    def combine(self: LazyAdmissibleActions, other: Any) -> Any:
        self._materialise_with(other)
        return method(self, other)

    return combine


class LazyAdmissibleActions(list):
    """A ``list`` of strings that computes its contents (``fetch()``) on first use.

    It is a real list (``isinstance(x, list)``, ``json.dumps``, ``+``, ``==``, slicing,
    sorting, mutation) so that users and recorders can treat it as one; only the engine call
    is deferred. Its storage stays empty until the first Python-level access, which fills it
    in place: every reading method and operator of list is overridden to fill first. C code
    that takes a list subclass's storage without going through those methods (``list.__len__(x)``
    called on the class, ``heapq`` on it, serialisers such as orjson that read list
    subclasses natively) would see an empty list before the first read; the standard
    library's ``json``, ``pickle``, ``copy``, ``list(x)``, ``[*x]``, ``sorted`` and ``random`` all go
    through the overridden methods (see tests/test_scienceworld_env.py).

    ``state`` names the engine state it belongs to (task, simplifications, actions since
    reset) when the engine is deterministic; two unchanged lists of the same state are equal
    without asking the engine. It pickles and copies as a plain ``list``.
    """

    __slots__ = ("_fetch", "state")

    def __init__(self, fetch: Callable[[], list[str]], state: tuple | None = None):
        super().__init__()
        self._fetch: Callable[[], list[str]] | None = fetch
        self.state = state

    @property
    def computed(self) -> bool:
        """Whether the contents have been fetched (reading never happens twice)."""
        return self._fetch is None

    def _materialise(self) -> None:
        """Fill the list's own storage from ``fetch()`` once; a failed fetch can be retried."""
        fetch = self._fetch
        if fetch is not None:
            items = fetch()
            list.extend(self, items)  # list's own extend: the overridden one would recurse
            self._fetch = None  # drop the env reference

    def _materialise_with(self, other: object) -> None:
        self._materialise()
        if isinstance(other, LazyAdmissibleActions):
            other._materialise()

    # reading
    __len__ = _fill_first(list.__len__)
    __iter__ = _fill_first(list.__iter__)
    __reversed__ = _fill_first(list.__reversed__)
    __getitem__ = _fill_first(list.__getitem__)
    __contains__ = _fill_first(list.__contains__)
    __mul__ = _fill_first(list.__mul__)
    __rmul__ = _fill_first(list.__rmul__)
    index = _fill_first(list.index)
    count = _fill_first(list.count)
    copy = _fill_first(list.copy)
    __add__ = _fill_both(list.__add__)
    __lt__ = _fill_both(list.__lt__)
    __le__ = _fill_both(list.__le__)
    __gt__ = _fill_both(list.__gt__)
    __ge__ = _fill_both(list.__ge__)

    # changing (allowed, as on any list; the list is this info's own object)
    append = _fill_then_change(list.append)
    extend = _fill_then_change(list.extend)
    insert = _fill_then_change(list.insert)
    remove = _fill_then_change(list.remove)
    pop = _fill_then_change(list.pop)
    clear = _fill_then_change(list.clear)
    sort = _fill_then_change(list.sort)
    reverse = _fill_then_change(list.reverse)
    __setitem__ = _fill_then_change(list.__setitem__)
    __delitem__ = _fill_then_change(list.__delitem__)
    __iadd__ = _fill_then_change(list.__iadd__)
    __imul__ = _fill_then_change(list.__imul__)

    def __radd__(self, other: Any) -> Any:
        """``[...] + lazy``: Python asks this subclass first, before list's own concatenation."""
        if not isinstance(other, list):
            return NotImplemented
        self._materialise()
        return list.__add__(other, self)

    def __eq__(self, other: object) -> bool:
        if self._same_state(other):
            return True
        self._materialise_with(other)
        return list.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        if self._same_state(other):
            return False
        self._materialise_with(other)
        return list.__ne__(self, other)

    __hash__ = None

    def _same_state(self, other: object) -> bool:
        """Two unchanged lists of one deterministic engine state hold the same actions."""
        return isinstance(other, LazyAdmissibleActions) and self.state is not None and self.state == other.state

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[type[list], tuple[list[str]]]:
        """Pickle and copy as a plain list (vector envs, result stores, ``copy.deepcopy``)."""
        self._materialise()
        return list, (list.copy(self),)

    def __reduce__(self) -> tuple[type[list], tuple[list[str]]]:
        return self.__reduce_ex__(2)

    def __repr__(self) -> str:
        """The list's repr; never raises, so printing an old info stays possible."""
        try:
            self._materialise()
        except (StaleAdmissibleActionsError, ScienceWorldError) as error:
            return f"<admissible actions not available: {error}>"
        return list.__repr__(self)


class ScienceWorldEnv(TextEnv):
    """ScienceWorld (Wang et al., 2022) as a Gymnasium text environment.

    Arguments:
        split: ``train``, ``dev`` (ID) or ``test`` (OOD: held-out variations).
        task: a task name (``"boil"``) or id (``"1-1"``), a list of them, or None for all 30.
        simplifications: ``"easy"`` (all of ScienceWorld's simplifications), a comma list or
            list of names (``teleportAction``, ``openDoors``, ...), or None/``""`` for none.
        expert_plan: add ``info["expert_plan"]`` (the rest of the gold action sequence).
        java_heap: the JVM's maximum heap (``-Xmx``), e.g. ``"512m"`` or ``"2g"``; at least ``"64m"``
            (``"256m"`` with ``expert_plan``); None for Java's default. java_options: more JVM options.
        deterministic: constant identity hash codes in the JVM (identical replays; default).
        admissible: ``lazy`` (computed when read) or ``eager`` (after every step, as stock);
            tasks with a bee hive always compute it (see the module docstring).
        call_timeout: seconds one engine call may take before the JVM counts as hung.
    """

    def __init__(
        self,
        split: str = "train",
        task: str | Sequence[str] | None = None,
        simplifications: str | Sequence[str] | None = "easy",
        expert_plan: bool = False,
        java_heap: str | int | None = DEFAULT_JAVA_HEAP,
        java_options: Sequence[str] | None = None,
        deterministic: bool = True,
        admissible: str = "lazy",
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        gold_cache_size: int = 512,
        render_mode: str | None = None,
    ):
        super().__init__(split=split, render_mode=render_mode)
        if split not in SPLITS:
            raise ValueError(f"unknown ScienceWorld split {split!r}; choose one of {SPLITS}")
        if admissible not in ADMISSIBLE_MODES:
            raise ValueError(f"admissible must be one of {ADMISSIBLE_MODES}, got {admissible!r}")
        self.tasks: tuple[Task, ...] = self._resolve_tasks(task)
        self.simplifications = normalize_simplifications(simplifications)
        if "noElectricalAction" in self.simplifications.split(","):
            electrical = [t.name for t in self.tasks if t.electrical]
            if electrical:
                raise ValueError(
                    f"simplification noElectricalAction removes the actions that the electrical "
                    f"tasks need ({', '.join(electrical)}); drop it or choose other tasks"
                )
        self.expert_plan = bool(expert_plan)
        self.admissible = admissible
        self.deterministic = bool(deterministic)
        self._engine_options = EngineOptions(
            java_heap=java_heap,
            java_options=list(java_options or ()),
            deterministic=self.deterministic,
            call_timeout=call_timeout,
        )
        Engine.check_options(**self._engine_options)
        if self.expert_plan:
            check_java_heap(
                java_heap,
                MIN_JAVA_HEAP_FOR_GOLD_PATHS,
                " with expert_plan=True (computing gold paths takes more memory than playing)",
            )
        self._engine: Engine | None = None
        self._ids: tuple[str, ...] | None = None
        self._index: dict[str, tuple[Task, int]] | None = None
        self._gold_cache: OrderedDict[tuple[str, int, str], list[str]] = OrderedDict()
        self._gold_cache_size = int(gold_cache_size)
        self._state = 0  # bumped by every engine step; lazy lists remember the state they belong to
        self._history = b""  # digest of the task and the actions since reset (deterministic engines)
        self._points = 0  # the engine's score clipped at 0 (0..100)
        self._plan: list[str] = []
        self._stock_draws = False  # compute the list after every step (see the module docstring)

    # ---- tasks ---------------------------------------------------------------------

    @staticmethod
    def _resolve_tasks(task: str | Sequence[str] | None) -> tuple[Task, ...]:
        if task is None:
            return all_tasks()
        keys = [task] if isinstance(task, str) else list(task)
        if not keys:
            raise ValueError("task= must name at least one task (or be None for all)")
        chosen = []
        for key in keys:
            if not isinstance(key, str):
                raise ValueError(f"task names are strings like 'boil' or '1-1', got {key!r}")
            found = find_task(key)
            if found not in chosen:
                chosen.append(found)
        order = {t.id: i for i, t in enumerate(all_tasks())}
        return tuple(sorted(chosen, key=lambda t: order[t.id]))

    def _build_index(self) -> dict[str, tuple[Task, int]]:
        if self._index is None:
            # Round-robin over tasks (each task's first variation, then each one's second, ...), so
            # the first N ids, which an evaluation run of N episodes plays, cover every task.
            per_task = [
                [(task, variation) for variation in split_variations(task.name, self.split)] for task in self.tasks
            ]
            index: dict[str, tuple[Task, int]] = {}
            for row in itertools.zip_longest(*per_task):
                for entry in row:
                    if entry is not None:
                        index[format_task_id(*entry)] = entry
            self._index = index
            self._ids = tuple(index)
        return self._index

    def _split_task_ids(self) -> Sequence[str]:
        self._build_index()
        assert self._ids is not None
        return self._ids

    def _task_index(self) -> dict[str, tuple[Task, int]]:
        return self._build_index()

    def _choose_task(self, options: dict[str, Any]) -> str:
        requested = options.get("task_id")
        if requested is None:
            return super()._choose_task(options)
        task_id = str(requested)
        try:
            task, variation = parse_task_id(task_id)
        except ValueError as error:
            raise ValueError(f"unknown task id {requested!r} for split {self.split!r}: {error}") from None
        canonical = format_task_id(task, variation)
        if canonical not in self._build_index():
            where = [s for s in SPLITS if variation in split_variations(task.name, s)]
            reason = (
                f"task {task.id} ({task.name}) is not among this env's tasks"
                if task not in self.tasks
                else f"variation {variation} of {task.id} is in split {where}"
            )
            raise ValueError(f"unknown task id {requested!r} for split {self.split!r}: {reason}")
        return canonical

    # ---- engine --------------------------------------------------------------------

    @property
    def engine(self) -> Engine | None:
        """The running engine (None before the first reset or after close)."""
        return self._engine

    def _ensure_engine(self) -> Engine:
        if self._engine is not None and not self._engine.alive:
            self._engine.close()  # a dead or hung JVM: clean up, then start afresh
            self._engine = None
        if self._engine is None:
            self._engine = Engine(**self._engine_options)
        return self._engine

    def _load(self, engine: Engine, task: Task, variation: int) -> list[str] | None:
        if not self.expert_plan:
            engine.load(task.name, variation, self.simplifications, gold_path=False)
            return None
        key = (task.name, variation, self.simplifications)
        plan = self._gold_cache.get(key)
        if plan is not None:
            self._gold_cache.move_to_end(key)
            engine.load(task.name, variation, self.simplifications, gold_path=False)
            return list(plan)
        plan = engine.load(task.name, variation, self.simplifications, gold_path=True) or []
        self._gold_cache[key] = list(plan)
        while len(self._gold_cache) > self._gold_cache_size:
            self._gold_cache.popitem(last=False)
        return list(plan)

    def _start_task(self, task_id: str) -> TaskStart:
        task, variation = self._build_index()[task_id]
        engine = self._ensure_engine()
        self._stock_draws = self.admissible == "eager" or task.bee_hive
        plan = self._load(engine, task, variation)
        self._state += 1
        self._history = self._chain(b"", f"{task_id}|{self.simplifications}")
        observation, raw, _completed = engine.step(FIRST_ACTION)
        self._points = max(raw, 0)
        self._plan = plan or []
        # the first look can already score a few points; the base would report 0
        extra: dict[str, Any] = {"raw_score": raw, "score": self._points / 100.0}
        if self.expert_plan:
            extra["expert_plan"] = list(self._plan)
        return TaskStart(
            observation=observation,
            task_type=task.name,
            instruction=engine.task_description(),
            admissible_actions=self._admissible_now(engine, 0, task_id),
            extra=extra,
        )

    def _apply(self, action: str) -> StepResult:
        engine = self._engine
        if engine is None:  # closed since the last reset
            raise EngineDiedError("the ScienceWorld engine was closed; call reset() to start a new one")
        try:
            observation, raw, completed = engine.step(action)
        except EngineJavaError as error:  # never seen in fuzzing; any string must stay legal
            observation, raw, completed = f"The engine could not process that action ({error}).", None, False
        self._state += 1
        self._history = self._chain(self._history, action)
        if raw is None:  # the Java exception above: nothing scored
            return StepResult(
                observation=observation,
                reward=0.0,
                terminated=False,
                valid_action=False,
                success=False,
                score=self._points / 100.0,
                admissible_actions=self._admissible_now(engine, self._steps, self._task_id),
                extra={"raw_score": self._points, **({"expert_plan": list(self._plan)} if self.expert_plan else {})},
            )
        failed = raw < 0
        points = max(raw, 0)
        reward, self._points = (points - self._points) / 100.0, points
        valid = not observation.startswith(INVALID_PREFIXES)
        extra: dict[str, Any] = {"raw_score": raw}
        if self.expert_plan:
            if completed:  # gold paths can run on past the step that completes the task
                self._plan = []
            elif self._plan and action.strip() == self._plan[0]:
                self._plan = self._plan[1:]
            extra["expert_plan"] = list(self._plan)
        return StepResult(
            observation=observation,
            reward=reward,
            terminated=bool(completed or failed),
            valid_action=valid,
            success=bool(completed and not failed),
            score=points / 100.0,
            admissible_actions=self._admissible_now(engine, self._steps, self._task_id),
            extra=extra,
        )

    @staticmethod
    def _chain(digest: bytes, text: str) -> bytes:
        return hashlib.blake2b(digest + text.encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def _admissible_now(self, engine: Engine, step: int, task_id: str | None) -> list[str]:
        if self._stock_draws:
            return engine.valid_actions(keep_random_state=False)
        state = (self._history,) if self.deterministic else None
        return LazyAdmissibleActions(
            partial(self._read_admissible, engine, self._state, self._history, f"step {step} of task {task_id}"), state
        )

    def _read_admissible(self, engine: Engine, state: int, history: bytes, made_at: str) -> list[str]:
        """The list of the engine state a lazy list was made in, while the engine is in it.

        The engine can only compute the list of its current state, so the list must be read
        before the env moves on; a later read raises instead of returning another state's
        actions. With a deterministic engine the state is known by its history (task,
        variation, simplifications, actions since reset), so a list also stays readable
        whenever an episode replays the same actions (gymnasium's ``check_env`` compares two
        such steps); lists only drawn lazily keep the simulator's random generator as the
        replay leaves it, hence ``not self._stock_draws``.
        """
        same_step = state == self._state
        same_history = self.deterministic and not self._stock_draws and history == self._history
        if engine is not self._engine or not (same_step or same_history):
            raise StaleAdmissibleActionsError(
                f"info['admissible_actions'] of {made_at} was first read after the env had moved on "
                f"(it is now at step {self._steps} of task {self._task_id}). The list is computed when first "
                f"read, from the engine's current state, so it must be read before the next step() or reset(): "
                f"keep it with actions = list(info['admissible_actions']) (or record the info with json.dumps, "
                f"pickle or copy.deepcopy) right after the step, or make the env with admissible='eager', "
                f"which computes it after every step (several times slower)"
            )
        return engine.valid_actions(keep_random_state=True)

    def _info(self, *, admissible_actions: list[str], **fields: Any) -> dict[str, Any]:
        # the base class copies the list, which would compute it; keep the lazy list
        info = super()._info(admissible_actions=[], **fields)
        is_lazy = isinstance(admissible_actions, LazyAdmissibleActions)
        info["admissible_actions"] = admissible_actions if is_lazy else list(admissible_actions)
        return info

    def _close_engine(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
