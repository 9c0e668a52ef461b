"""What an evaluation run is: its typed configuration, its name, and its checked arguments.

:class:`RunConfig` is what a run stores (``config.json`` and its SQLite row) and what the
store compares when a run is opened again: the fields marked ``identity`` are the run's
identity (:meth:`RunConfig.identity_keys`), so resuming a run with another env, split,
agent, seed, env kwargs, task list or agent protocol is refused instead of mixing two setups.

The checks here run before anything is built or written, so bad input fails fast, in one
line, and never registers a run.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any


class _EnginePackages(Mapping[str, tuple[str, ...]]):
    """Short env name -> the engine packages whose versions a run records, read from each env's
    descriptor (``envrl.envs.REGISTRY``) when first asked: this module stays importable, and
    its fast argument checks stay fast, without importing the envs."""

    def _table(self) -> dict[str, tuple[str, ...]]:
        from envrl.envs import REGISTRY

        return {name: d.engine_packages for name, d in REGISTRY.items()}

    def __getitem__(self, name: str) -> tuple[str, ...]:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


#: engine packages whose versions a run records, by short env name (from the env descriptors)
ENGINE_PACKAGES: Mapping[str, tuple[str, ...]] = _EnginePackages()

#: packages whose versions can change an LLM agent's answers, by agent kind (the spec's prefix)
AGENT_PACKAGES: dict[str, tuple[str, ...]] = {
    "hf": ("torch", "transformers", "tokenizers"),
    "openai": ("openai",),
}

#: the rule every run follows, stored with it so that a reader need not know this code
EPISODE_RULE = "episode i plays task_ids[i % task_count] with seed + i"

#: seeds go to numpy's generators, which take 0 <= seed < 2**32
SEED_LIMIT = 2**32

#: a field of :class:`RunConfig` that identifies the run
_IDENTITY = {"identity": True}


class EvaluationError(ValueError):
    """Bad input to an evaluation (unknown env, split or agent, episodes < 1, ...)."""


class RunFailed(RuntimeError):
    """The run could not go on (e.g. worker processes cannot start)."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A run's configuration, as stored. :meth:`to_dict` is what the store writes; fields
    with ``metadata={"identity": True}`` must match when a run is opened again."""

    env: str  # short name ("alfworld"), or the gymnasium id
    env_id: str = field(metadata=_IDENTITY)
    split: str = field(metadata=_IDENTITY)
    agent: str = field(metadata=_IDENTITY)  # the agent's label
    episodes: int
    seed: int = field(metadata=_IDENTITY)
    env_kwargs: dict[str, Any] = field(metadata=_IDENTITY)  # the agent's env_kwargs under the caller's
    step_limit: int | None
    agent_options: dict[str, Any]
    agent_protocol: dict[str, Any] = field(
        metadata=_IDENTITY
    )  # what makes an agent's answers (template, sampling, model)
    workers: int
    batch_size: int
    backend: str  # "processes" or "ray"
    task_count: int
    task_ids_sha256: str = field(metadata=_IDENTITY)
    episode_rule: str = EPISODE_RULE
    versions: dict[str, str]
    #: versions of the packages behind an LLM agent; recorded, not part of the env-side protocol
    #: the leaderboard compares, and left out of :meth:`to_dict` when None (not an LLM agent)
    agent_versions: dict[str, str] | None = field(default=None, metadata={"omit_none": True})

    @classmethod
    def identity_keys(cls) -> tuple[str, ...]:
        """The fields that identify a run, in field order."""
        return tuple(f.name for f in fields(cls) if f.metadata.get("identity"))

    def to_dict(self) -> dict[str, Any]:
        """The stored form: every field, in field order, but ``omit_none`` fields that are None."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if not (f.metadata.get("omit_none") and getattr(self, f.name) is None)
        }


def task_list_hash(task_ids: Sequence[str]) -> str:
    """SHA-256 of the task list, one id a line: two runs that agree on it play the same tasks."""
    return hashlib.sha256("\n".join(task_ids).encode("utf-8")).hexdigest()


def envrl_version() -> str:
    """envrl's installed version (its ``__version__`` when it runs from a checkout)."""
    from importlib import metadata

    try:
        return metadata.version("envrl")
    except metadata.PackageNotFoundError:
        try:
            import envrl

            return str(getattr(envrl, "__version__", "unknown"))
        except ImportError:  # pragma: no cover
            return "unknown"


# ---- names -----------------------------------------------------------------------------------


def _env_ids() -> tuple[dict[str, str], str | None]:
    try:
        from envrl.envs import ENV_IDS
    except ImportError as exc:
        return {}, f"{type(exc).__name__}: {exc}"
    return dict(ENV_IDS), None


def resolve_env(env: str) -> tuple[str, str]:
    """``(short name, gymnasium id)`` for a short name ("alfworld"), a registered id, or a
    ``"module:id"`` id (gymnasium imports the module first; used by tests and plugins)."""
    import gymnasium as gym

    ids, problem = _env_ids()
    if env in ids:
        return env, ids[env]
    lowered = {name.lower(): name for name in ids}
    if env.lower() in lowered:
        name = lowered[env.lower()]
        return name, ids[name]
    for name, env_id in ids.items():
        if env == env_id:
            return name, env_id
    if ":" in env or env in gym.registry:
        return env, env
    known = ", ".join(sorted(ids)) if ids else f"none (envrl.envs could not be imported: {problem})"
    raise EvaluationError(f"unknown env {env!r}; known envs: {known}")


def default_run_id(env: str, split: str, agent: str, seed: int) -> str:
    """``<env>-<split>-<agent>-s<seed>`` with characters other than ``[A-Za-z0-9._-]`` as
    ``_`` (e.g. ``alfworld-valid_unseen-expert-s0``). The same command gives the same id,
    which is what makes re-running it resume. ``agent`` should name the agent fully
    (:func:`agent_run_name`): two agents must never share a default id."""
    raw = f"{env}-{split}-{agent}-s{seed}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("._") or "run"


def agent_run_name(agent_spec: str | Callable[[], Any], agent_label: str) -> str:
    """The agent's part of a default run id: its label (which may add settings, e.g. an LLM
    agent's template) and the whole spec, whichever holds the other, else both. The spec is
    always in it, because an agent's label need not say everything its spec does (the
    hand-coded and the planner expert were once both labelled ``expert``)."""
    if not isinstance(agent_spec, str) or agent_spec in agent_label:
        return agent_label
    if agent_label in agent_spec:
        return agent_spec
    return f"{agent_spec}-{agent_label}"


# ---- checks ----------------------------------------------------------------------------------


def check_counts(episodes: Any, workers: Any, episode_timeout: float | None, batch_size: Any, seed: Any) -> None:
    """The numeric arguments of a run (EvaluationError when one is wrong)."""
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise EvaluationError(f"episodes must be an integer >= 1, got {episodes!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise EvaluationError(f"workers must be an integer >= 1, got {workers!r}")
    if episode_timeout is not None and episode_timeout <= 0:
        raise EvaluationError(f"episode_timeout must be > 0, got {episode_timeout!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise EvaluationError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    check_seeds(seed, episodes)


def check_seeds(seed: Any, episodes: int) -> None:
    """Every seed of the run (``seed .. seed + episodes - 1``) must be one numpy accepts:
    a bad one would make every episode an error that no resume can fix."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise EvaluationError(f"seed must be an integer, got {seed!r}")
    if not 0 <= seed < SEED_LIMIT:
        raise EvaluationError(f"seed must be in 0..{SEED_LIMIT - 1} (numpy's range), got {seed}")
    if seed + episodes > SEED_LIMIT:
        raise EvaluationError(
            f"episode i uses seed {seed} + i, so {episodes} episodes need seed <= "
            f"{SEED_LIMIT - episodes} (seeds stop at {SEED_LIMIT - 1}), got {seed}"
        )


def check_run_id(run_id: str) -> None:
    """A run id names a directory under the runs directory: no separators, not ``.``/``..``."""
    if not run_id or run_id in (".", "..") or "/" in run_id or "\\" in run_id or "\0" in run_id:
        raise EvaluationError(f"invalid run id {run_id!r}: it names a directory, so no slashes")
