"""``envrl/Diag-Chain-v0``: credit assignment over a horizon of N rooms (docs/diagnostics.md).

N rooms in a row, each with a left and a right door and a sign showing a symbol; by the family's
rule (:data:`RULE`) each symbol names the door that leads on, and the other door drops the player
back to the first room. Leaving the last room is the only reward. The rooms' texts carry no move
count, so the same room reads the same in every rollout and at every visit: GiGPO's anchor states.
"""

from __future__ import annotations

import random
from functools import cache

from envrl.envs.diagnostics.base import DiagnosticEnv, Game, Outcome

#: the family's rule: which door each symbol means (the same for every N and split)
RULE = {
    "heron": "left",
    "maple": "right",
    "anvil": "left",
    "comet": "right",
    "tulip": "left",
    "otter": "right",
    "flint": "left",
    "prism": "right",
}
SYMBOLS = tuple(RULE)
ACTIONS = {"left": "open the left door", "right": "open the right door"}
#: moves per room the torch lasts
MOVES_PER_ROOM = 3


def article(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


class ChainGame(Game):
    out_of_moves = "Your torch burns out."

    def __init__(self, signs: list[str]):
        self.signs = signs
        self.room = 0  # 0-based
        self.best = 0  # the furthest room reached

    def observation(self) -> str:
        return self._room_text()

    def _room_text(self) -> str:
        return (
            f"Room {self.room + 1} of {len(self.signs)}. The sign on the wall shows {article(self.signs[self.room])}. "
            "There is a door on the left and a door on the right."
        )

    def actions(self) -> list[str]:
        return [ACTIONS["left"], ACTIONS["right"]]

    def play(self, action: str) -> Outcome:
        if action != ACTIONS[RULE[self.signs[self.room]]]:
            self.room = 0
            return Outcome(f"The door opens onto a chute, and you slide back to the first room. {self._room_text()}")
        self.room += 1
        self.best = max(self.best, self.room)
        if self.room == len(self.signs):
            return Outcome("You step through the door into the daylight. You escaped!", reward=1.0, won=True)
        return Outcome(f"You go through the door. {self._room_text()}")

    def expert_plan(self) -> list[str]:
        return [ACTIONS[RULE[sign]] for sign in self.signs[self.room :]]

    def progress(self) -> float:
        return self.best / len(self.signs)

    def random_success(self, moves: int) -> float:
        return chain_random_success(len(self.signs), moves, room=self.room)


class ChainEnv(DiagnosticEnv):
    """A chain of ``length`` rooms (``test_ood``: ``2 * length``); the torch lasts 3 moves a room."""

    knob = "length"
    knob_range = (1, 32)
    task_type = "chain"

    def __init__(
        self, split: str = "train", length: int = 4, expert_plan: bool = False, render_mode: str | None = None
    ):
        super().__init__(split, length, expert_plan=expert_plan, render_mode=render_mode)

    def rooms(self, ood: bool) -> int:
        return self.value * (2 if ood else 1)

    def new_game(self, rng: random.Random, ood: bool) -> tuple[ChainGame, str]:
        signs = [rng.choice(SYMBOLS) for _ in range(self.rooms(ood))]
        return ChainGame(signs), f"Get out through the last of the {len(signs)} rooms."

    def move_budget(self, game: Game, ood: bool) -> int:
        return MOVES_PER_ROOM * self.rooms(ood)


def chain_random_success(rooms: int, moves: int | None = None, room: int = 0) -> float:
    """The exact chance that a uniformly random door-opener escapes ``rooms`` rooms in ``moves``
    moves (default the env's budget), starting in ``room`` (0-based): each move advances with
    probability 1/2, else restarts from the first room."""
    budget = MOVES_PER_ROOM * rooms if moves is None else moves

    @cache
    def escape(room: int, left: int) -> float:
        if room == rooms:
            return 1.0
        if left == 0:
            return 0.0
        return 0.5 * escape(room + 1, left - 1) + 0.5 * escape(0, left - 1)

    return escape(room, budget)
