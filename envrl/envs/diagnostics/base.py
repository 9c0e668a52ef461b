"""What the diagnostic tasks share: splits, task ids, the difficulty knob, action matching, the
move budget and the expert's plan (see docs/diagnostics.md).

A diagnostic is a :class:`Game` (a small state machine written in plain Python) plus a
:class:`DiagnosticEnv` subclass that says how to generate one task from a seeded
``random.Random``. The env turns games into the :class:`~envrl.envs.base.TextEnv` contract:
task ids ``<knob><value>/<split>/<index>``, the same content for the same id in any process
(``random.Random`` seeded with a string hashes it with SHA-512, not Python's salted ``hash``),
admissible actions compared ignoring case and extra spaces, ``Nothing happens.`` for anything
else, and an in-game move budget after which the episode terminates as failed.
"""

from __future__ import annotations

import random
from abc import abstractmethod
from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from envrl.envs.base import StepResult, TaskStart, TextEnv

#: the splits of every diagnostic, in leaderboard order, with their kinds
SPLIT_KINDS = {"train": "ID", "select": "ID", "valid": "ID", "test_ood": "OOD"}
SPLITS = tuple(SPLIT_KINDS)
#: tasks per split (generated on demand, so a large split costs nothing until played)
SPLIT_SIZES = {"train": 2000, "select": 200, "valid": 200, "test_ood": 200}
#: the info key of the expert's remaining actions (the expert agent plays it)
EXPERT_PLAN = "expert_plan"


def normalize(text: str) -> str:
    """An action as it is compared: lower case, single spaces."""
    return " ".join(text.split()).lower()


@dataclass
class Outcome:
    """What one admissible action did to a game."""

    text: str
    reward: float = 0.0
    won: bool = False


class Game:
    """One task being played. Subclasses hold the state and implement the three methods."""

    #: what the env says when the move budget runs out (the episode then ends, failed)
    out_of_moves = "You are out of moves."

    @abstractmethod
    def observation(self) -> str:
        """The current state's text (shown at reset and after each move)."""

    @abstractmethod
    def actions(self) -> list[str]:
        """The admissible actions now, in a fixed order."""

    @abstractmethod
    def play(self, action: str) -> Outcome:
        """Apply one admissible action (as :meth:`actions` spells it)."""

    @abstractmethod
    def expert_plan(self) -> list[str]:
        """The shortest winning sequence of actions from the current state."""

    def progress(self) -> float:
        """Partial progress in [0, 1] (``info["score"]``); 1.0 exactly when won."""
        return 0.0

    @abstractmethod
    def random_success(self, moves: int) -> float:
        """The exact chance that uniformly random admissible actions win from the current state
        within ``moves`` moves (the random agent's expected success)."""


class DiagnosticEnv(TextEnv):
    """A diagnostic task family as a Gymnasium text env (see the module docstring).

    Subclasses set :attr:`knob` (the difficulty argument's name), :attr:`knob_range`,
    :attr:`task_type`, and implement :meth:`new_game` and :meth:`move_budget`.
    """

    knob: ClassVar[str]
    knob_range: ClassVar[tuple[int, int]]
    task_type: ClassVar[str]

    def __init__(self, split: str, value: int, expert_plan: bool = False, render_mode: str | None = None):
        name = type(self).__name__
        if split not in SPLIT_KINDS:
            raise ValueError(f"unknown {name} split {split!r}; choose one of {', '.join(SPLITS)}")
        low, high = self.knob_range
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{name}'s {self.knob} must be an integer from {low} to {high}, got {value!r}")
        super().__init__(split=split, render_mode=render_mode)
        self.value = value
        self.expert_plan = bool(expert_plan)
        prefix = f"{self.knob[0]}{value}/{split}/"
        self._ids = [f"{prefix}{i}" for i in range(SPLIT_SIZES[split])]
        self._id_set = frozenset(self._ids)
        self._game: Game | None = None
        self._moves_left = 0
        self._won = False

    # ---- what a subclass provides -------------------------------------------------------

    @abstractmethod
    def new_game(self, rng: random.Random, ood: bool) -> tuple[Game, str]:
        """A fresh game for one task, and its instruction. ``ood``: the task is from ``test_ood``."""

    @abstractmethod
    def move_budget(self, game: Game, ood: bool) -> int:
        """Moves allowed before the episode ends as failed."""

    # ---- the TextEnv hooks ----------------------------------------------------------------

    def _split_task_ids(self) -> Sequence[str]:
        return self._ids

    def _task_index(self) -> Container[str]:
        return self._id_set

    def task_rng(self, task_id: str) -> random.Random:
        """The task's own generator: the same content for the same id on every machine."""
        return random.Random(f"{type(self).__name__}|{task_id}")

    def task_random_success(self, task_id: str) -> float:
        """The random agent's exact chance of winning ``task_id`` within the move budget."""
        if task_id not in self._id_set:
            raise ValueError(f"unknown task id {task_id!r} for split {self.split!r}")
        ood = SPLIT_KINDS[self.split] == "OOD"
        game, _ = self.new_game(self.task_rng(task_id), ood)
        return game.random_success(self.move_budget(game, ood))

    def _start_task(self, task_id: str) -> TaskStart:
        ood = SPLIT_KINDS[self.split] == "OOD"
        game, instruction = self.new_game(self.task_rng(task_id), ood)
        self._game = game
        self._moves_left = self.move_budget(game, ood)
        self._won = False
        return TaskStart(
            observation=game.observation(),
            task_type=self.task_type,
            instruction=instruction,
            admissible_actions=game.actions(),
            extra=self._extra(),
        )

    def _apply(self, action: str) -> StepResult:
        game = self._game
        assert game is not None  # the base class checks reset() came first
        self._moves_left -= 1
        by_name = {normalize(a): a for a in game.actions()}
        chosen = by_name.get(normalize(action))
        if chosen is None:
            text, reward, valid = self.INVALID_FEEDBACK, 0.0, False
        else:
            outcome = game.play(chosen)
            text, reward, valid, self._won = outcome.text, outcome.reward, True, outcome.won
        terminated = self._won or self._moves_left <= 0
        if terminated and not self._won:
            text = f"{text} {game.out_of_moves}"
        return StepResult(
            observation=text,
            reward=reward,
            terminated=terminated,
            valid_action=valid,
            success=self._won,
            score=1.0 if self._won else game.progress(),
            admissible_actions=[] if terminated else game.actions(),
            extra=self._extra(),
        )

    def _extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"moves_left": self._moves_left}
        if self.expert_plan and self._game is not None:
            extra[EXPERT_PLAN] = [] if self._won else self._game.expert_plan()
        return extra
