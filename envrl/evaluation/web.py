"""A small web viewer for a results store: leaderboard, run pages, trajectory viewer.

Routes (all GET, server-side rendered, plain links: it works without JavaScript):

``/``
    the leaderboard of :func:`envrl.evaluation.leaderboard.leaderboard_data` (measured rows,
    then reported rows with their references; a split with world-model probes gets an
    "SP acc", "SP exact" and "ID acc" column after its own), its notes, then every run in the store;
``/runs/<run_id>``
    one run: config, overall metrics, per-task-type table, plots, the same agent on the
    env's other splits, LLM agent figures when the steps carry ``agent_info``, episodes;
``/runs/<run_id>/plots/<name>.png``
    the run page's figures (:data:`PLOTS`), rendered by :mod:`envrl.evaluation.plots`;
``/runs/<run_id>/episodes/<index>?step=k``
    one episode, one step at a time (``k = 0`` is the initial observation).

An unknown run, episode, plot or step answers 404. The viewer only reads: it goes through
the :class:`~envrl.evaluation.store.ResultStore` read methods (one short read-only SQLite
read per call, so a run being written is shown as far as it got, and a read-only runs
directory can be browsed) and never takes a run's lock. An episode record that cannot be
read is left out, and the run page says which; a store that cannot be read at all answers
503 with the reason (and :func:`serve` refuses to start on one). Everything that comes from
the store is escaped by Jinja's autoescape; templates never mark data ``|safe``.

Loaded trajectories and rendered plots are cached in memory, keyed by the run's
``updated_at`` and episode count, which every appended episode changes, so a page never
shows stale data and a finished run is read once.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response, abort, render_template, request
from jinja2 import BaseLoader, ChoiceLoader, DictLoader
from werkzeug.wrappers import Response as WerkzeugResponse

from envrl.evaluation import plots
from envrl.evaluation.leaderboard import leaderboard_data, split_kind
from envrl.evaluation.metrics import Metrics, compute_metrics, summarize
from envrl.evaluation.store import EpisodeLoad, EpisodeRecord, ResultStore, StoreError

#: figures of a run page, by the name in their URL
PLOTS = ("task_types", "turns", "splits")

#: ``agent_info`` keys shown first in the trajectory viewer, in this order; others follow sorted
AGENT_INFO_ORDER = ("think", "response", "format_valid", "error", "prompt_tokens", "completion_tokens", "latency")

#: how many runs' full episode records stay in memory
EPISODE_CACHE_RUNS = 4

#: how many rendered figures stay in memory
PLOT_CACHE_SIZE = 128

_STEP_RE = re.compile(r"[0-9]{1,9}")

#: templates defined here rather than as files: the run page with a note above it on the
#: episode records that could not be read, and the page of a store that cannot be read (503)
_RUN_PAGE = "web_run_checked.html"
_STORE_ERROR_PAGE = "web_store_error.html"
_TEMPLATES = {
    _RUN_PAGE: """{% extends "web_run.html" %}
{% block content %}
{% if skipped %}
<p id="skipped" class="notes">Skipped {{ skipped|length }} unreadable episode record{{ "s" if skipped|length != 1 }}
 of this run; the rest are shown: {{ skipped|join("; ") }}.</p>
{% endif %}
{{ super() }}
{% endblock %}""",
    _STORE_ERROR_PAGE: """{% extends "web_base.html" %}
{% block title %}results unavailable{% endblock %}
{% block content %}
<h1>The results cannot be read</h1>
<p id="error">{{ description }}</p>
{% endblock %}""",
}


# ---- formatting (Jinja filters) ---------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def format_percent(value: Any) -> str:
    """A rate in [0, 1] as a percentage with one decimal (``"70.0"``); ``"–"`` for no value."""
    number = _number(value)
    return "\u2013" if number is None else f"{100 * number:.1f}"


def format_ci(low: Any, high: Any) -> str:
    """A 95% interval as ``"[60.0, 80.0]"``; ``""`` when either end is missing."""
    if _number(low) is None or _number(high) is None:
        return ""
    return f"[{format_percent(low)}, {format_percent(high)}]"


def format_decimal(value: Any, digits: int = 1) -> str:
    """A number with ``digits`` decimals; ``"–"`` for no value."""
    number = _number(value)
    return "\u2013" if number is None else f"{number:.{digits}f}"


def format_time(timestamp: Any) -> str:
    """A Unix timestamp as ``"2026-01-31 12:00 UTC"``."""
    number = _number(timestamp)
    if number is None:
        return "\u2013"
    return datetime.fromtimestamp(number, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def http_url(value: Any) -> str | None:
    """``value`` if it is an http(s) URL, else None: a reference link from the data must not
    become a ``javascript:`` link."""
    if not isinstance(value, str):
        return None
    try:
        scheme = urlsplit(value.strip()).scheme.lower()
    except ValueError:
        return None
    return value.strip() if scheme in ("http", "https") else None


def _text(value: Any) -> str:
    """A value of a config or protocol as one string: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


# ---- reading the store -------------------------------------------------------------------


class _LRU:
    """A small thread-safe least-recently-used map."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key]

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


def _fingerprint(run: Mapping[str, Any]) -> tuple[Any, ...]:
    """What changes whenever an episode of ``run`` is recorded."""
    return (run["run_id"], run["updated_at"], len(run["episodes"]))


class _Reader:
    """The store as the viewer sees it: read methods only, and the two caches."""

    def __init__(self, runs_dir: str | os.PathLike[str] | None):
        self.store = ResultStore(runs_dir)
        self._episodes = _LRU(EPISODE_CACHE_RUNS)
        self._plots = _LRU(PLOT_CACHE_SIZE)
        self._render_lock = threading.Lock()  # matplotlib is not thread-safe; plots are cached anyway

    def runs(self) -> list[dict[str, Any]]:
        return self.store.list_runs()

    def run(self, run_id: str, runs: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
        """The run named ``run_id`` (as :meth:`ResultStore.list_runs` gives it), else 404."""
        for run in runs if runs is not None else self.runs():
            if run["run_id"] == run_id:
                return dict(run)
        abort(404, description=f"There is no run named {run_id!r} in this store.")

    def load(self, run: Mapping[str, Any]) -> EpisodeLoad:
        """Full records of ``run`` and the ones that could not be read (cached until the run
        changes)."""
        key = _fingerprint(run)
        cached = self._episodes.get(key)
        if cached is None:
            cached = self.store.read_episodes(run["run_id"])
            self._episodes.put(key, cached)
        return cached

    def episodes(self, run: Mapping[str, Any]) -> dict[int, EpisodeRecord]:
        """The readable full records of ``run`` by episode index."""
        return {r.episode_index: r for r in self.load(run).records}

    def plot(self, key: Hashable, render: Callable[[], bytes]) -> bytes:
        png = self._plots.get(key)
        if png is None:
            with self._render_lock:
                png = render()
            self._plots.put(key, png)
        return png


# ---- view models -------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitRun:
    """A run of the same agent on one split of the same env (the run page's ID vs OOD view)."""

    run_id: str
    split: str
    kind: str
    seed: int
    metrics: Metrics
    current: bool


def _same_agent_runs(run: Mapping[str, Any], runs: Iterable[Mapping[str, Any]]) -> list[SplitRun]:
    """Every run of ``run``'s agent on ``run``'s env, ID splits first, then OOD."""
    rows = []
    for other in runs:
        if other["env"] != run["env"] or other["agent"] != run["agent"]:
            continue
        rows.append(
            SplitRun(
                run_id=other["run_id"],
                split=other["split"],
                kind=split_kind(other["env"], other["split"]),
                seed=other["seed"],
                metrics=summarize(other["episodes"]),
                current=other["run_id"] == run["run_id"],
            )
        )
    rows.sort(key=lambda r: (r.kind != "ID", r.split, r.seed, r.run_id))
    return rows


def _split_bars(rows: Sequence[SplitRun]) -> list[plots.RateBar]:
    splits = [r.split for r in rows]
    bars = []
    for row in rows:
        label = row.split if splits.count(row.split) == 1 else f"{row.split} ({row.run_id})"
        m = row.metrics
        bars.append(
            plots.RateBar(
                label=label,
                rate=m.success_rate,
                ci_low=m.ci_low,
                ci_high=m.ci_high,
                episodes=m.episodes,
                kind=row.kind,
                highlight=row.current,
            )
        )
    return bars


def _task_type_bars(episodes: Sequence[Mapping[str, Any]]) -> list[plots.RateBar]:
    return [
        plots.RateBar(
            label=name or "(unknown)", rate=m.success_rate, ci_low=m.ci_low, ci_high=m.ci_high, episodes=m.episodes
        )
        for name, m in compute_metrics(episodes).by_task_type.items()
    ]


@dataclass(frozen=True)
class AgentInfoStats:
    """What the steps' ``agent_info`` adds up to over a run (LLM agents)."""

    steps: int  # steps that carry agent_info
    format_checked: int  # of those, steps that say whether the response was well formed
    format_invalid: int
    errors: int  # steps whose model call failed
    prompt_tokens: int | None
    completion_tokens: int | None
    mean_latency: float | None

    @property
    def format_invalid_share(self) -> float | None:
        return self.format_invalid / self.format_checked if self.format_checked else None


def agent_info_stats(records: Iterable[EpisodeRecord]) -> AgentInfoStats | None:
    """Format-invalid share, model errors, token totals and mean latency over every step of
    ``records`` that has ``agent_info``; None when no step has any (random, expert agents)."""
    steps = checked = invalid = errors = 0
    prompt: int | None = None
    completion: int | None = None
    latencies: list[float] = []
    for record in records:
        for step in record.trajectory:
            info = step.agent_info
            if not info:
                continue
            steps += 1
            if isinstance(info.get("format_valid"), bool):
                checked += 1
                invalid += not info["format_valid"]
            if info.get("error"):
                errors += 1
            if _number(info.get("prompt_tokens")) is not None:
                prompt = (prompt or 0) + int(info["prompt_tokens"])
            if _number(info.get("completion_tokens")) is not None:
                completion = (completion or 0) + int(info["completion_tokens"])
            if _number(info.get("latency")) is not None:
                latencies.append(float(info["latency"]))
    if not steps:
        return None
    return AgentInfoStats(
        steps=steps,
        format_checked=checked,
        format_invalid=invalid,
        errors=errors,
        prompt_tokens=prompt,
        completion_tokens=completion,
        mean_latency=sum(latencies) / len(latencies) if latencies else None,
    )


@dataclass(frozen=True)
class InfoItem:
    """One ``agent_info`` entry as the viewer shows it: long text in a block, the rest inline."""

    key: str
    text: str
    block: bool


def agent_info_items(info: Mapping[str, Any] | None) -> list[InfoItem]:
    """The entries of one step's ``agent_info``, known keys first (:data:`AGENT_INFO_ORDER`)."""
    if not info:
        return []
    keys = [k for k in AGENT_INFO_ORDER if k in info] + sorted(k for k in info if k not in AGENT_INFO_ORDER)
    items = []
    for key in keys:
        value = info[key]
        if isinstance(value, str):
            items.append(InfoItem(str(key), value, block="\n" in value or len(value) > 80))
        elif isinstance(value, bool) or value is None or isinstance(value, (int, float)):
            items.append(InfoItem(str(key), json.dumps(value), block=False))
        else:
            items.append(InfoItem(str(key), json.dumps(value, ensure_ascii=False, indent=2, default=str), block=True))
    return items


#: the figures of a probe, in the order of the leaderboard's probe columns
PROBE_FIGURES = ("sp_token_accuracy", "sp_exact_match", "id_accuracy")


def _leaderboard_view(data: Mapping[str, Any]) -> dict[str, Any]:
    """``leaderboard_data``'s dict arranged for the template: column groups per env (a probed
    column spans its probe columns too), each column marked ``probed``, and each row's cells
    and probes as lists aligned with the columns (None where the row has none)."""
    probed = set(data.get("probe_columns") or ())
    columns = [dict(column, probed=column.get("key") in probed) for column in data.get("columns") or []]
    groups: list[list[Any]] = []
    for column in columns:
        span = 1 + len(PROBE_FIGURES) * column["probed"]
        if groups and groups[-1][0] == column.get("env"):
            groups[-1][1] += span
        else:
            groups.append([column.get("env"), span])
    measured: list[dict[str, Any]] = []
    reported: list[dict[str, Any]] = []
    for row in data.get("rows") or []:
        cells = row.get("cells") or {}
        reference = row.get("reference")
        if isinstance(reference, Mapping):
            reference = dict(reference, link=http_url(reference.get("url")))
        view = {
            "agent": row.get("agent"),
            "source": "reported" if row.get("source") == "reported" else "measured",
            "reference": reference or None,
            "protocol": [(str(k), _text(v)) for k, v in sorted((row.get("protocol") or {}).items())],
            "cells": [cells.get(column.get("key")) for column in columns],
            "probes": [(row.get("probes") or {}).get(column.get("key")) for column in columns],
        }
        (reported if view["source"] == "reported" else measured).append(view)
    return {
        "columns": columns,
        "width": 1 + sum(span for _, span in groups),
        "probe_metrics": PROBE_FIGURES,
        "env_groups": groups,
        "measured": measured,
        "reported": reported,
        "notes": list(data.get("notes") or []),
    }


def skipped_notes(run: Mapping[str, Any], load: EpisodeLoad) -> list[str]:
    """What the run page says about the records it had to leave out: which episodes and why
    (a malformed record), and how many summary rows held unusable values."""
    notes = [f"episode {index} ({reason})" for index, reason in sorted(load.skipped.items())]
    rows = int(run.get("skipped") or 0)
    if rows:
        notes.append(f"{rows} episode row{'s' if rows != 1 else ''} with unusable values")
    return notes


def _step_number(raw: str | None, last: int) -> int:
    """The ``step`` query argument as an int in ``0..last``; anything else is a 404."""
    if raw is None:
        return 0
    if not _STEP_RE.fullmatch(raw) or int(raw) > last:
        abort(404, description=f"There is no step {raw!r} in this episode (steps 0 to {last}).")
    return int(raw)


# ---- the app -----------------------------------------------------------------------------


def create_app(runs_dir: str | os.PathLike[str] | None = None) -> Flask:
    """The viewer of the results store under ``runs_dir`` (default ``$ENVRL_RUNS_DIR`` or
    ``./runs``), as a Flask app (a WSGI callable: serve it with :func:`serve` or any WSGI
    server). The store is read on every request; nothing is loaded up front."""
    app = Flask(__name__)
    reader = _Reader(runs_dir)
    app.extensions["envrl_reader"] = reader
    app.jinja_env.filters.update(pct=format_percent, decimal=format_decimal, when=format_time)
    app.jinja_env.globals.update(ci=format_ci, runs_dir=str(reader.store.runs_dir))
    app.jinja_env.trim_blocks = True
    app.jinja_env.lstrip_blocks = True
    # Flask's own loader (templates/ folders) first, then the pages defined in this module
    loaders: list[BaseLoader] = [DictLoader(_TEMPLATES)]
    if app.jinja_env.loader is not None:
        loaders.insert(0, app.jinja_env.loader)
    app.jinja_env.loader = ChoiceLoader(loaders)

    @app.get("/")
    def leaderboard_page() -> str:
        view = _leaderboard_view(leaderboard_data(reader.store.runs_dir))
        runs = sorted(reader.runs(), key=lambda r: (r["env"], r["split"], r["agent"], r["run_id"]))
        listed = [dict(run, metrics=summarize(run["episodes"])) for run in runs]
        return render_template("web_leaderboard.html", lb=view, runs=listed)

    @app.get("/runs/<run_id>")
    def run_page(run_id: str) -> str:
        runs = reader.runs()
        run = reader.run(run_id, runs)
        report = compute_metrics(run["episodes"])
        load = reader.load(run)
        return render_template(
            _RUN_PAGE,
            skipped=skipped_notes(run, load),
            run=run,
            report=report,
            planned=max(int(run["episodes_planned"]), report.overall.episodes),
            config_json=json.dumps(run["config"], indent=2, sort_keys=True, ensure_ascii=False, default=str),
            splits=_same_agent_runs(run, runs),
            llm=agent_info_stats(load.records),
        )

    @app.get("/runs/<run_id>/plots/<name>.png")
    def plot_png(run_id: str, name: str) -> WerkzeugResponse:  # make_conditional's declared type; it returns self
        if name not in PLOTS:
            abort(404, description=f"There is no plot named {name!r}; plots: {', '.join(PLOTS)}.")
        runs = reader.runs()
        run = reader.run(run_id, runs)
        episodes = run["episodes"]
        if name == "task_types":
            key: Hashable = (name, _fingerprint(run))
            png = reader.plot(key, lambda: plots.task_type_png(_task_type_bars(episodes)))
        elif name == "turns":
            key = (name, _fingerprint(run))
            png = reader.plot(
                key,
                lambda: plots.turns_histogram_png(
                    [int(e["turns"]) for e in episodes if e["success"]],
                    [int(e["turns"]) for e in episodes if not e["success"]],
                ),
            )
        else:
            rows = _same_agent_runs(run, runs)
            siblings = {row.run_id for row in rows}
            key = (name, run["run_id"], tuple(_fingerprint(r) for r in runs if r["run_id"] in siblings))
            png = reader.plot(key, lambda: plots.split_png(_split_bars(rows)))
        response = Response(png, mimetype="image/png", headers={"Cache-Control": "no-cache"})
        response.add_etag()  # the browser revalidates (the run may grow) and gets a 304 while it has not
        return response.make_conditional(request)

    @app.get("/runs/<run_id>/episodes/<int:index>")
    def episode_page(run_id: str, index: int) -> str:
        run = reader.run(run_id)
        load = reader.load(run)
        if index in load.skipped:
            abort(
                404,
                description=f"The record of episode {index} of run {run_id!r} cannot be read "
                f"({load.skipped[index]}); the run's other episodes are shown.",
            )
        records = reader.episodes(run)
        record = records.get(index)
        if record is None:
            abort(404, description=f"Run {run_id!r} has no episode {index}.")
        last = len(record.trajectory)
        step_number = _step_number(request.args.get("step"), last)
        step = record.trajectory[step_number - 1] if step_number else None
        indices = sorted(records)
        position = indices.index(index)
        return render_template(
            "web_episode.html",
            run=run,
            record=record,
            step_number=step_number,
            last=last,
            step=step,
            info=agent_info_items(step.agent_info) if step else [],
            previous_episode=indices[position - 1] if position > 0 else None,
            next_episode=indices[position + 1] if position + 1 < len(indices) else None,
        )

    @app.errorhandler(404)
    def not_found(error: Any) -> tuple[str, int]:
        description = getattr(error, "description", None) or "Not found."
        return render_template("web_404.html", description=description), 404

    @app.errorhandler(StoreError)
    def store_unreadable(error: StoreError) -> tuple[str, int]:
        """The store went bad while serving (it was checked at start): say why on the page."""
        return render_template(_STORE_ERROR_PAGE, description=str(error)), 503

    return app


# ---- serving -----------------------------------------------------------------------------


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def serve(runs_dir: str | os.PathLike[str] | None = None, host: str = "127.0.0.1", port: int = 8050) -> int:
    """Serve the viewer (werkzeug, threaded) until SIGINT or SIGTERM; returns the exit code.

    Prints the URL once listening (``port=0`` picks a free port and prints it). Returns 0
    after a signal, 1 when the store cannot be read or the address cannot be bound (the
    reason goes to stderr, one line). Meant for
    one person's browser on a trusted network: werkzeug's server is not a production server.
    """
    from werkzeug.serving import make_server

    from envrl.ports import check_port

    try:
        check_port(port)
    except ValueError as exc:
        print(f"envrl: cannot listen on {host}:{port}: the port {exc}", file=sys.stderr)
        return 1
    app = create_app(runs_dir)
    try:
        app.extensions["envrl_reader"].store.check_readable()
    except StoreError as exc:
        print(f"envrl serve: error: {exc}", file=sys.stderr)
        return 1
    try:
        server = make_server(host, port, app, threaded=True)
    except OSError as exc:
        print(f"envrl: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except SystemExit:  # werkzeug prints why (e.g. port in use) and exits
        print(f"envrl: cannot listen on {host}:{port}", file=sys.stderr)
        return 1
    shown_host = f"[{host}]" if ":" in host else host
    runs_path = app.extensions["envrl_reader"].store.runs_dir
    print(f"envrl: results in {runs_path} at http://{shown_host}:{server.server_port}/ (Ctrl-C to stop)", flush=True)
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not the main thread: the caller handles signals
        pass
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


__all__ = [
    "AGENT_INFO_ORDER",
    "PLOTS",
    "AgentInfoStats",
    "InfoItem",
    "SplitRun",
    "agent_info_items",
    "agent_info_stats",
    "create_app",
    "format_ci",
    "format_decimal",
    "format_percent",
    "format_time",
    "http_url",
    "serve",
]
