"""Expert demonstrations for supervised fine-tuning (``envrl data expert``), as parquet.

A dataset is a folder holding ``data.parquet`` (one row per step of a successful expert
episode) and ``meta.json`` (how it was made). Each row's prompt is built exactly as an LLM
agent builds it when evaluated (:class:`~envrl.agents.prompts.Conversation` with the same
template and history window), and its response is the template's own rendering of the
expert's action (:meth:`~envrl.agents.prompts.PromptTemplate.format_response`), which
:func:`~envrl.agents.prompts.parse_response` reads back as that action: a checkpoint is
trained on the very prompts it is evaluated with.

Row fields: ``env``, ``split``, ``task_id``, ``seed``, ``episode``, ``step``, ``messages``
(``[{role, content}]``), ``response``, ``action``, ``observation`` (before the action),
``next_observation``, ``reward``, ``done``, ``instruction``, ``admissible_actions``.

Which episodes: episode ``i`` plays task ``task_ids[i % n]`` with seed ``seed + i``, the rule
of evaluation runs, so :func:`load_sft_data` can rebuild the same rows from an ``envrl eval``
run of the expert. Episode records do not store ``info`` (the instruction and admissible
actions a prompt shows), so those rows are rebuilt by replaying the recorded actions in the
env (envrl's envs are deterministic) and checking every observation against the record.
Only successful episodes are kept; the others are counted in ``meta.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envrl.envs import add_env_arg_option, parse_env_args

if TYPE_CHECKING:
    from envrl.agents.prompts import Conversation

DATA_FILE = "data.parquet"
META_FILE = "meta.json"
DEFAULT_TEMPLATE = "action"
DEFAULT_HISTORY = 2

#: what a valid ``--data`` is, for every error that refuses one
VALID_DATA = (
    "a folder written by `envrl data expert` (holding data.parquet), or an `envrl eval` runs directory "
    "(holding envrl.sqlite) as DIR when it holds one run with successful episodes, else DIR#RUN_ID"
)

#: env settings that only add the expert's plan to ``info`` (observations do not depend on them)
PLAN_KWARGS = ("expert_plan", "expert_type")

#: a function that gives the next action for (observation, info)
Chooser = Callable[[str, dict[str, Any]], str]


class ReplayMismatch(ValueError):
    """A recorded episode that the env does not reproduce (other env settings or version)."""


def default_agent(env_name: str) -> str:
    """``expert:search`` where a grounded expert exists (its demonstrations are learnable from
    the observations), else ``expert``."""
    from envrl.agents.grounded import GROUNDED_ENVS

    return "expert:search" if env_name in GROUNDED_ENVS else "expert"


def features() -> Any:
    """The dataset's schema (fixed, so that an empty dataset and a full one agree)."""
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
            "messages": List({"role": text, "content": text}),
            "response": text,
            "action": text,
            "observation": text,
            "next_observation": text,
            "reward": Value("float64"),
            "done": Value("bool"),
            "instruction": text,
            "admissible_actions": List(text),
        }
    )


# ---- playing episodes into rows ----------------------------------------------------------------


def play_episode(
    env: Any,
    conversation: Conversation,
    choose: Chooser,
    *,
    env_name: str,
    split: str,
    task_id: str,
    seed: int,
    episode: int,
    on_reset: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, Any]], bool]:
    """Play one episode, choosing each action with ``choose``: its rows and its success.

    The prompt of each step is ``conversation.messages(observation, info)`` taken before the
    action is chosen and ``conversation.record(observation, action)`` after, as
    :class:`~envrl.agents.llm.LLMAgent` does. ``on_reset`` hears the first observation.
    """
    template = conversation.template
    conversation.reset()
    observation, info = env.reset(seed=seed, options={"task_id": task_id})
    if on_reset is not None:
        on_reset(observation)
    rows: list[dict[str, Any]] = []
    done = False
    while not done:
        messages = conversation.messages(observation, info)
        action = choose(observation, info)
        next_observation, reward, terminated, truncated, next_info = env.step(action)
        done = bool(terminated or truncated)
        rows.append(
            {
                "env": env_name,
                "split": split,
                "task_id": task_id,
                "seed": seed,
                "episode": episode,
                "step": len(rows),
                "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
                "response": template.format_response(action),
                "action": action,
                "observation": str(observation),
                "next_observation": str(next_observation),
                "reward": float(reward),
                "done": done,
                "instruction": str(info.get("instruction", "")),
                "admissible_actions": [str(a) for a in info.get("admissible_actions", []) or []],
            }
        )
        conversation.record(observation, action)
        observation, info = next_observation, next_info
    return rows, bool(info.get("success", False))


class ExpertPlay:
    """An expert and its env, ready to play episodes (a context manager that closes both).

    ``agent``: a spec for :func:`envrl.agents.make_agent` (default :func:`default_agent`). The
    env is ``gym.make(env_id, split=split, **agent.env_kwargs, **env_kwargs)``. Episode ``i``
    plays ``task_ids[i % n]`` (default: the split's tasks) with seed ``seed + i``, the rule of
    evaluation runs. ValueError on bad input (unknown env, split or task id, empty split).
    """

    def __init__(
        self,
        env: str,
        split: str,
        *,
        agent: str | None = None,
        seed: int = 0,
        env_kwargs: Mapping[str, Any] | None = None,
        task_ids: Sequence[str] | None = None,
    ) -> None:
        import gymnasium as gym

        from envrl.agents import make_agent
        from envrl.evaluation.config import resolve_env

        self.name, self.env_id = resolve_env(env)
        self.split, self.seed = split, seed
        self.spec = agent or default_agent(self.name)
        self.expert = make_agent(self.spec, self.name, seed=seed)
        self.env_kwargs = {**getattr(self.expert, "env_kwargs", {}), **dict(env_kwargs or {})}
        self.game: Any = None
        try:
            self.game = gym.make(self.env_id, split=split, **self.env_kwargs)
            self.tasks = _check_tasks(task_ids, [str(t) for t in self.game.unwrapped.task_ids], split)
            if not self.tasks:
                raise ValueError(f"split {split!r} of {self.name} holds no tasks with these env settings")
        except BaseException:
            self.close()
            raise

    def episodes(
        self, count: int, conversation: Conversation, progress: bool = False
    ) -> Iterator[tuple[int, list[dict[str, Any]], bool]]:
        """Play episodes ``0 .. count - 1``: each one's index, rows (:func:`play_episode`) and success."""
        for i in _progress(range(count), progress, f"{self.name} {self.split}"):
            task_id, episode_seed = self.tasks[i % len(self.tasks)], self.seed + i
            self.expert.reset(seed=episode_seed)
            rows, success = play_episode(
                self.game,
                conversation,
                self.expert.act,
                env_name=self.name,
                split=self.split,
                task_id=task_id,
                seed=episode_seed,
                episode=i,
            )
            yield i, rows, success

    def close(self) -> None:
        if self.game is not None:
            self.game.close()
            self.game = None
        close = getattr(self.expert, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> ExpertPlay:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def collect_expert_data(
    env: str,
    split: str,
    episodes: int,
    out_dir: str | Path,
    *,
    agent: str | None = None,
    template: str = DEFAULT_TEMPLATE,
    history: int = DEFAULT_HISTORY,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    task_ids: Sequence[str] | None = None,
    progress: bool = False,
) -> Path:
    """Play ``episodes`` expert episodes (:class:`ExpertPlay`) and write ``out_dir/data.parquet``
    and ``out_dir/meta.json``. Returns ``out_dir``; ValueError on bad input (unknown env,
    template or task id, episodes < 1)."""
    from envrl.agents.prompts import Conversation, load_template

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if history < 0:
        raise ValueError(f"history must be >= 0, got {history}")
    prompt_template = load_template(template)
    rows: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    with ExpertPlay(env, split, agent=agent, seed=seed, env_kwargs=env_kwargs, task_ids=task_ids) as play:
        conversation = Conversation(prompt_template, play.name, history)
        for i, episode_rows, success in play.episodes(episodes, conversation, progress):
            if success:
                rows.extend(episode_rows)
            else:
                task_id = play.tasks[i % len(play.tasks)]
                failed.append({"episode": i, "task_id": task_id, "seed": seed + i, "turns": len(episode_rows)})
    meta = {
        "env": play.name,
        "env_id": play.env_id,
        "split": split,
        "agent": play.spec,
        "agent_name": str(getattr(play.expert, "name", play.spec)),
        "template": prompt_template.name,
        "template_sha256": prompt_template.sha256,
        "history": history,
        "seed": seed,
        "env_kwargs": play.env_kwargs,
        "task_ids": list(task_ids) if task_ids is not None else None,
        "episodes": episodes,
        "kept": episodes - len(failed),
        "failed": failed,
        "rows": len(rows),
        "episode_rule": "episode i plays task_ids[i % len(task_ids)] with seed + i",
    }
    return write_dataset(rows, meta, out_dir)


def write_dataset(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], out_dir: str | Path) -> Path:
    """``out_dir/data.parquet`` (the rows, with :func:`features`) and ``out_dir/meta.json``."""
    import datasets

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dataset = to_dataset(rows)
    bar = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a bar for one small file is noise
    try:
        dataset.to_parquet(str(out / DATA_FILE))
    finally:
        if bar:
            datasets.enable_progress_bars()
    text = json.dumps(meta, indent=2, sort_keys=True, default=str)
    (out / META_FILE).write_text(text + "\n", encoding="utf-8")
    return out


def to_dataset(rows: Sequence[Mapping[str, Any]]) -> Any:
    """The rows as a ``datasets.Dataset`` with :func:`features` (columns even when empty)."""
    from datasets import Dataset

    schema = features()
    if not rows:
        return Dataset.from_dict({name: [] for name in schema}, features=schema)
    return Dataset.from_list([dict(row) for row in rows], features=schema)


def _check_tasks(task_ids: Sequence[str] | None, split_tasks: list[str], split: str) -> list[str]:
    if task_ids is None:
        return split_tasks
    tasks = [str(t) for t in task_ids]
    if not tasks:
        raise ValueError("task_ids is empty; give at least one task id, or None for the whole split")
    known = set(split_tasks)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise ValueError(f"task id {unknown[0]!r} is not in split {split!r} (e.g. {', '.join(split_tasks[:2])})")
    return tasks


def _progress(items: range, enabled: bool, label: str) -> Iterator[int]:
    if not enabled:
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, desc=label, unit="episode", file=sys.stderr)


# ---- loading ----------------------------------------------------------------------------------


def load_sft_data(path: str | Path, *, template: str | None = None, history: int | None = None) -> Any:
    """The SFT rows (a ``datasets.Dataset`` with at least ``messages`` and ``response``).

    ``path`` is a folder written by :func:`collect_expert_data`, or an ``envrl eval`` runs
    directory: ``DIR`` when it holds exactly one run with successful episodes, ``DIR#RUN_ID``
    to pick one. A run's successful episodes are replayed in its env (with the run's env
    settings) to rebuild the rows :func:`collect_expert_data` writes, with ``template`` and
    ``history`` (defaults ``action`` and 2). For a dataset folder, ``template`` and
    ``history``, when given, must be the ones it was built with. ValueError (one sentence)
    for anything else.
    """
    text = str(path)
    folder, run_id = Path(text), None
    if not folder.exists() and "#" in text:
        base, _, run_id = text.rpartition("#")
        folder = Path(base)
    if (folder / DATA_FILE).is_file():
        if run_id is not None:
            raise ValueError(f"{folder} is a dataset folder, not a runs directory: drop #{run_id}")
        return _load_dataset_folder(folder, template, history)
    from envrl.evaluation.store import DB_NAME

    if (folder / DB_NAME).is_file():
        return _load_run(folder, run_id, template, history)
    reason = "does not exist" if not folder.exists() else "holds neither data.parquet nor envrl.sqlite"
    raise ValueError(f"{text} {reason}; a valid --data is {VALID_DATA}")


def _load_dataset_folder(folder: Path, template: str | None, history: int | None) -> Any:
    import pyarrow.parquet as pq
    from datasets import Dataset

    from envrl.agents.prompts import load_template

    meta_path = folder / META_FILE
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    if template is not None and meta.get("template_sha256") not in (None, load_template(template).sha256):
        raise ValueError(
            f"{folder} was built with prompt template {meta.get('template')!r}, not {template!r}: "
            "rebuild it with the template the policy uses"
        )
    if history is not None and meta.get("history") not in (None, history):
        raise ValueError(f"{folder} was built with a history of {meta.get('history')} turns, not {history}")
    dataset = Dataset(pq.read_table(folder / DATA_FILE))
    missing = {"messages", "response"} - set(dataset.column_names)
    if missing:
        raise ValueError(f"{folder / DATA_FILE} lacks the columns {', '.join(sorted(missing))}; {VALID_DATA}")
    return dataset


def _load_run(runs_dir: Path, run_id: str | None, template: str | None, history: int | None) -> Any:
    from envrl.evaluation.store import ResultStore, StoreError

    store = ResultStore(runs_dir)
    try:
        runs = store.list_runs()
        chosen = _choose_run(runs_dir, runs, run_id)
        records = [r for r in store.load_episodes(chosen["run_id"]) if r.success and r.error is None]
    except StoreError as exc:
        raise ValueError(f"{exc}; a valid --data is {VALID_DATA}") from exc
    return to_dataset(replay_run(chosen["config"], records, template=template, history=history))


def _choose_run(runs_dir: Path, runs: Sequence[Mapping[str, Any]], run_id: str | None) -> Mapping[str, Any]:
    def successes(run: Mapping[str, Any]) -> int:
        return sum(1 for e in run["episodes"] if e.get("success"))

    if run_id is not None:
        match = [r for r in runs if r["run_id"] == run_id]
        if not match:
            known = ", ".join(r["run_id"] for r in runs) or "none"
            raise ValueError(f"{runs_dir} has no run {run_id!r} (runs: {known})")
        if not successes(match[0]):
            raise ValueError(f"run {run_id!r} in {runs_dir} has no successful episode to learn from")
        return match[0]
    useful = [r for r in runs if successes(r)]
    if len(useful) == 1:
        return useful[0]
    if not useful:
        raise ValueError(f"{runs_dir} holds no run with a successful episode; a valid --data is {VALID_DATA}")
    names = ", ".join(r["run_id"] for r in useful)
    raise ValueError(
        f"{runs_dir} holds {len(useful)} runs with successful episodes ({names}); pick one: {runs_dir}#RUN_ID"
    )


def replay_run(
    config: Mapping[str, Any], records: Sequence[Any], *, template: str | None = None, history: int | None = None
) -> list[dict[str, Any]]:
    """The rows of ``records`` (episode records of the run ``config`` describes), rebuilt by
    replaying their actions in the run's env; :class:`ReplayMismatch` when the env does not
    give back a recorded observation. The env is made with the run's settings less
    :data:`PLAN_KWARGS`: replaying needs no expert plan, and planning is the slow part."""
    import gymnasium as gym

    from envrl.agents.prompts import Conversation, load_template
    from envrl.evaluation.config import resolve_env

    name, _ = resolve_env(str(config["env"]))
    split = str(config["split"])
    conversation = Conversation(
        load_template(template or DEFAULT_TEMPLATE), name, DEFAULT_HISTORY if history is None else history
    )
    kwargs = {k: v for k, v in dict(config.get("env_kwargs") or {}).items() if k not in PLAN_KWARGS}
    rows: list[dict[str, Any]] = []
    game = gym.make(config["env_id"], split=split, **kwargs)
    try:
        for record in sorted(records, key=lambda r: r.episode_index):
            rows.extend(_replay_episode(game, conversation, record, name, split))
    finally:
        game.close()
    return rows


def _replay_episode(game: Any, conversation: Conversation, record: Any, name: str, split: str) -> list[dict[str, Any]]:
    where = f"run {record.run_id} episode {record.episode_index} ({record.task_id})"
    steps = iter(record.trajectory)

    def check_start(observation: str) -> None:
        if record.initial_observation and observation != record.initial_observation:
            raise ReplayMismatch(f"{where}: the env's first observation differs from the recorded one")

    def next_action(observation: str, info: dict[str, Any]) -> str:
        step = next(steps, None)
        if step is None:
            raise ReplayMismatch(f"{where}: the env did not end where the recorded episode ended")
        return str(step.action)

    rows, _ = play_episode(
        game,
        conversation,
        next_action,
        env_name=name,
        split=split,
        task_id=record.task_id,
        seed=record.seed,
        episode=record.episode_index,
        on_reset=check_start,
    )
    if len(rows) != len(record.trajectory):
        raise ReplayMismatch(f"{where}: the env ended after {len(rows)} of {len(record.trajectory)} recorded steps")
    for row, step in zip(rows, record.trajectory):
        if row["next_observation"] != step.observation:
            raise ReplayMismatch(f"{where}: step {row['step']} gives another observation than the recorded one")
    return rows


# ---- command line ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``envrl data expert``."""
    parser.add_argument("--env", required=True, help="env name (e.g. alfworld) or gymnasium id")
    parser.add_argument("--split", default="train", help="split to play (default train)")
    parser.add_argument("--episodes", type=int, required=True, help="expert episodes to play (>= 1)")
    parser.add_argument("--out", required=True, help="folder for data.parquet and meta.json")
    parser.add_argument(
        "--agent", default=None, help="expert agent spec (default: expert:search for alfworld and webshop, else expert)"
    )
    parser.add_argument("--template", default=DEFAULT_TEMPLATE, help=f"prompt template (default {DEFAULT_TEMPLATE})")
    parser.add_argument(
        "--history", type=int, default=DEFAULT_HISTORY, help=f"past turns in the prompt (default {DEFAULT_HISTORY})"
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed; episode i uses seed + i (default 0)")
    parser.add_argument("--max-steps", type=int, default=None, help="step limit per episode (default: the env's)")
    add_env_arg_option(parser)
    parser.add_argument(
        "--task-id", action="append", default=None, dest="task_ids", help="play only these tasks (repeatable)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """``envrl data expert``: collect, then say where the rows went and how many episodes were
    kept. 0 when some were kept, 1 when none succeeded, 2 on bad input."""
    prog = "envrl data expert"
    if args.max_steps is not None and args.max_steps < 1:
        print(f"{prog}: error: --max-steps must be >= 1, got {args.max_steps}", file=sys.stderr)
        return 2
    try:
        env_kwargs = parse_env_args(args.env_arg)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if args.max_steps is not None:
        env_kwargs["max_episode_steps"] = args.max_steps
    try:
        out = collect_expert_data(
            args.env,
            args.split,
            args.episodes,
            args.out,
            agent=args.agent,
            template=args.template,
            history=args.history,
            seed=args.seed,
            env_kwargs=env_kwargs,
            task_ids=args.task_ids,
            progress=not args.no_progress,
        )
    except ValueError as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    meta = json.loads((out / META_FILE).read_text(encoding="utf-8"))
    print(
        f"wrote {meta['rows']} rows to {out / DATA_FILE}: kept {meta['kept']} of {meta['episodes']} episodes "
        f"({len(meta['failed'])} unsuccessful, left out); template {meta['template']}, history {meta['history']}"
    )
    if not meta["kept"]:
        print(f"{prog}: error: no episode succeeded, so the dataset is empty", file=sys.stderr)
        return 1
    return 0
