"""LLM agents: a prompt template, a window of recent turns, one parser, and a generation back end.

``hf:<model path or name>`` runs a transformers model in the agent's process
(:class:`~envrl.agents.hf.HFBackend`); ``openai:<model>[@<base_url>]`` calls any
OpenAI-compatible server (:class:`~envrl.agents.openai_backend.OpenAIBackend`: vLLM,
llama.cpp, ``envrl serve-model``, a hosted API).

One :class:`LLMAgent` plays one episode at a time. Agents that play side by side in one
process share a back end (:meth:`LLMAgent.sibling`), and :func:`envrl.agents.base.act_batch`
(through the :class:`~envrl.agents.base.BatchedAgent` protocol) asks it for all their responses
in one call: one batched ``generate`` for a transformers model,
concurrent requests for a server.

Each turn the agent records ``step_info`` (the raw response, its reasoning, whether the format
was valid and why not, token counts, latency, and the server's error when a request failed
after its retries). A format-invalid or failed response becomes the empty action, which the
env answers with its invalid-action feedback: the episode goes on and the step is counted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from envrl.agents.choose import CHOOSE_SCORES
from envrl.agents.generation import Backend, Generation, Message, SamplingConfig
from envrl.agents.prompts import DEFAULT_TEMPLATE, Conversation, PromptTemplate, load_template, parse_response

#: the action sent when a response had no usable action
NO_ACTION = ""
#: how an LLM agent picks its action (see :mod:`envrl.agents.choose` for "choose")
ACTION_MODES = ("generate", "choose")


@dataclass(frozen=True)
class LLMOptions:
    """Agent-side settings of an LLM run (``envrl eval`` flags); all of them are recorded."""

    template: str = DEFAULT_TEMPLATE
    history: int = 2
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    #: "generate" (write a response, parse its action) or "choose" (score the admissible actions; hf: only)
    action_mode: str = "generate"
    #: choose mode: a candidate's score is its summed ("sum") or mean ("mean") token log-prob
    choose_score: str = "sum"
    #: the agent's name on the leaderboard (default: its spec), e.g. a training checkpoint's name
    name: str | None = None
    #: back-end settings: hf: device, dtype, max_batch_size; openai: max_concurrency, timeout, max_retries
    backend: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.history, int) or self.history < 0:
            raise ValueError(f"history must be an integer >= 0, got {self.history!r}")
        if self.action_mode not in ACTION_MODES:
            raise ValueError(f"action_mode must be one of {', '.join(ACTION_MODES)}, got {self.action_mode!r}")
        if self.choose_score not in CHOOSE_SCORES:
            raise ValueError(f"choose_score must be one of {', '.join(CHOOSE_SCORES)}, got {self.choose_score!r}")

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> LLMOptions:
        """From flat options (as the CLI and ``run_evaluation(agent_options=...)`` pass them)."""
        options = dict(options or {})
        sampling_keys = ("temperature", "top_p", "max_new_tokens")
        sampling = SamplingConfig(**{k: options.pop(k) for k in sampling_keys if options.get(k) is not None})
        for key in sampling_keys:
            options.pop(key, None)
        template = options.pop("template", None) or DEFAULT_TEMPLATE
        history = options.pop("history", None)
        action_mode = options.pop("action_mode", None) or "generate"
        choose_score = options.pop("choose_score", None) or "sum"
        name = options.pop("name", None)
        return cls(
            template=str(template),
            history=2 if history is None else int(history),
            sampling=sampling,
            action_mode=str(action_mode),
            choose_score=str(choose_score),
            name=None if name is None else str(name),
            backend={k: v for k, v in options.items() if v is not None},
        )


class SharedBackend:
    """A back end built on first use and shared by sibling agents (one model per process)."""

    def __init__(self, factory: Callable[[], Backend], description: Mapping[str, Any]):
        self._factory = factory
        self._backend: Backend | None = None
        self._lock = threading.Lock()
        self.description = dict(description)

    def get(self) -> Backend:
        with self._lock:
            if self._backend is None:
                self._backend = self._factory()
            return self._backend

    def protocol(self) -> dict[str, Any]:
        """The back end's own record once it is built (e.g. the weights' fingerprint), else
        what is known from the spec."""
        if self._backend is not None:
            return dict(self._backend.protocol())
        return dict(self.description)

    def close(self) -> None:
        with self._lock:
            if self._backend is not None:
                self._backend.close()
                self._backend = None


class LLMAgent:
    """An agent that asks a language model for each action (see the module docstring)."""

    def __init__(
        self,
        name: str,
        env_name: str,
        backend: SharedBackend,
        options: LLMOptions,
        template: PromptTemplate | None = None,
        owns_backend: bool = True,
    ):
        self.name = name
        self.env_name = env_name
        self.shared = backend
        self.options = options
        self.template = template or load_template(options.template)
        self.env_kwargs: dict[str, Any] = {}
        self.step_info: dict[str, Any] | None = None
        #: the latest response with its token ids and log-probs (what a trainer learns from)
        self.last_generation: Generation | None = None
        #: the prompt messages of the latest turn (ENVRL's follow-up prompts continue them)
        self.last_messages: list[Message] = []
        self.conversation = Conversation(self.template, env_name, options.history)
        self._seed: int | None = None
        #: whether close() releases the back end (siblings, and a trainer's agents, leave it to its owner)
        self.owns_backend = owns_backend
        self.reset()

    # ---- the Agent protocol -----------------------------------------------------------

    def reset(self, seed: int | None = None) -> None:
        self.conversation.reset()
        self._seed = seed
        self.step_info = None
        self.last_generation = None
        self.last_messages = []
        self.stats = {
            "responses": 0,
            "format_invalid": 0,
            "failed_requests": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
        }

    def act(self, observation: str, info: dict[str, Any]) -> str:
        return act_together([self], [observation], [info])[0]

    def act_together(
        self, agents: Sequence[LLMAgent], observations: Sequence[str], infos: Sequence[Mapping[str, Any]]
    ) -> list[str]:
        """The :class:`~envrl.agents.base.BatchedAgent` protocol: see :func:`act_together`."""
        return act_together(agents, observations, infos)

    def sibling(self) -> LLMAgent:
        """Another agent with the same settings and the same (shared) back end."""
        return LLMAgent(self.name, self.env_name, self.shared, self.options, self.template, owns_backend=False)

    def close(self) -> None:
        if self.owns_backend:
            self.shared.close()

    # ---- what runs record -------------------------------------------------------------

    def protocol(self) -> dict[str, Any]:
        """The agent-side protocol: template (name and content hash), history window,
        sampling settings and the back end."""
        return {
            "agent": self.name,
            "template": self.template.name,
            "template_sha256": self.template.sha256,
            "history": self.options.history,
            "action_mode": self.options.action_mode,
            **({"choose_score": self.options.choose_score} if self.options.action_mode == "choose" else {}),
            "sampling": self.options.sampling.to_dict(),
            "backend": self.shared.protocol(),
        }

    def episode_stats(self) -> dict[str, Any]:
        """Counts over the current episode: responses, format-invalid ones, failed requests, tokens."""
        return dict(self.stats)

    # ---- one turn, in two halves (so that many agents can share one generate call) ---

    def prepare(self, observation: str, info: Mapping[str, Any]) -> list[Message]:
        self.last_messages = self.conversation.messages(observation, info)
        return self.last_messages

    def complete(self, observation: str, generation: Generation) -> str:
        self.last_generation = generation
        parsed = parse_response(generation.text, self.template.require_think)
        action = parsed.action if parsed.action is not None else NO_ACTION
        self.stats["responses"] += 1
        self.stats["format_invalid"] += int(not parsed.format_valid)
        self.stats["failed_requests"] += int(generation.error is not None)
        self.stats["prompt_tokens"] += generation.prompt_tokens
        self.stats["completion_tokens"] += generation.completion_tokens
        self.step_info = {
            "response": generation.text,
            "think": parsed.think,
            "format_valid": parsed.format_valid,
            "format_problem": parsed.problem,
            "finish_reason": generation.finish_reason,
            "prompt_tokens": generation.prompt_tokens,
            "completion_tokens": generation.completion_tokens,
            "latency": round(generation.latency, 4),
            "attempts": generation.attempts,
        }
        if generation.choice is not None:
            self.step_info["choice_logprob"] = generation.choice_logprob
        if generation.error is not None:
            self.step_info["error"] = generation.error
        self.conversation.record(observation, action, parsed.think or "")
        return action

    def candidates(self, info: Mapping[str, Any]) -> list[str]:
        """``choose`` mode: the responses to score, one per admissible action, in the template's format."""
        return [self.template.format_response(str(a)) for a in info.get("admissible_actions", []) or []]

    def sampling_for_step(self) -> SamplingConfig:
        """This turn's sampling settings: with sampling on and a seeded episode, the seed
        follows (episode seed, turn), so a run repeats with the same batch layout."""
        sampling = self.options.sampling
        if sampling.temperature > 0 and sampling.seed is None and self._seed is not None:
            sampling = replace(sampling, seed=(self._seed * 1_000_003 + self.conversation.turn) % 2**31)
        return sampling


def act_together(
    agents: Sequence[LLMAgent], observations: Sequence[str], infos: Sequence[Mapping[str, Any]]
) -> list[str]:
    """One action per agent; agents sharing a back end are answered by one ``generate`` call
    per distinct sampling setting (greedy agents always share one)."""
    actions: list[str | None] = [None] * len(agents)
    groups: dict[tuple[int, SamplingConfig], list[int]] = {}
    prompts: list[list[Message]] = []
    samplings: list[SamplingConfig] = []
    for i, (agent, observation, info) in enumerate(zip(agents, observations, infos)):
        prompts.append(agent.prepare(observation, info))
        samplings.append(agent.sampling_for_step())
        key = replace(samplings[i], seed=None) if samplings[i].temperature > 0 else samplings[i]
        groups.setdefault((id(agent.shared), key), []).append(i)
    for (_, sampling), members in groups.items():
        seeds = None
        if sampling.temperature > 0:  # per-prompt seeds where the back end takes them, else one per call
            seeds = [samplings[i].seed for i in members]
            sampling = replace(sampling, seed=sum(seed or 0 for seed in seeds) % 2**31)
        backend = agents[members[0]].shared.get()
        if agents[members[0]].options.action_mode == "choose":
            candidates = [agents[i].candidates(infos[i]) for i in members]
            score = agents[members[0]].options.choose_score
            generations = _choose(backend, [prompts[i] for i in members], candidates, sampling, seeds, score)
        else:
            generations = backend.generate([prompts[i] for i in members], sampling, seeds=seeds)
        if len(generations) != len(members):
            raise RuntimeError(
                f"back end {backend.model} returned {len(generations)} responses for {len(members)} prompts"
            )
        for i, generation in zip(members, generations):
            actions[i] = agents[i].complete(observations[i], generation)
    return [a if a is not None else NO_ACTION for a in actions]


def _choose(
    backend: Backend,
    prompts: Sequence[Sequence[Message]],
    candidates: Sequence[Sequence[str]],
    sampling: SamplingConfig,
    seeds: Sequence[int | None] | None,
    score: str,
) -> list[Generation]:
    choose = getattr(backend, "choose", None)
    if not callable(choose):
        raise ValueError(f"back end {backend.model} cannot score actions: choose mode needs an hf: model")
    return list(choose(prompts, candidates, sampling, seeds=seeds, score=score))


# ---- building agents from specs -----------------------------------------------------------


def _hf_backend(model: str, options: LLMOptions) -> SharedBackend:
    """A transformers model, loaded in each process on first use; a local path that does not
    exist fails now (a hub name cannot be checked without loading it)."""
    from pathlib import Path

    if model.startswith(("/", "./", "../", "~")) and not Path(model).expanduser().exists():
        raise ValueError(f"no checkpoint at {model}")

    from envrl.agents.hf import weights_fingerprint

    def build() -> Backend:
        from envrl.agents.hf import HFBackend

        return HFBackend(model, **dict(options.backend))

    description = {
        "backend": "hf",
        "model": model,
        "weights_sha256": weights_fingerprint(model),
        **dict(options.backend),
    }
    return SharedBackend(build, description)


def _openai_backend(model_and_url: str, options: LLMOptions) -> SharedBackend:
    from envrl.agents.openai_backend import OpenAIBackend, parse_openai_spec

    model, base_url = parse_openai_spec(model_and_url)
    backend = OpenAIBackend(model, base_url, **dict(options.backend))  # cheap: checks the key and URL now
    shared = SharedBackend(lambda: backend, backend.protocol())
    shared.get()
    return shared


def make_llm_agent(spec: str, env_name: str | None, options: Mapping[str, Any] | None = None) -> LLMAgent:
    """``hf:<model>`` or ``openai:<model>[@<base_url>]`` with flat ``options`` (template, history,
    temperature, top_p, max_new_tokens and back-end settings)."""
    kind, _, target = spec.partition(":")
    if not target:
        raise ValueError(f"agent {spec!r} needs a model: {kind}:<model>")
    llm_options = LLMOptions.from_mapping(options)
    template = load_template(llm_options.template)
    if kind not in ("hf", "openai"):
        raise ValueError(f"unknown LLM agent kind {kind!r}")
    if llm_options.action_mode == "choose" and kind != "hf":
        raise ValueError(
            "action mode 'choose' scores the admissible actions with the model's own log-probabilities: it needs an hf: agent"
        )
    shared = _hf_backend(target, llm_options) if kind == "hf" else _openai_backend(target, llm_options)
    name = llm_options.name or _default_name(spec, template.name, llm_options.action_mode)
    return LLMAgent(name, env_name or "default", shared, llm_options, template)


def _default_name(spec: str, template: str, action_mode: str) -> str:
    """The spec, plus the template and the action mode where they are not the defaults."""
    tags = [
        t for t in (template if template != DEFAULT_TEMPLATE else "", "choose" if action_mode == "choose" else "") if t
    ]
    return f"{spec}[{','.join(tags)}]" if tags else spec
