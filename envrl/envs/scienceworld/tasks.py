"""ScienceWorld's 30 tasks, their variations and envrl's task ids, without starting a JVM.

Task ids are ``"<task id>:<variation>"`` with ScienceWorld's own task ids, e.g. ``"1-1:17"``
(boil, variation 17). ``"boil:17"`` is accepted as an alias wherever an id is read and is
turned into ``"1-1:17"``. Splits are ScienceWorld's variation splits (``get_variations_train``,
``_dev``, ``_test``): for most tasks the first half of the variations is train, the next
quarter dev and the rest test, which holds unseen objects, substances or locations (OOD).
The table of variation counts below was read from the engine (``getTaskMaxVariations``); a
test checks it, and the split rule, against scienceworld 1.2.3.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

SPLITS = ("train", "dev", "test")

#: task name -> number of variations (scienceworld 1.2.3)
MAX_VARIATIONS = {
    "boil": 30,
    "change-the-state-of-matter-of": 30,
    "chemistry-mix": 32,
    "chemistry-mix-paint-secondary-color": 36,
    "chemistry-mix-paint-tertiary-color": 36,
    "find-animal": 300,
    "find-living-thing": 300,
    "find-non-living-thing": 300,
    "find-plant": 300,
    "freeze": 30,
    "grow-fruit": 126,
    "grow-plant": 126,
    "identify-life-stages-1": 14,
    "identify-life-stages-2": 10,
    "inclined-plane-determine-angle": 168,
    "inclined-plane-friction-named-surfaces": 1386,
    "inclined-plane-friction-unnamed-surfaces": 162,
    "lifespan-longest-lived": 125,
    "lifespan-longest-lived-then-shortest-lived": 125,
    "lifespan-shortest-lived": 125,
    "measure-melting-point-known-substance": 436,
    "measure-melting-point-unknown-substance": 300,
    "melt": 30,
    "mendelian-genetics-known-plant": 120,
    "mendelian-genetics-unknown-plant": 480,
    "power-component": 20,
    "power-component-renewable-vs-nonrenewable-energy": 20,
    "test-conductivity": 900,
    "test-conductivity-of-unknown-substances": 600,
    "use-thermometer": 540,
}

#: ScienceWorld's simplifications; "easy" means all of them (the engine keeps electrical
#: actions in the electrical tasks).
SIMPLIFICATIONS = ("teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors", "noElectricalAction")


#: Tasks whose world holds a bee hive (TaskGrowPlant, TaskMendelianGenetics1/2 in the jar).
#: Bees are the simulator's only random movers.
BEE_HIVE_TASKS = frozenset(
    {"grow-plant", "grow-fruit", "mendelian-genetics-known-plant", "mendelian-genetics-unknown-plant"}
)


@dataclass(frozen=True)
class Task:
    """One ScienceWorld task: ``id`` like ``"1-1"``, engine ``name`` like ``"boil"``."""

    id: str
    name: str
    topic: str
    title: str

    @property
    def family(self) -> int:
        return int(self.id.split("-")[0])

    @property
    def electrical(self) -> bool:
        return "power-component" in self.name or "conductivity" in self.name

    @property
    def bee_hive(self) -> bool:
        """The greenhouse has a bee hive: once opened, bees fly at random (see env.py)."""
        return self.name in BEE_HIVE_TASKS


def _id_key(task_id: str) -> tuple[int, int]:
    major, minor = task_id.split("-")
    return int(major), int(minor)


@lru_cache(maxsize=1)
def all_tasks() -> tuple[Task, ...]:
    """The 30 tasks in id order (1-1, 1-2, ..., 10-2), from the scienceworld package's tasks.json."""
    try:
        text = resources.files("scienceworld").joinpath("tasks.json").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError) as error:
        raise ImportError(
            "envrl/ScienceWorld-v0 needs the scienceworld package: pip install 'envrl[scienceworld]'"
        ) from error
    tasks = []
    for entry in json.loads(text):
        tasks.append(Task(entry["task_id"], entry["task_name"], entry["topic"], entry["task"]))
    tasks.sort(key=lambda task: _id_key(task.id))
    missing = {task.name for task in tasks} ^ set(MAX_VARIATIONS)
    if missing:  # pragma: no cover - another scienceworld version
        raise RuntimeError(
            f"scienceworld's task list differs from envrl's table ({sorted(missing)}); "
            f"envrl supports scienceworld==1.2.3"
        )
    return tuple(tasks)


def find_task(key: str) -> Task:
    """A task by id (``"1-1"``) or name (``"boil"``); ValueError names the choices."""
    for task in all_tasks():
        if key in (task.id, task.name):
            return task
    choices = ", ".join(f"{task.id} {task.name}" for task in all_tasks())
    raise ValueError(f"unknown ScienceWorld task {key!r}; tasks (id name): {choices}")


def split_variations(name: str, split: str) -> list[int]:
    """ScienceWorld's variations of task ``name`` in ``split`` (the engine's own rule)."""
    if split not in SPLITS:
        raise ValueError(f"unknown ScienceWorld split {split!r}; choose one of {SPLITS}")
    count = MAX_VARIATIONS[name]
    small = {0: ([], [], []), 1: ([0], [], [0]), 2: ([0], [], [1]), 3: ([0], [1], [2]), 4: ([0, 1], [2], [3])}
    if count in small:
        return list(small[count][SPLITS.index(split)])
    # Chunks of count // 4: two for train, one for dev, then test is the fourth chunk plus the
    # fifth (the remainder) when there is one; any further chunk belongs to no split.
    size = count // 4
    chunks = [list(range(start, min(start + size, count))) for start in range(0, count, size)]
    if split == "train":
        return chunks[0] + chunks[1]
    if split == "dev":
        return chunks[2]
    return chunks[3] + (chunks[4] if len(chunks) > 4 else [])


_TASK_ID = re.compile(r"^(?P<task>[^:\s]+):(?P<variation>\d+)$")


def parse_task_id(task_id: str) -> tuple[Task, int]:
    """``"1-1:17"`` or ``"boil:17"`` -> (task, variation); ValueError if malformed or unknown."""
    match = _TASK_ID.match(str(task_id).strip())
    if not match:
        raise ValueError(f"ScienceWorld task ids look like '1-1:17' (task id : variation), got {task_id!r}")
    task = find_task(match["task"])
    variation = int(match["variation"])
    if variation >= MAX_VARIATIONS[task.name]:
        raise ValueError(
            f"task {task.id} ({task.name}) has variations 0-{MAX_VARIATIONS[task.name] - 1}, got {variation}"
        )
    return task, variation


def format_task_id(task: Task, variation: int) -> str:
    return f"{task.id}:{variation}"


def normalize_simplifications(simplifications: str | Sequence[str] | None) -> str:
    """The engine's simplification string: ``""``, ``"easy"`` or a comma list of names."""
    if simplifications is None:
        return ""
    items = [simplifications] if isinstance(simplifications, str) else list(simplifications)
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"simplifications must be strings, got {item!r}")
        names.extend(part.strip() for part in item.split(",") if part.strip())
    for name in names:
        if name != "easy" and name not in SIMPLIFICATIONS:
            raise ValueError(f"unknown ScienceWorld simplification {name!r}; choose 'easy' or any of {SIMPLIFICATIONS}")
    if "easy" in names:
        return "easy"
    return ",".join(dict.fromkeys(names))
