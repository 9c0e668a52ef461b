"""A training run's configuration: dataclasses, loaded from YAML and overridden with ``key=value``.

One :class:`TrainConfig` holds everything a run needs, in sections a reader finds by name
(``policy``, ``rollout``, ``optim``, ``eval``) plus ``algorithm``, the chosen algorithm's own
dataclass (:mod:`envrl.training.algorithms`). The precedence is: the dataclass defaults, then
the shipped YAML of the pair (below), then each ``--config FILE.yaml``, then each
``--set section.key=value``. A key that does not exist is an error that lists the keys of its
section, so a typo never trains with a default.

Shipped YAML, in layers
    What a pair ``(algo, env)`` ships is the env's base, ``configs/_base/<env>.yaml`` (the
    rollout, evaluation and model keys every algorithm uses on that env), deep-merged with the
    algorithm's file for the env, ``configs/<algo>/<env>.yaml`` (its delta). Either may be
    absent: an algorithm without a file for the env (a new one needs none) runs on the env's
    base and its Config's defaults; an env without a base (the diagnostic envs) on the
    algorithm's file alone, or on the defaults. Any file, shipped or ``--config``, may name
    ``extends: FILE`` or ``extends: [FILE, ...]`` (paths relative to its own folder): the files
    it extends are resolved first, in order, and the file itself is merged last, so an
    algorithm's settings shared by all envs live once (``configs/<algo>/_default.yaml``).
    The merge (:func:`deep_merge`): a mapping merges key by key, recursively; any other value,
    lists included, replaces the earlier one. A file that extends a missing file, or a chain of
    ``extends`` that comes back to a file, is a ConfigError naming the files.

The resolved configuration is written to the output folder; a run resumed there must have the
same one (:func:`differences` names what changed).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from envrl.envs import ENV_IDS, SPLIT_KINDS


class ConfigError(ValueError):
    """A configuration that cannot be used; the message says what to change."""


@dataclass
class PolicyConfig:
    """The model and how it acts (the same settings an ``hf:`` agent evaluates it with)."""

    model: str = ""  # a checkpoint folder (or a hub name where a hub is reachable)
    template: str = "action"  # prompt template: action, think-action, react, or a JSON file
    history: int = 2  # past turns the prompt shows
    action_mode: str = "generate"  # generate a response, or choose among the admissible actions
    choose_score: str = "sum"  # choose mode: candidates scored by summed or mean token log-probs
    temperature: float = 1.0  # sampling temperature of rollouts
    top_p: float = 1.0
    max_new_tokens: int = 64
    lora_rank: int = 0  # 0 trains every weight; > 0 trains LoRA adapters (peft) of this rank
    lora_alpha: int = 16
    dtype: str = "auto"  # auto: the checkpoint's on GPU, float32 on CPU
    device: str = "auto"


@dataclass
class RolloutConfig:
    """Which tasks are played and how many at once (GRPO/GiGPO)."""

    split: str = "train"
    tasks: int = 0  # train on the split's first N tasks (0: all of them)
    groups: int = 2  # tasks per update; each played by group_size envs
    group_size: int = 8  # G: rollouts of one task with one seed
    max_steps: int = 0  # episode step limit (0: the env's default)
    backend: str = "subprocess"  # make_vec back end: subprocess, ray or inline (cheap envs; step_timeout null)
    ray_address: str | None = None
    step_timeout: float | None = 300.0  # seconds an env may take to answer before its worker is replaced
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # for gym.make (e.g. families: [custom])


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch_size: int = 8  # samples per forward/backward (gradients accumulate over a minibatch)
    minibatches: int = 1  # optimizer steps per pass over an update's batch
    epochs: int = 1  # passes over an update's batch
    warmup_updates: int = 0
    schedule: str = "constant"  # constant, linear or cosine (after warmup), over the run's updates


@dataclass
class EvalConfig:
    """Periodic evaluation through the evaluation runner, into the leaderboard store."""

    every: int = 0  # updates between evaluations (0: only before the first and after the last)
    at_start: bool = True  # evaluate the starting weights too
    episodes: int = 20  # per split
    splits: list[str] = field(default_factory=list)  # default: the env's first ID eval split and first OOD split
    # the evaluation protocol is set apart from the training distribution: gym.make kwargs and step limit
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    max_steps: int = 0  # 0: the env's default
    temperature: float | None = None  # default: the policy's sampling temperature
    runs_dir: str | None = None  # default: $ENVRL_RUNS_DIR or ./runs, like envrl eval
    workers: int = 1
    batch_size: int = 8


@dataclass
class TrainConfig:
    algo: str = ""
    env: str = ""
    out: str = ""
    updates: int = 10
    seed: int = 0
    save_every: int = 0  # updates between checkpoints (0: only at the end)
    name: str = ""  # the run's name on the leaderboard (default: the output folder's name)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    algorithm: Any = None  # the algorithm's config dataclass

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def run_name(self) -> str:
        return self.name or Path(self.out).name or "train"

    def eval_splits(self) -> list[str]:
        """The splits evaluated: ``eval.splits``, else the env's first non-train ID split and its first OOD split."""
        if self.eval.splits:
            return list(self.eval.splits)
        kinds = SPLIT_KINDS.get(self.env, {})
        in_dist = [s for s, kind in kinds.items() if kind == "ID" and s != "train"]
        out_dist = [s for s, kind in kinds.items() if kind == "OOD"]
        return in_dist[:1] + out_dist[:1]


SECTIONS = {"policy": PolicyConfig, "rollout": RolloutConfig, "optim": OptimConfig, "eval": EvalConfig}


def _configs_dir() -> Path:
    """The folder of the shipped YAML files."""
    return Path(str(resources.files("envrl.training").joinpath("configs")))


def shipped_files(algo: str, env: str) -> list[Path]:
    """The shipped YAML files of ``algo`` on ``env``, in merge order (the env's base, then the
    algorithm's file for the env; see the module docstring), those that exist."""
    root = _configs_dir()
    return [path for path in (root / "_base" / f"{env}.yaml", root / algo / f"{env}.yaml") if path.is_file()]


def shipped_config(algo: str, env: str) -> dict[str, Any]:
    """The shipped settings of ``algo`` on ``env``: its files resolved and deep-merged ({} when none ship)."""
    merged: dict[str, Any] = {}
    for path in shipped_files(algo, env):
        merged = deep_merge(merged, resolve_yaml(path))
    return merged


def deep_merge(base: Mapping[str, Any], delta: Mapping[str, Any]) -> dict[str, Any]:
    """``delta`` over ``base``: mappings merge key by key, recursively; any other value of
    ``delta`` (a list too) replaces ``base``'s. Neither argument is changed."""
    out = dict(base)
    for key, value in delta.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def resolve_yaml(path: str | Path, _chain: Sequence[Path] = ()) -> dict[str, Any]:
    """A YAML file with its ``extends`` resolved: the files it extends (relative to its folder),
    merged in order, then the file itself; ConfigError for a missing file or a cycle."""
    path = Path(path)
    here = path.resolve()
    if here in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain[_chain.index(here) :], here))
        raise ConfigError(f"config files extend each other in a cycle: {cycle}")
    data = _read_yaml(path)
    parents = data.pop("extends", None)
    if parents is None:
        return data
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) and p for p in parents):
        raise ConfigError(f"config file {path}: extends takes a file name or a list of them, got {parents!r}")
    merged: dict[str, Any] = {}
    for parent in parents:
        parent_path = path.parent / parent
        if not parent_path.is_file():
            raise ConfigError(f"config file {path} extends {parent}, and {parent_path} does not exist")
        merged = deep_merge(merged, resolve_yaml(parent_path, (*_chain, here)))
    return deep_merge(merged, data)


def build_config(
    algo: str,
    env: str,
    *,
    algorithm_config: type,
    files: Sequence[str | Path] = (),
    overrides: Mapping[str, Any] | None = None,
    sets: Sequence[str] = (),
) -> TrainConfig:
    """The resolved configuration (see the module docstring for the order of precedence).

    ``overrides`` are flat ``section.key -> value`` (the command line's own flags), applied
    before ``sets`` (``"section.key=value"`` strings, values parsed as YAML scalars).
    """
    if env not in ENV_IDS:
        raise ConfigError(f"unknown env {env!r}; choose one of {', '.join(sorted(ENV_IDS))}")
    config = TrainConfig(algo=algo, env=env, algorithm=algorithm_config())
    shipped = shipped_files(algo, env)
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if shipped:
        layers.append((" + ".join(str(p) for p in shipped), shipped_config(algo, env)))
    for path in (Path(f) for f in files):
        layers.append((str(path), resolve_yaml(path)))
    for source, data in layers:
        _apply(config, data, source)
    for key, value in (overrides or {}).items():
        if value is not None:
            _set(config, key, value, "the command line")
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set takes key=value (e.g. optim.lr=1e-5), got {item!r}")
        _set(config, key.strip(), _parse_scalar(text), f"--set {item}")
    if config.algo != algo or config.env != env:
        raise ConfigError("algo and env are chosen on the command line (--algo, --env), not in config files")
    return config


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values")
    return data


def _apply(config: TrainConfig, data: Mapping[str, Any], source: str) -> None:
    for key, value in data.items():
        if isinstance(value, dict) and key in (*SECTIONS, "algorithm"):
            for sub, sub_value in value.items():
                _set(config, f"{key}.{sub}", sub_value, source)
        else:
            _set(config, str(key), value, source)


def _set(config: TrainConfig, key: str, value: Any, source: str) -> None:
    """Set ``section.key`` (or a top-level key), checking the name and converting the type."""
    section_name, _, name = key.rpartition(".")
    if section_name:
        target = config.algorithm if section_name == "algorithm" else getattr(config, section_name, None)
        if target is None or not dataclasses.is_dataclass(target) or section_name not in (*SECTIONS, "algorithm"):
            raise ConfigError(
                f"unknown config section {section_name!r} in {source}; sections: {', '.join([*SECTIONS, 'algorithm'])}"
            )
    else:
        target, name = config, key
        if name in (*SECTIONS, "algorithm"):
            raise ConfigError(f"{name!r} is a section; set its keys as {name}.KEY (in {source})")
    fields = {f.name: f for f in dataclasses.fields(target)}
    if name not in fields:
        where = f"section {section_name!r}" if section_name else "the top level"
        known = ", ".join(k for k in fields if k not in (*SECTIONS, "algorithm"))
        raise ConfigError(f"unknown config key {key!r} in {source}; keys of {where}: {known}")
    setattr(target, name, _convert(value, getattr(target, name), key, source))


def _convert(value: Any, current: Any, key: str, source: str) -> Any:
    """``value`` as the type of the field's default (ints stay ints, lists stay lists)."""
    if value is None or current is None:
        return value
    expected = type(current)
    if expected is bool:
        if isinstance(value, bool):
            return value
    elif expected is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    elif expected is float and isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    elif expected is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif expected is str and isinstance(value, str):
        return value
    elif expected is list and isinstance(value, list):
        return value
    elif expected is dict and isinstance(value, dict):
        return value
    raise ConfigError(f"config key {key!r} in {source} takes a {expected.__name__}, got {value!r}")


def _parse_scalar(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def differences(saved: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two resolved configurations."""
    keys = sorted(set(saved) | set(current))
    out: list[str] = []
    for key in keys:
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            out.append(prefix + key)
    return out
