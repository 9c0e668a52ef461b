"""Evaluation: run agents on env splits, store every episode, compute metrics, rank runs.

* :func:`run_evaluation` plays a run in worker processes and returns a :class:`RunSummary`;
* :mod:`~envrl.evaluation.store`: episode records, the run directory (JSONL journal) and the
  SQLite database every run shares;
* :mod:`~envrl.evaluation.metrics`: success rate with a 95% Wilson interval, mean score,
  turns, turns of successes, valid-action ratio; overall, per task type, per split;
* :mod:`~envrl.evaluation.leaderboard`: all runs as one table (text, Markdown, JSON).
"""

from envrl.evaluation.leaderboard import leaderboard, leaderboard_rows, render_leaderboard
from envrl.evaluation.metrics import Metrics, MetricsReport, compute_metrics, group_by, summarize, wilson_interval
from envrl.evaluation.runner import (
    EvaluationError,
    RunFailed,
    RunSummary,
    default_run_id,
    resolve_env,
    run_evaluation,
)
from envrl.evaluation.store import (
    EpisodeRecord,
    ResultStore,
    RunConfigMismatch,
    RunLocked,
    RunWriter,
    StepRecord,
    default_runs_dir,
    read_jsonl,
)

__all__ = [
    "EpisodeRecord",
    "EvaluationError",
    "Metrics",
    "MetricsReport",
    "ResultStore",
    "RunConfigMismatch",
    "RunFailed",
    "RunLocked",
    "RunSummary",
    "RunWriter",
    "StepRecord",
    "compute_metrics",
    "default_run_id",
    "default_runs_dir",
    "group_by",
    "leaderboard",
    "leaderboard_rows",
    "read_jsonl",
    "render_leaderboard",
    "resolve_env",
    "run_evaluation",
    "summarize",
    "wilson_interval",
]
