"""Reading an early-experience folder for training (IWM, SR, the rationale writers).

:mod:`envrl.training.early_experience` writes the folder; this module reads it back for the
trainers, so that :mod:`envrl.training.algorithms.iwm` and :mod:`~envrl.training.algorithms.sr`
hold only their algorithms. A folder holds the expert's steps (``expert.parquet``: states
``s_i`` and actions ``a_i``) and, for each expert state, the alternatives ``a_i^j`` played from
it and what they led to (``rollout.parquet``: ``s_i^j``), plus ``meta.json``.

Prompts are rebuilt from the rows with the policy's own template and history window
(:func:`policy_messages`), exactly as :class:`~envrl.agents.prompts.Conversation` builds them
when the policy acts, so the data need not have been built with the policy's template.
A folder built with ``--proposer admissible`` (random actions, not the policy's) is read with a
logged warning, so a run trained on it says so. Every refusal is a :class:`~envrl.training.config.ConfigError` of one sentence that names the
command making a valid folder.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envrl.agents.generation import Message
from envrl.agents.prompts import Turn
from envrl.training.config import ConfigError
from envrl.training.data import META_FILE
from envrl.training.early_experience import EXPERT_FILE, ROLLOUT_FILE

log = logging.getLogger(__name__)

#: the command that writes an early-experience folder (named in every error that asks for one)
BUILD_COMMAND = "envrl data early-experience --env ENV --expert EXPERT_DIR --k K --model POLICY_DIR --out DIR"

#: the columns each part must have (the trainers read these; other columns are ignored)
EXPERT_COLUMNS = ("env", "episode", "step", "instruction", "observation", "admissible_actions", "action")
ROLLOUT_COLUMNS = (
    "env",
    "episode",
    "step",
    "alternative",
    "instruction",
    "observation",
    "history",
    "admissible_actions",
    "expert_action",
    "expert_next_observation",
    "action",
    "next_observation",
)


@dataclass
class EarlyExperience:
    """An early-experience folder's rows (plain dicts) and its ``meta.json``."""

    folder: Path
    expert: list[dict[str, Any]]
    rollout: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)


def check_folder(data: str, algo: str) -> Path:
    """The folder ``data`` names, or a ConfigError (one sentence) saying how to make one."""
    if not data:
        raise ConfigError(
            f"{algo} needs an early-experience folder: build one with `{BUILD_COMMAND}` and pass --data DIR"
        )
    folder = Path(data)
    missing = [name for name in (EXPERT_FILE, ROLLOUT_FILE) if not (folder / name).is_file()]
    if missing:
        raise ConfigError(
            f"{data} is not an early-experience folder (it lacks {' and '.join(missing)}); "
            f"build one with `{BUILD_COMMAND}` and pass --data DIR"
        )
    return folder


def read_early_experience(data: str | Path, algo: str = "early experience") -> EarlyExperience:
    """Both parquet files of the folder ``data`` (ConfigError when they are missing or lack columns)."""
    import pyarrow.parquet as pq

    folder = check_folder(str(data), algo)
    tables = {}
    for name, columns in ((EXPERT_FILE, EXPERT_COLUMNS), (ROLLOUT_FILE, ROLLOUT_COLUMNS)):
        table = pq.read_table(folder / name)
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise ConfigError(
                f"{folder / name} lacks the columns {', '.join(missing)}; rebuild it with `{BUILD_COMMAND}`"
            )
        tables[name] = table.to_pylist()
    meta_path = folder / META_FILE
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    if meta.get("proposer") == "admissible":  # a baseline's data: say so wherever it is trained on
        log.warning(
            "%s: the alternatives were drawn uniformly from the admissible actions (--proposer admissible), "
            "not sampled from the policy as the paper's are",
            folder,
        )
    return EarlyExperience(folder, tables[EXPERT_FILE], tables[ROLLOUT_FILE], meta)


def check_env(data: EarlyExperience, env: str) -> None:
    """Refuse rows of another env (their prompts would introduce the wrong env)."""
    envs = sorted({str(row["env"]) for row in (*data.expert, *data.rollout)} - {env})
    if envs:
        raise ConfigError(f"{data.folder} holds {', '.join(envs)} data, not {env}: train with --env {envs[0]}")


def expert_histories(rows: Sequence[Mapping[str, Any]]) -> list[list[dict[str, str]]]:
    """For each expert row, the earlier turns of its episode (oldest first), as rollout rows store them."""
    by_episode: dict[Any, dict[int, Mapping[str, Any]]] = {}
    for row in rows:
        by_episode.setdefault(row["episode"], {})[int(row["step"])] = row
    histories = []
    for row in rows:
        steps = by_episode[row["episode"]]
        earlier = [steps[k] for k in range(int(row["step"])) if k in steps]
        if len(earlier) != int(row["step"]):
            raise ConfigError(f"expert episode {row['episode']} lacks steps before step {row['step']}")
        histories.append([{"observation": str(r["observation"]), "action": str(r["action"])} for r in earlier])
    return histories


def policy_messages(policy: Any, row: Mapping[str, Any], history_turns: Sequence[Mapping[str, Any]]) -> list[Message]:
    """The prompt the policy sees at the row's state: built as :class:`~envrl.agents.prompts.Conversation`
    builds it (the last ``policy.config.history`` turns; turn number = earlier turns + 1)."""
    turns = [Turn(observation=str(t["observation"]), action=str(t["action"])) for t in history_turns]
    return policy.template.messages_at(
        policy.env_name,
        str(row["instruction"]),
        str(row["observation"]),
        [str(a) for a in row.get("admissible_actions") or []],
        turns,
        policy.config.history,
    )
