"""ALFWorld rooms rebuilt from the data that the ``alfworld`` wheel ships, written as PDDL.

The wheel has no games, but it has what a game is made of:

* ``alfworld/gen/layouts/FloorPlan<N>-objects.json``: the object and receptacle types in a room;
* ``FloorPlan<N>-openable.json``: receptacle ids (``Cabinet|-00.64|+00.39|+04.30``, i.e. the type
  and the x|y|z position) mapped to the agent pose ``[x, z, rotation, horizon]`` that faces them;
* ``FloorPlan<N>-layout.npy``: the reachable (x, z) grid points of the room;
* ``alfworld/gen/constants.py``: which object types each receptacle type can hold, and which types
  can be cleaned, heated, cooled, sliced or toggled;
* ``alfworld/gen/goal_library.py``: the PDDL goal and the task sentences of each task type;
* ``alfworld/data/alfred.pddl`` and ``alfred.twl2``: the domain and the text grammar.

This module turns one floor plan plus a goal into a PDDL problem written in the same style,
and with the same predicates, as the problems of the official ``json_2.1.1`` games, so that
ALFWorld's own grammar produces the same kind of text ("You arrive at cabinet 3. ...").

Where the layouts say less than AI2-THOR did, the rooms are filled in plausibly:

* receptacles listed in objects.json without a pose (coffee machines, stove burners, toasters,
  most toilets and towel holders...) get one on a reachable grid point;
* objects get THOR-style ids near their receptacle and share its location (officially each
  object has its own nearest grid point, which the text never shows);
* lamps stand on a desk, side table, dresser or table; scenery (windows, light switches...)
  only has a location, as officially;
* only the types present in the room are declared, and each canContain fact is listed once
  (the official files list every ALFRED type and repeat canContain per receptacle).

``alfworld/gen`` itself cannot be imported for this (it drives AI2-THOR and imports cv2), and
importing the ``alfworld`` package creates ``~/.cache/alfworld``; the two data modules above are
plain Python without imports, so they are loaded straight from their files instead.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOM_TYPES = {
    "Kitchen": range(1, 31),
    "LivingRoom": range(201, 231),
    "Bedroom": range(301, 331),
    "Bathroom": range(401, 431),
}
FLOOR_PLANS: tuple[int, ...] = tuple(n for numbers in ROOM_TYPES.values() for n in numbers)

LAMP_TYPES = ("DeskLamp", "FloorLamp")
# Furniture a lamp stands on or beside. The look_at goal needs the lamp `inReceptacle` of
# something the agent can go to, as in the official games ("On the desk 1, you see a desklamp 1").
LAMP_HOSTS = ("SideTable", "Desk", "Dresser", "CoffeeTable", "DiningTable", "TVStand")
# Receptacle ids whose type is not the text before the first "|" (the basin is the receptacle).
BASIN_SUFFIXES = {"SinkBasin": "SinkBasin", "BathtubBasin": "BathtubBasin"}
# Receptacle types the layouts list in objects.json but never give a pose for in openable.json
# (kitchens' coffee machines, stove burners and toasters, most bathrooms' towel holders...):
# they get a synthetic pose on a reachable grid point. Value: (how many, height y, camera horizon).
SYNTHETIC_RECEPTACLES = {
    "StoveBurner": (4, 0.92, 30),
    "CoffeeMachine": (1, 0.90, 30),
    "Toaster": (1, 0.90, 30),
    "GarbageCan": (1, 0.00, 60),
    "Toilet": (1, 0.05, 15),
    "HandTowelHolder": (1, 1.60, 0),
    "TowelHolder": (1, 1.10, 30),
    "ToiletPaperHanger": (1, 0.70, 30),
    "LaundryHamper": (1, 0.00, 60),
}
SYNTHETIC_DEFAULT = (1, 0.50, 30)
# Scenery that the official problems list with `objectAtLocation` only (never in a receptacle):
# it shows up in "look" ("Next to it, you see a window 1") and nowhere else.
SCENERY_TYPES = (
    "Blinds",
    "Chair",
    "Curtains",
    "HousePlant",
    "LightSwitch",
    "Mirror",
    "Painting",
    "Poster",
    "ShowerDoor",
    "ShowerGlass",
    "Sink",
    "Bathtub",
    "StoveKnob",
    "Television",
    "Window",
)
MAX_INSTANCES = 3  # alfworld.gen.constants.MAX_NUM_OF_OBJ_INSTANCES
STEP = 0.25  # grid size of a location (alfworld.gen.constants.AGENT_STEP_SIZE)


# --------------------------------------------------------------------------- package data


@functools.lru_cache(maxsize=1)
def alfworld_root() -> Path:
    """The installed ``alfworld`` package directory, found without importing the package."""
    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the 'alfworld' package is not installed (pip install alfworld==0.4.2)")
    return Path(next(iter(spec.submodule_search_locations)))


def _load_data_module(relative: str, name: str) -> ModuleType:
    path = alfworld_root() / relative
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=1)
def constants() -> ModuleType:
    """``alfworld/gen/constants.py`` (object lists, receptacle compatibility, action classes)."""
    return _load_data_module("gen/constants.py", "_envrl_alfworld_constants")


@functools.lru_cache(maxsize=1)
def goal_library() -> dict[str, dict]:
    """``alfworld.gen.goal_library.gdict``: PDDL goal and sentence templates per task type."""
    return _load_data_module("gen/goal_library.py", "_envrl_alfworld_goal_library").gdict


@functools.lru_cache(maxsize=1)
def domain_pddl() -> str:
    return (alfworld_root() / "data" / "alfred.pddl").read_text()


@functools.lru_cache(maxsize=1)
def grammar_template() -> str:
    """The twl2 grammar; its task line reads "UNKNOWN GOAL" until a task is written in."""
    return (alfworld_root() / "data" / "alfred.twl2").read_text()


def grammar_with_task(task_description: str) -> str:
    """What ALFWorld's ``add_task_to_grammar`` does: the task sentence replaces UNKNOWN GOAL."""
    grammar = grammar_template()
    assert grammar.count("UNKNOWN GOAL") == 1
    return grammar.replace("UNKNOWN GOAL", task_description)


@functools.lru_cache(maxsize=1)
def receptacle_contents() -> dict[str, tuple[str, ...]]:
    """Receptacle type -> object types it can hold (sorted, sliced variants left out).

    ``constants.VAL_RECEPTACLE_OBJECTS`` holds sets; sorting keeps every iteration order, and
    so every generated byte, independent of the hash seed.
    """
    c = constants()
    movable = set(c.MOVABLE_RECEPTACLES)
    return {
        rtype: tuple(sorted(o for o in objs if not o.endswith("Sliced")))
        for rtype, objs in sorted(c.VAL_RECEPTACLE_OBJECTS.items())
        if rtype not in movable
    }


@functools.lru_cache(maxsize=1)
def pickupable_types() -> frozenset[str]:
    """Object types that some receptacle can hold: these can be taken and moved."""
    return frozenset(o for objs in receptacle_contents().values() for o in objs)


def action_class(name: str) -> frozenset[str]:
    """Types in ``VAL_ACTION_OBJECTS[name]`` (Cleanable, Heatable, Coolable, Sliceable, Toggleable)."""
    return frozenset(o for o in constants().VAL_ACTION_OBJECTS[name] if not o.endswith("Sliced"))


def room_type(floor_plan: int) -> str:
    for name, numbers in ROOM_TYPES.items():
        if floor_plan in numbers:
            return name
    raise ValueError(f"no floor plan {floor_plan}")


# --------------------------------------------------------------------------- naming


_MANGLE = str.maketrans({"|": "_bar_", "-": "_minus_", "+": "_plus_", ".": "_dot_", ",": "_comma_"})


def mangle(name: str) -> str:
    """A THOR id as a PDDL name, as ALFWorld writes it (``|`` -> ``_bar_``, ``-`` -> ``_minus_``...)."""
    return name.translate(_MANGLE)


def format_coordinate(value: float) -> str:
    """THOR's id coordinate format: sign, two integer digits, two decimals (``-00.64``, ``00.00``)."""
    value = round(value, 2)
    digits = f"{abs(value):05.2f}"
    if value == 0:
        return digits
    return ("+" if value > 0 else "-") + digits


def thor_id(type_name: str, position: tuple[float, float, float], suffix: str = "") -> str:
    coords = "|".join(format_coordinate(v) for v in position)
    return f"{type_name}|{coords}" + (f"|{suffix}" if suffix else "")


def location_name(x: float, z: float, rotation: float, horizon: float) -> str:
    """A pose as an ALFWorld location: ``loc|<x/0.25>|<z/0.25>|<rotation/90>|<horizon>``."""
    return f"loc|{round(x / STEP)}|{round(z / STEP)}|{round(rotation / 90) % 4}|{round(horizon)}"


# --------------------------------------------------------------------------- floor plans


@dataclass(frozen=True)
class FloorPlan:
    """What the layout files say about one room."""

    number: int
    object_types: tuple[str, ...]  # sorted, as listed in objects.json
    receptacle_poses: tuple[tuple[str, tuple[float, float, float, float]], ...]  # openable.json, sorted
    points: tuple[tuple[float, float], ...]  # reachable grid points, sorted

    @property
    def room_type(self) -> str:
        return room_type(self.number)


@functools.cache
def load_floor_plan(number: int) -> FloorPlan:
    layouts = alfworld_root() / "gen" / "layouts"
    objects = json.loads((layouts / f"FloorPlan{number}-objects.json").read_text())
    poses = json.loads((layouts / f"FloorPlan{number}-openable.json").read_text())
    points = np.load(layouts / f"FloorPlan{number}-layout.npy")
    return FloorPlan(
        number=number,
        object_types=tuple(sorted(set(objects))),
        receptacle_poses=tuple(sorted((rid, _pose(rid, pose)) for rid, pose in poses.items())),
        points=tuple(sorted((round(float(x), 2), round(float(z), 2)) for x, z in points)),
    )


def _pose(receptacle_id: str, values: Sequence[Any]) -> tuple[float, float, float, float]:
    """A receptacle's pose from ``openable.json``: four numbers (x, z, rotation, horizon)."""
    if len(values) != 4:
        raise ValueError(f"openable.json: pose of {receptacle_id} has {len(values)} values, expected 4")
    x, z, rotation, horizon = (float(v) for v in values)
    return x, z, rotation, horizon


def receptacle_type_of(receptacle_id: str) -> str:
    parts = receptacle_id.split("|")
    return BASIN_SUFFIXES.get(parts[-1], parts[0])


def position_of(thor_object_id: str) -> tuple[float, float, float]:
    x, y, z = (float(v) for v in thor_object_id.split("|")[1:4])
    return x, y, z


def receptacle_types_in(plan: FloorPlan) -> tuple[str, ...]:
    """Receptacle types of the room: those with a pose, plus the ones we synthesize."""
    contents = receptacle_contents()
    posed = {receptacle_type_of(rid) for rid, _ in plan.receptacle_poses}
    listed = {t for t in plan.object_types if t in contents}
    return tuple(sorted((posed | listed) & set(contents)))


def object_types_in(plan: FloorPlan) -> tuple[str, ...]:
    """Pickupable object types of the room that at least one of its receptacles can hold."""
    receptacles = receptacle_types_in(plan)
    contents = receptacle_contents()
    return tuple(t for t in plan.object_types if t in pickupable_types() and any(t in contents[r] for r in receptacles))


def lamp_types_in(plan: FloorPlan) -> tuple[str, ...]:
    hosts = set(receptacle_types_in(plan)) & set(LAMP_HOSTS)
    return tuple(t for t in LAMP_TYPES if t in plan.object_types) if hosts else ()


# --------------------------------------------------------------------------- scenes


@dataclass(frozen=True)
class Goal:
    """One ALFWorld task: its type, the object, and the target receptacle or lamp type."""

    task_type: str
    object_type: str
    receptacle_type: str | None = None  # every task but look_at_obj_in_light
    toggle_type: str | None = None  # look_at_obj_in_light only

    @property
    def excluded_start_types(self) -> frozenset[str]:
        """Receptacle types the goal objects must not start in (see ``build_scene``)."""
        excluded = {self.receptacle_type} if self.receptacle_type else set()
        if self.task_type == "pick_cool_then_place_in_recep":
            excluded.add("Fridge")
        return frozenset(excluded)

    @property
    def name(self) -> str:
        """The official directory name, e.g. ``pick_heat_then_place_in_recep-Cup-None-CounterTop``."""
        target = self.toggle_type if self.task_type == "look_at_obj_in_light" else self.receptacle_type
        return f"{self.task_type}-{self.object_type}-None-{target}"


@dataclass(frozen=True)
class Receptacle:
    id: str  # THOR id, e.g. "Cabinet|-00.64|+00.39|+04.30"
    type: str  # e.g. "Cabinet", "SinkBasin"
    location: str  # e.g. "loc|-6|17|1|30"


@dataclass(frozen=True)
class SceneObject:
    id: str
    type: str
    location: str
    receptacle: str | None  # receptacle id; None for scenery


@dataclass(frozen=True)
class Scene:
    floor_plan: int
    receptacles: tuple[Receptacle, ...]
    objects: tuple[SceneObject, ...]
    agent_location: str


def _heading(rotation: float) -> tuple[float, float]:
    """Unit (dx, dz) the agent faces at a THOR rotation (0 = +z, 90 = +x)."""
    return {0: (0.0, 1.0), 1: (1.0, 0.0), 2: (0.0, -1.0), 3: (-1.0, 0.0)}[round(rotation / 90) % 4]


def _synthetic_receptacles(plan: FloorPlan, rng: random.Random) -> list[Receptacle]:
    """Receptacles that objects.json lists but openable.json gives no pose for.

    Each stands about a metre in front of a random reachable grid point, facing it; stove
    burners come four to a stove, two per agent pose, as in the official kitchens.
    """
    posed = {receptacle_type_of(rid) for rid, _ in plan.receptacle_poses}
    missing = [t for t in receptacle_types_in(plan) if t not in posed]
    made: list[Receptacle] = []
    for rtype in missing:
        count, height, horizon = SYNTHETIC_RECEPTACLES.get(rtype, SYNTHETIC_DEFAULT)
        x, z = rng.choice(plan.points)
        rotation = rng.choice((0, 90, 180, 270))
        dx, dz = _heading(rotation)
        for i in range(count):
            lateral = (i % 2 - 0.5) * 0.45 if count > 1 else 0.0
            depth = 0.8 + 0.3 * (i // 2)
            position = (x + dx * depth + dz * lateral, height, z + dz * depth - dx * lateral)
            # Two burners per pose: the back row is reached from a step to the side.
            pose_x = x + dz * (0.25 if i >= 2 else 0.0)
            pose_z = z - dx * (0.25 if i >= 2 else 0.0)
            made.append(Receptacle(thor_id(rtype, position), rtype, location_name(pose_x, pose_z, rotation, horizon)))
    return made


def place_receptacles(plan: FloorPlan, rng: random.Random) -> tuple[Receptacle, ...]:
    contents = receptacle_contents()
    receptacles = [
        Receptacle(rid, receptacle_type_of(rid), location_name(*pose))
        for rid, pose in plan.receptacle_poses
        if receptacle_type_of(rid) in contents
    ]
    receptacles += _synthetic_receptacles(plan, rng)
    return tuple(sorted(receptacles, key=lambda r: r.id))


def _object_id(otype: str, receptacle: Receptacle, rng: random.Random, taken: set[str]) -> str:
    """A fresh THOR-style id for an object resting in/on ``receptacle`` (near its position)."""
    x, y, z = position_of(receptacle.id)
    while True:
        offset = (rng.uniform(-0.35, 0.35), rng.uniform(0.0, 0.12), rng.uniform(-0.35, 0.35))
        object_id = thor_id(otype, (x + offset[0], y + offset[1], z + offset[2]))
        if object_id not in taken:
            taken.add(object_id)
            return object_id


def instance_counts(plan: FloorPlan, goal: Goal, rng: random.Random) -> dict[str, int]:
    """How many of each pickupable type the room holds (1-3; at least 2 of a pick-two object)."""
    counts = {t: rng.randint(1, MAX_INSTANCES) for t in object_types_in(plan)}
    if goal.task_type == "pick_two_obj_and_place":
        counts[goal.object_type] = rng.randint(2, MAX_INSTANCES + 1)
    return counts


def _start_location(plan: FloorPlan, receptacle_locations: set[str], rng: random.Random) -> str:
    """A reachable pose that faces no receptacle, so the game opens "in the middle of a room"."""
    points = list(plan.points)
    rng.shuffle(points)
    for x, z in points:
        location = location_name(x, z, rng.choice((0, 90, 180, 270)), 30)
        if location not in receptacle_locations:
            return location
    raise ValueError(f"FloorPlan{plan.number}: no free starting point")


def build_scene(plan: FloorPlan, goal: Goal, rng: random.Random) -> Scene:
    """Receptacles from the layout, objects spread over compatible receptacles, an agent pose.

    Goal objects of a placing task never start in a receptacle of the target type, so that
    no game is won before it starts, nor in the fridge for a cooling task (the official games
    count what is in the fridge as cool already, which would leave nothing to cool). The lamp
    of a look_at task stands on a lamp host.
    """
    receptacles = place_receptacles(plan, rng)
    by_type: dict[str, list[Receptacle]] = {}
    for r in receptacles:
        by_type.setdefault(r.type, []).append(r)
    contents = receptacle_contents()
    taken: set[str] = set()
    objects: list[SceneObject] = []

    for otype, count in sorted(instance_counts(plan, goal, rng).items()):
        hosts = [r for r in receptacles if otype in contents[r.type]]
        if otype == goal.object_type:
            hosts = [r for r in hosts if r.type not in goal.excluded_start_types]
        for _ in range(count):
            host = rng.choice(hosts)
            objects.append(SceneObject(_object_id(otype, host, rng, taken), otype, host.location, host.id))

    lamp_hosts = [r for r in receptacles if r.type in LAMP_HOSTS]
    for lamp in lamp_types_in(plan):
        host = rng.choice(lamp_hosts)
        objects.append(SceneObject(_object_id(lamp, host, rng, taken), lamp, host.location, host.id))

    for scenery in SCENERY_TYPES:
        if scenery in plan.object_types:
            spot = rng.choice(receptacles)
            objects.append(SceneObject(_object_id(scenery, spot, rng, taken), scenery, spot.location, None))

    start = _start_location(plan, {r.location for r in receptacles}, rng)
    return Scene(plan.number, receptacles, tuple(sorted(objects, key=lambda o: o.id)), start)


# --------------------------------------------------------------------------- PDDL


def goal_pddl(goal: Goal) -> str:
    """The goal from ``goal_library`` with its ``#`` type markers written as PDDL's ``-``."""
    template = goal_library()[goal.task_type]["pddl"]
    text = template.format(
        obj=goal.object_type, recep=goal.receptacle_type or "", toggle=goal.toggle_type or "", mrecep=""
    )
    return text.replace("#", "-")


def task_description(goal: Goal, rng: random.Random) -> str:
    """A task sentence from ``goal_library``'s templates, lower-cased as ALFWorld fills them in."""
    template = rng.choice(goal_library()[goal.task_type]["templates"])
    return template.format(
        obj=goal.object_type.lower(),
        recep=(goal.receptacle_type or "").lower(),
        toggle=(goal.toggle_type or "").lower(),
        mrecep="",
    )


def _block(lines: list[str]) -> str:
    return "".join(f"        {line}\n" for line in lines)


def problem_pddl(scene: Scene, goal: Goal, problem_name: str) -> str:
    """The PDDL problem, laid out like the official ``json_2.1.1`` problems.

    Same sections and predicates: typed objects, receptacles and locations; receptacleType,
    objectType, canContain, pickupable, isReceptacleObject, openable, the agent's atLocation,
    cleanable/heatable/coolable/isCool, toggleable (the task's lamp type only, as officially),
    sliceable, inReceptacle, receptacleAtLocation and objectAtLocation. Unlike the official
    files, types and canContain facts are listed once each and only for types in the room:
    the rest never occurs in a fact, and a smaller problem is a faster one to verify.
    """
    contents = receptacle_contents()
    pickupable = pickupable_types()
    movable = set(constants().MOVABLE_RECEPTACLES)
    openable_types = set(constants().OPENABLE_CLASS_LIST)
    objects = scene.objects
    m = mangle
    otypes = sorted({o.type for o in objects})
    rtypes = sorted({r.type for r in scene.receptacles})
    locations = sorted({r.location for r in scene.receptacles} | {o.location for o in objects})
    if scene.agent_location not in locations:
        locations.append(scene.agent_location)

    def having(cls: str, predicate: str) -> list[str]:
        members = action_class(cls)
        return [f"({predicate} {m(o.id)})" for o in objects if o.type in members]

    # Officially, target objects that start in a fridge are already cool.
    already_cool = [
        f"(isCool {m(o.id)})"
        for o in objects
        if o.type == goal.object_type and o.receptacle and receptacle_type_of(o.receptacle) == "Fridge"
    ]
    init_sections = [
        [f"(receptacleType {m(r.id)} {r.type}Type)" for r in scene.receptacles]
        + [f"(objectType {m(o.id)} {o.type}Type)" for o in objects]
        + [f"(canContain {r}Type {o}Type)" for r in rtypes for o in otypes if o in contents[r]]
        + [f"(pickupable {m(o.id)})" for o in objects if o.type in pickupable]
        + [f"(isReceptacleObject {m(o.id)})" for o in objects if o.type in movable]
        + [f"(openable {m(r.id)})" for r in scene.receptacles if r.type in openable_types],
        [f"(atLocation agent1 {m(scene.agent_location)})"],
        having("Cleanable", "cleanable"),
        having("Heatable", "heatable") + having("Coolable", "coolable") + already_cool,
        [f"(toggleable {m(o.id)})" for o in objects if o.type == goal.toggle_type],
        having("Sliceable", "sliceable"),
        [f"(inReceptacle {m(o.id)} {m(o.receptacle)})" for o in objects if o.receptacle]
        + [f"(receptacleAtLocation {m(r.id)} {m(r.location)})" for r in scene.receptacles]
        + [f"(objectAtLocation {m(o.id)} {m(o.location)})" for o in objects],
    ]
    declarations = [f"{t}Type - otype" for t in otypes] + [f"{t}Type - rtype" for t in rtypes]
    entities = (
        [f"{m(o.id)} - object" for o in objects]
        + [f"{m(r.id)} - receptacle" for r in scene.receptacles]
        + [f"{m(loc)} - location" for loc in locations]
    )
    return (
        f"\n(define (problem plan_{problem_name})\n(:domain alfred)\n(:objects\nagent1 - agent\n"
        + _block(declarations)
        + "\n\n"
        + _block(entities)
        + "        )\n    \n\n(:init\n\n\n"
        + "        \n".join(_block(section) for section in init_sections)
        + "        )\n    \n\n"
        + goal_pddl(goal)
    )
