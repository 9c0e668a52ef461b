"""ALFWorld's six task types and how to read them from names."""

from __future__ import annotations

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)


def task_type_of(name: str) -> str:
    """The task type a folder name such as ``pick_heat_then_place_in_recep-Cup-None-Fridge-12`` starts with."""
    prefix = name.split("-", 1)[0]
    if prefix not in TASK_TYPES:
        raise ValueError(f"{name!r} does not start with an ALFWorld task type ({', '.join(TASK_TYPES)})")
    return prefix


def instruction_of(observation: str) -> str:
    """The ``Your task is to: ...`` sentence of an ALFWorld intro (without the prefix)."""
    marker = "Your task is to: "
    index = observation.rfind(marker)
    return observation[index + len(marker) :].strip() if index >= 0 else ""
