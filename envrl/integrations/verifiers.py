"""envrl's environments as a `verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environment.

verifiers 0.4 (the ``verifiers.v1`` stack) no longer has ``MultiTurnEnv``: an environment is a
*taskset* (the dataset: one typed task per row), an ``Env`` whose ``run(task, agents)`` plays
one episode, and a *harness* (the program that calls the model), all found by importing a
top-level module named by the taskset id. Its multi-turn games (TextArena, OpenEnv) are written
as an ``Env`` that holds ``agent.interaction(task)`` open and acts as the model's user: each
assistant reply is a move, the engine's answer is the next user message. This module does the
same for envrl:

* :class:`EnvrlTaskset` is the dataset: one row (:class:`EnvrlTaskData`) per episode, with the
  split's ``task_id`` and the episode's ``seed``. Episode ``i`` plays ``task_ids[i mod n]`` with
  seed ``seed + i``, the rule of ``envrl eval``, so a row replays exactly (the envs are
  deterministic) and a verifiers run and an envrl run of the same seed play the same episodes.
* :class:`EnvrlEnv` plays a row: at the rollout's start it makes its own envrl env
  (``gym.make``) and resets it to the row's task and seed, sends the first observation (in
  envrl's prompt template) as the first user message, parses every reply with envrl's one
  parser (:func:`envrl.agents.prompts.parse_response`: ``<action>...</action>``), steps the
  env, and sends the observation back, until the env terminates or truncates. The env is
  closed when the rollout ends, however it ends.
* The rubric is the task's ``@vf.reward``/``@vf.metric`` methods (:class:`EnvrlTask`):
  reward ``episode_return`` (the sum of the env's rewards, what envrl's runs and trainers
  count), metrics ``success``, ``final_score``, ``turns``, ``invalid_actions`` and
  ``format_errors``, read from what the episode recorded on ``trace.info["envrl"]``.
* :class:`EnvrlChatHarness` is the model's side: one chat completion per user turn, made in
  process through the rollout's interception endpoint (so verifiers records every call on the
  trace). verifiers' own ``null``/``bash`` harnesses would also work, but they install a
  script with ``uv`` into a sandbox for every run; this one needs nothing beyond ``openai``.

Bad input never raises inside a rollout: a reply without a usable ``<action>`` sends the empty
action, which the env answers with its own invalid-action feedback (as envrl's LLM agents do);
once the episode has ended no reply reaches the env (:meth:`EpisodeSession.respond` answers
:data:`EPISODE_OVER_MESSAGE`), and :class:`EnvrlEnv` stops the exchange instead of asking the
model again. Wrong arguments (an unknown env or split, ``episodes=0``) fail in
:func:`load_environment`, before any rollout.

Taskset id. verifiers imports a taskset by a top-level module name, so importing this module
registers itself as ``envrl_verifiers`` (:data:`TASKSET_ID`) too. In another process (the
``vf-eval`` command) that name exists only once this module is imported, hence
``python -m envrl.integrations.verifiers eval ...``, which imports it and hands the rest of the
command line to ``vf-eval``.

Versions: the ``verifiers.v1`` API is young and changes between releases, so the supported
range is pinned (:data:`VERIFIERS_VERSIONS`) and checked when this module is imported.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

from envrl.integrations.versions import check_version, installed_version

#: verifiers releases this adapter is tested with: at least the first, below the second
VERIFIERS_VERSIONS = ("0.4.0", "0.5.0")
INSTALL_HINT = "pip install 'envrl[verifiers]'"
#: the taskset id verifiers resolves to this module (``--env.taskset.id``, ``vf-eval <id>``)
TASKSET_ID = "envrl_verifiers"

#: what :meth:`EpisodeSession.respond` answers once the episode has ended (the env is not stepped)
EPISODE_OVER_MESSAGE = "The episode is over; no more actions are taken."


def check_verifiers_version(installed: str | None) -> str:
    """``installed`` (verifiers' version, None when it is missing) if this adapter supports it,
    else an ImportError saying what to install (:func:`envrl.integrations.versions.check_version`;
    verifiers also needs Python 3.11)."""
    if sys.version_info < (3, 11):
        raise ImportError("envrl.integrations.verifiers needs Python 3.11 or newer (verifiers does)")
    return check_version(
        installed, VERIFIERS_VERSIONS, user=__name__, label="verifiers", distribution="verifiers", extra="verifiers"
    )


VERIFIERS_VERSION = check_verifiers_version(installed_version("verifiers"))

try:
    import verifiers.v1 as vf
    from openai import AsyncOpenAI
    from verifiers.v1.dialects.chat import message_to_wire
except ImportError as exc:  # a broken install: say which extra repairs it
    raise ImportError(f"envrl.integrations.verifiers cannot import verifiers ({exc}): {INSTALL_HINT}") from exc

import gymnasium as gym  # noqa: E402  (after the check: a missing extra is the first thing to report)

from envrl.agents.prompts import DEFAULT_TEMPLATE, Conversation, load_template, parse_response  # noqa: E402
from envrl.envs import SINGLE_THREAD_ENVS, env_id, env_name  # noqa: E402
from envrl.envs.base import TextEnv  # noqa: E402

# verifiers finds a taskset by importing its id as a top-level module (run as a script, this file is
# ``__main__`` and the alias goes to the module it imports under its own name: see the end)
if __name__ != "__main__":
    sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])


# ---- one episode, without verifiers -------------------------------------------------------


@dataclass(frozen=True)
class StepOutcome:
    """What one reply did: the next user message, the env's reward, whether the episode is over,
    the action sent (None when the episode had already ended) and the parser's complaint."""

    message: str
    reward: float
    done: bool
    action: str | None
    valid_action: bool
    format_problem: str | None = None


class EpisodeSession:
    """One rollout's envrl env, from reset to close, and the text the model sees.

    The first user message is :attr:`first_message`; :meth:`respond` parses a reply, steps the env
    and returns the next one. Messages are envrl's template (``think-action`` by default) with a
    history window of 0: the chat itself carries the earlier turns. Not thread-safe; blocking.
    """

    def __init__(
        self,
        env: str,
        task_id: str,
        seed: int,
        *,
        split: str | None = None,
        max_turns: int | None = None,
        template: str = DEFAULT_TEMPLATE,
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.env_name = env_name(env)
        self.template = load_template(template)
        self.conversation = Conversation(self.template, self.env_name, history=0)
        self.task_id, self.seed = task_id, seed
        self.env = make_env(self.env_name, split, max_turns, env_kwargs)
        self.total_return = 0.0
        self.turns = 0
        self.invalid_actions = 0
        self.format_errors = 0
        self.terminated = self.truncated = False
        try:
            observation, self.info = self.env.reset(seed=seed, options={"task_id": task_id})
        except BaseException:
            self.env.close()
            raise
        self.first_message = self._message(observation, self.info)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def respond(self, reply: Any) -> StepOutcome:
        """Play one model reply. Anything is accepted: a reply without one usable
        ``<action>...</action>`` sends the empty action (the env's invalid-action feedback); after
        the episode's end nothing reaches the env and the answer is :data:`EPISODE_OVER_MESSAGE`."""
        if self.done:
            return StepOutcome(self.over_message(), 0.0, True, None, False, None)
        parsed = parse_response(reply if isinstance(reply, str) else "", self.template.require_think)
        action = parsed.action if parsed.action is not None else ""
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.info = info
        self.total_return += float(reward)
        self.turns += 1
        valid = bool(info.get("valid_action", False))
        self.invalid_actions += int(not valid)
        self.format_errors += int(not parsed.format_valid)
        self.terminated, self.truncated = bool(terminated), bool(truncated)
        message = self._message(observation, info) if not self.done else observation
        return StepOutcome(message, float(reward), self.done, action, valid, parsed.problem)

    def over_message(self) -> str:
        outcome = "succeeded" if self.info.get("success") else "did not succeed"
        return f"{EPISODE_OVER_MESSAGE} The task {outcome}; the return is {self.total_return:g}."

    def summary(self) -> dict[str, Any]:
        """What the rubric reads (``trace.info["envrl"]``): the episode so far, JSON-ready."""
        return {
            "task_id": self.task_id,
            "seed": self.seed,
            "return": self.total_return,
            "success": bool(self.info.get("success", False)),
            "score": float(self.info.get("score", 0.0)),
            "turns": self.turns,
            "invalid_actions": self.invalid_actions,
            "format_errors": self.format_errors,
            "terminated": self.terminated,
            "truncated": self.truncated,
        }

    def close(self) -> None:
        self.env.close()

    def _message(self, observation: str, info: Mapping[str, Any]) -> str:
        return str(self.conversation.messages(observation, info)[-1]["content"])


def make_env(name: str, split: str | None, max_turns: int | None, env_kwargs: Mapping[str, Any] | None) -> gym.Env:
    """``gym.make`` with the split and, when set, ``max_turns`` as the env's step limit."""
    kwargs = dict(env_kwargs or {})
    if split is not None:
        kwargs["split"] = split
    if max_turns is not None:
        kwargs["max_episode_steps"] = max_turns
    return gym.make(env_id(name), **kwargs)


def _positive_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)


def check_counts(*, episodes: Any = None, max_turns: Any = None, seed: Any = 0) -> None:
    """ValueError for ``episodes``/``max_turns`` other than a positive int or None, or a seed
    outside numpy's range (before pydantic would quietly read ``True`` as 1)."""
    if not _positive_or_none(episodes):
        raise ValueError(f"episodes must be a positive integer or None, got {episodes!r}")
    if not _positive_or_none(max_turns):
        raise ValueError(f"max_turns must be a positive integer or None, got {max_turns!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")


def dataset_rows(
    env: str,
    split: str | None = None,
    episodes: int | None = None,
    *,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The dataset: one row per episode, ``{"episode", "task_id", "seed", "split"}``.

    ``episodes=None`` plays every task of the split once. Checks its arguments (an unknown env
    or split raises ValueError from the env itself) by making one env to read the split.
    """
    check_counts(episodes=episodes, seed=seed)
    made = make_env(env, split, None, env_kwargs)
    try:
        base = cast(TextEnv, made.unwrapped)
        task_ids = list(base.task_ids)
        split_name = str(base.split)
    finally:
        made.close()
    if not task_ids:
        raise ValueError(f"split {split_name!r} of {env} has no tasks")
    count = len(task_ids) if episodes is None else episodes
    if seed + count > 2**32:
        raise ValueError(f"seeds {seed}..{seed + count - 1} leave numpy's range [0, 2**32)")
    return [
        {"episode": i, "task_id": task_ids[i % len(task_ids)], "seed": seed + i, "split": split_name}
        for i in range(count)
    ]


# ---- the verifiers side --------------------------------------------------------------------


class EnvrlTasksetConfig(vf.TasksetConfig):
    """Which episodes the taskset holds (``--env.taskset.*`` on the command line)."""

    id: str = TASKSET_ID
    env: str = "alfworld"
    """envrl env: alfworld, webshop, scienceworld, textworld (or its Gymnasium id)."""
    split: str | None = None
    """The split (None: the env's default, ``train``)."""
    episodes: int | None = None
    """Rows: episode ``i`` plays ``task_ids[i mod n]`` with seed ``seed + i``; None: each task once."""
    seed: int = 0
    max_turns: int | None = None
    """The env's step limit (``max_episode_steps``); None keeps the env's default."""
    template: str = DEFAULT_TEMPLATE
    """envrl prompt template (name or JSON path) for the observations and the response format."""
    env_kwargs: dict[str, Any] = {}
    """Other ``gym.make`` arguments, e.g. ``{"families": ["custom"]}`` for TextWorld."""


class EnvrlTaskData(vf.TaskData):
    """One row: which task, which seed, and how to make the env that plays it."""

    env: str
    split: str
    task_id: str
    seed: int
    episode: int
    max_turns: int | None = None
    template: str = DEFAULT_TEMPLATE
    env_kwargs: dict[str, Any] = {}


class EnvrlTask(vf.Task[EnvrlTaskData, vf.State, vf.TaskConfig]):
    """A row plus its rubric: the env's return as the reward, the rest as metrics.

    The scoring methods read ``trace.info["envrl"]``, which :class:`EnvrlEnv` updates after
    every step, so a rollout cut short (an error, a token limit) is scored on what it played.
    """

    @property
    def key(self) -> str:
        data = self.data
        return f"{data.env}/{data.split}/{data.task_id}/seed={data.seed}"

    @vf.reward
    async def episode_return(self, trace: vf.Trace) -> float:
        return float(_outcome(trace).get("return", 0.0))

    @vf.metric
    async def success(self, trace: vf.Trace) -> float:
        return float(bool(_outcome(trace).get("success", False)))

    @vf.metric
    async def final_score(self, trace: vf.Trace) -> float:
        """The env's ``info["score"]`` at the end (partial progress in [0, 1])."""
        return float(_outcome(trace).get("score", 0.0))

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(_outcome(trace).get("turns", 0))

    @vf.metric
    async def invalid_actions(self, trace: vf.Trace) -> float:
        return float(_outcome(trace).get("invalid_actions", 0))

    @vf.metric
    async def format_errors(self, trace: vf.Trace) -> float:
        return float(_outcome(trace).get("format_errors", 0))


def _outcome(trace: vf.Trace) -> dict[str, Any]:
    value = trace.info.get("envrl")
    return value if isinstance(value, dict) else {}


class EnvrlTaskset(vf.Taskset[EnvrlTask, EnvrlTasksetConfig]):
    """The rows of :func:`dataset_rows`, as typed tasks (finite; listed once per taskset)."""

    def __init__(self, config: EnvrlTasksetConfig) -> None:
        super().__init__(config)
        self._rows: list[dict[str, Any]] | None = None

    def rows(self) -> list[dict[str, Any]]:
        if self._rows is None:
            c = self.config
            self._rows = dataset_rows(c.env, c.split, c.episodes, seed=c.seed, env_kwargs=c.env_kwargs)
        return self._rows

    def load(self) -> list[EnvrlTask]:
        c = self.config
        short = env_name(c.env)
        system = load_template(c.template).system
        return [
            EnvrlTask(
                EnvrlTaskData(
                    id=f"{short}/{row['split']}/{row['task_id']}/seed={row['seed']}",
                    name=f"{short}:{row['task_id']}",
                    prompt=None,  # the env opens the conversation with the first observation
                    system_prompt=system,
                    env=short,
                    split=row["split"],
                    task_id=row["task_id"],
                    seed=row["seed"],
                    episode=row["episode"],
                    max_turns=c.max_turns,
                    template=c.template,
                    env_kwargs=dict(c.env_kwargs),
                ),
                c.task,
            )
            for row in self.rows()
        ]


class EnvrlEnvConfig(vf.EnvConfig):
    """:class:`EnvrlEnv`'s config: the taskset and the one seat, ``player`` (the model)."""

    taskset: EnvrlTasksetConfig = EnvrlTasksetConfig()
    player: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The model's seat. Runs on the host (its harness is an in-process chat loop)."""


class EnvrlEnv(vf.Env[EnvrlEnvConfig]):
    """One envrl episode per rollout, the env playing the model's user (see the module docstring)."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        data = task.data
        if not isinstance(data, EnvrlTaskData):
            raise TypeError(f"EnvrlEnv plays EnvrlTaskData rows, got {type(data).__name__}")
        # the env is made, stepped and closed on one thread only, never on the event loop's: a
        # thread of its own, or the one thread shared by the engines that are not thread-safe
        executor = engine_thread(data.env)
        loop = asyncio.get_running_loop()

        def call(fn: Any, *args: Any) -> Any:
            return loop.run_in_executor(executor, fn, *args)

        session: EpisodeSession | None = None
        try:
            session = await call(_open_session, data)
            async with agents.player.interaction(task) as interaction:
                interaction.trace.info["envrl"] = session.summary()
                segment = await interaction.turn(session.first_message)
                while not segment.terminated and not session.done:
                    outcome = await call(session.respond, segment.last_reply)
                    interaction.trace.info["envrl"] = session.summary()
                    if outcome.done:  # a final end: the model is not asked again
                        interaction.trace.stop("envrl_terminated" if session.terminated else "envrl_truncated")
                        break
                    segment = await interaction.turn(outcome.message)
        finally:
            if session is not None:
                await call(session.close)
            if executor is not _SHARED_ENGINE_THREAD:
                executor.shutdown(wait=False)


#: the one thread on which every rollout of a :data:`~envrl.envs.SINGLE_THREAD_ENVS` family runs its env
_SHARED_ENGINE_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="envrl-verifiers-shared")


def engine_thread(env: str) -> ThreadPoolExecutor:
    """The thread a rollout of ``env`` runs its env on: the shared one, or a new one of its own."""
    if env_name(env) in SINGLE_THREAD_ENVS:
        return _SHARED_ENGINE_THREAD
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="envrl-verifiers")


def _open_session(data: EnvrlTaskData) -> EpisodeSession:
    return EpisodeSession(
        data.env,
        data.task_id,
        data.seed,
        split=data.split,
        max_turns=data.max_turns,
        template=data.template,
        env_kwargs=data.env_kwargs,
    )


class EnvrlChatHarnessConfig(vf.HarnessConfig):
    request_timeout: float = 600.0
    """Seconds one model call may take."""


class EnvrlChatHarness(vf.Harness[EnvrlChatHarnessConfig]):
    """The model's seat: one chat completion per user turn, through the rollout's interception
    endpoint (which applies the run's model and sampling settings and records the call).

    In process, as the base class allows: the conversation so far (the system prompt, then the
    exchange) is sent as it is; the reply ends the segment.
    """

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: Any,
        trace: Any,
        runtime: Any,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> Any:
        from verifiers.v1.runtimes import ProgramResult

        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages.extend(message_to_wire(message) for message in prompt)
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, timeout=self.config.request_timeout)
        try:
            await client.chat.completions.create(model=ctx.model, messages=messages)  # type: ignore[arg-type]
        except Exception as exc:  # the interception recorded the real cause; a failed program says why
            return ProgramResult(exit_code=1, stdout="", stderr=f"{type(exc).__name__}: {exc}")
        finally:
            await client.close()
        return ProgramResult(exit_code=0, stdout="", stderr="")


# ---- entry points --------------------------------------------------------------------------


def load_environment(
    env: str = "alfworld",
    split: str | None = None,
    episodes: int | None = None,
    max_turns: int | None = None,
    *,
    seed: int = 0,
    template: str = DEFAULT_TEMPLATE,
    **env_kwargs: Any,
) -> EnvrlEnv:
    """A verifiers environment over ``env``'s ``split``: ``episodes`` rows (None: each task
    once) from ``seed``, ``max_turns`` as the env's step limit, other keyword arguments to
    ``gym.make``. Arguments are checked here (the split is read once), not in the first rollout.

    Evaluate it with verifiers' runner: ``async with env.serving(): await env.run_slot(slot, ctx)``
    for each ``slot`` of ``env.slots(task)``, or :func:`evaluate`.
    """
    check_counts(episodes=episodes, max_turns=max_turns, seed=seed)
    taskset = EnvrlTasksetConfig(
        env=env_name(env),
        split=split,
        episodes=episodes,
        seed=seed,
        max_turns=max_turns,
        template=template,
        env_kwargs=env_kwargs,
    )
    load_template(template)  # a misspelt template fails now
    environment = vf.load_environment(EnvrlEnvConfig(taskset=taskset))
    if not isinstance(environment, EnvrlEnv):  # pragma: no cover - verifiers resolved another module
        raise RuntimeError(f"verifiers resolved {TASKSET_ID!r} to {type(environment).__name__}, not EnvrlEnv")
    environment.taskset.rows()
    return environment


async def evaluate(
    environment: EnvrlEnv,
    *,
    model: str,
    base_url: str,
    api_key_var: str = "OPENAI_API_KEY",
    sampling: Mapping[str, Any] | None = None,
    rollouts: int = 1,
    max_concurrent: int | None = 8,
) -> list[Any]:
    """Play every row ``rollouts`` times against an OpenAI-compatible server with verifiers' own
    episode runner (what ``vf-eval`` does in process, without writing a run directory); returns
    the ``vf.Episode`` objects, each with one trace carrying ``reward``, ``rewards`` and ``metrics``."""
    from verifiers.v1.clients import EvalClientConfig, ModelContext

    ctx = ModelContext(
        model=model,
        client=EvalClientConfig(base_url=base_url, api_key_var=api_key_var),
        sampling=vf.SamplingConfig(**dict(sampling or {})),
    )
    semaphore = asyncio.Semaphore(max_concurrent) if max_concurrent else None
    async with environment.serving():
        slots = [slot for task in environment.taskset for slot in environment.slots(task, rollouts)]
        return list(await asyncio.gather(*(environment.run_slot(slot, ctx, semaphore) for slot in slots)))


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m envrl.integrations.verifiers eval ARGS``: verifiers' ``vf-eval ARGS`` with this
    module importable as the taskset ``envrl_verifiers``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "eval":
        raise SystemExit(
            "usage: python -m envrl.integrations.verifiers eval [--env.taskset.env textworld] "
            "[--env.taskset.split valid] [--model NAME --client.base-url URL] [vf-eval options]"
        )
    from verifiers.v1.cli.eval.main import main as vf_eval

    vf_eval([TASKSET_ID, *args[1:]])


__all__ = [
    "EPISODE_OVER_MESSAGE",
    "TASKSET_ID",
    "VERIFIERS_VERSIONS",
    "EnvrlChatHarness",
    "EnvrlChatHarnessConfig",
    "EnvrlEnv",
    "EnvrlEnvConfig",
    "EnvrlTask",
    "EnvrlTaskData",
    "EnvrlTaskset",
    "EnvrlTasksetConfig",
    "EpisodeSession",
    "StepOutcome",
    "check_verifiers_version",
    "dataset_rows",
    "evaluate",
    "load_environment",
]


if __name__ == "__main__":
    # run as a script this file is ``__main__``; the taskset must resolve to the imported module
    import importlib

    importlib.import_module("envrl.integrations.verifiers").main()
