"""envrl's environments, registered with Gymnasium.

``register_envs`` is the ``gymnasium.envs`` entry point, so ``gym.make("envrl/ALFWorld-v0")``
works without importing envrl first. ``ENV_IDS`` maps the short names used on the command
line to the ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from envrl.envs import alfworld, diagnostics, scienceworld, textworld, webshop
from envrl.envs.checks import EnvContractError as EnvContractError
from envrl.envs.checks import check_text_env as check_text_env
from envrl.envs.descriptor import ContractTask as ContractTask
from envrl.envs.descriptor import DescriptorError as DescriptorError
from envrl.envs.descriptor import EnvDescriptor, collect

#: short name -> descriptor: the one table of envs; each env package declares its own
#: ``DESCRIPTORS`` (importing them imports no engine), and every table below derives from it
REGISTRY: dict[str, EnvDescriptor] = collect(
    d for package in (alfworld, webshop, textworld, scienceworld, diagnostics) for d in package.DESCRIPTORS
)

#: short name -> (Gymnasium id, entry point, default step limit)
ENVIRONMENTS = {name: (d.env_id, d.entry_point, d.max_episode_steps) for name, d in REGISTRY.items()}
ENV_IDS = {name: d.env_id for name, d in REGISTRY.items()}

#: families whose engines must not run on two threads of one process at once (a server or
#: adapter that hosts many episodes in one process runs these on one shared thread)
SINGLE_THREAD_ENVS = frozenset(name for name, d in REGISTRY.items() if d.single_thread)

#: each env's splits in leaderboard order, with their kind: in-distribution (ID) or
#: out-of-distribution (OOD); see docs/design.md
SPLIT_KINDS: dict[str, dict[str, str]] = {name: dict(d.split_kinds) for name, d in REGISTRY.items()}


def describe(name: str) -> EnvDescriptor:
    """The descriptor of a short name or a registered id; a ValueError naming the choices otherwise."""
    return REGISTRY[env_name(name)]


#: applied by ``gym.make`` outside ``TimeLimit``: lets the env know its episode was truncated
TRUNCATION_SIGNAL = gym.envs.registration.WrapperSpec(
    name="TruncationSignal", entry_point="envrl.envs.base:TruncationSignal", kwargs={}
)


def register_envs() -> None:
    """Register every envrl id (idempotent)."""
    for env_id, entry_point, max_steps in ENVIRONMENTS.values():
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point=entry_point,
                max_episode_steps=max_steps,
                disable_env_checker=True,
                additional_wrappers=(TRUNCATION_SIGNAL,),
            )


def env_id(name: str) -> str:
    """The Gymnasium id for a short name (``alfworld``) or an id given as is."""
    if name in ENV_IDS:
        return ENV_IDS[name]
    if name in ENV_IDS.values():
        return name
    raise ValueError(f"unknown environment {name!r}; choose one of {sorted(ENV_IDS)}")


def env_name(name: str) -> str:
    """The short name (``alfworld``) for a short name or a Gymnasium id; ValueError otherwise."""
    gym_id = env_id(name)
    return next(short for short, full in ENV_IDS.items() if full == gym_id)


def add_env_arg_option(parser: Any) -> None:
    """The repeatable ``--env-arg KEY=VALUE`` flag of commands that make envs (read with :func:`parse_env_args`)."""
    parser.add_argument(
        "--env-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a gym.make argument, VALUE read as JSON where it is (e.g. families='[\"custom\"]'); repeatable",
    )


def parse_env_args(items: Sequence[str]) -> dict[str, Any]:
    """``["families=[\"custom\"]", "java_heap=256m"]`` -> gym.make kwargs: the command lines'
    ``--env-arg KEY=VALUE``. A value is read as JSON where it is JSON (numbers, lists, true),
    else kept as text; a ValueError names an item without ``=``."""
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--env-arg takes KEY=VALUE (e.g. families='[\"custom\"]'), got {item!r}")
        try:
            kwargs[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            kwargs[key.strip()] = text
    return kwargs


register_envs()
