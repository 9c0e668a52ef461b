"""One record per registered env: everything the rest of envrl needs to know about it.

Before this, adding an env meant editing a dozen tables (ids, splits, step limits, engine
packages, example actions, adapters), some of which failed silently when an env was missing.
Each env package now declares its :class:`EnvDescriptor` (``DESCRIPTORS`` in its
``__init__.py``) and :mod:`envrl.envs` collects them; every consumer reads the registry. This
module imports nothing heavy, so a package can declare its descriptor without importing its engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

#: the kinds a split may have: in-distribution or out-of-distribution
SPLIT_KIND_VALUES = frozenset({"ID", "OOD"})

#: tasks of an env that the tokenizer corpus of ``envrl model init`` plays when its descriptor
#: sets no other number (also used for an env played by id that has no descriptor)
DEFAULT_CORPUS_TASKS = 4


class DescriptorError(ValueError):
    """An env descriptor that cannot be registered (a missing or malformed field)."""


@dataclass(frozen=True)
class ContractTask:
    """A small task the contract suite (``tests/test_env_contract.py``) plays on this env.

    ``kwargs`` go to ``gym.make`` (with ``split``); ``task_id`` is a task the env's expert wins
    in more than two moves (None: the split's first task); ``fixtures`` name pytest fixtures the
    task needs for their side effect (e.g. ``with_official_data``) and ``fixture_kwargs`` map a
    ``gym.make`` keyword to the fixture whose value it takes (e.g. ``cache_dir`` <- ``tw_cache``).
    """

    split: str
    task_id: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    fixtures: tuple[str, ...] = ()
    fixture_kwargs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EnvDescriptor:
    """What envrl knows about one registered env.

    * ``name``: the short name of the command line (``alfworld``); ``env_id`` the Gymnasium id;
      ``entry_point`` ``module:Class`` (imported only by ``gym.make``).
    * ``max_episode_steps``: the default step limit ``gym.make`` applies.
    * ``split_kinds``: every split in leaderboard order -> ``"ID"`` or ``"OOD"``.
    * ``single_thread``: the engine must not run on two threads of one process at once (servers
      and adapters that host many episodes run it on one shared thread).
    * ``engine_packages``: distributions whose versions an evaluation run records.
    * ``example_action``: shown in prompts' format instruction.
    * ``tool_intro``: the paragraph that opens a tool-calling prompt (TRL adapter): what the
      agent is and how it acts. (Chat templates keep their own per-env intros: they are part of
      a template's fingerprint, so a run's identity records them.)
    * ``downloader``: the module behind ``envrl data <name>``, which fetches the env's official data
      (None: nothing to fetch). It defines ``HELP`` (the command's line in ``envrl data --help``),
      ``add_arguments(parser)`` and ``run(args) -> int``, as the CLI's other command modules do;
      ``envrl --help`` imports it, so it must import nothing heavy.
    * ``corpus_tasks``: how many of the env's tasks the tokenizer corpus of ``envrl model init``
      plays (once by the expert, once by a random agent) when the env is in that corpus: few for
      an env whose tasks are slow to make (TextWorld generates each game on first use).
    * ``default_corpus_position``: where the env's episodes come in the default tokenizer corpus
      of the sizes other than ``tiny``, 0 first (None: not in it). A position, not a flag, because
      the order is part of what a build writes: the corpus's checksum and the episodes listed in
      ``envrl_model.json`` follow it (the BPE merges, counted over the whole corpus, did not
      change when textworld and alfworld were swapped).
    * ``contract_task``: the contract suite's task (:class:`ContractTask`).
    """

    name: str
    env_id: str
    entry_point: str
    max_episode_steps: int
    split_kinds: Mapping[str, str]
    example_action: str
    tool_intro: str
    contract_task: ContractTask
    single_thread: bool = False
    engine_packages: tuple[str, ...] = ()
    downloader: str | None = None
    corpus_tasks: int = DEFAULT_CORPUS_TASKS
    default_corpus_position: int | None = None

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise DescriptorError(f"env descriptor {self.name or self.env_id!r}: {problem}")
        # frozen, and its tables too: a consumer cannot change another's view of an env
        object.__setattr__(self, "split_kinds", MappingProxyType(dict(self.split_kinds)))

    def _problem(self) -> str:
        """The first thing wrong with this descriptor, in one sentence ('' when nothing is)."""
        if not self.name or not self.name.strip() or self.name != self.name.strip().lower():
            return f"name must be a non-empty lower-case short name, got {self.name!r}"
        if not self.env_id or "/" not in self.env_id:
            return f"env_id must be a namespaced Gymnasium id like 'envrl/Name-v0', got {self.env_id!r}"
        module, sep, attr = self.entry_point.partition(":")
        if not (module and sep and attr):
            return f"entry_point must be 'module:Class', got {self.entry_point!r}"
        if isinstance(self.max_episode_steps, bool) or not isinstance(self.max_episode_steps, int):
            return f"max_episode_steps must be an integer, got {self.max_episode_steps!r}"
        if self.max_episode_steps < 1:
            return f"max_episode_steps must be >= 1, got {self.max_episode_steps}"
        if not self.split_kinds:
            return "split_kinds is empty; declare every split with its kind (ID or OOD)"
        bad = {split: kind for split, kind in self.split_kinds.items() if kind not in SPLIT_KIND_VALUES}
        if bad:
            return f"split kinds must be 'ID' or 'OOD', got {bad}"
        if "ID" not in self.split_kinds.values():
            return "has no ID split; training and model selection need one"
        if not isinstance(self.example_action, str) or not self.example_action.strip():
            return "example_action is empty; prompts show it in their format instruction"
        if not isinstance(self.tool_intro, str) or not self.tool_intro.strip():
            return "tool_intro is empty; tool-calling prompts open with it"
        if not isinstance(self.contract_task, ContractTask):
            return f"contract_task must be a ContractTask, got {type(self.contract_task).__name__}"
        if self.contract_task.split not in self.split_kinds:
            return f"contract_task's split {self.contract_task.split!r} is not one of its splits"
        if isinstance(self.engine_packages, str) or not all(isinstance(p, str) for p in self.engine_packages):
            return f"engine_packages must be a tuple of distribution names, got {self.engine_packages!r}"
        if self.downloader is not None and not _is_module_name(self.downloader):
            return (
                f"downloader must be a module name like 'envrl.envs.alfworld.official' or None, got {self.downloader!r}"
            )
        if not _is_count(self.corpus_tasks, minimum=1):
            return f"corpus_tasks must be an integer >= 1 (tasks the tokenizer corpus plays), got {self.corpus_tasks!r}"
        position = self.default_corpus_position
        if position is not None and not _is_count(position, minimum=0):
            return f"default_corpus_position must be None or an integer >= 0, got {position!r}"
        return ""

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits in leaderboard order."""
        return tuple(self.split_kinds)

    @property
    def default_split(self) -> str:
        """The first ID split (``train`` for every env today): what a caller that names none plays."""
        return next(split for split, kind in self.split_kinds.items() if kind == "ID")


def _is_count(value: object, *, minimum: int) -> bool:
    """``value`` is an int (not a bool, which Python counts as one) of at least ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_module_name(value: object) -> bool:
    """``value`` is a dotted module name (``envrl.envs.alfworld.official``), not ``module:function``."""
    return isinstance(value, str) and all(part.isidentifier() for part in value.split("."))


def collect(descriptors: Any) -> dict[str, EnvDescriptor]:
    """``name -> descriptor`` for an iterable of descriptors, refusing a duplicate name or id
    (two packages claiming one id would silently shadow each other in ``gym.register``)."""
    registry: dict[str, EnvDescriptor] = {}
    ids: dict[str, str] = {}
    for descriptor in descriptors:
        if not isinstance(descriptor, EnvDescriptor):
            raise DescriptorError(f"an env package declared {descriptor!r}, which is not an EnvDescriptor")
        if descriptor.name in registry:
            raise DescriptorError(f"two env descriptors are named {descriptor.name!r}")
        if descriptor.env_id in ids:
            raise DescriptorError(
                f"env descriptors {ids[descriptor.env_id]!r} and {descriptor.name!r} both claim {descriptor.env_id!r}"
            )
        registry[descriptor.name] = descriptor
        ids[descriptor.env_id] = descriptor.name
    return registry
