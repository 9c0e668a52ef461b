"""``envrl/ALFWorld-v0``: ALFWorld's text household tasks on the real TextWorld PDDL engine."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import textworld

from envrl.envs.alfworld import engine as engine_lib
from envrl.envs.alfworld.official import OFFICIAL_SPLITS, data_root, official_games
from envrl.envs.alfworld.tasks import instruction_of
from envrl.envs.base import StepResult, TaskStart, TextEnv

SPLITS = ("train", "valid_seen", "valid_unseen", "ood_objects")
SOURCES = ("auto", "official", "builtin")
EXPERT_TYPES = ("planner", "handcoded")


@dataclass(frozen=True)
class GameRef:
    """Where one task's game lives; official and built-in games share this shape."""

    task_id: str
    task_type: str
    path: Path
    has_traj_data: bool = False


def split_games(split: str, source: str = "auto", data_dir: str | os.PathLike | None = None) -> list[GameRef]:
    """The games of ``split`` from official data (``ALFWORLD_DATA``) or envrl's built-in generator.

    ``source="auto"`` means official data when ``ALFWORLD_DATA`` (or ``data_dir``) is set, else
    built-in. The two never mix: every task id starts with ``official:`` or ``builtin:``.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; choose one of {SPLITS}")
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; choose one of {SOURCES}")
    root = data_root(data_dir) if source in ("auto", "official") else None
    if source == "official" and root is None:
        raise ValueError("source='official' needs ALFWORLD_DATA (or data_dir=) pointing at the official data")
    if root is not None:
        if split not in OFFICIAL_SPLITS:
            raise ValueError(
                f"split {split!r} exists only in envrl's built-in games, but official data is configured "
                f"(ALFWORLD_DATA={os.environ.get('ALFWORLD_DATA', data_dir)}); pass source='builtin'"
            )
        return [GameRef(g.task_id, g.task_type, g.path, g.traj_data is not None) for g in official_games(root, split)]
    from envrl.envs.alfworld.generate import builtin_games

    return [GameRef(g.task_id, g.task_type, g.path) for g in builtin_games(split)]


class ALFWorldEnv(TextEnv):
    """ALFWorld (Shridhar et al., 2021) as a Gymnasium text environment.

    Observations are exactly the engine's text; ``info["admissible_actions"]`` lists the
    commands the engine accepts now; reward is 1.0 when the PDDL goal holds (``success``).

    Arguments:
        split: ``train``, ``valid_seen`` (ID), ``valid_unseen`` or ``ood_objects`` (OOD).
        source: ``auto``, ``official`` or ``builtin`` (see :func:`split_games`).
        command_style: ``move`` (ALFWorld 0.4: ``move X to Y``) or ``put`` (``put X in/on Y``).
        expert_plan: add ``info["expert_plan"]``, the expert's remaining actions.
        expert_type: ``planner`` (the game's walkthrough, replanned by Fast Downward when the
            agent leaves it) or ``handcoded`` (ALFWorld's hand-coded expert; needs traj_data.json).
    """

    def __init__(
        self,
        split: str = "valid_unseen",
        source: str = "auto",
        command_style: str = "move",
        expert_plan: bool = False,
        expert_type: str = "planner",
        data_dir: str | os.PathLike | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(split=split, render_mode=render_mode)
        if split not in SPLITS:
            raise ValueError(f"unknown ALFWorld split {split!r}; choose one of {SPLITS}")
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r}; choose one of {SOURCES}")
        if command_style not in engine_lib.COMMAND_STYLES:
            raise ValueError(f"command_style must be one of {engine_lib.COMMAND_STYLES}, got {command_style!r}")
        if expert_type not in EXPERT_TYPES:
            raise ValueError(f"expert_type must be one of {EXPERT_TYPES}, got {expert_type!r}")
        self.source = source
        self.command_style = command_style
        self.expert_plan = expert_plan
        self.expert_type = expert_type
        self._data_dir = data_dir
        self._games: dict[str, GameRef] | None = None
        self._engine: Any = None
        self._admissible: list[str] = []
        self._plan: list[str] = []
        self._won = False
        self._engine_handcoded = False
        self._loaded_task: str | None = None
        self._walkthrough: list[str] = []

    # ---- tasks ---------------------------------------------------------------------

    def _game_index(self) -> dict[str, GameRef]:
        if self._games is None:
            games = split_games(self.split, self.source, self._data_dir)
            self._games = {game.task_id: game for game in games}
        return self._games

    @property
    def games(self) -> list[GameRef]:
        """The split's games (task id, task type, game file), in the split's order."""
        return list(self._game_index().values())

    def _split_task_ids(self) -> Sequence[str]:
        return list(self._game_index())

    def _task_index(self) -> dict[str, GameRef]:
        return self._game_index()

    # ---- engine --------------------------------------------------------------------

    def _make_engine(self, handcoded: bool) -> Any:
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        tw_env = engine_lib.start_engine(infos)
        return engine_lib.handcoded_expert_wrapper(tw_env) if handcoded else tw_env

    def _start_task(self, task_id: str) -> TaskStart:
        game = self._game_index()[task_id]
        handcoded = self.expert_plan and self.expert_type == "handcoded"
        if handcoded and not game.has_traj_data:
            raise ValueError(f"expert_type='handcoded' needs traj_data.json beside the game of {task_id}")
        if self._engine is None or self._engine_handcoded != handcoded:
            self._engine = self._make_engine(handcoded)
            self._engine_handcoded = handcoded
            self._loaded_task = None
        if self._loaded_task != task_id:
            # Playing the same task again (a GRPO group, say) only needs reset(), not load().
            with open(game.path, encoding="utf-8") as handle:
                data = engine_lib.with_command_style(json.load(handle), self.command_style)
            self._engine.load(data)
            if handcoded:  # the hand-coded expert reads traj_data.json beside the game file
                self._engine.gamefile = str(game.path)
            self._loaded_task = task_id
            self._walkthrough = list(data.get("walkthrough") or [])
        state = self._engine.reset()
        self._admissible = list(state["admissible_commands"])
        self._won = bool(state["won"])
        extra: dict[str, Any] = {"won": self._won}
        if self.expert_plan:
            self._plan = self._expert_actions(state, fresh=True, walkthrough=self._walkthrough)
            extra["expert_plan"] = list(self._plan)
        observation = state.feedback
        return TaskStart(
            observation=observation,
            task_type=game.task_type,
            instruction=instruction_of(observation),
            admissible_actions=self._admissible,
            extra=extra,
        )

    def _apply(self, action: str) -> StepResult:
        valid = action.strip() in self._admissible
        state, _, _ = self._engine.step(action)
        self._admissible = list(state["admissible_commands"])
        self._won = bool(state["won"])
        extra: dict[str, Any] = {"won": self._won}
        if self.expert_plan:
            self._plan = self._expert_actions(state, taken=action.strip() if valid else None)
            extra["expert_plan"] = list(self._plan)
        return StepResult(
            observation=state.feedback,
            reward=1.0 if self._won else 0.0,
            terminated=self._won,
            valid_action=valid,
            success=self._won,
            score=1.0 if self._won else 0.0,
            admissible_actions=self._admissible,
            extra=extra,
        )

    def _expert_actions(
        self, state: Any, *, fresh: bool = False, walkthrough: list[str] | None = None, taken: str | None = None
    ) -> list[str]:
        """The expert's remaining actions: follow the walkthrough, replan when the agent left it."""
        if self._won:
            return []
        if self.expert_type == "handcoded":
            plan = state.get("extra.expert_plan") or []
            return [engine_lib.translate_command(a, self.command_style) for a in plan]
        if fresh and walkthrough:
            return list(walkthrough)
        if not fresh:
            if taken is None:  # an invalid action leaves the state, and so the plan, unchanged
                return self._plan
            if self._plan and taken == self._plan[0]:
                return self._plan[1:]
        plan = self._engine.unwrapped.replan()
        return [engine_lib.translate_command(a, self.command_style) for a in plan]

    def _close_engine(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
            self._loaded_task = None
