"""Evaluation: run agents on env splits, store every episode, compute metrics, rank runs.

* :func:`run_evaluation` plays a run in worker processes (or on Ray actors) and returns a
  :class:`RunSummary`; :mod:`~envrl.evaluation.config`: what a run is (:class:`RunConfig`);
  :mod:`~envrl.evaluation.episodes`: the episode engine (episodes side by side, one batched
  agent call per turn) that the workers, and training rollouts, play with;
  :mod:`~envrl.evaluation.process_pool` and :mod:`~envrl.evaluation.ray_pool`: the workers;
* :mod:`~envrl.evaluation.store`: episode records, the run directory (JSONL journal) and the
  SQLite database every run shares;
* :mod:`~envrl.evaluation.metrics`: success rate with a 95% Wilson interval, mean score,
  turns, turns of successes, valid-action ratio; overall, per task type, per split;
* :mod:`~envrl.evaluation.leaderboard`: one row per agent, columns per env and split, with
  published reference rows (text, Markdown, JSON); :mod:`~envrl.evaluation.web`: the same
  in a browser, with a page per run and a trajectory viewer.
"""

from envrl.evaluation.config import EvaluationError, RunConfig, RunFailed, default_run_id, resolve_env
from envrl.evaluation.leaderboard import (
    leaderboard,
    leaderboard_data,
    render_leaderboard,
    render_runs,
    run_rows,
    split_kind,
)
from envrl.evaluation.metrics import Metrics, MetricsReport, compute_metrics, group_by, summarize, wilson_interval
from envrl.evaluation.runner import RunSummary, run_evaluation
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
    "RunConfig",
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
    "leaderboard_data",
    "read_jsonl",
    "render_leaderboard",
    "render_runs",
    "run_rows",
    "split_kind",
    "resolve_env",
    "run_evaluation",
    "summarize",
    "wilson_interval",
]
