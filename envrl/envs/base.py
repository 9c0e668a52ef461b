"""The environment contract every envrl environment follows (see docs/design.md).

An envrl environment is a ``gymnasium.Env`` whose observations and actions are plain
strings. Subclasses implement three small hooks (``_split_task_ids``, ``_start_task`` and
``_apply``); this base class owns everything that must behave the same across engines:

* the text spaces,
* choosing a task from ``seed`` or ``options["task_id"]``,
* screening actions (wrong type, too long) so that no input can crash an engine,
* the ``info`` keys, filled the same way for every env,
* what happens after an episode ends, and after ``close()``.

Step limits: every id is registered with its default limit, so ``gym.make`` wraps the env in
Gymnasium's own ``TimeLimit`` (``truncated=True``), and ``gym.make(..., max_episode_steps=N)``
changes it. One mechanism, the standard one. Gymnasium hides the limit from the env itself, so
each id is also registered with :class:`TruncationSignal`, an outer wrapper that tells the env
when ``TimeLimit`` has truncated its episode.

Episode ends are final. Once a step has returned ``terminated=True`` (won, bought, failed) or
``truncated=True`` (the step limit), the episode's outcome is fixed: every further ``step()`` is
answered with :data:`EPISODE_OVER_FEEDBACK`, reward 0.0, the same ``terminated``/``truncated``
flags, ``valid_action=False``, no admissible actions, and the final ``success`` and ``score``;
the engine never sees the action. So training loops and vector envs that step past the end (or
sum rewards over a padded batch) can never change or double-count an outcome.

``close()`` is final too: ``reset()`` or ``step()`` after it raise
``gymnasium.error.ClosedEnvironmentError``; ``close()`` twice is harmless. Subclasses free
their engines in :meth:`TextEnv._close_engine`.
"""

from __future__ import annotations

import string
from abc import abstractmethod
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

# Documented bounds of the text spaces. An action longer than MAX_ACTION_LENGTH is not
# passed to the engine: it returns feedback instead (a 1 MB string must not stall a step).
MAX_ACTION_LENGTH = 1024
MAX_OBSERVATION_LENGTH = 1 << 20

#: the observation of every step taken after the episode ended (see the module docstring)
EPISODE_OVER_FEEDBACK = "The episode is over; call reset() to start a new one."

INFO_KEYS = (
    "task_id",
    "task_type",
    "split",
    "instruction",
    "admissible_actions",
    "valid_action",
    "success",
    "score",
    "step",
)


class FreeText(gym.spaces.Text):
    """A text space that contains any ``str`` up to ``max_length`` characters.

    ``gymnasium.spaces.Text`` only contains strings over its charset; agents' actions and
    engines' observations use arbitrary Unicode, so membership here only bounds the length.
    ``sample()`` still draws printable ASCII, which is what ``check_env`` needs.
    """

    def __init__(self, max_length: int, seed: int | None = None):
        super().__init__(max_length=max_length, min_length=0, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"FreeText(max_length={self.max_length})"


@dataclass
class StepResult:
    """What an engine reports for one applied action (before the base adds the common keys)."""

    observation: str
    reward: float
    terminated: bool
    valid_action: bool
    success: bool
    score: float
    admissible_actions: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TaskStart:
    """What an engine reports when a task starts."""

    observation: str
    task_type: str
    instruction: str
    admissible_actions: list[str]
    extra: dict[str, Any] = field(default_factory=dict)


class TextEnv(gym.Env[str, str]):
    """Base class of the envrl environments; see the module docstring for the contract."""

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 1}

    #: feedback for an action the engine cannot use
    INVALID_FEEDBACK = "Nothing happens."

    def __init__(self, split: str, render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.render_mode = render_mode
        self.split = split
        self.observation_space = FreeText(MAX_OBSERVATION_LENGTH)
        self.action_space = FreeText(MAX_ACTION_LENGTH)
        self._task_id: str | None = None
        self._task_type = ""
        self._instruction = ""
        self._steps = 0
        self._terminated = False
        self._truncated = False
        self._closed = False
        self._last_observation = ""
        self._last_info: dict[str, Any] = {}

    # ---- hooks for subclasses -------------------------------------------------------

    @abstractmethod
    def _split_task_ids(self) -> Sequence[str]:
        """The split's fixed, ordered task ids."""

    @abstractmethod
    def _start_task(self, task_id: str) -> TaskStart:
        """Load ``task_id`` into the engine and return its first observation."""

    @abstractmethod
    def _apply(self, action: str) -> StepResult:
        """Apply a screened action (a ``str`` within the length limit) to a running episode."""

    def _close_engine(self) -> None:
        """Free the engine (processes, servers, browsers); called once, by :meth:`close`."""

    # ---- public API ------------------------------------------------------------------

    @property
    def task_ids(self) -> Sequence[str]:
        """The split's task ids, in their fixed order."""
        return self._split_task_ids()

    @property
    def task_id(self) -> str | None:
        return self._task_id

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._check_open()
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"options must be a dict such as {{'task_id': ...}}, got {type(options).__name__}")
        super().reset(seed=seed)
        task_id = self._choose_task(options or {})
        start = self._start_task(task_id)
        self._task_id = task_id
        self._task_type = start.task_type
        self._instruction = start.instruction
        self._steps = 0
        self._terminated = False
        self._truncated = False
        info = self._info(
            admissible_actions=start.admissible_actions,
            valid_action=True,
            success=False,
            score=0.0,
            extra=start.extra,
        )
        self._remember(start.observation, info)
        return start.observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._check_open()
        if self._task_id is None:
            raise gym.error.ResetNeeded("Call reset() before step().")
        self._steps += 1
        if self.ended is not None:
            return self._unchanged(EPISODE_OVER_FEEDBACK, admissible_actions=[])
        problem = self._screen(action)
        if problem is not None:
            return self._unchanged(problem)
        result = self._apply(action)
        self._terminated = bool(result.terminated)
        info = self._info(
            admissible_actions=result.admissible_actions,
            valid_action=result.valid_action,
            success=result.success,
            score=result.score,
            extra=result.extra,
        )
        self._remember(result.observation, info)
        return result.observation, float(result.reward), self._terminated, False, info

    @property
    def ended(self) -> tuple[bool, bool] | None:
        """``(terminated, truncated)`` once the running episode has ended, else None."""
        return (self._terminated, self._truncated) if self._terminated or self._truncated else None

    def mark_truncated(self) -> None:
        """End the running episode at the step limit (called by :class:`TruncationSignal`)."""
        if self._task_id is not None and not self._terminated:
            self._truncated = True

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close_engine()
        super().close()

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._last_observation
        if self.render_mode == "human":
            print(self._last_observation)
        return None

    # ---- helpers ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise gym.error.ClosedEnvironmentError(f"{type(self).__name__} was closed; make a new env to play again")

    def _unchanged(self, feedback: str, **changes: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """A step the engine never sees: an action screened out, or any step after the end.

        The engine's state (and every key the env adds to ``info``, such as the outcome or an
        expert's plan) is what the previous step left; only the step count, the validity and
        the feedback change.
        """
        info = {**self._last_info, **changes, "step": self._steps, "valid_action": False, "feedback": feedback}
        self._remember(feedback, info)
        return feedback, 0.0, self._terminated, self._truncated, info

    def _choose_task(self, options: dict[str, Any]) -> str:
        task_ids = self._split_task_ids()
        if not task_ids:
            raise RuntimeError(f"split {self.split!r} of {type(self).__name__} has no tasks")
        if options.get("task_id") is not None:
            task_id = str(options["task_id"])
            if task_id not in self._task_index():
                sample = ", ".join(list(task_ids)[:3])
                raise ValueError(
                    f"unknown task id {task_id!r} for split {self.split!r} "
                    f"({len(task_ids)} tasks; ids look like: {sample})"
                )
            return task_id
        index = int(self.np_random.integers(len(task_ids)))
        return task_ids[index]

    def _task_index(self) -> Container[str]:
        """The task ids, for membership tests only; subclasses may return a cached set or their
        own index keyed by id."""
        return set(self._split_task_ids())

    def _screen(self, action: Any) -> str | None:
        """Feedback for an action that must not reach the engine, or None if it may."""
        if not isinstance(action, str):
            return f"Invalid action: expected text, got {type(action).__name__}."
        if len(action) > MAX_ACTION_LENGTH:
            return f"Invalid action: {len(action)} characters (the limit is {MAX_ACTION_LENGTH})."
        return None

    def _info(
        self, *, admissible_actions: list[str], valid_action: bool, success: bool, score: float, extra: dict[str, Any]
    ) -> dict[str, Any]:
        info: dict[str, Any] = {
            "task_id": self._task_id,
            "task_type": self._task_type,
            "split": self.split,
            "instruction": self._instruction,
            "admissible_actions": list(admissible_actions),
            "valid_action": bool(valid_action),
            "success": bool(success),
            "score": float(score),
            "step": self._steps,
        }
        info.update(extra)
        return info

    def _remember(self, observation: str, info: dict[str, Any]) -> None:
        self._last_observation = observation
        self._last_info = info


class TruncationSignal(gym.Wrapper[str, str, str, str], gym.utils.RecordConstructorArgs):
    """Tells a :class:`TextEnv` that the ``TimeLimit`` below it has truncated the episode.

    ``gym.make`` applies ``TimeLimit`` but gives the env itself no way to know the limit
    (``env.unwrapped.spec.max_episode_steps`` is None by design), so without this wrapper a
    step past the limit would still reach the engine and could change the outcome. And
    ``TimeLimit`` counts every call, also after the episode ended, so past the end this wrapper
    reports the flags the episode ended with. Every envrl id is registered with it (see
    ``envrl.envs.register_envs``).
    """

    def __init__(self, env: gym.Env[str, str]):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        text_env: TextEnv = self.env.unwrapped  # type: ignore[assignment]
        ended = text_env.ended
        observation, reward, terminated, truncated, info = self.env.step(action)
        if ended is not None:
            terminated, truncated = ended
        elif truncated:
            text_env.mark_truncated()
        # float(): Gymnasium types rewards as SupportsFloat; a TextEnv's are floats already
        return observation, float(reward), terminated, truncated, info
