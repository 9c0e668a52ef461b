"""Evaluation metrics: pure functions over episode records.

Every function here takes an iterable of episode records, either
:class:`envrl.evaluation.store.EpisodeRecord` objects or plain mappings with the same keys
(``success``, ``score``, ``turns``, ``valid_action_ratio``, ``task_type``, ``split``,
``error``), and returns plain numbers, so the runner, the leaderboard and notebooks compute
the same figures the same way.

Conventions:

* success rate: successes / episodes, with a 95% Wilson score interval (it stays inside
  [0, 1] and behaves well for small n and rates near 0 or 1, unlike the normal interval);
* an episode recorded with an ``error`` counts as a failure: it stays in the denominator;
* mean turns of successes is ``None`` when no episode succeeded;
* valid-action ratio is the mean over episodes of each episode's own ratio (so a long episode
  does not weigh more than a short one); episodes without any step (ratio ``None``, e.g. an
  episode whose worker died before the first action) are left out of that mean only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

#: two-sided 95% normal quantile, Phi^-1(0.975)
Z_95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``successes / n``.

    ``(centre ± half) / (1 + z²/n)`` with ``centre = p + z²/(2n)`` and
    ``half = z * sqrt(p(1-p)/n + z²/(4n²))``. For ``n == 0`` there is no information and the
    interval is the whole ``(0.0, 1.0)``.
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denominator = 1.0 + z2 / n
    centre = p + z2 / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    low = (centre - half) / denominator
    high = (centre + half) / denominator
    # exact at the ends (the formula gives 0 and 1 there, up to rounding)
    if successes == 0:
        low = 0.0
    if successes == n:
        high = 1.0
    return max(0.0, low), min(1.0, high)


def _field(record: Any, name: str, default: Any = None) -> Any:
    if isinstance(record, Mapping):
        return record.get(name, default)
    return getattr(record, name, default)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class Metrics:
    """The figures of one group of episodes (a run, a task type, a split)."""

    episodes: int
    successes: int
    success_rate: float
    ci_low: float
    ci_high: float
    mean_score: float | None
    mean_turns: float | None
    mean_turns_success: float | None
    valid_action_ratio: float | None
    errors: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(records: Iterable[Any]) -> Metrics:
    """Success rate (+ 95% Wilson CI), mean score, mean turns, mean turns of successes,
    valid-action ratio and error count over ``records``."""
    records = list(records)
    n = len(records)
    successes = [bool(_field(r, "success", False)) for r in records]
    k = sum(successes)
    low, high = wilson_interval(k, n)
    scores = [float(_field(r, "score", 0.0) or 0.0) for r in records]
    turns = [int(_field(r, "turns", 0) or 0) for r in records]
    turns_success = [t for t, s in zip(turns, successes, strict=True) if s]
    ratios = [float(v) for v in (_field(r, "valid_action_ratio") for r in records) if v is not None]
    errors = sum(1 for r in records if _field(r, "error"))
    return Metrics(
        episodes=n,
        successes=k,
        success_rate=k / n if n else 0.0,
        ci_low=low,
        ci_high=high,
        mean_score=_mean(scores),
        mean_turns=_mean([float(t) for t in turns]),
        mean_turns_success=_mean([float(t) for t in turns_success]),
        valid_action_ratio=_mean(ratios),
        errors=errors,
    )


def group_by(records: Iterable[Any], key: str | Callable[[Any], Any]) -> dict[str, Metrics]:
    """``summarize`` per value of ``key`` (a record field name or a function), sorted by key."""
    get = (lambda r: _field(r, key)) if isinstance(key, str) else key
    groups: dict[str, list[Any]] = {}
    for record in records:
        value = get(record)
        groups.setdefault("" if value is None else str(value), []).append(record)
    return {name: summarize(groups[name]) for name in sorted(groups)}


@dataclass(frozen=True)
class MetricsReport:
    """Overall, per task type and per split."""

    overall: Metrics
    by_task_type: dict[str, Metrics]
    by_split: dict[str, Metrics]

    def to_dict(self) -> dict[str, Any]:
        return {
            "overall": self.overall.to_dict(),
            "by_task_type": {k: v.to_dict() for k, v in self.by_task_type.items()},
            "by_split": {k: v.to_dict() for k, v in self.by_split.items()},
        }


def compute_metrics(records: Iterable[Any]) -> MetricsReport:
    """All metrics of a set of episodes: overall, per task type and per split."""
    records = list(records)
    return MetricsReport(
        overall=summarize(records),
        by_task_type=group_by(records, "task_type"),
        by_split=group_by(records, "split"),
    )


# ---- formatting helpers shared by the CLI and the leaderboard ---------------------------


def format_rate(metrics: Metrics) -> str:
    """``"70.0 [39.7, 89.2]"``: success % with its 95% CI, one decimal."""
    return f"{100 * metrics.success_rate:.1f} [{100 * metrics.ci_low:.1f}, {100 * metrics.ci_high:.1f}]"


def format_number(value: float | None, digits: int = 2, percent: bool = False) -> str:
    if value is None:
        return "-"
    if percent:
        return f"{100 * value:.1f}"
    return f"{value:.{digits}f}"


def format_table(headers: list[str], rows: list[list[str]], align_right: set[int] | None = None) -> str:
    """Plain aligned text table (no dependency), columns separated by two spaces."""
    align_right = align_right or set()
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: list[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            out.append(cell.rjust(widths[i]) if i in align_right else cell.ljust(widths[i]))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def report_table(report: MetricsReport, group_label: str = "task type") -> str:
    """The table the CLI prints after a run: one row overall, then one per task type."""
    headers = [group_label, "episodes", "success % [95% CI]", "score", "turns", "turns (succ.)", "valid %", "errors"]

    def row(name: str, m: Metrics) -> list[str]:
        return [
            name,
            str(m.episodes),
            format_rate(m),
            format_number(m.mean_score),
            format_number(m.mean_turns, 1),
            format_number(m.mean_turns_success, 1),
            format_number(m.valid_action_ratio, percent=True),
            str(m.errors),
        ]

    rows = [row("ALL", report.overall)]
    rows += [row(name or "(unknown)", m) for name, m in report.by_task_type.items()]
    return format_table(headers, rows, align_right={1, 3, 4, 5, 6, 7})
