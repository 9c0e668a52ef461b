"""Early Experience data (``envrl data early-experience``): what the agent's own actions do in
the expert's states.

Early Experience trains on two parts: the expert's demonstrations, and what happens when,
from an expert state ``s_i``, the agent acts otherwise. For every expert state this builder
takes ``K`` alternative actions ``a_i^j`` (never the expert's ``a_i``), executes each from
``s_i`` and records the next observation ``s_i^j``. Implicit world modelling (IWM) learns to
predict ``s_i^j`` from ``(s_i, a_i^j)``; self-reflection (SR) contrasts the expert's outcome
with the alternatives'.

Reaching a state. envrl's envs are deterministic and have no snapshots, so ``s_i`` is
reached by resetting with the expert episode's task id and seed and replaying the expert's
actions ``a_0..a_{i-1}`` (once per alternative: each one changes the state). The observations
on the way, and the state's own, must equal the recorded ones byte for byte (the row's prompt
shows them); a state where one does not (an edited record, other env settings or version) is
dropped, listed in ``meta.json`` and never guessed at: an edited observation at step ``i``
drops the states ``i`` onwards of its episode. The env is ``gym.make(env_id, split=...,
**env_kwargs)`` with the expert data's env settings (less
:data:`~envrl.training.data.PLAN_KWARGS`, which only add the expert's plan) updated by
``--env-arg``. A state without alternatives (no admissible action) is kept unchecked:
nothing is executed from it.

Alternatives. Actions are compared normalised (lowercase, whitespace collapsed). The paper
samples them from the agent's own initial policy, so that is the default:

* ``policy`` (the default), with ``model=`` / ``--model PATH``, or ``policy:PATH``: a
  transformers checkpoint (the SFT or initial model) scores the state's admissible actions as
  its response to the expert row's prompt and samples one (``choose`` mode of
  :class:`~envrl.agents.hf.HFBackend`, temperature 1); draw ``d`` is seeded by
  ``SeedSequence([seed, episode, step, d])``. Where the sampled action is a pattern with a slot
  (WebShop's search page lists ``search[<query>]``), ``slots="generate"`` (the default) has the
  policy write the slot's text itself: the response is continued after the pattern's head
  (``<action>search[`` with the ``action`` template), sampled at temperature 1 from
  ``torch.manual_seed`` of the same draw seed, for at most :data:`SLOT_TOKENS` tokens, and cut
  at the pattern's closing text (``]``), a line break or a tag (:func:`clean_slot`); so the
  alternative is ``search[<the policy's own query>]``. ``slots="literal"`` sends the pattern as
  listed (which searches for the text ``<query>``). Draws repeating the expert's action or an
  earlier draw, and slots the policy left empty, are dropped (``duplicates_dropped``), until
  ``K`` are found or ``4 K`` were drawn.
* ``admissible``: ``K`` distinct actions drawn uniformly without replacement from the state's
  admissible actions (each listed once; the expert's left out) and sent as listed, with numpy
  ``default_rng([seed, episode, step])``; fewer when fewer exist. ``duplicates_dropped``
  counts list entries repeating an earlier one. A baseline, and the choice where no policy
  checkpoint exists: it must be asked for by name.

Without a checkpoint the default proposer is an error naming both ways out (``--model PATH``
or ``--proposer admissible``), never a silent fall-back to ``admissible``: uniformly random
actions are a different data set (other states' outcomes, another share of invalid actions),
and a folder that says "early experience" should not quietly hold it.

Output folder:

* ``expert.parquet``: a byte copy of the expert rows, so the folder is all a trainer needs;
* ``rollout.parquet``: one row per (state, alternative), sorted by (episode, step,
  alternative); columns in :func:`rollout_features`. ``history`` holds all the expert's
  earlier turns of the episode, oldest first (a trainer cuts its own window with
  :func:`history_window`); ``messages`` is the expert row's prompt at ``s_i``;
* ``meta.json``: the settings (env, split, env_kwargs, expert folder and fingerprints, the
  expert's template and history, k, proposer, seed, the seeding rule, envrl's version; with a
  policy, its weights' fingerprint and ``slots``) and the
  counts: ``states``, ``states_kept``, ``dropped_mismatch`` (task id, episode, step of each
  dropped state), ``alternatives`` (rows), ``short_of_k`` (kept states with fewer than K),
  ``duplicates_dropped``.

The same inputs and seed give the same bytes of ``rollout.parquet``, whatever ``--workers``.

Killed builds. The folder is built in a hidden sibling (``.<name>.partial``) and renamed into
place when complete, so ``--out`` is either absent or whole. Each expert episode's rows go to
a shard there as soon as they are made; running the same command again skips finished shards
(a partial folder of other settings is started over). Running it once the folder exists
returns it unchanged when its settings are the same, and refuses otherwise.

Parallelism: ``--workers N`` processes (``forkserver`` where there is one, else ``spawn``),
each making its own env and taking chunks of expert episodes. Alternatives are proposed in
the calling process (a policy is loaded once), while the workers execute earlier chunks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing as mp
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envrl.envs import add_env_arg_option, parse_env_args
from envrl.training.data import DATA_FILE, META_FILE, PLAN_KWARGS

if TYPE_CHECKING:
    from envrl.agents.prompts import Turn

EXPERT_FILE = "expert.parquet"
ROLLOUT_FILE = "rollout.parquet"
#: what ``--proposer`` takes (``policy``: the checkpoint named by ``--model``)
PROPOSERS = ("policy", "policy:PATH", "admissible")
#: what ``--slots`` takes: the policy writes a pattern's slot text, or sends the pattern as listed
SLOTS = ("generate", "literal")
#: a slot in an admissible action, e.g. WebShop's ``search[<query>]``
SLOT = re.compile(r"<([a-z][a-z_]*)>")
#: the most tokens the policy writes into one slot (a search query is a few words)
SLOT_TOKENS = 32
#: the refusal when the default proposer has no checkpoint to sample from
NO_POLICY = (
    "the default proposer samples the alternatives from the agent's own policy, as the paper does: name its "
    "checkpoint (the SFT or initial model) with --model PATH, or pass --proposer admissible to draw them "
    "uniformly from the admissible actions"
)
#: the policy proposer stops after this many draws per wanted alternative
DRAWS_PER_ALTERNATIVE = 4
#: rows per row group of rollout.parquet (at least; whole episodes are never split)
ROW_GROUP_ROWS = 1024
#: columns the builder reads from the expert rows
EXPERT_COLUMNS = (
    "env",
    "split",
    "task_id",
    "seed",
    "episode",
    "step",
    "messages",
    "action",
    "observation",
    "next_observation",
    "reward",
    "instruction",
    "admissible_actions",
)
#: files whose presence tells a checkpoint has a tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_SHARDS = "shards"
_SETTINGS = "settings.json"

#: one expert episode's rows in step order
Episode = list[dict[str, Any]]


def rollout_features() -> Any:
    """The schema of ``rollout.parquet`` (a ``datasets.Features``)."""
    from datasets import Features, List, Value

    text = Value("string")
    return Features(
        {
            "env": text,
            "split": text,
            "task_id": text,
            "seed": Value("int64"),
            "episode": Value("int64"),
            "step": Value("int64"),
            "alternative": Value("int64"),
            "instruction": text,
            "observation": text,
            "history": List({"observation": text, "action": text}),
            "messages": List({"role": text, "content": text}),
            "admissible_actions": List(text),
            "expert_action": text,
            "expert_next_observation": text,
            "expert_reward": Value("float64"),
            "action": text,
            "next_observation": text,
            "reward": Value("float64"),
            "done": Value("bool"),
        }
    )


def normalise(action: str) -> str:
    """How actions are compared: lowercase, whitespace collapsed."""
    return " ".join(str(action).lower().split())


def history_window(row: Mapping[str, Any], history: int) -> list[Turn]:
    """The last ``history`` expert turns of a rollout row, oldest first, as a prompt shows them."""
    from envrl.agents.prompts import Turn

    if history < 0:
        raise ValueError(f"history must be >= 0, got {history}")
    turns = list(row["history"])[-history:] if history else []
    return [Turn(observation=str(t["observation"]), action=str(t["action"])) for t in turns]


# ---- proposing alternatives -------------------------------------------------------------------


def admissible_alternatives(row: Mapping[str, Any], k: int, seed: int) -> tuple[list[str], int]:
    """Up to ``k`` distinct admissible actions of ``row`` other than its expert action, drawn with
    ``default_rng([seed, episode, step])``, and how many listed actions repeated earlier ones."""
    import numpy as np

    expert = normalise(row["action"])
    seen = {expert}
    candidates: list[str] = []
    repeated = 0
    for action in row["admissible_actions"]:
        key = normalise(action)
        if key in seen:
            repeated += key != expert
            continue
        seen.add(key)
        candidates.append(str(action))
    rng = np.random.default_rng([seed, int(row["episode"]), int(row["step"])])
    picked = rng.choice(len(candidates), size=min(k, len(candidates)), replace=False)
    return [candidates[int(i)] for i in picked], repeated


def draw_seed(seed: int, episode: int, step: int, draw: int) -> int:
    """The seed of the policy proposer's draw ``draw`` at (episode, step)."""
    import numpy as np

    return int(np.random.SeedSequence([seed, episode, step, draw]).generate_state(1)[0])


def clean_slot(text: str, closing: str) -> str:
    """The slot text the policy wrote, as an env can take it: cut at the pattern's ``closing``
    text (``]``), a line break or a tag's ``<``; brackets and U+FFFD (a byte-level tokenizer's
    half-decoded character, which WebShop refuses) removed; whitespace collapsed."""
    for stop in (closing, "\n", "<"):
        if stop:
            text = text.split(stop, 1)[0]
    text = text.replace("\ufffd", "").replace("[", " ").replace("]", " ")
    return " ".join(text.split())


def slot_head(template: Any, action: str) -> tuple[str, str] | None:
    """For an admissible action with a slot: the response text before the slot (the policy
    continues from it) and the action's text after the slot (which closes it); None when the
    action has no slot or the template's response does not show the slot verbatim."""
    match = SLOT.search(action)
    if match is None:
        return None
    response = template.format_response(action)
    at = response.find(match.group(0))
    if at < 0:
        return None
    return response[:at], action[match.end() :]


class PolicyProposer:
    """Alternatives sampled from a checkpoint: ``choose`` mode over the admissible actions, and
    the policy's own text in a chosen pattern's slot (``slots="generate"``)."""

    def __init__(self, path: str, template: Any, slots: str = "generate") -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from envrl.agents.generation import SamplingConfig
        from envrl.agents.hf import HFBackend

        if slots not in SLOTS:
            raise ValueError(f"slots must be one of {', '.join(SLOTS)}, got {slots!r}")
        # loaded here and handed to the back end, so that slot filling can continue a response
        # on the very model that scores the choices (float32 on CPU, the checkpoint's dtype on CUDA)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype: Any = "auto" if self.device == "cuda" else torch.float32
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        self.model = model.to(self.device).eval()
        self.backend = HFBackend.from_loaded(path, self.model, AutoTokenizer.from_pretrained(path))
        self.template = template
        self.slots = slots
        self.sampling = SamplingConfig(temperature=1.0)

    def fill(self, messages: Sequence[Mapping[str, Any]], action: str, seed: int) -> str | None:
        """``action`` with its slot replaced by the policy's own text (see the module docstring);
        the action unchanged when it has no slot; None when the policy left the slot empty."""
        import torch
        from transformers import GenerationConfig

        head = slot_head(self.template, action)
        if head is None:
            return action
        before, closing = head
        tokenizer = self.backend.tokenizer
        ids = self.backend.encode([dict(m) for m in messages]) + list(
            tokenizer(before, add_special_tokens=False)["input_ids"]
        )
        if self.backend.context_length is not None:
            ids = ids[-max(1, self.backend.context_length - SLOT_TOKENS) :]
        config = GenerationConfig(
            max_new_tokens=SLOT_TOKENS,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            num_beams=1,
            eos_token_id=list(self.backend.stop_ids),
            pad_token_id=self.backend.pad_id,
        )
        with torch.random.fork_rng(devices=[self.device] if self.device == "cuda" else []):
            torch.manual_seed(seed)
            with torch.inference_mode():
                out = self.model.generate(
                    input_ids=torch.tensor([ids], device=self.device),
                    attention_mask=torch.ones((1, len(ids)), dtype=torch.long, device=self.device),
                    generation_config=config,
                )
        tokens = out[0, len(ids) :].tolist()
        stops = set(self.backend.stop_ids)
        end = next((n for n, token in enumerate(tokens) if token in stops), len(tokens))
        text = clean_slot(str(tokenizer.decode(tokens[:end], skip_special_tokens=True)), closing)
        if not text:
            return None
        match = SLOT.search(action)
        assert match is not None  # slot_head found it
        return action[: match.start()] + text + closing

    def __call__(self, row: Mapping[str, Any], k: int, seed: int) -> tuple[list[str], int]:
        """Up to ``k`` distinct sampled actions other than the expert's, and the draws dropped."""
        actions = [str(a) for a in row["admissible_actions"]]
        if not actions:
            return [], 0
        texts = [self.template.format_response(a) for a in actions]
        seen = {normalise(row["action"])}
        chosen: list[str] = []
        dropped = draws = 0
        episode, step = int(row["episode"]), int(row["step"])
        while len(chosen) < k and draws < DRAWS_PER_ALTERNATIVE * k:
            count = min(k - len(chosen), DRAWS_PER_ALTERNATIVE * k - draws)
            seeds = [draw_seed(seed, episode, step, d) for d in range(draws, draws + count)]
            prompts = [row["messages"]] * count
            sampled = self.backend.choose(prompts, [texts] * count, self.sampling, seeds=seeds)
            for generation, draw_at in zip(sampled, seeds):
                if generation.error or generation.choice is None:
                    raise RuntimeError(
                        f"{self.backend.model} could not score episode {episode} step {step}: {generation.error}"
                    )
                action: str | None = actions[generation.choice]
                if self.slots == "generate":
                    action = self.fill(row["messages"], actions[generation.choice], draw_at)
                if action is None or normalise(action) in seen:
                    dropped += 1
                    continue
                seen.add(normalise(action))
                chosen.append(action)
            draws += count
        return chosen, dropped

    def close(self) -> None:
        self.model = None
        self.backend.close()


Proposer = Callable[[Mapping[str, Any], int, int], tuple[list[str], int]]


# ---- executing alternatives ---------------------------------------------------------------------


def replay_to(env: Any, episode: Sequence[Mapping[str, Any]], step: int) -> bool:
    """Reset ``env`` to the expert episode's start and replay its actions before ``step``: True
    when every observation on the way, up to state ``step``'s, is the recorded one byte for byte
    (and the episode did not end on the way)."""
    first = episode[0]
    observation, _ = env.reset(seed=int(first["seed"]), options={"task_id": str(first["task_id"])})
    for row in episode[:step]:
        if str(observation) != row["observation"]:
            return False
        observation, _, terminated, truncated, _ = env.step(str(row["action"]))
        if terminated or truncated:
            return False
    return str(observation) == episode[step]["observation"]


def episode_rollouts(
    env: Any, episode: Episode, alternatives: Sequence[Sequence[str]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each alternative of each state of ``episode`` executed from that state: the rollout rows,
    and the states dropped because the replay did not reproduce their recorded observation."""
    rows: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    for i, expert in enumerate(episode):
        state: list[dict[str, Any]] = []
        for j, action in enumerate(alternatives[i]):
            if not replay_to(env, episode, i):
                dropped.append({"task_id": expert["task_id"], "episode": int(expert["episode"]), "step": i})
                state = []
                break
            observation, reward, terminated, truncated, _ = env.step(action)
            state.append(
                {
                    "env": expert["env"],
                    "split": expert["split"],
                    "task_id": expert["task_id"],
                    "seed": int(expert["seed"]),
                    "episode": int(expert["episode"]),
                    "step": i,
                    "alternative": j,
                    "instruction": expert["instruction"],
                    "observation": expert["observation"],
                    "history": [{"observation": r["observation"], "action": r["action"]} for r in episode[:i]],
                    "messages": [{"role": m["role"], "content": m["content"]} for m in expert["messages"]],
                    "admissible_actions": list(expert["admissible_actions"]),
                    "expert_action": expert["action"],
                    "expert_next_observation": expert["next_observation"],
                    "expert_reward": float(expert["reward"]),
                    "action": action,
                    "next_observation": str(observation),
                    "reward": float(reward),
                    "done": bool(terminated or truncated),
                }
            )
        rows.extend(state)
    return rows, dropped


@dataclass
class _Job:
    """Expert episodes for one worker: each with its alternatives per state and its dropped draws."""

    env_id: str
    split: str
    env_kwargs: dict[str, Any]
    shards: str
    k: int
    episodes: list[tuple[Episode, list[list[str]], int]]


def _make_env(job: _Job) -> Any:
    import gymnasium as gym

    return gym.make(job.env_id, split=job.split, **job.env_kwargs)


def _execute(job: _Job, env: Any) -> None:
    """Write each episode's shard: its rows, then the counts that mark it finished."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = rollout_features().arrow_schema
    for episode, alternatives, duplicates in job.episodes:
        rows, dropped = episode_rollouts(env, episode, alternatives)
        index = int(episode[0]["episode"])
        mismatched = {d["step"] for d in dropped}
        counts = {
            "states": len(episode),
            "dropped_mismatch": dropped,
            "alternatives": len(rows),
            "short_of_k": sum(1 for i, alts in enumerate(alternatives) if i not in mismatched and len(alts) < job.k),
            "duplicates_dropped": duplicates,
        }
        shard = Path(job.shards) / _shard_name(index)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), f"{shard}.parquet.tmp")
        os.replace(f"{shard}.parquet.tmp", f"{shard}.parquet")
        Path(f"{shard}.json.tmp").write_text(json.dumps(counts, sort_keys=True), encoding="utf-8")
        os.replace(f"{shard}.json.tmp", f"{shard}.json")


def _execute_in_worker(job: _Job) -> int:
    env = _make_env(job)
    try:
        _execute(job, env)
    finally:
        env.close()
    return len(job.episodes)


def _shard_name(episode: int) -> str:
    return f"episode-{episode:09d}"


# ---- building -----------------------------------------------------------------------------------


def build_early_experience(
    env: str,
    split: str,
    expert_dir: str | Path,
    out_dir: str | Path,
    *,
    k: int,
    proposer: str = "policy",
    model: str | Path | None = None,
    slots: str = "generate",
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    workers: int = 1,
    progress: bool = False,
) -> Path:
    """Build the Early Experience folder ``out_dir`` from the expert folder ``expert_dir`` (see
    the module docstring); returns ``out_dir``. ``proposer="policy"`` (the default) samples the
    alternatives from ``model``, the agent's own checkpoint; without one it is refused
    (:data:`NO_POLICY`). ValueError (one sentence) on bad input."""
    from envrl.evaluation.config import resolve_env

    if k < 1:
        raise ValueError(f"k must be >= 1 (alternatives per expert state), got {k}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if slots not in SLOTS:
        raise ValueError(f"slots must be one of {', '.join(SLOTS)}, got {slots!r}")
    proposer = resolve_proposer(proposer, model)
    name, env_id = resolve_env(env)
    expert_path = Path(expert_dir)
    expert_meta, episodes = _read_expert(expert_path)
    if (expert_meta.get("env"), expert_meta.get("split")) != (name, split):
        raise ValueError(
            f"{expert_path} holds {expert_meta.get('env')} {expert_meta.get('split')} expert data, not {name} "
            f"{split}: give the --env and --split it was built with, or another --expert"
        )
    policy = None if proposer == "admissible" else proposer.partition(":")[2]
    kwargs = {key: v for key, v in dict(expert_meta.get("env_kwargs") or {}).items() if key not in PLAN_KWARGS}
    kwargs.update(env_kwargs or {})
    settings = _settings(name, env_id, split, kwargs, expert_path, expert_meta, k, proposer, policy, slots, seed)
    out = Path(out_dir)
    if _finished(out, settings):
        return out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} already exists and is not this build's output; remove it or choose another --out")
    partial = out.parent / f".{out.name}.partial"
    shards = _open_partial(partial, settings)
    pending = [e for e in episodes if not (shards / f"{_shard_name(int(e[0]['episode']))}.json").is_file()]
    propose = _proposer(policy, expert_meta, slots)
    try:
        jobs = _jobs(pending, propose, k, seed, env_id, split, kwargs, shards, workers)
        with _progress(len(episodes), len(episodes) - len(pending), progress, f"{name} {split}") as bar:
            if workers == 1:
                _run_inline(jobs, bar)
            else:
                _run_pool(jobs, workers, bar)
    finally:
        close = getattr(propose, "close", None)
        if callable(close):
            close()
    _assemble(partial, expert_path, [int(e[0]["episode"]) for e in episodes], settings)
    if out.exists():
        out.rmdir()
    partial.rename(out)
    return out


def _read_expert(folder: Path) -> tuple[dict[str, Any], list[Episode]]:
    """The expert folder's meta.json and its rows grouped by episode (each in step order)."""
    import pyarrow.parquet as pq

    valid = "an `envrl data expert` folder (data.parquet and meta.json)"
    if not (folder / DATA_FILE).is_file() or not (folder / META_FILE).is_file():
        reason = "does not exist" if not folder.exists() else "lacks data.parquet or meta.json"
        raise ValueError(f"expert data {folder} {reason}; give {valid}")
    try:
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
        table = pq.read_table(folder / DATA_FILE)
    except (OSError, ValueError) as exc:
        raise ValueError(f"expert data {folder} cannot be read ({exc}); give {valid}") from exc
    missing = [c for c in EXPERT_COLUMNS if c not in table.column_names]
    if not isinstance(meta, dict) or missing:
        raise ValueError(f"expert data {folder} lacks {', '.join(missing) or 'a meta.json object'}; give {valid}")
    grouped: dict[int, Episode] = {}
    for row in table.select(list(EXPERT_COLUMNS)).to_pylist():
        grouped.setdefault(int(row["episode"]), []).append(row)
    if not grouped:
        raise ValueError(f"expert data {folder} has no rows (no successful expert episode) to start from")
    episodes = []
    for index in sorted(grouped):
        rows = sorted(grouped[index], key=lambda r: int(r["step"]))
        if [int(r["step"]) for r in rows] != list(range(len(rows))):
            raise ValueError(f"expert data {folder}: episode {index} is not whole (its steps are not 0..n-1)")
        episodes.append(rows)
    return meta, episodes


def resolve_proposer(proposer: str = "policy", model: str | Path | None = None) -> str:
    """``admissible`` or ``policy:PATH``, as meta.json records it, from ``--proposer`` and
    ``--model``; the checkpoint is checked before anything runs. ``policy`` takes its checkpoint
    from ``model`` and is refused without one (:data:`NO_POLICY`); ``admissible`` takes none."""
    if proposer == "admissible":
        if model is not None:
            raise ValueError(
                f"--proposer admissible draws uniformly from the admissible actions and samples nothing from "
                f"--model {model}: drop one of the two"
            )
        return proposer
    if proposer == "policy":
        if model is None:
            raise ValueError(NO_POLICY)
        path = str(model)
    else:
        kind, sep, path = proposer.partition(":")
        if kind != "policy" or not sep or not path:
            raise ValueError(f"unknown proposer {proposer!r}; use one of {', '.join(PROPOSERS)}")
        if model is not None and str(model) != path:
            raise ValueError(f"--proposer {proposer} and --model {model} name two checkpoints: give one")
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ValueError(f"policy checkpoint {path} is not a model folder (no config.json)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"policy checkpoint {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
            "save the tokenizer with the model"
        )
    return f"policy:{path}"


def _proposer(policy: str | None, expert_meta: Mapping[str, Any], slots: str) -> Proposer:
    if policy is None:
        return admissible_alternatives
    from envrl.agents.prompts import TemplateError, load_template

    try:
        template = load_template(str(expert_meta.get("template")))
    except TemplateError as exc:
        raise ValueError(f"the expert data's prompt template cannot be loaded: {exc}") from exc
    if template.sha256 != expert_meta.get("template_sha256"):
        raise ValueError(f"prompt template {template.name!r} differs from the one the expert data was built with")
    return PolicyProposer(policy, template, slots)


def _settings(
    name: str,
    env_id: str,
    split: str,
    env_kwargs: dict[str, Any],
    expert: Path,
    expert_meta: Mapping[str, Any],
    k: int,
    proposer: str,
    policy: str | None,
    slots: str,
    seed: int,
) -> dict[str, Any]:
    """Everything the output depends on (meta.json less the counts; a resumed build must match it)."""
    import envrl

    if policy is None:
        rule = "state i of episode e: alternatives drawn with default_rng([seed, e, i])"
    else:
        rule = (
            "state i of episode e: draw d sampled with default_rng(SeedSequence([seed, e, i, d]).generate_state(1)[0])"
        )
        if slots == "generate":
            rule += f"; a slot's text sampled after torch.manual_seed of that seed, at most {SLOT_TOKENS} tokens"
    settings: dict[str, Any] = {
        "env": name,
        "env_id": env_id,
        "split": split,
        "env_kwargs": env_kwargs,
        "expert_dir": str(expert.resolve()),
        "expert_meta_sha256": _sha256(expert / META_FILE),
        "expert_data_sha256": _sha256(expert / DATA_FILE),
        "template": expert_meta.get("template"),
        "template_sha256": expert_meta.get("template_sha256"),
        "history": expert_meta.get("history"),
        "k": k,
        "proposer": proposer,
        "seed": seed,
        "rule": rule,
        "envrl_version": envrl.__version__,
    }
    if policy is not None:
        from envrl.agents.hf import weights_fingerprint

        settings["policy_weights_sha256"] = weights_fingerprint(policy)
        settings["slots"] = slots
    return json.loads(json.dumps(settings, default=str))  # as meta.json will read back


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _finished(out: Path, settings: Mapping[str, Any]) -> bool:
    """Whether ``out`` is already this very build's output."""
    try:
        meta = json.loads((out / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(meta, dict)
        and (out / ROLLOUT_FILE).is_file()
        and (out / EXPERT_FILE).is_file()
        and {key: meta.get(key) for key in settings} == dict(settings)
    )


def _open_partial(partial: Path, settings: Mapping[str, Any]) -> Path:
    """The partial folder's shard folder, kept when it was started with the same settings."""
    marker = partial / _SETTINGS
    text = json.dumps(settings, indent=2, sort_keys=True) + "\n"
    if partial.exists() and not (marker.is_file() and marker.read_text(encoding="utf-8") == text):
        shutil.rmtree(partial)
    (partial / _SHARDS).mkdir(parents=True, exist_ok=True)
    marker.write_text(text, encoding="utf-8")
    return partial / _SHARDS


def _jobs(
    episodes: list[Episode],
    propose: Proposer,
    k: int,
    seed: int,
    env_id: str,
    split: str,
    env_kwargs: dict[str, Any],
    shards: Path,
    workers: int,
) -> Iterator[_Job]:
    """The pending episodes in chunks (one episode each when run inline), proposed as they go."""
    size = 1 if workers == 1 else max(1, math.ceil(len(episodes) / (4 * workers)))
    for start in range(0, len(episodes), size):
        chunk = []
        for episode in episodes[start : start + size]:
            proposals = [propose(row, k, seed) for row in episode]
            chunk.append((episode, [alts for alts, _ in proposals], sum(d for _, d in proposals)))
        yield _Job(env_id, split, env_kwargs, str(shards), k, chunk)


def _run_inline(jobs: Iterator[_Job], bar: Any) -> None:
    env = None
    try:
        for job in jobs:
            env = env if env is not None else _make_env(job)
            _execute(job, env)
            bar.update(len(job.episodes))
    finally:
        if env is not None:
            env.close()


def _run_pool(jobs: Iterator[_Job], workers: int, bar: Any) -> None:
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context(method))
    try:
        futures: list[Future[int]] = [pool.submit(_execute_in_worker, job) for job in jobs]
        for future in as_completed(futures):
            bar.update(future.result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class _NoBar:
    def update(self, count: int) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _progress(total: int, done: int, enabled: bool, label: str) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc=f"{label} early experience", unit="episode", file=sys.stderr)


def _assemble(partial: Path, expert: Path, episodes: Sequence[int], settings: Mapping[str, Any]) -> None:
    """Turn the finished shards into expert.parquet, rollout.parquet and meta.json."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shards = partial / _SHARDS
    schema = rollout_features().arrow_schema
    totals: dict[str, Any] = {
        "states": 0,
        "dropped_mismatch": [],
        "alternatives": 0,
        "short_of_k": 0,
        "duplicates_dropped": 0,
    }
    buffer: list[Any] = []
    with pq.ParquetWriter(partial / ROLLOUT_FILE, schema) as writer:
        for index in episodes:
            shard = shards / _shard_name(index)
            counts = json.loads(Path(f"{shard}.json").read_text(encoding="utf-8"))
            for key, value in counts.items():
                totals[key] = totals[key] + value
            buffer.append(pq.read_table(f"{shard}.parquet", schema=schema))
            if sum(t.num_rows for t in buffer) >= ROW_GROUP_ROWS:
                writer.write_table(pa.concat_tables(buffer))
                buffer = []
        if buffer:
            writer.write_table(pa.concat_tables(buffer))
    shutil.copyfile(expert / DATA_FILE, partial / EXPERT_FILE)
    totals["states_kept"] = totals["states"] - len(totals["dropped_mismatch"])
    meta = {**settings, "counts": totals}
    (partial / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    shutil.rmtree(shards)
    (partial / _SETTINGS).unlink()


# ---- loading ------------------------------------------------------------------------------------


def load_early_experience(folder: str | Path) -> tuple[Any, Any, dict[str, Any]]:
    """``(expert, rollout, meta)``: the two parts of a folder :func:`build_early_experience`
    wrote, as ``datasets.Dataset``, and its meta.json. ValueError for any other folder."""
    import pyarrow.parquet as pq
    from datasets import Dataset

    path = Path(folder)
    missing = [n for n in (EXPERT_FILE, ROLLOUT_FILE, META_FILE) if not (path / n).is_file()]
    if missing:
        reason = "does not exist" if not path.exists() else f"lacks {', '.join(missing)}"
        raise ValueError(
            f"{path} {reason}: it is not an Early Experience folder (make one with `envrl data early-experience`)"
        )
    meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    return Dataset(pq.read_table(path / EXPERT_FILE)), Dataset(pq.read_table(path / ROLLOUT_FILE)), meta


# ---- command line ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``envrl data early-experience``."""
    parser.add_argument("--env", required=True, help="env name (e.g. alfworld) or gymnasium id of the expert data")
    parser.add_argument("--split", default="train", help="split of the expert data (default train)")
    parser.add_argument("--expert", required=True, help="an `envrl data expert` folder")
    parser.add_argument("--k", type=int, required=True, help="alternative actions per expert state (>= 1)")
    parser.add_argument("--out", required=True, help="folder for expert.parquet, rollout.parquet and meta.json")
    parser.add_argument(
        "--proposer",
        default="policy",
        help="policy (default: sampled from the --model checkpoint, the agent's own policy, as the paper does), "
        "policy:PATH, or admissible (uniform over the admissible actions; needs no checkpoint)",
    )
    parser.add_argument(
        "--model", default=None, help="the policy's checkpoint (the SFT or initial model) the alternatives come from"
    )
    parser.add_argument(
        "--slots",
        choices=SLOTS,
        default="generate",
        help="policy proposer: the policy writes a pattern's slot itself, e.g. WebShop's search[<query>] "
        "(generate, default), or the pattern is sent as listed (literal)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the alternatives' draws (default 0)")
    add_env_arg_option(parser)
    parser.add_argument("--workers", type=int, default=1, help="env processes (default 1: this process)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """``envrl data early-experience``: build, then say what was written. 0 when alternatives
    were written, 1 when none could be, 2 on bad input."""
    prog = "envrl data early-experience"
    try:
        out = build_early_experience(
            args.env,
            args.split,
            args.expert,
            args.out,
            k=args.k,
            proposer=args.proposer,
            model=args.model,
            slots=args.slots,
            seed=args.seed,
            env_kwargs=parse_env_args(args.env_arg),
            workers=args.workers,
            progress=not args.no_progress,
        )
    except ValueError as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    counts = json.loads((out / META_FILE).read_text(encoding="utf-8"))["counts"]
    print(
        f"wrote {counts['alternatives']} alternatives from {counts['states_kept']} of {counts['states']} expert "
        f"states to {out / ROLLOUT_FILE} ({len(counts['dropped_mismatch'])} dropped: replay mismatch; "
        f"{counts['short_of_k']} short of k)"
    )
    if not counts["alternatives"]:
        print(f"{prog}: error: no alternative could be executed, so the rollouts are empty", file=sys.stderr)
        return 1
    return 0
