"""World-model probes (``envrl probe``): how well a policy's model predicts its environment.

ENVRL and IWM train the policy's own model on the env's dynamics; success rate says whether
that helped the policy, not whether the model learnt the dynamics. A probe measures the
latter on transitions ``(s_t, a_t, s_{t+1})`` the model was not trained on.

Transitions. The env's expert (:func:`~envrl.training.data.default_agent`, what
``envrl data expert`` plays) plays ``episodes`` episodes of the split; episode ``i`` plays
task ``task_ids[i % n]`` with seed ``seed + i``, the rule of evaluation runs, so the same
arguments give the same transitions. Every step that does not end its episode is kept, with
the task instruction, the episode's earlier turns as the policy sees them (observation,
action) and the admissible actions at ``s_t``; a step that ends the episode (terminated or
truncated) is left out, because what the env answers then is an end-of-game message rather
than the next state. Failed expert episodes are kept too: their transitions are as real.

State prediction (SP), on the world-model template (:mod:`envrl.training.dynamics`), with the
prompts and targets of the SP/IWM loss (:func:`~envrl.training.dynamics.state_prediction_sample`,
history window ``--history``):

* token accuracy: with the target ``s_{t+1}`` given (teacher forcing), the share of its tokens
  (and the end-of-turn token after them) that are the model's greedy next-token prediction,
  over all tokens of all transitions;
* exact match: the share of transitions whose greedy generation (at most the target's length
  plus :data:`EXACT_MATCH_MARGIN` tokens) equals ``s_{t+1}`` once whitespace is normalised
  (:func:`normalise_whitespace`).

Inverse dynamics (ID), on the inverse-dynamics template: every candidate action is scored as
the response to ``(s_t, s_{t+1})``, written in the policy template's response format (as
``choose`` mode writes candidates), by its mean token log-probability (length-normalised, so
long actions are not penalised for their length; :func:`~envrl.agents.choose.candidate_scores`
with ``score="mean"``, the prompt computed once for all candidates). The candidates are
the admissible actions at ``s_t``, each once (compared lowercased with whitespace collapsed),
plus the expert's action where the list lacks it (WebShop lists ``search[<query>]``, not the
query searched). Top-1 accuracy counts the argmax; candidates tied for the best score share
the credit (the expected accuracy of breaking ties at random), so a scorer that cannot tell
them apart scores exactly the chance level, the mean of ``1 / len(candidates)``, which is
reported beside it. The scorer is any function from (prompt messages, candidate responses)
to scores (:data:`Scorer`); the model's is :class:`ModelScorer`.

A follow-up template (:mod:`envrl.training.dynamics`; ENVRL's default prompts) asks its question
after the policy's own prompt at ``s_t``, rebuilt from the transition as the policy's agent builds
it on that turn (the policy template, the last ``--history`` turns, the admissible actions:
:meth:`~envrl.agents.prompts.PromptTemplate.messages_at`).

Prompts longer than the model's context lose their start, as agents' prompts do (the target or
the candidates always fit); how many teacher-forced SP and ID prompts did is recorded with the
probe (``config["truncated_prompts"]``); the back end logs those it cuts for generation.

Results go to the runs directory's store (:meth:`~envrl.evaluation.store.ResultStore.write_probe`):
``envrl leaderboard`` and ``envrl serve`` show them beside success and turns. The agent name
defaults to the label ``envrl eval --agent hf:CHECKPOINT --template T`` gives its runs, so the
probe lands in their row; ``--name`` names any other row (a training run's ``<run>@<update>``).
The same (agent, env, split, seed, episodes) probed again replaces the stored probe.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envrl.envs import add_env_arg_option, parse_env_args

if TYPE_CHECKING:
    from envrl.agents.generation import Message
    from envrl.agents.prompts import PromptTemplate, Turn
    from envrl.evaluation.store import ProbeRecord
    from envrl.training.dynamics import AnyWorldModelTemplate, TargetSample
    from envrl.training.policy import Policy

#: the policy's prompt template (its response format writes the ID candidates); training's default
DEFAULT_TEMPLATE = "action"
DEFAULT_HISTORY = 2
DEFAULT_EPISODES = 10
#: tokens a greedy SP generation may run past its target's length
EXACT_MATCH_MARGIN = 8
#: transitions per forward (SP token accuracy) or per generate call (SP exact match)
DEFAULT_BATCH_SIZE = 8

#: (prompt messages, candidate responses) -> one score per candidate, higher is likelier
Scorer = Callable[[Sequence["Message"], Sequence[str]], Sequence[float]]


# ---- transitions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    """One expert step ``(s_t, a_t, s_{t+1})`` with what a prompt shows of ``s_t``."""

    episode: int
    step: int
    task_id: str
    instruction: str
    history: tuple[Turn, ...]  # the episode's earlier turns, oldest first (templates cut their window)
    observation: str
    action: str
    next_observation: str
    admissible_actions: tuple[str, ...]


def collect_transitions(
    env: str,
    split: str,
    episodes: int,
    *,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    agent: str | None = None,
) -> list[Transition]:
    """The transitions of ``episodes`` expert episodes of ``split`` (see the module docstring).

    ``agent``: an expert spec (default :func:`~envrl.training.data.default_agent`). The env is
    ``gym.make(env_id, split=split, **expert.env_kwargs, **env_kwargs)``. ValueError (one
    sentence) for an unknown env or split, or episodes < 1.
    """
    from envrl.agents.prompts import Conversation, Turn, load_template
    from envrl.training.data import DEFAULT_TEMPLATE, ExpertPlay

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    transitions: list[Transition] = []
    with ExpertPlay(env, split, agent=agent, seed=seed, env_kwargs=env_kwargs) as play:
        # the prompts play_episode builds are not used: the probes build their own
        conversation = Conversation(load_template(DEFAULT_TEMPLATE), play.name, 0)
        for i, rows, _ in play.episodes(episodes, conversation):
            history: list[Turn] = []
            for row in rows:
                if not row["done"]:
                    transitions.append(
                        Transition(
                            episode=i,
                            step=int(row["step"]),
                            task_id=row["task_id"],
                            instruction=row["instruction"],
                            history=tuple(history),
                            observation=row["observation"],
                            action=row["action"],
                            next_observation=row["next_observation"],
                            admissible_actions=tuple(row["admissible_actions"]),
                        )
                    )
                history.append(Turn(observation=row["observation"], action=row["action"]))
    return transitions


def state_messages(
    policy_template: PromptTemplate, env_name: str, transition: Transition, history: int
) -> list[Message]:
    """The policy's prompt messages at ``s_t``, as its agent builds them on that turn: what a
    follow-up template continues."""
    t = transition
    return policy_template.messages_at(
        env_name, t.instruction, t.observation, list(t.admissible_actions), t.history, history
    )


# ---- inverse dynamics -------------------------------------------------------------------------


@dataclass(frozen=True)
class InverseDynamicsResult:
    """Top-1 accuracy and its chance level over ``count`` transitions (None when there are none)."""

    accuracy: float | None
    chance: float | None
    count: int


def id_candidates(transition: Transition) -> tuple[list[str], int]:
    """The actions an ID probe scores at ``transition`` and the index of the true one: the
    admissible actions, each once (compared lowercased, whitespace collapsed), then the true
    action where none of them is it."""
    from envrl.training.early_experience import normalise

    candidates: list[str] = []
    seen: set[str] = set()
    for action in transition.admissible_actions:
        key = normalise(action)
        if key not in seen:
            seen.add(key)
            candidates.append(str(action))
    truth = normalise(transition.action)
    keys = [normalise(c) for c in candidates]
    if truth not in keys:
        candidates.append(transition.action)
        return candidates, len(candidates) - 1
    return candidates, keys.index(truth)


def inverse_dynamics_probe(
    transitions: Sequence[Transition],
    template: AnyWorldModelTemplate,
    policy_template: PromptTemplate,
    scorer: Scorer,
    *,
    history: int,
    env_name: str = "",
) -> InverseDynamicsResult:
    """Score each transition's candidates (:func:`id_candidates`) as responses to its
    inverse-dynamics prompt; top-1 accuracy (ties share the credit) and the chance level."""
    from envrl.training.dynamics import inverse_dynamics_messages

    hits = chance = 0.0
    for t in transitions:
        candidates, truth = id_candidates(t)
        state = (t.instruction, t.history, t.observation, t.next_observation)
        policy_messages = state_messages(policy_template, env_name, t, history)
        messages = inverse_dynamics_messages(template, policy_template, history, *state, policy_messages)
        scores = [float(v) for v in scorer(messages, [policy_template.format_response(a) for a in candidates])]
        if len(scores) != len(candidates):
            raise ValueError(f"the scorer gave {len(scores)} scores for {len(candidates)} candidates")
        best = max(scores)
        tied = [i for i, value in enumerate(scores) if value == best]
        hits += (truth in tied) / len(tied)
        chance += 1 / len(candidates)
    if not transitions:
        return InverseDynamicsResult(None, None, 0)
    return InverseDynamicsResult(hits / len(transitions), chance / len(transitions), len(transitions))


# ---- state prediction -------------------------------------------------------------------------


def normalise_whitespace(text: str) -> str:
    """How an SP generation is compared with the next observation: runs of whitespace (spaces,
    newlines, tabs) as one space, none at either end."""
    return " ".join(str(text).split())


def exact_match(generated: str, target: str) -> bool:
    """Whether ``generated`` is ``target`` up to whitespace (:func:`normalise_whitespace`)."""
    return normalise_whitespace(generated) == normalise_whitespace(target)


def teacher_forced_hits(
    model: Any, samples: Sequence[TargetSample], pad_id: int, *, batch_size: int = DEFAULT_BATCH_SIZE
) -> list[int]:
    """For each sample, how many of its response tokens are the model's argmax prediction
    given the prompt and the response tokens before it (one right-padded forward per batch;
    causal attention keeps the padding out of every real position)."""
    import torch

    device = next(model.parameters()).device
    hits: list[int] = []
    for start in range(0, len(samples), batch_size):
        chunk = samples[start : start + batch_size]
        width = max(len(s.prompt_ids) + len(s.response_ids) for s in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long, device=device)
        attention = torch.zeros((len(chunk), width), dtype=torch.long, device=device)
        for row, s in enumerate(chunk):
            tokens = list(s.prompt_ids) + list(s.response_ids)
            ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long, device=device)
            attention[row, : len(tokens)] = 1
        with torch.inference_mode():
            predicted = model(input_ids=ids, attention_mask=attention).logits.argmax(dim=-1)
        for row, s in enumerate(chunk):
            first, count = len(s.prompt_ids), len(s.response_ids)
            # position p predicts token p + 1
            guesses = predicted[row, first - 1 : first - 1 + count]
            hits.append(int((guesses == ids[row, first : first + count]).sum()))
    return hits


def fit_prompt(prompt_ids: Sequence[int], reserved: int, context_length: int | None) -> list[int]:
    """``prompt_ids`` without as many leading tokens as it takes for ``reserved`` more tokens
    to fit ``context_length`` (at least one prompt token is kept); unchanged without a limit."""
    ids = list(prompt_ids)
    if context_length is None or len(ids) + reserved <= context_length:
        return ids
    return ids[-max(1, context_length - reserved) :]


# ---- the model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeResult:
    """What one probe measured (fractions in [0, 1]; None when there was nothing to measure)."""

    transitions: int
    sp_token_accuracy: float | None
    sp_exact_match: float | None
    id_accuracy: float | None
    id_chance: float | None
    truncated_prompts: int


class ModelScorer:
    """The ID scorer of a policy's model: each candidate's mean token log-probability (its
    tokens plus the end-of-turn token) given the prompt, the prompt run once for all of them."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.truncated = 0

    def __call__(self, messages: Sequence[Message], responses: Sequence[str]) -> list[float]:
        import torch

        from envrl.agents.choose import candidate_scores, score_candidates

        options = [self.policy.encode_response(r) for r in responses]
        full = self.policy.encode_prompt(messages)
        prompt = fit_prompt(full, max(len(o) for o in options), self.policy.backend.context_length)
        self.truncated += len(prompt) < len(full)
        with torch.inference_mode():
            token_logprobs = score_candidates(self.policy.unwrapped, prompt, options, self.policy.backend.pad_id)
            return [float(v) for v in candidate_scores(token_logprobs, options, "mean").tolist()]


def state_prediction_probe(
    policy: Policy,
    transitions: Sequence[Transition],
    template: AnyWorldModelTemplate,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> tuple[float | None, float | None, int]:
    """SP token accuracy, exact-match rate and the number of prompts cut to fit the context."""
    from envrl.training.dynamics import TargetSample, state_prediction_messages, state_prediction_sample

    if not transitions:
        return None, None, 0
    context = policy.backend.context_length
    history = policy.config.history
    samples, messages, truncated = [], [], 0
    for t in transitions:
        # the loss's own sample (prompt and target) and, for the greedy generation, its messages
        state = (t.instruction, t.history, t.observation, t.action)
        policy_messages = state_messages(policy.template, policy.env_name, t, history)
        sample = state_prediction_sample(policy, template, *state, t.next_observation, state_messages=policy_messages)
        messages.append(state_prediction_messages(template, policy.template, history, *state, policy_messages))
        prompt = fit_prompt(sample.prompt_ids, len(sample.response_ids), context)
        truncated += len(prompt) < len(sample.prompt_ids)
        samples.append(TargetSample(prompt, sample.response_ids, sample.kind))
    hits = teacher_forced_hits(policy.unwrapped, samples, policy.backend.pad_id, batch_size=batch_size)
    token_accuracy = sum(hits) / sum(len(s.response_ids) for s in samples)
    limits = [len(s.response_ids) + EXACT_MATCH_MARGIN for s in samples]
    generated = _greedy(policy, messages, limits, batch_size)
    matches = sum(exact_match(text, t.next_observation) for text, t in zip(generated, transitions))
    return token_accuracy, matches / len(transitions), truncated


def _greedy(policy: Policy, prompts: Sequence[Sequence[Message]], limits: Sequence[int], batch_size: int) -> list[str]:
    """Each prompt's greedy continuation of at most its limit's tokens, decoded without the end
    token. Prompts go in batches of similar limits, generated to the batch's largest: greedy
    decoding does not depend on the batch (:mod:`envrl.agents.hf`), so a continuation cut to its
    own limit is the one that limit would have given."""
    from envrl.agents.generation import SamplingConfig

    texts = [""] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: limits[i])
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        sampling = SamplingConfig(temperature=0.0, max_new_tokens=max(limits[i] for i in chunk))
        for i, generation in zip(chunk, policy.backend.generate([prompts[i] for i in chunk], sampling)):
            if generation.error:
                raise RuntimeError(f"generation failed: {generation.error}")
            tokens = generation.token_ids or []
            # past its own limit a continuation has not stopped yet: its first tokens hold no end token
            texts[i] = (
                generation.text
                if len(tokens) <= limits[i]
                else str(policy.tokenizer.decode(tokens[: limits[i]], skip_special_tokens=True))
            )
    return texts


def probe_model(
    policy: Policy,
    transitions: Sequence[Transition],
    sp_template: AnyWorldModelTemplate,
    id_template: AnyWorldModelTemplate,
    *,
    scorer: Scorer | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> ProbeResult:
    """Both probes of ``policy``'s model on ``transitions``; ``scorer`` replaces the model's ID
    scorer (:class:`ModelScorer`)."""
    policy.train_mode(False)
    sp_accuracy, sp_exact, truncated = state_prediction_probe(policy, transitions, sp_template, batch_size=batch_size)
    model_scorer = ModelScorer(policy)
    result = inverse_dynamics_probe(
        transitions,
        id_template,
        policy.template,
        scorer or model_scorer,
        history=policy.config.history,
        env_name=policy.env_name,
    )
    truncated += model_scorer.truncated
    return ProbeResult(len(transitions), sp_accuracy, sp_exact, result.accuracy, result.chance, truncated)


# ---- a probe, end to end ----------------------------------------------------------------------


def check_checkpoint(path: str | Path) -> Path:
    """``path`` if it is a folder holding a transformers model and its tokenizer, else ValueError."""
    from envrl.training.early_experience import TOKENIZER_FILES

    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"checkpoint {path} is not a folder")
    weights = [*folder.glob("*.safetensors"), *folder.glob("pytorch_model*.bin")]
    if not (folder / "config.json").is_file() or not weights:
        raise ValueError(f"checkpoint {path} holds no model (config.json and weights)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"checkpoint {path} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    return folder


def default_agent_name(checkpoint: str | Path, template: str) -> str:
    """The label ``envrl eval --agent hf:CHECKPOINT --template T`` (generate mode) gives its
    runs: the spec, tagged with the template's name unless it is the agents' default."""
    from envrl.agents.prompts import DEFAULT_TEMPLATE as AGENT_DEFAULT_TEMPLATE
    from envrl.agents.prompts import load_template

    spec, name = f"hf:{checkpoint}", load_template(template).name
    return spec if name == AGENT_DEFAULT_TEMPLATE else f"{spec}[{name}]"


def load_probe_templates(sp_template: str, id_template: str) -> tuple[AnyWorldModelTemplate, AnyWorldModelTemplate]:
    """The state-prediction and inverse-dynamics templates; ValueError when one is of the wrong kind."""
    from envrl.training.dynamics import load_world_model_template

    sp, inverse = load_world_model_template(sp_template), load_world_model_template(id_template)
    if sp.kind != "state-prediction":
        raise ValueError(f"world-model template {sp_template!r} is a {sp.kind} template, not state-prediction")
    if inverse.kind != "inverse-dynamics":
        raise ValueError(f"template {id_template!r} is a {inverse.kind} template, not inverse-dynamics")
    return sp, inverse


def run_probe(
    checkpoint: str | Path,
    env: str,
    split: str,
    *,
    episodes: int = DEFAULT_EPISODES,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    template: str = DEFAULT_TEMPLATE,
    history: int = DEFAULT_HISTORY,
    sp_template: str = "world-model",
    id_template: str = "inverse-dynamics",
    name: str | None = None,
    runs_dir: str | Path | None = None,
    device: str = "auto",
    dtype: str = "auto",
    batch_size: int = DEFAULT_BATCH_SIZE,
    scorer: Scorer | None = None,
) -> tuple[ProbeRecord, ProbeResult]:
    """Probe ``checkpoint`` on ``episodes`` expert episodes of ``env``/``split`` and record the
    probe in the store of ``runs_dir``. Checks every input before playing or loading anything:
    ValueError (one sentence) for bad input; RuntimeError when there is nothing to measure."""
    import envrl
    from envrl.agents.hf import weights_fingerprint
    from envrl.agents.prompts import load_template
    from envrl.evaluation.config import resolve_env
    from envrl.evaluation.store import ProbeRecord, ResultStore
    from envrl.training.config import PolicyConfig
    from envrl.training.policy import Policy

    if episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {episodes}")
    if history < 0:
        raise ValueError(f"--history must be >= 0, got {history}")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    check_checkpoint(checkpoint)
    policy_template = load_template(template)
    sp, inverse = load_probe_templates(sp_template, id_template)
    env_name, env_id = resolve_env(env)
    transitions = collect_transitions(env_name, split, episodes, seed=seed, env_kwargs=env_kwargs)
    if not transitions:
        raise RuntimeError(f"the {episodes} expert episode(s) of {env_name}/{split} gave no transition to probe")
    config = PolicyConfig(model=str(checkpoint), template=template, history=history, device=device, dtype=dtype)
    policy = Policy(config, env_name)
    result = probe_model(policy, transitions, sp, inverse, scorer=scorer, batch_size=batch_size)
    record = ProbeRecord(
        agent=name or default_agent_name(checkpoint, template),
        env=env_name,
        split=split,
        seed=seed,
        episodes=episodes,
        transitions=result.transitions,
        sp_token_accuracy=result.sp_token_accuracy,
        sp_exact_match=result.sp_exact_match,
        id_accuracy=result.id_accuracy,
        id_chance=result.id_chance,
        sp_template=sp.name,
        id_template=inverse.name,
        policy_template=policy_template.name,
        envrl_version=envrl.__version__,
        created_at=time.time(),
        config={
            "checkpoint": str(checkpoint),
            "weights_sha256": weights_fingerprint(str(checkpoint)),
            "env_id": env_id,
            "env_kwargs": dict(env_kwargs or {}),
            "history": history,
            "policy_template_sha256": policy_template.sha256,
            "id_score": "mean",
            "exact_match_margin": EXACT_MATCH_MARGIN,
            "truncated_prompts": result.truncated_prompts,
            "dtype": policy.backend.dtype,
        },
    )
    ResultStore(runs_dir).write_probe(record)
    return record, result


# ---- command line -----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``envrl probe``."""
    parser.add_argument("--checkpoint", required=True, help="a transformers checkpoint folder (model and tokenizer)")
    parser.add_argument("--env", required=True, help="env name (e.g. textworld) or gymnasium id")
    parser.add_argument("--split", required=True, help="the held-out split whose expert transitions are probed")
    parser.add_argument(
        "--episodes",
        type=int,
        default=DEFAULT_EPISODES,
        help=f"expert episodes to take transitions from (default {DEFAULT_EPISODES})",
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed; episode i uses seed + i (default 0)")
    add_env_arg_option(parser)
    parser.add_argument(
        "--template",
        default=DEFAULT_TEMPLATE,
        help=f"the policy's prompt template, whose response format writes the ID candidates (default {DEFAULT_TEMPLATE})",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=DEFAULT_HISTORY,
        help=f"past turns the probe prompts show (default {DEFAULT_HISTORY})",
    )
    parser.add_argument(
        "--world-model-template", default="world-model", help="state-prediction template (default world-model)"
    )
    parser.add_argument(
        "--inverse-dynamics-template",
        default="inverse-dynamics",
        help="inverse-dynamics template (default inverse-dynamics)",
    )
    parser.add_argument(
        "--runs-dir",
        default=None,
        help="results directory the probe is recorded in (default $ENVRL_RUNS_DIR or ./runs)",
    )
    parser.add_argument(
        "--name",
        default=None,
        help="the leaderboard row (agent) the probe belongs to (default: what `envrl eval --agent hf:CHECKPOINT "
        "--template T` calls it)",
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 or auto (default auto)")
    parser.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto (default auto)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"transitions per forward or generate call (default {DEFAULT_BATCH_SIZE})",
    )


def run(args: argparse.Namespace) -> int:
    """``envrl probe``: probe, record, print one line. 0 done, 1 nothing to measure or a store
    that cannot be written, 2 bad input."""
    from envrl.evaluation.store import StoreError

    prog = "envrl probe"
    try:
        env_kwargs = parse_env_args(args.env_arg)
        record, result = run_probe(
            args.checkpoint,
            args.env,
            args.split,
            episodes=args.episodes,
            seed=args.seed,
            env_kwargs=env_kwargs,
            template=args.template,
            history=args.history,
            sp_template=args.world_model_template,
            id_template=args.inverse_dynamics_template,
            name=args.name,
            runs_dir=args.runs_dir,
            device=args.device,
            dtype=args.dtype,
            batch_size=args.batch_size,
        )
    except ValueError as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except (RuntimeError, StoreError) as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    print(
        f"{record.agent} on {record.env}/{record.split}: {result.transitions} transitions of {record.episodes} "
        f"episode(s); SP token accuracy {_percent(result.sp_token_accuracy)}, SP exact match "
        f"{_percent(result.sp_exact_match)}, ID accuracy {_percent(result.id_accuracy)} (chance "
        f"{_percent(result.id_chance)}); recorded as {record.probe_id}"
    )
    return 0


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
