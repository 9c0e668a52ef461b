"""ALFWorld's observation-grounded expert (``expert:search``): look around first, plan only then.

The planner expert (``expert``) walks straight to the goal object, which only the game's
state reveals; no policy can learn that from the text. This expert searches as a newcomer
to the room would: it goes to the receptacles named in the room's description, most likely
ones first, opens the closed ones, and reads what each observation shows. Once every object
the task needs has appeared in an observation (the goal object; both for "put two"; the lamp
too for "look at ... under the lamp"), it plays the env's planner (``info["expert_plan"]``,
computed from the current state) to the end. It never reads the plan before that.

"Most likely" comes from a prior, ``alfworld_prior.json``: for each object type and
receptacle type, how many receptacles of that type held the object type in the initial
states of the built-in ``train`` games, out of how many such receptacles there were in the
rooms where the object type lay. The task's own target receptacles are searched last (the
object is to be put there, so it does not start there), and so is the fridge of a cooling
task; ties keep the order of the room's description. Regenerate the prior (built-in games,
no ``ALFWORLD_DATA`` needed; the split is generated on first use) with::

    env -u ALFWORLD_DATA .venv/bin/python benchmarks/repro/alfworld_prior.py

This module counts; it does not list the games. An agent acts through the env's text API only
and may not import envs (``tests/test_architecture.py``), while the games of a split are the
env's to list (``envrl.envs.alfworld.env.split_games``). So :func:`build_prior` takes the game
files from its caller, and the command that lists them lives outside the package, where
importing both sides is no layering question. The info dict could not carry this: the prior
sums a thousand games' initial states, which no single episode shows.
"""

from __future__ import annotations

import functools
import json
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PRIOR_PATH = Path(__file__).with_name("alfworld_prior.json")
PRIOR_COMMAND = "env -u ALFWORLD_DATA .venv/bin/python benchmarks/repro/alfworld_prior.py"

# an entity as the text names it: "cabinet 3", "sinkbasinbasin 1", "mug 2"
_MENTION = re.compile(r"\b([a-z]+) (\d+)\b")
_TASK_MARKER = "Your task is to:"
# the task sentences of ALFWorld's six task types (alfworld/gen/goal_library.py)
_LOOK = re.compile(r"(?:look at|examine the) (\w+) (?:under|with) the (\w+)")
_TWO = re.compile(r"(?:put|find) two (\w+) (?:and put them )?(?:in|on) (\w+)")
_ONE = re.compile(
    r"(?:put (?:a|some) (?:(?:clean|hot|cool) )?(\w+)|(?:clean|heat|cool) some (\w+) and put it) (?:in|on) (\w+)"
)
# a fact of a problem's initial state that says where things are and what they are
_FACT = re.compile(r"\((receptacleType|objectType|inReceptacle) ([^\s()?]+) ([^\s()?]+)\)")


# --------------------------------------------------------------------------- the task


@dataclass(frozen=True)
class SearchTask:
    """What a task sentence asks the agent to find.

    ``wanted``: type -> how many distinct instances must be seen (the goal object; a lamp for
    look-at tasks). ``search_last``: receptacle types where the goal object does not start.
    """

    wanted: Mapping[str, int]
    search_last: frozenset[str]


def parse_task(instruction: str) -> SearchTask:
    """The objects to find for an ALFWorld task sentence (``"put two cd in safe."``).

    Raises ValueError for a sentence of none of the six task types.
    """
    text = instruction.strip().lower().rstrip(".").strip()
    if match := _LOOK.fullmatch(text):
        return SearchTask({match[1]: 1, match[2]: 1}, frozenset())
    if match := _TWO.fullmatch(text):
        return SearchTask({match[1]: 2}, frozenset({match[2]}))
    if match := _ONE.fullmatch(text):
        last = {match[3]} | ({"fridge"} if text.startswith(("put a cool ", "cool some ")) else set())
        return SearchTask({match[1] or match[2]: 1}, frozenset(last))
    raise ValueError(f"not an ALFWorld task sentence: {instruction!r}")


def mentions(observation: str) -> list[str]:
    """The entities an observation names (``"cabinet 3"``), in order, each once."""
    return list(dict.fromkeys(f"{word} {number}" for word, number in _MENTION.findall(observation)))


def room_receptacles(observation: str) -> list[str]:
    """The receptacles of the room's description (the game's first observation), in its order."""
    return mentions(observation.split(_TASK_MARKER, 1)[0])


# --------------------------------------------------------------------------- the prior


def count_placements(problems: Iterable[str]) -> dict[str, dict[str, list[int]]]:
    """object type -> receptacle type -> [hits, trials] over PDDL problems' initial states.

    A trial is a receptacle of that type in a room where the object type lies in some
    receptacle; a hit, such a receptacle that holds at least one object of that type. Types
    are lower-cased (``CounterTopType`` -> ``countertop``), as the task sentences write them.
    """
    counts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for problem in problems:
        init = problem.split("(:goal", 1)[0]
        receptacle_type: dict[str, str] = {}
        object_type: dict[str, str] = {}
        holds: dict[str, set[str]] = defaultdict(set)  # receptacle -> object types in it
        for predicate, first, second in _FACT.findall(init):
            if predicate == "receptacleType":
                receptacle_type[first] = _type_name(second)
            elif predicate == "objectType":
                object_type[first] = _type_name(second)
            else:
                holds[second].add(first)
        held_types = {receptacle: {object_type[o] for o in objects} for receptacle, objects in holds.items()}
        present = set().union(*held_types.values()) if held_types else set()
        for otype in present:
            for receptacle, rtype in receptacle_type.items():
                cell = counts[otype][rtype]
                cell[1] += 1
                cell[0] += otype in held_types.get(receptacle, set())
    return {o: {r: list(cell) for r, cell in sorted(row.items())} for o, row in sorted(counts.items())}


def _type_name(pddl_type: str) -> str:
    return pddl_type.removesuffix("Type").lower()


@dataclass(frozen=True)
class ReceptaclePrior:
    """How likely a receptacle of each type holds an object type, and the search order it gives."""

    counts: Mapping[str, Mapping[str, Sequence[int]]]  # object type -> receptacle type -> (hits, trials)

    @functools.cached_property
    def types(self) -> tuple[str, ...]:
        """Every type the prior knows, longest first (see :meth:`type_of`)."""
        names = set(self.counts) | {r for row in self.counts.values() for r in row}
        return tuple(sorted(names, key=lambda name: (-len(name), name)))

    def rate(self, object_type: str, receptacle_type: str) -> float:
        """The fraction of ``receptacle_type`` receptacles that held ``object_type`` (0 if never seen)."""
        hits, trials = self.counts.get(object_type, {}).get(receptacle_type, (0, 0))
        return hits / trials if trials else 0.0

    def type_of(self, name: str) -> str:
        """The type of a text name (``"sinkbasinbasin 1"`` -> ``sinkbasin``): the longest known
        type that starts the name, or the name's word itself. ALFWorld names an entity after its
        id, which for basins adds "basin" to the type."""
        word = name.split()[0]
        return next((t for t in self.types if word.startswith(t)), word)

    def order(self, receptacles: Sequence[str], wanted: Iterable[str], last: Collection[str] = ()) -> list[str]:
        """``receptacles`` (text names) in search order: highest summed rate of the ``wanted``
        object types first, types in ``last`` after all others, ties in the given order."""
        wanted = list(wanted)

        def key(item: tuple[int, str]) -> tuple[bool, float, int]:
            index, name = item
            rtype = self.type_of(name)
            return rtype in last, -sum(self.rate(o, rtype) for o in wanted), index

        return [name for _, name in sorted(enumerate(receptacles), key=key)]


@functools.lru_cache(maxsize=4)
def load_prior(path: Path = PRIOR_PATH) -> ReceptaclePrior:
    """The prior stored at ``path`` (default: the one shipped beside this module)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return ReceptaclePrior(data["counts"])


def build_prior(game_files: Iterable[str | Path], source: str) -> dict[str, Any]:
    """The prior's file content, counted over ALFWorld game files (each a JSON with a
    ``pddl_problem``); ``source`` says in words which games they are."""
    problems = (json.loads(Path(path).read_text(encoding="utf-8"))["pddl_problem"] for path in game_files)
    return {
        "about": "object type -> receptacle type -> [receptacles holding it, receptacles in rooms where it lies]",
        "source": source,
        "command": PRIOR_COMMAND,
        "counts": count_placements(problems),
    }


def write_prior(prior: Mapping[str, Any], path: Path = PRIOR_PATH) -> None:
    """Store ``prior`` at ``path``, one line per [hits, trials] cell (short enough to read)."""
    text = json.dumps(prior, indent=1, sort_keys=True)
    text = re.sub(r"\[\s*(\d+),\s*(\d+)\s*\]", r"[\1, \2]", text)
    Path(path).write_text(text + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- the agent


class AlfworldSearchExpert:
    """Searches the room for what the task needs, then plays the env's planner to the end.

    A closed receptacle it arrives at is opened (its contents then show); every receptacle is
    visited at most once. It raises RuntimeError, rather than wander, when every receptacle
    has been searched without success, or when the planner has no plan once all is found.
    """

    name = "expert:search"

    def __init__(self, prior: ReceptaclePrior | None = None):
        self.prior = prior if prior is not None else load_prior()
        self.env_kwargs: dict[str, Any] = {"expert_plan": True}
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        self._task: SearchTask | None = None
        self._receptacles: list[str] = []
        self._visited: set[str] = set()
        self._seen: set[str] = set()
        self._current: str | None = None
        self.found = False  # every wanted object has been seen: the planner finishes

    def act(self, observation: str, info: dict[str, Any]) -> str:
        if self._task is None:
            self._task = parse_task(info.get("instruction") or observation.rsplit(_TASK_MARKER, 1)[-1])
            self._receptacles = room_receptacles(observation)
        self._seen.update(mentions(observation))
        self.found = self.found or not self.missing()
        if self.found:
            return self._finish(info)
        return self._search(observation, info["admissible_actions"])

    def missing(self) -> list[str]:
        """The wanted types seen fewer times than the task needs."""
        assert self._task is not None
        seen = [self.prior.type_of(name) for name in self._seen]
        return [t for t, count in self._task.wanted.items() if seen.count(self.prior.type_of(t)) < count]

    def _search(self, observation: str, admissible: Sequence[str]) -> str:
        assert self._task is not None
        here = self._current
        if here is not None and f"The {here} is closed." in observation and f"open {here}" in admissible:
            return f"open {here}"
        goto = [a.removeprefix("go to ") for a in admissible if a.startswith("go to ")]
        candidates = [r for r in dict.fromkeys(self._receptacles + goto) if r not in self._visited and r in goto]
        if not candidates:
            raise RuntimeError(f"searched every receptacle without seeing {', '.join(self.missing())}")
        wanted = [self.prior.type_of(t) for t in self.missing()]
        last = {self.prior.type_of(t) for t in self._task.search_last}
        target = self.prior.order(candidates, wanted, last)[0]
        self._visited.add(target)
        self._current = target
        return f"go to {target}"

    def _finish(self, info: dict[str, Any]) -> str:
        plan = info.get("expert_plan")
        if plan is None:
            raise RuntimeError("expert:search needs an env made with expert_plan=True (see its env_kwargs)")
        if not plan:
            raise RuntimeError("the planner has no plan left, though the task is not won (expert_plan is empty)")
        return str(plan[0])
