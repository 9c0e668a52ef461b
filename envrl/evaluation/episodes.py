"""The episode engine: play episodes of a text env with an agent, several side by side, and
record each as an :class:`~envrl.evaluation.store.EpisodeRecord`.

Evaluation runs use it in every worker process and Ray actor (one :class:`EpisodeBatch`
each); training rollouts can use it in their own process with their own policy agent. It
knows nothing of runs, pools or stores beyond the two record types it fills in.

Which episode plays what
    :meth:`EpisodeBatch.start` ``(index, task_id, seed)`` resets an env with
    ``seed=seed, options={"task_id": task_id}`` and its agent with ``seed=seed``; ``index``
    only labels the record. The caller decides the numbering (an evaluation run plays
    ``task_ids[i % len(task_ids)]`` with ``seed + i`` as episode ``i``).

Batches
    An :class:`EpisodeBatch` holds ``batch_size`` (env, agent) pairs and plays their episodes
    in lockstep: each :meth:`~EpisodeBatch.turn`, every episode in progress gets its action
    from one :func:`~envrl.agents.base.act_batch` call, so a batched agent (an LLM agent, a
    policy) answers all of them with one generation. Agents that act one by one are asked
    one by one.

What a step records
    Each step becomes a :class:`~envrl.evaluation.store.StepRecord`; the agent's
    ``step_info`` (a mapping it sets when it acts: an LLM agent's raw response and token
    counts, a policy's token ids and log-probs) is copied into its ``agent_info``. At the
    end of an episode the agent's ``episode_stats()`` (if it has one) becomes the record's
    ``agent_stats``.

Failures
    An exception in one env, or in one agent that acts on its own, ends that episode only: it
    is recorded with ``error`` set and that env (or agent) is rebuilt, since the exception may
    have left it in a bad state. An exception in batched agents' shared call ends every
    episode in that call, and the agents are rebuilt. An episode that runs
    :data:`HARD_STEP_CAP` steps without ending (an env with no step limit) is stopped.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from envrl.evaluation.store import EpisodeRecord, StepRecord
from envrl.processes import MAX_ERROR_LENGTH, describe_exception

#: an agent spec for ``envrl.agents.make_agent`` ("random", "expert", "hf:...", ...), or a
#: zero-argument callable that returns an agent (picklable, a top-level class or function,
#: when the batch is built in another process)
AgentSpec = str | Callable[[], Any]

#: an episode that has not ended after this many steps is stopped (an env without step limit)
HARD_STEP_CAP = 10_000

#: what :meth:`EpisodeBatch.start` takes: (index, task id, seed)
EpisodeJob = tuple[int, str, int]


# ---- how failures are written --------------------------------------------------------------


def error_message(exc: BaseException) -> str:
    """``exc``'s message on one line, at most :data:`~envrl.processes.MAX_ERROR_LENGTH`
    characters, without its type: for sentences like "cannot make X: <message>". A
    ``KeyError``'s key is given as it is, since ``str(KeyError)`` quotes it."""
    if isinstance(exc, KeyError) and len(exc.args) == 1:
        exc = Exception(exc.args[0])
    prefix = f"{type(exc).__name__}: "
    return describe_exception(exc, MAX_ERROR_LENGTH + len(prefix))[len(prefix) :]


def describe_error(exc: BaseException) -> str:
    """``"TypeName: message"`` for a record's ``error`` (the message as in :func:`error_message`)."""
    return f"{type(exc).__name__}: {error_message(exc)}"


# ---- building agents and envs ----------------------------------------------------------------


@dataclass(frozen=True)
class EpisodeSetup:
    """What an :class:`EpisodeBatch` builds (its envs and agents) and how it labels its
    records. Frozen and picklable (with a picklable ``agent_spec``): it is what a worker
    process or a Ray actor is handed."""

    env_id: str
    split: str
    env_kwargs: Mapping[str, Any]
    agent_spec: AgentSpec
    agent_options: Mapping[str, Any]
    env_name: str  # the short name agents are built for ("alfworld"), or the env id
    run_id: str
    agent_label: str
    batch_size: int = 1


def build_agent(agent_spec: AgentSpec, env_name: str, agent_options: Mapping[str, Any] | None = None) -> Any:
    """One agent from its spec: ``make_agent(spec, env_name, options)`` or ``spec()``."""
    if isinstance(agent_spec, str):
        from envrl.agents import make_agent

        return make_agent(agent_spec, env_name, options=agent_options or None)
    return agent_spec()


def build_agents(setup: EpisodeSetup) -> list[Any]:
    """``setup.batch_size`` agents. An agent with ``sibling()`` (an LLM agent) makes the
    others, which share its back end: one model loaded once, asked in one batch."""
    first = build_agent(setup.agent_spec, setup.env_name, setup.agent_options)
    agents = [first]
    while len(agents) < setup.batch_size:
        sibling = getattr(first, "sibling", None)
        agents.append(
            sibling() if callable(sibling) else build_agent(setup.agent_spec, setup.env_name, setup.agent_options)
        )
    return agents


def build_env(env_id: str, split: str, env_kwargs: Mapping[str, Any]) -> Any:
    """``gym.make(env_id, split=split, **env_kwargs)``."""
    import gymnasium as gym

    return gym.make(env_id, split=split, **dict(env_kwargs))


def close_quietly(obj: Any) -> None:
    """``obj.close()`` if it has one, ignoring what it raises: used on envs and agents that
    may be broken already, where a second failure must not hide the first."""
    close = getattr(obj, "close", None)
    if callable(close):
        try:
            close()
        except Exception:
            pass


def agent_label(agent_spec: AgentSpec, agent: Any) -> str:
    """The name records carry: the agent's ``name``, else its spec (or the callable's name)."""
    if isinstance(agent_spec, str):
        return str(getattr(agent, "name", None) or agent_spec)
    return str(getattr(agent, "name", None) or getattr(agent_spec, "__name__", type(agent).__name__))


# ---- one episode -----------------------------------------------------------------------------


class Episode:
    """One episode in progress: the env's latest answer and the trajectory so far."""

    def __init__(self, setup: EpisodeSetup, env: Any, agent: Any, index: int, task_id: str, seed: int) -> None:
        self.setup, self.env, self.agent = setup, env, agent
        self.index, self.task_id, self.seed = index, task_id, seed
        self.start = time.perf_counter()
        self.trajectory: list[StepRecord] = []
        self.task_type = ""
        self.initial_observation = ""
        self.observation: Any = ""
        self.info: dict[str, Any] = {}
        self.success = False
        self.score = 0.0
        self.error: str | None = None

    def begin(self) -> None:
        """Reset the env on this episode's task and the agent with its seed (may raise)."""
        self.observation, self.info = self.env.reset(seed=self.seed, options={"task_id": self.task_id})
        self.task_type = str(self.info.get("task_type", ""))
        self.initial_observation = str(self.observation)
        self.agent.reset(seed=self.seed)

    def apply(self, action: str) -> bool:
        """Play ``action`` and record the step; True when the episode is over (may raise)."""
        agent_info = getattr(self.agent, "step_info", None)  # set by the agent when it chose ``action``
        self.observation, reward, terminated, truncated, self.info = self.env.step(action)
        self.trajectory.append(
            StepRecord(
                action=str(action),
                observation=str(self.observation),
                reward=float(reward),
                valid=bool(self.info.get("valid_action", True)),
                agent_info=dict(agent_info) if agent_info else None,
            )
        )
        self.success = bool(self.info.get("success", False))
        self.score = float(self.info.get("score", 0.0))
        if terminated or truncated:
            return True
        if len(self.trajectory) >= HARD_STEP_CAP:
            self.error = f"episode did not end within {HARD_STEP_CAP} steps (no step limit?)"
            return True
        return False

    def record(self, exc: BaseException | None = None) -> EpisodeRecord:
        """The finished episode; ``exc`` is the exception that ended it, if any."""
        if exc is not None:
            self.error = describe_error(exc)
        stats = getattr(self.agent, "episode_stats", None)
        turns = len(self.trajectory)
        s = self.setup
        return EpisodeRecord(
            run_id=s.run_id,
            episode_index=self.index,
            env_id=s.env_id,
            split=s.split,
            task_id=self.task_id,
            task_type=self.task_type,
            seed=self.seed,
            agent=s.agent_label,
            success=self.success and self.error is None,
            score=self.score,
            turns=turns,
            valid_action_ratio=(sum(step.valid for step in self.trajectory) / turns) if turns else None,
            wall_time=time.perf_counter() - self.start,
            error=self.error,
            trajectory=self.trajectory,
            initial_observation=self.initial_observation,
            finished_at=time.time(),
            agent_stats=stats() if callable(stats) else None,
        )


# ---- a batch of episodes in lockstep -------------------------------------------------------


class EpisodeBatch:
    """``setup.batch_size`` (env, agent) pairs whose episodes are played in lockstep (see the
    module docstring). Each finished episode goes to ``on_done(record)``; ``on_start(index,
    task_type)``, if given, hears when an episode's env has been reset.

    Builds its envs and agents at once (and raises if it cannot); :meth:`close` closes them.
    """

    def __init__(
        self,
        setup: EpisodeSetup,
        on_done: Callable[[EpisodeRecord], None],
        on_start: Callable[[int, str], None] | None = None,
    ) -> None:
        self.setup = setup
        self.on_done = on_done
        self.on_start = on_start
        self.agents = build_agents(setup)
        self.envs: list[Any] = []
        try:
            self.envs = [self._new_env() for _ in range(setup.batch_size)]
        except BaseException:
            self.close()
            raise
        self.episodes: list[Episode | None] = [None] * setup.batch_size

    def free(self) -> int:
        """How many more episodes can start now."""
        return sum(1 for e in self.episodes if e is None)

    def busy(self) -> bool:
        """Whether any episode is in progress."""
        return any(e is not None for e in self.episodes)

    def in_progress(self) -> list[tuple[int, Episode]]:
        """(slot, episode) for every episode in progress, by slot."""
        return [(slot, e) for slot, e in enumerate(self.episodes) if e is not None]

    def start(self, index: int, task_id: str, seed: int) -> None:
        """Begin an episode in a free slot (ValueError if none is free). An episode whose reset
        raises is recorded as failed at once."""
        slot = self.episodes.index(None)
        episode = Episode(self.setup, self.envs[slot], self.agents[slot], index, task_id, seed)
        self.episodes[slot] = episode
        try:
            episode.begin()
        except Exception as exc:
            self._finish(slot, exc)
            return
        if self.on_start is not None:
            self.on_start(index, episode.task_type)

    def turn(self) -> None:
        """One action for every episode in progress."""
        from envrl.agents.base import is_batched

        active = self.in_progress()
        if not active:
            return
        if all(is_batched(episode.agent) for _, episode in active):
            moves = self._act_together(active)
        else:
            moves = self._act_one_by_one(active)
        for slot, episode, action in moves:
            self._apply(slot, episode, action)

    def play(self, jobs: Iterable[EpisodeJob]) -> None:
        """Play ``jobs`` to their end, starting each as a slot frees up."""
        queue = deque(jobs)
        while queue or self.busy():
            while queue and self.free():
                self.start(*queue.popleft())
            self.turn()

    def close(self) -> None:
        """Close every env and agent (quietly: they may be broken)."""
        for env in self.envs:
            close_quietly(env)
        for agent in self.agents:
            close_quietly(agent)

    # ---- inside a turn -------------------------------------------------------------------

    def _act_one_by_one(self, active: list[tuple[int, Episode]]) -> list[tuple[int, Episode, str]]:
        """Each agent acts on its own: one that raises ends only its own episode, and is
        replaced by a new agent."""
        moves = []
        for slot, episode in active:
            try:
                moves.append((slot, episode, episode.agent.act(episode.observation, episode.info)))
            except Exception as exc:
                self._finish(slot, exc, rebuild_env=False)
                self.agents[slot] = build_agent(self.setup.agent_spec, self.setup.env_name, self.setup.agent_options)
        return moves

    def _act_together(self, active: list[tuple[int, Episode]]) -> list[tuple[int, Episode, str]]:
        """One :func:`~envrl.agents.base.act_batch` call for all: if it raises, every episode in
        it ends and all agents are rebuilt (their shared back end is suspect)."""
        from envrl.agents.base import act_batch

        episodes = [episode for _, episode in active]
        try:
            actions = act_batch(
                [e.agent for e in episodes], [e.observation for e in episodes], [e.info for e in episodes]
            )
        except Exception as exc:
            for slot, _ in active:
                self._finish(slot, exc, rebuild_env=False)
            for agent in self.agents:
                close_quietly(agent)
            self.agents = build_agents(self.setup)
            return []
        return [(slot, episode, action) for (slot, episode), action in zip(active, actions)]

    def _apply(self, slot: int, episode: Episode, action: str) -> None:
        try:
            ended = episode.apply(action)
        except Exception as exc:
            self._finish(slot, exc)
            return
        if ended:
            self._finish(slot, None)

    def _finish(self, slot: int, exc: BaseException | None, rebuild_env: bool = True) -> None:
        episode = self.episodes[slot]
        assert episode is not None, f"slot {slot} has no episode to finish"
        self.episodes[slot] = None
        self.on_done(episode.record(exc))
        if exc is not None and rebuild_env:  # the exception may have left the engine in a bad state
            close_quietly(self.envs[slot])
            self.envs[slot] = self._new_env()

    def _new_env(self) -> Any:
        return build_env(self.setup.env_id, self.setup.split, self.setup.env_kwargs)
