"""``envrl/Diag-Generalization-v0``: matching the task's words against the actions', on larger
tables and unseen names (docs/diagnostics.md).

A table holds K objects; the task lists 1-2 of them (ID) to put in the basket. ``take the <object>``
moves a listed object into the basket and puts any other back (a wasted move); the budget is the
table's size plus 2. ``test_ood`` has 2K objects, 3 listed, all named from :data:`HELD_OUT_NAMES`,
which no ID split (and so no tokenizer trained on ``train``) ever shows.
"""

from __future__ import annotations

import random
from functools import cache

from envrl.envs.diagnostics.base import DiagnosticEnv, Game, Outcome

#: the names of the ID splits
TRAIN_NAMES = (
    "apple", "basket", "candle", "drum", "feather", "glove", "hammer", "jar", "kettle", "ladder",
    "mirror", "needle", "orange", "pencil", "quilt", "ribbon", "saddle", "teapot", "umbrella", "violin",
    "wallet", "yarn", "anchor", "bottle", "compass", "dice", "envelope", "fork", "globe", "helmet",
    "ink", "jacket", "lantern", "magnet", "napkin", "pillow", "rope", "spoon", "towel", "whistle",
)  # fmt: skip
#: the names only ``test_ood`` uses (enough for the largest OOD table, 2 * 16)
HELD_OUT_NAMES = (
    "abacus", "bellows", "cymbal", "dagger", "easel", "funnel", "gavel", "harp", "icicle", "jigsaw",
    "kazoo", "ledger", "mallet", "nutmeg", "oar", "parasol", "quiver", "rattle", "sextant", "trowel",
    "bobbin", "chisel", "gimlet", "lute", "monocle", "plinth", "spindle", "thimble", "urn", "whisk",
    "zither", "sickle",
)  # fmt: skip
#: moves allowed beyond the table's size
SPARE_MOVES = 2
OOD_TARGETS = 3


def take_action(name: str) -> str:
    return f"take the {name}"


def listing(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


class TableGame(Game):
    out_of_moves = "The shop closes."

    def __init__(self, table: list[str], targets: list[str]):
        self.table = table
        self.targets = targets
        self.basket: list[str] = []

    def observation(self) -> str:
        return f"On the table: {listing(self.table)}. The list says: {listing(self.targets)}."

    def actions(self) -> list[str]:
        return [take_action(name) for name in self.table]

    def play(self, action: str) -> Outcome:
        name = action.removeprefix("take the ")
        if name not in self.targets:
            return Outcome(f"The {name} is not on the list; you put it back.")
        self.basket.append(name)
        self.table.remove(name)
        if len(self.basket) == len(self.targets):
            return Outcome(f"You put the {name} in the basket. Everything on the list is in the basket.", 1.0, True)
        return Outcome(f"You put the {name} in the basket. On the table: {listing(self.table)}.")

    def expert_plan(self) -> list[str]:
        return [take_action(name) for name in self.targets if name not in self.basket]

    def progress(self) -> float:
        return len(self.basket) / len(self.targets)

    def random_success(self, moves: int) -> float:
        return table_random_success(len(self.table), len(self.targets) - len(self.basket), moves)


class GeneralizationEnv(DiagnosticEnv):
    """A table of ``objects`` objects and 1-2 targets (``test_ood``: twice the objects, 3 targets,
    unseen names)."""

    knob = "objects"
    knob_range = (2, 16)
    task_type = "generalization"

    def __init__(
        self, split: str = "train", objects: int = 4, expert_plan: bool = False, render_mode: str | None = None
    ):
        super().__init__(split, objects, expert_plan=expert_plan, render_mode=render_mode)

    def new_game(self, rng: random.Random, ood: bool) -> tuple[TableGame, str]:
        size = 2 * self.value if ood else self.value
        table = rng.sample(HELD_OUT_NAMES if ood else TRAIN_NAMES, size)
        count = OOD_TARGETS if ood else rng.randint(1, min(2, size - 1))
        targets = rng.sample(table, count)
        return TableGame(table, targets), f"Put the {listing(targets)} in the basket."

    def move_budget(self, game: Game, ood: bool) -> int:
        assert isinstance(game, TableGame)
        return len(game.table) + SPARE_MOVES


def table_random_success(objects: int, targets: int, moves: int | None = None) -> float:
    """The exact chance that uniformly random ``take`` actions collect ``targets`` of ``objects``
    objects within ``moves`` (default the env's budget): a take picks a target with probability
    (targets left)/(objects left), and only a target leaves the table."""
    budget = objects + SPARE_MOVES if moves is None else moves

    @cache
    def win(left: int, on_table: int, moves_left: int) -> float:
        if left == 0:
            return 1.0
        if moves_left == 0:
            return 0.0
        hit = left / on_table
        return hit * win(left - 1, on_table - 1, moves_left - 1) + (1 - hit) * win(left, on_table, moves_left - 1)

    return win(targets, objects, budget)
