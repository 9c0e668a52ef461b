"""``check_text_env``: the envrl text-env contract, run on one env instance.

Gymnasium's ``check_env`` checks spaces and the step/reset signature; it cannot know what a
text env for LLM agents must also keep (``envs/base.py``, DESIGN.md): every ``info`` carries the
same keys and can be stored as JSON, any string (empty, huge, not a string at all) is an action
that gets feedback instead of an exception, an ended episode stays ended, ``reset(options=...)``
checks its argument, and ``close()`` is final. A new env is checked with one call::

    env = gym.make("envrl/Diag-Chain-v0", split="valid", expert_plan=True)
    envrl.envs.check_text_env(env)   # raises EnvContractError with one sentence, or returns None

The episode is played with the env's own ``info["expert_plan"]`` when it gives one (so the end
is reached by winning), else by the first admissible action of each step (an end by the step
limit or by the task's own failure is checked the same way).
"""

from __future__ import annotations

import json
from typing import Any

import gymnasium as gym

from envrl.envs.base import EPISODE_OVER_FEEDBACK, INFO_KEYS

#: actions every env must answer with feedback, not an exception
BAD_ACTIONS: tuple[Any, ...] = ("", "   ", None, 42, "x" * 5000, "\x00\ufffd")
#: how many steps the check plays before it gives up waiting for the episode to end
MAX_CHECK_STEPS = 1000


class EnvContractError(AssertionError):
    """The env breaks the text-env contract; the message says which rule, in one sentence."""


def check_text_env(env: gym.Env, task_id: str | None = None, *, check_close: bool = True) -> None:
    """Run the envrl text-env contract on ``env`` (made with ``gym.make`` or directly).

    ``task_id`` picks the task played (default: the env's first task id, else ``reset(seed=0)``).
    With ``check_close`` (the default) the env is closed at the end, since checking that
    ``close()`` is final needs it; pass False to keep using the env.
    """
    _check_options(env)
    _, info = _reset(env, task_id)
    _check_info(info, "reset()")
    start_task = info["task_id"]
    for action in BAD_ACTIONS:
        step = _step(env, action)
        _check_info(step[4], f"step({_show(action)})")
        if step[2] or step[3]:
            break  # a step limit this small ended the episode; the end is checked below
        if step[4]["valid_action"] is not False:
            raise EnvContractError(f"step({_show(action)}) was taken as a valid action; it must be feedback")
    _, info = _reset(env, task_id)
    if info["task_id"] != start_task:
        raise EnvContractError(f"reset to task {start_task!r} gave task {info['task_id']!r}")
    final = _play_to_the_end(env, info)
    _check_the_end_is_final(env, final)
    if check_close:
        _check_close(env)


def _check_options(env: gym.Env) -> None:
    for options in ([1], "task", 3):
        try:
            env.reset(options=options)  # type: ignore[arg-type]
        except TypeError as error:
            if "options must be a dict" not in str(error):
                raise EnvContractError(
                    f"reset(options={options!r}) raised TypeError({error}) without saying options must be a dict"
                ) from error
        except Exception as error:
            raise EnvContractError(
                f"reset(options={options!r}) raised {type(error).__name__} instead of TypeError"
            ) from error
        else:
            raise EnvContractError(f"reset(options={options!r}) was accepted; options must be a dict")


def _reset(env: gym.Env, task_id: str | None) -> tuple[Any, dict[str, Any]]:
    if task_id is None:
        task_ids = getattr(env.unwrapped, "task_ids", None)
        task_id = task_ids[0] if task_ids else None
    options = {"task_id": task_id} if task_id is not None else None
    try:
        observation, info = env.reset(seed=0 if options is None else None, options=options)
    except Exception as error:
        raise EnvContractError(f"reset(options={options!r}) raised {type(error).__name__}: {error}") from error
    if not isinstance(observation, str):
        raise EnvContractError(f"reset() returned a {type(observation).__name__} observation; it must be a str")
    return observation, info


def _step(env: gym.Env, action: Any) -> tuple[Any, ...]:
    try:
        step = env.step(action)
    except Exception as error:
        raise EnvContractError(
            f"step({_show(action)}) raised {type(error).__name__}: {error}; it must answer with feedback"
        ) from error
    observation, reward, terminated, truncated, _ = step
    if not isinstance(observation, str):
        raise EnvContractError(
            f"step({_show(action)}) returned a {type(observation).__name__} observation; it must be a str"
        )
    if not isinstance(reward, (int, float)) or not isinstance(terminated, bool) or not isinstance(truncated, bool):
        raise EnvContractError(f"step({_show(action)}) must return a float reward and bool terminated/truncated")
    return step


def _check_info(info: Any, where: str) -> None:
    if not isinstance(info, dict):
        raise EnvContractError(f"{where} returned info of type {type(info).__name__}; it must be a dict")
    missing = [key for key in INFO_KEYS if key not in info]
    if missing:
        raise EnvContractError(f"{where}'s info lacks {', '.join(missing)} (every info carries {', '.join(INFO_KEYS)})")
    if not isinstance(info["admissible_actions"], list) or not all(
        isinstance(a, str) for a in info["admissible_actions"]
    ):
        raise EnvContractError(f"{where}'s info['admissible_actions'] must be a list of str")
    if not isinstance(info["success"], bool) or not 0.0 <= float(info["score"]) <= 1.0:
        raise EnvContractError(f"{where}'s info must have a bool success and a score in [0, 1]")
    try:
        json.dumps(info)
    except (TypeError, ValueError) as error:
        raise EnvContractError(f"{where}'s info cannot be stored as JSON ({error})") from error


def _play_to_the_end(env: gym.Env, info: dict[str, Any]) -> tuple[bool, bool, dict[str, Any]]:
    """Play the expert plan (or first admissible actions) until the episode ends."""
    plan = list(info.get("expert_plan") or [])
    for n in range(MAX_CHECK_STEPS):
        action = plan[n] if n < len(plan) else (info["admissible_actions"] or ["look"])[0]
        _, _, terminated, truncated, info = _step(env, action)
        _check_info(info, f"step({_show(action)})")
        if terminated or truncated:
            return terminated, truncated, info
    raise EnvContractError(f"the episode did not end within {MAX_CHECK_STEPS} steps; give the env a step limit")


def _check_the_end_is_final(env: gym.Env, end: tuple[bool, bool, dict[str, Any]]) -> None:
    terminated, truncated, final = end
    for action in ("look", "", None, "x" * 5000, *final["admissible_actions"][:3]):
        observation, reward, got_terminated, got_truncated, info = _step(env, action)
        if observation != EPISODE_OVER_FEEDBACK or reward != 0.0:
            raise EnvContractError(
                f"step({_show(action)}) after the episode ended returned {observation[:60]!r} and reward {reward}; "
                f"it must return {EPISODE_OVER_FEEDBACK!r} and 0"
            )
        if (got_terminated, got_truncated) != (terminated, truncated):
            raise EnvContractError(
                "a step after the episode ended changed terminated/truncated; they must stay as they were"
            )
        if (info["success"], info["score"], info["task_id"]) != (final["success"], final["score"], final["task_id"]):
            raise EnvContractError("a step after the episode ended changed success, score or task_id")
        if info["valid_action"] is not False or info["admissible_actions"] != []:
            raise EnvContractError(
                "a step after the episode ended must have valid_action False and no admissible actions"
            )


def _check_close(env: gym.Env) -> None:
    env.close()
    for call, name in ((lambda: env.step("look"), "step()"), (lambda: env.reset(seed=0), "reset()")):
        try:
            call()
        except gym.error.ClosedEnvironmentError:
            continue
        except Exception as error:
            raise EnvContractError(
                f"{name} after close() raised {type(error).__name__}, not ClosedEnvironmentError"
            ) from error
        raise EnvContractError(f"{name} after close() worked; close() must be final (ClosedEnvironmentError)")
    try:
        env.close()
    except Exception as error:
        raise EnvContractError(f"a second close() raised {type(error).__name__}; it must be harmless") from error


def _show(action: Any) -> str:
    text = repr(action)
    return text if len(text) <= 20 else text[:17] + "..."
