"""Rollouts: groups of G envs playing one task with one seed, stepped together, one sample per step.

GRPO and GiGPO compare the G rollouts of a task with each other, so a batch is ``groups``
tasks times ``group_size`` envs of a :func:`~envrl.envs.vector.make_vec` vector env, all reset
at once (each group's envs with the same task id and seed) and stepped in lockstep: every turn,
the policy's agents answer all episodes still running with one batched generation, and the
vector env steps them. Autoreset is off, so an env whose episode ended waits (its further
steps are answered with the episode-over feedback and ignored) until every episode of the
batch has ended.

Each step becomes a :class:`StepSample` holding what the losses need (the token ids and the
log-probabilities the generation returned; the loop replaces the latter by the training forward
pass's own before it optimises, see :meth:`~envrl.training.loop.Trainer.score_old_policy`) and what the advantages need (reward, validity,
group, trajectory, step index, anchor observation), plus the policy's own view of the state for
the auxiliary world-model losses (ENVRL's SP and ID): the task instruction the prompt showed
and ``history``, the past turns of the trajectory that the prompt showed (the last
``policy.config.history`` ones, oldest first; the same :class:`~envrl.agents.prompts.Turn`
objects the agent's conversation holds, so storing them costs references, not copies), and
``messages``, the prompt messages themselves (ENVRL's default prompts continue them).

An env whose worker dies mid-episode is replaced by the vector env; its trajectory is dropped
from the batch (counted in ``RolloutBatch.dropped``), since a cut episode has no honest return.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envrl.agents.base import act_batch
from envrl.agents.generation import Message
from envrl.agents.prompts import Turn


@dataclass
class StepSample:
    """One env step of one trajectory (see the module docstring)."""

    prompt_ids: list[int]
    response_ids: list[int]  # with the end-of-turn token when the response ended by itself
    # per response token, or [choice log-prob] in choose mode: the sampler's values until the loop's
    # old-policy pass overwrites them with the training forward pass's (the PPO ratio's denominator)
    old_logprobs: list[float]
    candidate_ids: list[list[int]] | None  # choose mode: every candidate's tokens
    choice: int | None  # choose mode: the chosen candidate
    action: str
    reward: float
    observation: str  # what the policy acted on
    next_observation: str
    anchor: str  # the env's observation at this step, without history (GiGPO's anchor state)
    valid: bool  # the response gave a parseable action (format-valid)
    env_valid: bool  # the env accepted the action
    done: bool  # terminated
    truncated: bool
    group_id: int
    trajectory_id: int
    step: int
    task_id: str
    advantage: float = 0.0
    instruction: str = ""  # the task as the policy's prompt showed it (the env's info["instruction"])
    history: list[Turn] = field(default_factory=list)  # the past turns the policy's prompt showed, oldest first
    messages: list[Message] = field(default_factory=list)  # the policy's prompt messages (before tokenising)
    # what the sampler reported, kept when the old-policy pass replaces ``old_logprobs`` (to log the gap)
    rollout_logprobs: list[float] | None = None
    # the KL reference's log-probs of the same units, from the old-policy pass (None: not scored yet)
    ref_logprobs: list[float] | None = None


@dataclass
class Trajectory:
    """One episode's outcome."""

    group_id: int
    trajectory_id: int
    task_id: str
    seed: int
    turns: int = 0
    total_reward: float = 0.0
    success: bool = False
    score: float = 0.0
    dropped: str | None = None  # why the trajectory was dropped (its worker died)


@dataclass
class RolloutBatch:
    samples: list[StepSample] = field(default_factory=list)
    trajectories: list[Trajectory] = field(default_factory=list)

    @property
    def kept(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t.dropped is None]

    @property
    def dropped(self) -> int:
        return sum(t.dropped is not None for t in self.trajectories)

    def metrics(self) -> dict[str, float]:
        """Success rate, return, turns (all and successful), valid-action ratios, drops."""
        kept = self.kept
        wins = [t for t in kept if t.success]
        return {
            "success_rate": _mean([t.success for t in kept]),
            "return": _mean([t.total_reward for t in kept]),
            "score": _mean([t.score for t in kept]),
            "turns": _mean([t.turns for t in kept]),
            "turns_success": _mean([t.turns for t in wins]),
            "format_valid_ratio": _mean([s.valid for s in self.samples]),
            "valid_action_ratio": _mean([s.env_valid for s in self.samples]),
            "trajectories": float(len(kept)),
            "dropped_trajectories": float(self.dropped),
            "samples": float(len(self.samples)),
        }


def _mean(values: Sequence[float | bool]) -> float:
    return float(np.mean(values)) if len(values) else 0.0


class GroupRollout:
    """Plays batches of ``groups x group_size`` episodes with a policy's agents on a vector env.

    ``vector_env`` is a :class:`~envrl.envs.vector.TextVectorEnv` made with
    ``autoreset=False`` and ``groups * group_size`` envs; ``agents`` as many agents (a
    policy's, which answer together).
    """

    def __init__(self, vector_env: Any, agents: Sequence[Any], groups: int, group_size: int) -> None:
        if vector_env.num_envs != groups * group_size or len(agents) != vector_env.num_envs:
            raise ValueError(
                f"{groups} groups of {group_size} need {groups * group_size} envs and agents, "
                f"got {vector_env.num_envs} envs and {len(agents)} agents"
            )
        if getattr(vector_env, "autoreset", True):
            raise ValueError("rollouts need a vector env made with autoreset=False")
        self.vec = vector_env
        self.agents = list(agents)
        self.groups = groups
        self.group_size = group_size

    def collect(self, tasks: Sequence[tuple[str, int]], agent_seed: int) -> RolloutBatch:
        """Play one batch: group ``k`` plays ``tasks[k] = (task_id, env_seed)`` on its G envs;
        agent ``i`` is reset with seed ``agent_seed + i`` (so the G members sample differently)."""
        if len(tasks) != self.groups:
            raise ValueError(f"expected {self.groups} (task_id, seed) pairs, got {len(tasks)}")
        n = self.vec.num_envs
        seeds = [int(tasks[i // self.group_size][1]) for i in range(n)]
        options = [{"task_id": tasks[i // self.group_size][0]} for i in range(n)]
        observations, infos = self.vec.reset(seed=seeds, options=options)
        env_infos = [_info_of(infos, i) for i in range(n)]
        batch = RolloutBatch(
            trajectories=[
                Trajectory(i // self.group_size, i, tasks[i // self.group_size][0], seeds[i]) for i in range(n)
            ]
        )
        for i, agent in enumerate(self.agents):
            agent.reset(seed=agent_seed + i)
        running = [True] * n
        steps: list[list[StepSample]] = [[] for _ in range(n)]
        while any(running):
            active = [i for i in range(n) if running[i]]
            chosen = act_batch(
                [self.agents[i] for i in active], [observations[i] for i in active], [env_infos[i] for i in active]
            )
            actions = [""] * n  # ended episodes answer any action with the episode-over feedback
            for i, action in zip(active, chosen):
                actions[i] = action
            next_observations, rewards, terminated, truncated, step_infos = self.vec.step(actions)
            for i in active:
                info = _info_of(step_infos, i)
                trajectory = batch.trajectories[i]
                if info.get("worker_restarted"):
                    trajectory.dropped = str(info.get("error", "worker restarted"))
                    running[i] = False
                    continue
                outcome = (next_observations[i], rewards[i], terminated[i], truncated[i], info)
                instruction = str(env_infos[i].get("instruction", ""))  # the info the agent acted on
                sample = self._sample(i, trajectory.task_id, observations[i], outcome, len(steps[i]), instruction)
                steps[i].append(sample)
                trajectory.turns += 1
                trajectory.total_reward += float(rewards[i])
                trajectory.success = bool(info.get("success", False))
                trajectory.score = float(info.get("score", 0.0))
                if terminated[i] or truncated[i]:
                    running[i] = False
                env_infos[i] = info
            observations = next_observations
        for i in range(n):
            if batch.trajectories[i].dropped is None:
                batch.samples.extend(steps[i])
        return batch

    def _sample(
        self,
        i: int,
        task_id: str,
        observation: str,
        outcome: tuple[str, float, bool, bool, Mapping[str, Any]],
        step: int,
        instruction: str,
    ) -> StepSample:
        """Env ``i``'s step: what its agent generated and what the env answered (``outcome``)."""
        next_observation, reward, terminated, truncated, info = outcome
        agent = self.agents[i]
        conversation = agent.conversation
        # the turn just played is the conversation's last; its prompt showed the window before it
        window = conversation.history
        history = list(conversation.turns[:-1][-window:]) if window else []
        generation = agent.last_generation
        step_info = agent.step_info or {}
        if generation is None or generation.token_ids is None or generation.error is not None:
            prompt, response, logprobs = [], [], []  # a failed generation: nothing to learn from
        else:
            prompt = list(generation.prompt_token_ids or [])
            response = list(generation.token_ids)
            logprobs = (
                [float(generation.choice_logprob or 0.0)]
                if generation.choice is not None
                else list(generation.token_logprobs or [])
            )
        return StepSample(
            prompt_ids=prompt,
            response_ids=response,
            old_logprobs=logprobs,
            candidate_ids=None if generation is None else generation.candidate_token_ids,
            choice=None if generation is None else generation.choice,
            action=str(conversation.turns[-1].action) if conversation.turns else "",
            reward=float(reward),
            observation=str(observation),
            next_observation=str(next_observation),
            anchor=str(observation),
            valid=bool(step_info.get("format_valid", False)) and bool(response),
            env_valid=bool(info.get("valid_action", True)),
            done=bool(terminated),
            truncated=bool(truncated),
            group_id=i // self.group_size,
            trajectory_id=i,
            step=step,
            task_id=task_id,
            instruction=instruction,
            history=history,
            messages=list(agent.last_messages),
        )

    def close(self) -> None:
        self.vec.close()


def _info_of(infos: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Env ``index``'s own info from a vector env's batched info (keys it has, by their ``_key`` masks)."""
    out: dict[str, Any] = {}
    for key, values in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[index]:
            continue
        # Gymnasium batches a dict value (final_info) as a dict of batched values
        out[key] = _info_of(values, index) if isinstance(values, Mapping) else values[index]
    return out
