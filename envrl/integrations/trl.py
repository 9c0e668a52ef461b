"""envrl's environments in TRL's ``GRPOTrainer(environment_factory=...)``.

TRL plays an environment through a small duck-typed contract (``trl/trainer/grpo_trainer.py``):
the factory is called with no argument, one instance per rollout, reused across batches; before
each rollout TRL calls ``reset(**row)`` with every column of the dataset row and appends the
string it returns to the row's last user message; every public method other than ``reset`` and
``get_reward`` becomes a tool whose schema TRL reads from the type hints and the Google-style
docstring; when the rollout is over TRL calls ``get_reward()`` and adds it (weight 1) to the
rewards, logged as ``rewards/<ClassName>/mean``.

So each envrl family gets a class whose only public methods are its own verbs:
``act(action)`` for ALFWorld, ScienceWorld and TextWorld, ``search(query)`` and
``click(target)`` for WebShop (sent to the env as ``search[...]``/``click[...]``). Everything
else (the env, the return, the actions sent) is private or a read-only property, which TRL does
not turn into tools. ``get_reward()`` is the env's return: the sum of the rewards its steps gave,
exactly what envrl's own runs and trainers count.

Groups. GRPO compares the completions of one prompt, so they must start from one state.
:func:`split_dataset` writes one row per episode with its ``task_id`` and ``seed`` (episode
``i`` plays ``task_ids[i mod n]`` with seed ``seed + i``, the rule of ``envrl eval``); TRL repeats
a row for each completion of its group and ``reset`` plays that task with that seed, and the
envs are deterministic, so every completion of a group starts from the same observation.

Episode ends are final, as in envrl: once the env has terminated or truncated, a tool call
answers :data:`EPISODE_OVER_MESSAGE` and never steps the env, so nothing a model writes after the
end can change the reward. Any other text reaches the env, which answers an action it cannot use
with its own feedback (never an exception).

Configuration: ``environment_factory("textworld", families=["custom"], max_episode_steps=15)``
returns a picklable no-argument callable; keyword arguments go to ``gym.make``, except
``split`` (the split used when a row names none), ``max_episode_steps`` and
``admissible_limit`` (how many admissible actions an observation lists; 0 lists none).

Versions: TRL's ``environment_factory`` is experimental and changes between releases, so the
supported range is pinned (:data:`TRL_VERSIONS`) and checked when this module is imported, with
a message naming the extra to install.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from envrl.integrations.versions import check_version, installed_version

#: TRL releases this adapter is tested with: at least the first, below the second
TRL_VERSIONS = ("1.16.0", "2.0.0")

#: what a tool call answers once the episode has ended (followed by the final return)
EPISODE_OVER_MESSAGE = "The episode is over; no more actions are taken."
#: what a tool call answers before ``reset`` (TRL always resets first; a user's script may not)
NOT_STARTED_MESSAGE = "No episode is running; the environment must be reset first."


def check_trl_version(installed: str | None) -> str:
    """``installed`` (TRL's version, None when TRL is missing) if this adapter supports it, else an
    ImportError saying what to install (:func:`envrl.integrations.versions.check_version`)."""
    return check_version(installed, TRL_VERSIONS, user=__name__, label="TRL", distribution="trl", extra="trl")


TRL_VERSION = check_trl_version(installed_version("trl"))

# ---- the environments ----------------------------------------------------------------------------


class EnvrlEnvironment:
    """One envrl env as a TRL environment; subclasses add the env's verbs as tools.

    ``split`` is the split a row without a ``split`` column plays; ``max_episode_steps`` the
    step limit (default: the env's); ``admissible_limit`` how many admissible actions an
    observation lists; other keyword arguments go to ``gym.make``. Nothing is started until the
    first ``reset`` (TRL builds one instance at start-up only to read its tools).
    """

    #: the short name (``envrl.envs.ENV_IDS``)
    env_name: ClassVar[str] = ""
    #: the split played when neither the row nor the constructor names one
    default_split: ClassVar[str] = ""
    #: the first paragraph of a prompt: what the agent is and which tool does what
    intro: ClassVar[str] = ""

    def __init__(
        self,
        split: str | None = None,
        max_episode_steps: int | None = None,
        admissible_limit: int = 100,
        **env_kwargs: Any,
    ) -> None:
        if admissible_limit < 0:
            raise ValueError(f"admissible_limit must be >= 0, got {admissible_limit}")
        self._split = split or self.default_split
        self._max_episode_steps = max_episode_steps
        self._admissible_limit = admissible_limit
        self._env_kwargs = dict(env_kwargs)
        self._envs: dict[str, Any] = {}  # split -> gym env, made on first use
        self._env: Any = None
        self._return = 0.0
        self._actions: list[Any] = []
        self._info: dict[str, Any] = {}
        self._ended: str | None = None  # "won", "ended" or "the step limit" once the episode is over

    # ---- TRL's contract -------------------------------------------------------------------------

    def reset(self, **row: Any) -> str:
        """Start the episode of a dataset row (``task_id``, ``seed``, ``split``; other columns are
        ignored) and return its first observation, the task and the admissible actions. A row
        without a prompt (TRL's placeholder rows) gets the intro too, so the model is told its tools."""
        name = row.get("environment")
        if name is not None and name != self.env_name:
            raise ValueError(
                f"a row for environment {name!r} reached the {self.env_name} environment; with several envs, "
                "pass environment_factory a dict {name: environment_factory(name)}"
            )
        split = str(row.get("split") or self._split)
        task_id, seed = row.get("task_id"), row.get("seed")
        env = self._env_for(split)
        options = {"task_id": str(task_id)} if task_id is not None else None
        observation, info = env.reset(seed=None if seed is None else int(seed), options=options)
        self._env, self._info = env, info
        self._return, self._actions, self._ended = 0.0, [], None
        instruction = str(info.get("instruction") or "").strip()
        task = f"Your task: {instruction}\n\n" if instruction and instruction not in observation else ""
        text = f"{task}{observation}{self._choices(info)}"
        return text if _has_prompt(row.get("prompt")) else f"{self.intro}\n\n{text}"

    def get_reward(self) -> float:
        """The episode's return: the sum of the env's rewards since ``reset`` (0 before any step)."""
        return float(self._return)

    # ---- read-only state (properties are not tools) -------------------------------------------

    @property
    def episode_return(self) -> float:
        return float(self._return)

    @property
    def actions(self) -> tuple[Any, ...]:
        """The actions sent to the env this episode, as it received them (``click[...]`` for WebShop);
        replaying them in a fresh env from the same row gives the same return."""
        return tuple(self._actions)

    @property
    def done(self) -> bool:
        return self._ended is not None

    @property
    def info(self) -> dict[str, Any]:
        """The env's last ``info``."""
        return dict(self._info)

    # ---- helpers ----------------------------------------------------------------------------------

    def _env_for(self, split: str) -> Any:
        env = self._envs.get(split)
        if env is None:
            import gymnasium as gym

            import envrl.envs

            kwargs = dict(self._env_kwargs)
            if self._max_episode_steps is not None:
                kwargs["max_episode_steps"] = int(self._max_episode_steps)
            env = gym.make(envrl.envs.env_id(self.env_name), split=split, **kwargs)
            self._envs[split] = env
        return env

    def _step(self, action: Any) -> str:
        """Send one action to the env; what the tool answers (never raises for any action)."""
        if self._env is None:
            return NOT_STARTED_MESSAGE
        if self._ended is not None:
            return f"{EPISODE_OVER_MESSAGE} It ended ({self._ended}) with return {self._return:g}."
        observation, reward, terminated, truncated, info = self._env.step(action)
        self._actions.append(action)
        self._return += float(reward)
        self._info = info
        if terminated or truncated:
            self._ended = "won" if info.get("success") else ("the step limit" if truncated else "ended")
            return f"{observation}\n\nThe episode is over ({self._ended}); return {self._return:g}."
        return f"{observation}{self._choices(info)}"

    def _choices(self, info: Mapping[str, Any]) -> str:
        """The admissible actions as the tools take them (the first ``admissible_limit``)."""
        if not self._admissible_limit:
            return ""
        actions = [str(a) for a in info.get("admissible_actions") or []]
        return _listing("Admissible actions", actions, self._admissible_limit)

    def _close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()
        self._env = None

    def __del__(self) -> None:
        try:
            self._close()
        except Exception:  # interpreter shutdown: the engines are going away anyway
            pass


class _ActEnvironment(EnvrlEnvironment):
    """An env whose actions are free-text commands: one tool, ``act``."""

    def act(self, action: str) -> str:
        """Take one action in the environment and read what happens.

        Args:
            action: One command, written like the admissible actions listed in the observation, e.g. "go north".

        Returns:
            The environment's answer, followed by the actions admissible next.
        """
        return self._step(action)


def _webshop_intro() -> str:
    from envrl.envs import REGISTRY

    return REGISTRY["webshop"].tool_intro


class WebShopEnvironment(EnvrlEnvironment):
    """``envrl/WebShop-v0``: shopping for a customer; the tools are ``search`` and ``click``."""

    env_name = "webshop"
    default_split = "train"
    intro = _webshop_intro()

    def search(self, query: str) -> str:
        """Search the store from a page with a search bar.

        Args:
            query: The keywords to search for, e.g. "red running shoes size 9".

        Returns:
            The page that the search leads to, followed by what can be clicked on it.
        """
        return self._step(f"search[{query}]")

    def click(self, target: str) -> str:
        """Click a button, product or option on the current page.

        Args:
            target: The clickable exactly as listed, e.g. "buy now", "next >" or a product id.

        Returns:
            The page that the click leads to, followed by what can be clicked on it.
        """
        return self._step(f"click[{target}]")

    def _choices(self, info: Mapping[str, Any]) -> str:
        if not self._admissible_limit:
            return ""
        actions = [str(a) for a in info.get("admissible_actions") or []]
        clickable = [a[len("click[") : -1] for a in actions if a.startswith("click[") and a.endswith("]")]
        search = "search[<query>]" in actions
        head = "\n\nThe search tool works on this page." if search else "\n\nThis page has no search bar."
        return head + _listing("Clickable (click tool)", clickable, self._admissible_limit)


def _act_class(class_name: str, name: str) -> type[EnvrlEnvironment]:
    """The ``act``-tool class of a registered env, built from its descriptor and bound to this
    module's namespace, so that a factory of it pickles by reference."""
    from envrl.envs import REGISTRY

    descriptor = REGISTRY[name]
    cls = type(
        class_name,
        (_ActEnvironment,),
        {
            "__doc__": f"``{descriptor.env_id}``; the tool is ``act``.",
            "__module__": __name__,
            "__qualname__": class_name,
            "env_name": name,
            "default_split": descriptor.default_split,
            "intro": descriptor.tool_intro,
        },
    )
    globals()[class_name] = cls
    return cls


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-")) + "Environment"


def _environments() -> dict[str, type[EnvrlEnvironment]]:
    """Short name -> class for every registered env: WebShop's own verbs, ``act`` for the rest."""
    from envrl.envs import REGISTRY

    special = {
        "alfworld": "ALFWorldEnvironment",
        "scienceworld": "ScienceWorldEnvironment",
        "textworld": "TextWorldEnvironment",
    }
    table: dict[str, type[EnvrlEnvironment]] = {}
    for name in REGISTRY:
        if name == WebShopEnvironment.env_name:
            table[name] = WebShopEnvironment
        else:
            table[name] = _act_class(special.get(name, _class_name(name)), name)
    return table


#: short name -> environment class, one per registered env
ENVIRONMENTS: dict[str, type[EnvrlEnvironment]] = _environments()
ALFWorldEnvironment = ENVIRONMENTS["alfworld"]
ScienceWorldEnvironment = ENVIRONMENTS["scienceworld"]
TextWorldEnvironment = ENVIRONMENTS["textworld"]


def _listing(title: str, items: Sequence[str], limit: int) -> str:
    if not items:
        return f"\n\n{title}: none."
    shown = "\n".join(f"- {item}" for item in items[:limit])
    more = f"\n- ... and {len(items) - limit} more" if len(items) > limit else ""
    return f"\n\n{title} ({len(items)}):\n{shown}{more}"


def _has_prompt(prompt: Any) -> bool:
    """Whether a row's prompt says anything (TRL's placeholder rows hold one empty user message)."""
    if isinstance(prompt, str):
        return bool(prompt.strip())
    if isinstance(prompt, Sequence):
        return any(isinstance(m, Mapping) and str(m.get("content") or "").strip() for m in prompt)
    return False


def environment_class(env: str) -> type[EnvrlEnvironment]:
    """The environment class of a short name (``textworld``) or Gymnasium id (``envrl/TextWorld-v0``)."""
    import envrl.envs

    name = envrl.envs.env_name(env)  # a ValueError naming the choices for anything else
    if name not in ENVIRONMENTS:  # registered after this module was imported
        raise ValueError(f"environment {env!r} has no TRL class; re-import envrl.integrations.trl after registering it")
    return ENVIRONMENTS[name]


def environment_factory(env: str, **kwargs: Any) -> functools.partial[EnvrlEnvironment]:
    """A no-argument factory for ``GRPOTrainer(environment_factory=...)``: ``env``'s class with
    ``kwargs`` bound (``split``, ``max_episode_steps``, ``admissible_limit``, and ``gym.make``
    keyword arguments such as ``families=["custom"]``). A ``functools.partial``, so it pickles."""
    cls = environment_class(env)
    return functools.partial(cls, **kwargs)


# ---- datasets ---------------------------------------------------------------------------------------


def split_rows(
    env: str,
    split: str,
    episodes: int | None = None,
    *,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    prompt: str | None = None,
) -> list[dict[str, Any]]:
    """The rows of :func:`split_dataset` as plain dicts (no ``datasets`` needed)."""
    cls = environment_class(env)
    task_ids = _task_ids(cls.env_name, split, env_kwargs or {})
    count = len(task_ids) if episodes is None else int(episodes)
    if count < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    content = (cls.intro if prompt is None else prompt).rstrip() + "\n\n"
    return [
        {
            "prompt": [{"role": "user", "content": content}],
            "task_id": task_ids[i % len(task_ids)],
            "seed": seed + i,
            "split": split,
            "environment": cls.env_name,
        }
        for i in range(count)
    ]


def split_dataset(
    env: str,
    split: str,
    episodes: int | None = None,
    *,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    prompt: str | None = None,
) -> Any:
    """A ``datasets.Dataset`` of one row per episode of ``split``, for ``GRPOTrainer(train_dataset=...)``.

    Episode ``i`` plays ``task_ids[i mod n]`` with seed ``seed + i`` (as ``envrl eval`` does); the
    default ``episodes`` is one pass over the split. Columns: ``prompt`` (one user message: the
    env's intro, or ``prompt``; ``reset`` appends the first observation), ``task_id``, ``seed``,
    ``split`` and ``environment`` (the short name, which routes rows when ``environment_factory``
    is a dict of several envs). ``env_kwargs`` must be what the factory gets where they change
    the split's tasks (TextWorld's ``families``, ScienceWorld's ``task``).
    """
    from datasets import Dataset

    return Dataset.from_list(split_rows(env, split, episodes, seed=seed, env_kwargs=env_kwargs, prompt=prompt))


def _task_ids(env_name: str, split: str, env_kwargs: Mapping[str, Any]) -> list[str]:
    import gymnasium as gym

    import envrl.envs

    kwargs = {k: v for k, v in env_kwargs.items() if k not in ("max_episode_steps", "admissible_limit", "split")}
    env = gym.make(envrl.envs.env_id(env_name), split=split, **kwargs)
    try:
        return [str(t) for t in env.unwrapped.task_ids]  # type: ignore[attr-defined]
    finally:
        env.close()


__all__ = [
    "ALFWorldEnvironment",
    "ENVIRONMENTS",
    "EPISODE_OVER_MESSAGE",
    "EnvrlEnvironment",
    "NOT_STARTED_MESSAGE",
    "ScienceWorldEnvironment",
    "TRL_VERSION",
    "TRL_VERSIONS",
    "TextWorldEnvironment",
    "WebShopEnvironment",
    "check_trl_version",
    "environment_class",
    "environment_factory",
    "split_dataset",
    "split_rows",
]
