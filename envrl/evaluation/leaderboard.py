"""The leaderboard: every run in a results store, one row each.

Rows are read from the store's SQLite database and their figures computed with
:mod:`envrl.evaluation.metrics`, so they match what ``envrl eval`` printed for the same
episodes. Rows are ordered by env, split, then success rate (best first).
"""

from __future__ import annotations

import json
import os
from typing import Any

from envrl.evaluation.metrics import format_number, format_table, summarize
from envrl.evaluation.store import ResultStore

FORMATS = ("text", "markdown", "json")

HEADERS = ["run id", "env", "split", "agent", "episodes", "success % [95% CI]", "score", "turns",
           "turns (succ.)", "valid %"]


def leaderboard_rows(runs_dir: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """One dict per run with its identity and figures (rates as fractions in [0, 1]; a
    figure with no data, e.g. mean turns of successes when nothing succeeded, is ``None``)."""
    rows = []
    for run in ResultStore(runs_dir).list_runs():
        m = summarize(run["episodes"])
        rows.append({
            "run_id": run["run_id"],
            "env": run["env"],
            "env_id": run["env_id"],
            "split": run["split"],
            "agent": run["agent"],
            "seed": run["seed"],
            "episodes_done": m.episodes,
            "episodes_planned": max(run["episodes_planned"], m.episodes),
            "successes": m.successes,
            "success_rate": m.success_rate,
            "ci_low": m.ci_low,
            "ci_high": m.ci_high,
            "mean_score": m.mean_score,
            "mean_turns": m.mean_turns,
            "mean_turns_success": m.mean_turns_success,
            "valid_action_ratio": m.valid_action_ratio,
            "errors": m.errors,
        })
    rows.sort(key=lambda r: (r["env"], r["split"], -r["success_rate"] if r["episodes_done"] else 1.0, r["run_id"]))
    return rows


def _cells(row: dict[str, Any]) -> list[str]:
    if row["episodes_done"]:
        rate = (f"{100 * row['success_rate']:.1f} [{100 * row['ci_low']:.1f}, "
                f"{100 * row['ci_high']:.1f}]")
    else:
        rate = "-"
    return [
        row["run_id"],
        row["env"],
        row["split"],
        row["agent"],
        f"{row['episodes_done']}/{row['episodes_planned']}",
        rate,
        format_number(row["mean_score"]),
        format_number(row["mean_turns"], 1),
        format_number(row["mean_turns_success"], 1),
        format_number(row["valid_action_ratio"], percent=True),
    ]


def _markdown_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|")


def render_leaderboard(rows: list[dict[str, Any]], fmt: str = "text") -> str:
    """``rows`` (from :func:`leaderboard_rows`) as an aligned text table, a Markdown table, or
    JSON (the rows themselves)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown leaderboard format {fmt!r}; choose from {', '.join(FORMATS)}")
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "markdown":
        lines = ["| " + " | ".join(HEADERS) + " |",
                 "|" + "|".join("---:" if i >= 4 else "---" for i in range(len(HEADERS))) + "|"]
        lines += ["| " + " | ".join(_markdown_cell(c) for c in _cells(row)) + " |" for row in rows]
        return "\n".join(lines)
    if not rows:
        return "no runs recorded yet"
    return format_table(HEADERS, [_cells(r) for r in rows], align_right=set(range(4, len(HEADERS))))


def leaderboard(runs_dir: str | os.PathLike[str] | None = None, fmt: str = "text") -> str:
    """The leaderboard of every run under ``runs_dir`` (default ``$ENVRL_RUNS_DIR`` or ``./runs``)."""
    return render_leaderboard(leaderboard_rows(runs_dir), fmt)
