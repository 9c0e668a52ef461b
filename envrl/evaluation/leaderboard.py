"""The leaderboard: one row per agent, columns per env and split (ID and OOD side by side).

Every figure is computed from the store's episodes with :mod:`envrl.evaluation.metrics`, so
it matches what ``envrl eval`` printed. Rows published in papers
(``reported.json``) appear marked as *reported*, with their protocol beside them; they are
never ranked with, or mixed into, runs measured here.

Protocols. A run records its protocol (step limit, task list, episodes, seed, engine
versions; the agent's template, sampling and model). Within one column, runs are ranked only
against runs with the same env-side protocol: the most common one in that column. A run
measured under another protocol keeps its numbers but gets no rank, and its cell says how its
protocol differs. An agent whose runs used different agent-side settings (another template,
temperature or model) gets one row per setting.

Which run fills a cell: when an agent has several runs of one split under one setting, the
one with the most recorded episodes (then the latest) is shown; the others stay in the run
list.

World-model probes (``envrl probe``, :class:`~envrl.evaluation.store.ProbeRecord`) sit beside
success and turns: a split with at least one probe gets three more columns, "SP acc" (state
prediction, teacher-forced next-token accuracy), "SP exact" (state prediction, exact-match
rate of the greedy next observation) and "ID acc" (inverse dynamics, top-1 accuracy, with its
chance level). A probe belongs to the rows of the agent it names (every setting's row), or to
a row of its own when that agent has no run. Of several probes of one agent and split, the
one over the most transitions (then the latest) is shown. A split without probes keeps the
layout it had before probes existed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from importlib import resources
from typing import Any

from envrl.evaluation.metrics import format_number, format_table, summarize
from envrl.evaluation.store import ProbeRecord, ResultStore

FORMATS = ("text", "markdown", "json")

#: env-side protocol: what must be equal for two runs of a split to be ranked together
ENV_PROTOCOL_KEYS = ("step_limit", "task_ids_sha256", "episodes", "seed", "engine_versions")

#: the columns a probed split adds, after its success and turns columns
PROBE_HEADERS = ("SP acc", "SP exact", "ID acc")

PROBE_NOTE = (
    "SP acc, SP exact, ID acc: world-model probes of the agent's model (envrl probe) on expert transitions of "
    "the split, in %: state-prediction next-token accuracy (teacher-forced) and exact-match rate of the "
    "greedy next observation; inverse-dynamics top-1 accuracy over the admissible actions, with its chance level."
)


def split_kind(env: str, split: str) -> str:
    """``"ID"`` or ``"OOD"`` for a split of an envrl env (docs/design.md); other envs'
    splits are ``"ID"`` unless their name says otherwise."""
    from envrl.envs import SPLIT_KINDS

    kinds = SPLIT_KINDS.get(env)
    if kinds and split in kinds:
        return kinds[split]
    lowered = split.lower()
    return "OOD" if "ood" in lowered or "unseen" in lowered else "ID"


def _split_order(env: str, split: str) -> tuple[int, int, str]:
    from envrl.envs import SPLIT_KINDS

    kinds = list(SPLIT_KINDS.get(env, {}))
    position = kinds.index(split) if split in kinds else len(kinds)
    return (0 if split_kind(env, split) == "ID" else 1, position, split)


def reported_rows() -> list[dict[str, Any]]:
    """The published results shipped with envrl (``envrl/evaluation/reported.json``)."""
    text = resources.files("envrl.evaluation").joinpath("reported.json").read_text(encoding="utf-8")
    return list(json.loads(text)["rows"])


# ---- runs -------------------------------------------------------------------------------


def _env_protocol(run: dict[str, Any]) -> dict[str, Any]:
    config = run["config"]
    versions = dict(config.get("versions") or {})
    versions.pop("envrl", None)  # envrl's own version does not change what an env does
    return {
        "step_limit": config.get("step_limit", (config.get("env_kwargs") or {}).get("max_episode_steps")),
        "task_ids_sha256": config.get("task_ids_sha256"),
        "episodes": run["episodes_planned"],
        "seed": run["seed"],
        "engine_versions": versions,
    }


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:12]


def run_rows(runs_dir: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """One dict per run with its identity, protocol and figures (rates as fractions in
    [0, 1]; a figure with no data, e.g. mean turns of successes when nothing succeeded, is
    ``None``), ordered by env, split, then success rate (best first)."""
    rows = []
    for run in ResultStore(runs_dir).list_runs():
        m = summarize(run["episodes"])
        config = run["config"]
        rows.append(
            {
                "run_id": run["run_id"],
                "env": run["env"],
                "env_id": run["env_id"],
                "split": run["split"],
                "kind": split_kind(run["env"], run["split"]),
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
                "env_protocol": _env_protocol(run),
                "agent_protocol": config.get("agent_protocol") or {},
                "updated_at": run["updated_at"],
            }
        )
    rows.sort(
        key=lambda r: (
            r["env"],
            _split_order(r["env"], r["split"]),
            -r["success_rate"] if r["episodes_done"] else 1.0,
            r["run_id"],
        )
    )
    return rows


# ---- the agent table --------------------------------------------------------------------


def _describe_difference(protocol: dict[str, Any], reference: dict[str, Any]) -> str:
    names = {
        "step_limit": "step limit",
        "task_ids_sha256": "task list",
        "episodes": "episodes",
        "seed": "seed",
        "engine_versions": "engine versions",
    }
    parts = []
    for key in ENV_PROTOCOL_KEYS:
        if protocol.get(key) != reference.get(key):
            if key in ("task_ids_sha256", "engine_versions"):
                parts.append(f"{names[key]} differ")
            else:
                parts.append(f"{names[key]} {protocol.get(key)} (ranked runs: {reference.get(key)})")
    return "; ".join(parts)


def leaderboard_data(runs_dir: str | os.PathLike[str] | None = None, include_reported: bool = True) -> dict[str, Any]:
    """The leaderboard as plain data (what ``--format json`` prints and the web page shows).

    ``columns``: ``{"key": "<env>/<split>", "env", "split", "kind": "ID"|"OOD"}`` per env,
    ID splits first; ``rows``: ``{"agent", "source": "measured"|"reported", "reference",
    "protocol", "cells": {column key: cell}, "probes": {column key: probe}}`` where a cell has
    ``run_id``, ``success_rate``, ``ci_low``, ``ci_high``, ``episodes``, ``mean_turns``,
    ``mean_turns_success``, ``rank`` (None: not ranked) and ``protocol_note``, and a probe has
    ``probe_id``, ``sp_token_accuracy``, ``sp_exact_match``, ``id_accuracy``, ``id_chance``
    (fractions), ``transitions``, ``episodes``, ``seed``, ``sp_template``, ``id_template``,
    ``policy_template`` and ``created_at``; ``probe_columns``: the column keys that have a
    probe; ``notes``: lines to show under the table; ``runs``: every run (:func:`run_rows`).
    """
    runs = run_rows(runs_dir)
    probes = ResultStore(runs_dir).list_probes()
    # rows: one per (agent, agent-side setting)
    settings: dict[str, list[str]] = {}
    for run in runs:
        digest = _digest(run["agent_protocol"])
        if digest not in settings.setdefault(run["agent"], []):
            settings[run["agent"]].append(digest)

    def row_label(run: dict[str, Any]) -> str:
        digests = settings[run["agent"]]
        if len(digests) == 1:
            return run["agent"]
        return f"{run['agent']} (setting {digests.index(_digest(run['agent_protocol'])) + 1})"

    chosen: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs:
        key = (row_label(run), f"{run['env']}/{run['split']}")
        best = chosen.get(key)
        if best is None or (run["episodes_done"], run["updated_at"]) > (best["episodes_done"], best["updated_at"]):
            chosen[key] = run

    notes: list[str] = []
    rows: dict[str, dict[str, Any]] = {}
    for (label, column), run in chosen.items():
        row = rows.setdefault(
            label,
            {
                "agent": label,
                "source": "measured",
                "reference": None,
                "protocol": run["agent_protocol"],
                "cells": {},
                "probes": {},
            },
        )
        row["cells"][column] = {
            "run_id": run["run_id"],
            "success_rate": run["success_rate"] if run["episodes_done"] else None,
            "ci_low": run["ci_low"] if run["episodes_done"] else None,
            "ci_high": run["ci_high"] if run["episodes_done"] else None,
            "episodes": run["episodes_done"],
            "mean_turns": run["mean_turns"],
            "mean_turns_success": run["mean_turns_success"],
            "rank": None,
            "protocol_note": None,
            "env_protocol": run["env_protocol"],
        }
    for agent, digests in settings.items():
        if len(digests) > 1:
            notes.append(
                f"{agent} was run with {len(digests)} different agent settings (template, sampling or "
                f"model); each has its own row, see its runs' protocols."
            )

    # rank each column among the runs that share its most common env-side protocol
    columns_seen = sorted({c for row in rows.values() for c in row["cells"]})
    for column in columns_seen:
        cells = [row["cells"][column] for row in rows.values() if column in row["cells"]]
        cells = [c for c in cells if c["episodes"]]
        if not cells:
            continue
        digests = [_digest(c["env_protocol"]) for c in cells]
        reference_digest = Counter(digests).most_common(1)[0][0]  # ties: the first seen
        reference = cells[digests.index(reference_digest)]["env_protocol"]
        ranked = [c for c, d in zip(cells, digests) if d == reference_digest]
        unranked = [c for c, d in zip(cells, digests) if d != reference_digest]
        for cell in ranked:  # ties share a rank
            cell["rank"] = 1 + sum(other["success_rate"] > cell["success_rate"] for other in ranked)
        for cell in unranked:
            cell["protocol_note"] = _describe_difference(cell["env_protocol"], reference)
        if unranked:
            notes.append(
                f"{column}: {len(unranked)} run(s) are not ranked because their protocol differs from "
                f"the {len(ranked)} ranked run(s): "
                + "; ".join(f"{c['run_id']} ({c['protocol_note']})" for c in unranked)
            )
    for row in rows.values():
        for cell in row["cells"].values():
            del cell["env_protocol"]
    probe_columns = _attach_probes(rows, probes, {label: run["agent"] for (label, _), run in chosen.items()})
    if probe_columns:
        notes.append(PROBE_NOTE)

    measured = sorted(rows.values(), key=lambda r: (-_mean_success(r), r["agent"]))
    reported: list[dict[str, Any]] = []
    if include_reported:
        for entry in reported_rows():
            reported.append(
                {
                    "agent": entry["agent"],
                    "source": "reported",
                    "reference": {
                        "paper": entry["paper"],
                        "url": entry.get("url"),
                        "model": entry["model"],
                        "protocol": " | ".join(f"{r['env']}/{r['split']}: {r['protocol']}" for r in entry["results"]),
                        "note": "reported in the paper, not measured here",
                    },
                    "protocol": {},
                    "cells": {
                        f"{r['env']}/{r['split']}": {
                            "run_id": None,
                            "success_rate": r["success_rate"],
                            "ci_low": None,
                            "ci_high": None,
                            "episodes": None,
                            "mean_turns": r.get("mean_turns"),
                            "mean_turns_success": None,
                            "rank": None,
                            "protocol_note": r["protocol"],
                        }
                        for r in entry["results"]
                    },
                    "probes": {},
                }
            )
        if reported:
            notes.append(
                "Reported rows are figures published in papers, under their own protocols (often the "
                "official data and other models); they are shown for reference and never ranked with "
                "runs measured here."
            )
    keys = {c for row in measured for c in row["cells"]}
    keys |= {c for row in reported for c in row["cells"]}
    keys |= set(probe_columns)
    columns = []
    for key in sorted(keys, key=_column_order):
        env, split = key.split("/", 1)
        columns.append({"key": key, "env": env, "split": split, "kind": split_kind(env, split)})
    return {
        "columns": columns,
        "rows": measured + reported,
        "probe_columns": sorted(probe_columns, key=_column_order),
        "notes": notes,
        "runs": runs,
    }


def _column_order(key: str) -> tuple[str, tuple[int, int, str]]:
    env, split = key.split("/", 1)
    return (env, _split_order(env, split))


def _attach_probes(rows: dict[str, dict[str, Any]], probes: list[ProbeRecord], agent_of: dict[str, str]) -> set[str]:
    """Put each (agent, split)'s probe over the most transitions (then the latest) into the
    ``probes`` of that agent's rows (``agent_of``: row label -> agent), adding a row for an
    agent that has none; returns the column keys that got a probe."""
    best: dict[tuple[str, str], ProbeRecord] = {}
    for probe in probes:
        key = (probe.agent, f"{probe.env}/{probe.split}")
        held = best.get(key)
        if held is None or (probe.transitions, probe.created_at) > (held.transitions, held.created_at):
            best[key] = probe
    for (agent, column), probe in best.items():
        labels = [label for label, base in agent_of.items() if base == agent] or [agent]
        for label in dict.fromkeys(labels):
            row = rows.setdefault(
                label,
                {"agent": label, "source": "measured", "reference": None, "protocol": {}, "cells": {}, "probes": {}},
            )
            row["probes"][column] = {
                "probe_id": probe.probe_id,
                "sp_token_accuracy": probe.sp_token_accuracy,
                "sp_exact_match": probe.sp_exact_match,
                "id_accuracy": probe.id_accuracy,
                "id_chance": probe.id_chance,
                "transitions": probe.transitions,
                "episodes": probe.episodes,
                "seed": probe.seed,
                "sp_template": probe.sp_template,
                "id_template": probe.id_template,
                "policy_template": probe.policy_template,
                "created_at": probe.created_at,
            }
    return {column for _, column in best}


def _mean_success(row: dict[str, Any]) -> float:
    rates = [c["success_rate"] for c in row["cells"].values() if c["success_rate"] is not None]
    return sum(rates) / len(rates) if rates else -1.0


# ---- rendering --------------------------------------------------------------------------


def _rate_cell(cell: dict[str, Any] | None) -> str:
    if cell is None or cell["success_rate"] is None:
        return "-"
    text = f"{100 * cell['success_rate']:.1f}"
    if cell["ci_low"] is not None:
        text += f" [{100 * cell['ci_low']:.1f}, {100 * cell['ci_high']:.1f}]"
    if cell["rank"] is not None:
        text = f"#{cell['rank']} " + text
    elif cell["run_id"] is not None:
        text += " (unranked)"
    return text


def probe_cells(probe: dict[str, Any] | None) -> list[str]:
    """The "SP acc", "SP exact" and "ID acc" cells of one probe, in %; blank without a probe."""
    if probe is None:
        return [""] * len(PROBE_HEADERS)
    identity = format_number(probe["id_accuracy"], percent=True)
    if probe["id_chance"] is not None:
        identity += f" (chance {format_number(probe['id_chance'], percent=True)})"
    return [
        format_number(probe["sp_token_accuracy"], percent=True),
        format_number(probe["sp_exact_match"], percent=True),
        identity,
    ]


def _env_tables(data: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]], list[str]]]:
    """Per env: (env, headers, cell rows, footnotes)."""
    tables = []
    envs = list(dict.fromkeys(c["env"] for c in data["columns"]))
    for env in envs:
        columns = [c for c in data["columns"] if c["env"] == env]
        probed = set(data.get("probe_columns") or ())
        headers = ["agent"]
        for c in columns:
            headers += [f"{c['split']} ({c['kind']}) success %", "turns", "turns (succ.)"]
            if c["key"] in probed:
                headers += PROBE_HEADERS
        body: list[list[str]] = []
        footnotes: list[str] = []
        for row in data["rows"]:
            if not any(c["key"] in row["cells"] or c["key"] in row.get("probes", {}) for c in columns):
                continue
            label = row["agent"]
            if row["source"] == "reported":
                footnotes.append(
                    f"[R{len(footnotes) + 1}] {row['agent']}: {row['reference']['model']}; "
                    f"{row['reference']['paper']}"
                    + (f" <{row['reference']['url']}>" if row["reference"]["url"] else "")
                    + "; "
                    + "; ".join(
                        f"{c['split']}: {row['cells'][c['key']]['protocol_note']}"
                        for c in columns
                        if c["key"] in row["cells"]
                    )
                )
                label = f"{label} (reported) [R{len(footnotes)}]"
            cells = [label]
            for c in columns:
                cell = row["cells"].get(c["key"])
                cells += [
                    _rate_cell(cell),
                    format_number(cell["mean_turns"], 1) if cell else "-",
                    format_number(cell["mean_turns_success"], 1) if cell else "-",
                ]
                if c["key"] in probed:
                    cells += probe_cells(row.get("probes", {}).get(c["key"]))
            body.append(cells)
        tables.append((env, headers, body, footnotes))
    return tables


def _markdown_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|")


def render_leaderboard(data: dict[str, Any], fmt: str = "text") -> str:
    """``data`` (from :func:`leaderboard_data`) as aligned text tables (one per env), Markdown,
    or JSON."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown leaderboard format {fmt!r}; choose from {', '.join(FORMATS)}")
    if fmt == "json":
        return json.dumps(data, indent=2)
    if not data["runs"] and fmt == "text":
        prefix = ["no runs recorded yet", ""]
    else:
        prefix = []
    out: list[str] = list(prefix)
    for env, headers, body, footnotes in _env_tables(data):
        if fmt == "markdown":
            out.append(f"### {env}")
            out.append("")
            out.append("| " + " | ".join(headers) + " |")
            out.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|")
            out += ["| " + " | ".join(_markdown_cell(c) for c in cells) + " |" for cells in body]
            out += [""] + [f"- {_markdown_cell(f)}" for f in footnotes]
        else:
            out.append(f"== {env} ==")
            out.append(format_table(headers, body, align_right=set(range(1, len(headers)))))
            out += footnotes
        out.append("")
    if data["notes"]:
        out += [
            ("- " if fmt == "markdown" else "note: ") + (_markdown_cell(n) if fmt == "markdown" else n)
            for n in data["notes"]
        ]
    return "\n".join(out).rstrip()


RUN_HEADERS = [
    "run id",
    "env",
    "split",
    "agent",
    "episodes",
    "success % [95% CI]",
    "score",
    "turns",
    "turns (succ.)",
    "valid %",
]


def _run_cells(row: dict[str, Any]) -> list[str]:
    if row["episodes_done"]:
        rate = f"{100 * row['success_rate']:.1f} [{100 * row['ci_low']:.1f}, {100 * row['ci_high']:.1f}]"
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


def render_runs(rows: list[dict[str, Any]], fmt: str = "text") -> str:
    """Every run as one table row (``envrl leaderboard --runs``)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown leaderboard format {fmt!r}; choose from {', '.join(FORMATS)}")
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "markdown":
        lines = [
            "| " + " | ".join(RUN_HEADERS) + " |",
            "|" + "|".join("---:" if i >= 4 else "---" for i in range(len(RUN_HEADERS))) + "|",
        ]
        lines += ["| " + " | ".join(_markdown_cell(c) for c in _run_cells(row)) + " |" for row in rows]
        return "\n".join(lines)
    if not rows:
        return "no runs recorded yet"
    return format_table(RUN_HEADERS, [_run_cells(r) for r in rows], align_right=set(range(4, len(RUN_HEADERS))))


def leaderboard(runs_dir: str | os.PathLike[str] | None = None, fmt: str = "text", runs: bool = False) -> str:
    """The leaderboard of every run under ``runs_dir`` (default ``$ENVRL_RUNS_DIR`` or
    ``./runs``): per agent (default) or per run (``runs=True``)."""
    if runs:
        return render_runs(run_rows(runs_dir), fmt)
    return render_leaderboard(leaderboard_data(runs_dir), fmt)
