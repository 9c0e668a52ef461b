"""``envrl/TextWorld-v0``: games made by TextWorld's generator, played on TextWorld's engine.

Each task is a compiled Inform 7 game (``.z8``) played through ``textworld.start`` (the
Jericho/Frotz interpreter plus TextWorld's state tracking), generated and verified on first use
(see :mod:`envrl.envs.textworld.generate` for the ids, splits, settings and cache).

Observations are the game's own text with the interpreter's chrome removed: the ASCII-art
"TEXTWORLD" banner that opens every game, the status line (``-= Room =-score/moves``) and
the input prompt that close every response, and the "Would you like to RESTART, RESTORE ..."
question after the end; runs of blank lines are collapsed and the text is stripped. So the first
observation is the game's intro with the objective, followed by the first room. The banner is
~1,300 characters of drawing that carry no information for an agent.

Info, besides the common keys: ``won``, ``lost``, ``points`` (the game's raw score),
``max_score`` (its maximum) and, with ``expert_plan=True``, ``expert_plan``. ``score`` is
``points / max_score``, the reward is the change of that, ``success`` is ``won`` and an
episode terminates when the game is won or lost.

Actions. ``admissible_actions`` are TextWorld's admissible commands; any of them (compared
ignoring case and extra spaces) is valid. Any other single command made of letters, digits,
spaces, hyphens and apostrophes is passed to the game, which answers it in its own words
("You can't go that way.") with ``valid_action=False``. Text that could make one step do
several things or break the interpreter never reaches it and gets a short feedback instead:
chained commands (``.``, ``,``, ``;``, a newline, ``then``), other characters, more than
``MAX_COMMAND_LENGTH`` characters, and the interpreter's meta commands (``restart``,
``quit``, ``undo``, ``save``, ``restore``, ``again``, ``script``, ``tw-*`` ...), which would
otherwise leave the game waiting for a yes/no answer or confuse TextWorld's tracking.

Expert plan: the game's verified walkthrough while the agent follows it; once the agent does
something else that changes the game, TextWorld's ``policy_commands`` (a winning policy
replanned from the tracked state).

Sub-task sets: ``families=("custom",)`` keeps only those families' ids of the split (in the
split's order), e.g. the short ``custom`` quests for small training experiments.

Determinism: the Z-machine's random generator is seeded (``generate.FROTZ_SEED``) at every
reset, so the same task id and actions give the same observations in any process.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Sequence
from typing import Any

from envrl.envs.base import StepResult, TaskStart, TextEnv
from envrl.envs.textworld import generate
from envrl.envs.textworld.generate import FROTZ_SEED, SPLITS, TaskIdError

MAX_COMMAND_LENGTH = 150  # the interpreter truncates input at 198 bytes
META_VERBS = frozenset(
    {
        "again",
        "die",
        "g",
        "noscript",
        "notify",
        "oops",
        "q",
        "quit",
        "restart",
        "restore",
        "save",
        "script",
        "transcript",
        "undo",
        "unscript",
        "verify",
        "version",
    }
)
_SAFE_COMMAND = re.compile(r"[a-z0-9'\- ]+")
_BANNER_LINE = re.compile(r"[ _|$\\/<>]*")
_STATUS_LINE = re.compile(r">? *(?:-= [^\n]* =- *-?\d+/\d+)?")  # the prompt and the status bar
_END_QUESTION = "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?"
_BLANK_RUNS = re.compile(r"\n{3,}")

CHAINED_FEEDBACK = "One command at a time, please, made of letters, digits, spaces, hyphens and apostrophes."
TOO_LONG_FEEDBACK = "That command is too long."
META_FEEDBACK = "That command is not available in this game."


def clean_observation(text: str, first: bool = False) -> str:
    """The game's text without the banner (``first``), status line, prompt and end question."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    if lines and _STATUS_LINE.fullmatch(lines[-1]):
        lines.pop()
    lines = [_uncenter(line) for line in lines if not line.startswith(_END_QUESTION)]
    if first:
        while lines and _BANNER_LINE.fullmatch(lines[0]):
            lines.pop(0)
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip()


def _uncenter(line: str) -> str:
    """``*** The End ***`` and ``*** You lost! ***`` come indented by ~55 spaces."""
    stripped = line.lstrip(" ")
    return stripped if stripped.startswith("*** ") and stripped.endswith(" ***") else line


def normalize_command(text: str) -> str:
    return " ".join(text.split()).lower()


class TextWorldEnv(TextEnv):
    """TextWorld games as a Gymnasium text environment (see the module docstring).

    Arguments:
        split: ``train``, ``select`` (choose settings here), ``valid`` (the reported one; all three
            in-distribution) or ``test_ood`` (larger worlds, longer quests).
        expert_plan: add ``info["expert_plan"]``, the expert's remaining commands.
        cache_dir: where games are cached (default ``$ENVRL_CACHE/textworld`` or
            ``~/.cache/envrl/textworld``).
    """

    def __init__(
        self,
        split: str = "train",
        expert_plan: bool = False,
        cache_dir: str | os.PathLike | None = None,
        render_mode: str | None = None,
        families: Sequence[str] | None = None,
    ):
        if split not in SPLITS:
            raise ValueError(f"unknown TextWorld split {split!r}; choose one of {SPLITS}")
        unknown = sorted(set(families or ()) - set(generate.FAMILIES))
        if unknown or (families is not None and not families):
            raise ValueError(f"families must be a non-empty subset of {', '.join(generate.FAMILIES)}, got {families!r}")
        super().__init__(split=split, render_mode=render_mode)
        # a sub-task set (e.g. only the short "custom" quests, for small experiments): the split's
        # ids of these families, in the split's order
        self.families = tuple(families) if families is not None else generate.FAMILIES
        self.expert_plan = expert_plan
        self.cache_dir = cache_dir
        self._ids: list[str] | None = None
        self._id_set: frozenset[str] = frozenset()
        self._tw: Any = None
        self._game: generate.GameFiles | None = None
        self._admissible: dict[str, str] = {}  # normalized -> as the game spells it
        self._points = 0
        self._max_score = 1
        self._won = False
        self._lost = False
        self._facts: frozenset = frozenset()
        self._plan: list[str] = []

    # ---- tasks ---------------------------------------------------------------------

    def _split_task_ids(self) -> Sequence[str]:
        if self._ids is None:
            self._ids = [t for t in generate.task_ids(self.split) if generate.parse_task_id(t)[0] in self.families]
            self._id_set = frozenset(self._ids)
        return self._ids

    def _task_index(self) -> frozenset[str]:
        self._split_task_ids()
        return self._id_set

    def task_details(self, task_id: str) -> dict[str, Any]:
        """The generator's record of a task (settings, seed, walkthrough, sizes); generates it if needed."""
        self._check_task(task_id)
        return generate.ensure_game(task_id, self.cache_dir).meta

    def _check_task(self, task_id: str) -> None:
        if task_id not in self._task_index():
            try:
                _, split, _ = generate.parse_task_id(task_id)
            except TaskIdError as error:
                raise ValueError(str(error)) from None
            if split != self.split:
                raise ValueError(f"task id {task_id!r} belongs to split {split!r}, not {self.split!r}")
            raise ValueError(f"task id {task_id!r} is not in this env's families ({', '.join(self.families)})")

    # ---- engine --------------------------------------------------------------------

    def _start_task(self, task_id: str) -> TaskStart:
        import textworld

        if self._game is None or self._game.task_id != task_id:
            game = generate.ensure_game(task_id, self.cache_dir)
            self._close_engine()
            infos = textworld.EnvInfos(
                admissible_commands=True,
                score=True,
                max_score=True,
                won=True,
                lost=True,
                objective=True,
                policy_commands=self.expert_plan,
            )
            with warnings.catch_warnings():  # textworld silences it at import; pytest re-enables it
                warnings.filterwarnings("ignore", message=".*is not fully supported")
                self._tw = textworld.start(str(game.path), infos)
            self._game = game
        self._tw.seed(FROTZ_SEED)  # the interpreter re-reads its seed at every reset
        state = self._tw.reset()
        self._read_state(state)
        self._plan = self._game.walkthrough if self.expert_plan else []
        extra = self._extra()
        return TaskStart(
            observation=clean_observation(state.feedback, first=True),
            task_type=self._game.meta["family"],
            instruction=str(state["objective"] or self._game.meta["objective"]).strip(),
            admissible_actions=sorted(self._admissible.values()),
            extra=extra,
        )

    def _apply(self, action: str) -> StepResult:
        command, feedback = self._engine_command(action)
        if command is None:
            return StepResult(
                observation=feedback,
                reward=0.0,
                terminated=False,
                valid_action=False,
                success=self._won,
                score=self._score(),
                admissible_actions=sorted(self._admissible.values()),
                extra=self._extra(feedback=feedback),
            )
        key = normalize_command(command)
        valid = key in self._admissible
        before_points, before_facts = self._points, self._facts
        state, _, _ = self._tw.step(command)
        self._read_state(state)
        if self.expert_plan:
            self._update_plan(key, state, changed=self._facts != before_facts)
        extra = self._extra()
        return StepResult(
            observation=clean_observation(state.feedback),
            reward=(self._points - before_points) / self._max_score,
            terminated=self._won or self._lost,
            valid_action=valid,
            success=self._won,
            score=self._score(),
            admissible_actions=sorted(self._admissible.values()),
            extra=extra,
        )

    def _engine_command(self, action: str) -> tuple[str | None, str]:
        """The command to send to the game, or None and the feedback for text that must not reach it."""
        if len(action.strip().splitlines()) > 1:  # before normalizing, which joins lines
            return None, CHAINED_FEEDBACK
        key = normalize_command(action)
        if key in self._admissible:
            return self._admissible[key], ""
        if not key:
            return None, self.INVALID_FEEDBACK
        if len(key) > MAX_COMMAND_LENGTH:
            return None, TOO_LONG_FEEDBACK
        words = key.split()
        if not _SAFE_COMMAND.fullmatch(key) or "then" in words:
            return None, CHAINED_FEEDBACK
        if words[0] in META_VERBS or words[0].startswith("tw-"):
            return None, META_FEEDBACK
        return key, ""

    def _read_state(self, state: Any) -> None:
        self._max_score = state["max_score"] or 1
        self._points = state["score"] or 0
        self._won = bool(state["won"])
        self._lost = bool(state["lost"])
        commands = [] if self._won or self._lost else state["admissible_commands"] or []
        self._admissible = {normalize_command(c): c for c in commands}
        self._facts = frozenset(state.get("_facts") or ())

    def _score(self) -> float:
        return min(1.0, max(0.0, self._points / self._max_score))

    def _extra(self, **more: Any) -> dict[str, Any]:
        extra = {"won": self._won, "lost": self._lost, "points": self._points, "max_score": self._max_score, **more}
        if self.expert_plan:
            extra["expert_plan"] = list(self._plan)
        return extra

    def _update_plan(self, key: str, state: Any, changed: bool) -> None:
        """Follow the walkthrough while the agent does; replan once it changes the game otherwise."""
        if self._won or self._lost:
            self._plan = []
        elif self._plan and key == normalize_command(self._plan[0]):
            self._plan = self._plan[1:]
        elif changed:
            self._plan = list(state["policy_commands"] or [])

    def _close_engine(self) -> None:
        if self._tw is not None:
            self._tw.close()
            self._tw = None
        self._game = None
