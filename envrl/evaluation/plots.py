"""The run page's figures: plain data in, PNG bytes out.

Every function builds a :class:`matplotlib.figure.Figure` directly and draws it on the Agg
canvas, never through ``pyplot``: pyplot keeps a global registry of open figures (a figure
forgotten there leaks for the life of the server) and picks a backend from the environment,
while a bare ``Figure`` is garbage like any object and renders the same headless or not. So
the functions are pure, safe to call from the web server, and leave ``pyplot`` untouched.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

if TYPE_CHECKING:  # matplotlib.typing is newer than the oldest matplotlib supported
    from matplotlib.typing import LegendLocType

#: colours of the figures (colour-blind safe pairs from the Okabe-Ito palette)
COLOR_ID = "#0072B2"
COLOR_OOD = "#E69F00"
COLOR_SUCCESS = "#009E73"
COLOR_FAILURE = "#D55E00"
COLOR_NEUTRAL = "#0072B2"

#: figure size in inches and resolution: 640 x 320 pixels, readable beside a table
FIGSIZE = (6.4, 3.2)
DPI = 100

#: longest axis label drawn in full; longer ones are cut with an ellipsis
MAX_LABEL = 24


class _LegendStyle(TypedDict):
    """Keyword arguments for ``Axes.legend``, typed so that each one meets its parameter."""

    loc: LegendLocType
    bbox_to_anchor: tuple[float, float]
    fontsize: int
    frameon: bool


#: legends sit right of the axes, where no bar can hide them
LEGEND = _LegendStyle(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)


@dataclass(frozen=True)
class RateBar:
    """One bar of a success-rate chart: a rate in [0, 1] with its 95% interval."""

    label: str
    rate: float
    ci_low: float
    ci_high: float
    episodes: int
    kind: str = ""  # "ID" or "OOD" on the split chart, else ""
    highlight: bool = False  # drawn with a dark edge (the run the page is about)


def _short(label: str) -> str:
    return label if len(label) <= MAX_LABEL else label[: MAX_LABEL - 1] + "\u2026"


def _new_figure() -> Figure:
    figure = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself as figure.canvas
    return figure


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    figure.clear()
    return buffer.getvalue()


def _empty(figure: Figure, message: str) -> bytes:
    axes = figure.add_subplot()
    axes.set_axis_off()
    axes.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, color="#666666", transform=axes.transAxes)
    return _png(figure)


def rate_bars_png(
    bars: Sequence[RateBar], title: str, colors: Sequence[str] | None = None, legend: Sequence[tuple[str, str]] = ()
) -> bytes:
    """Bars of success % with 95% CI whiskers and ``k/n`` above each bar.

    ``colors`` gives one colour per bar (default: all :data:`COLOR_NEUTRAL`); ``legend`` is
    ``(label, colour)`` pairs explaining them (none by default)."""
    figure = _new_figure()
    if not bars:
        return _empty(figure, "no episodes yet")
    colors = list(colors) if colors is not None else [COLOR_NEUTRAL] * len(bars)
    axes = figure.add_subplot()
    positions = list(range(len(bars)))
    heights = [100 * b.rate for b in bars]
    below = [100 * max(0.0, b.rate - b.ci_low) for b in bars]
    above = [100 * max(0.0, b.ci_high - b.rate) for b in bars]
    axes.bar(
        positions,
        heights,
        color=colors,
        width=0.6,
        edgecolor=["#222222" if b.highlight else "none" for b in bars],
        linewidth=[2.0 if b.highlight else 0.0 for b in bars],
    )
    axes.errorbar(positions, heights, yerr=[below, above], fmt="none", ecolor="#333333", capsize=4, linewidth=1)
    for x, bar in zip(positions, bars, strict=True):
        successes = round(bar.rate * bar.episodes)
        axes.text(
            x,
            min(100 * bar.ci_high + 2, 104),
            f"{successes}/{bar.episodes}",
            ha="center",
            va="bottom",
            fontsize=8,
            color="#333333",
        )
    crowded = len(bars) > 4
    axes.set_xticks(
        positions, [_short(b.label) for b in bars], rotation=20 if crowded else 0, ha="right" if crowded else "center"
    )
    axes.set_ylim(0, 112)
    axes.set_yticks([0, 20, 40, 60, 80, 100])
    axes.set_ylabel("success % (95% CI)")
    axes.set_title(title, fontsize=11)
    axes.spines[["top", "right"]].set_visible(False)
    axes.grid(axis="y", alpha=0.3)
    if legend:
        axes.legend(handles=[Patch(color=color, label=label) for label, color in legend], **LEGEND)
    return _png(figure)


def task_type_png(bars: Sequence[RateBar]) -> bytes:
    """Success per task type of one run."""
    return rate_bars_png(bars, "success by task type")


def split_png(bars: Sequence[RateBar]) -> bytes:
    """Success of one agent on each split of an env, ID and OOD splits in two colours (the
    bar with ``highlight`` is the run the page is about)."""
    colors = [COLOR_OOD if b.kind == "OOD" else COLOR_ID for b in bars]
    legend = [
        (kind, COLOR_OOD if kind == "OOD" else COLOR_ID)
        for kind in ("ID", "OOD")
        if any((b.kind == "OOD") == (kind == "OOD") for b in bars)
    ]
    return rate_bars_png(bars, "same agent on every split of this env", colors, legend)


def turns_histogram_png(success_turns: Sequence[int], failure_turns: Sequence[int]) -> bytes:
    """Histogram of turns per episode, successes and failures stacked in two colours.

    Bins are one turn wide while the range allows (up to 60 bins), else 60 equal bins."""
    figure = _new_figure()
    values = list(success_turns) + list(failure_turns)
    if not values:
        return _empty(figure, "no episodes yet")
    low, high = min(values), max(values)
    if high - low + 1 <= 60:
        edges = [v - 0.5 for v in range(low, high + 2)]
    else:
        width = (high - low) / 60
        edges = [low + i * width for i in range(61)]
        edges[-1] = math.nextafter(high, math.inf)
    axes = figure.add_subplot()
    axes.hist(
        [list(success_turns), list(failure_turns)],
        bins=edges,
        stacked=True,
        color=[COLOR_SUCCESS, COLOR_FAILURE],
        label=[f"successes ({len(success_turns)})", f"failures ({len(failure_turns)})"],
    )
    axes.set_xlim(edges[0] - 1, edges[-1] + 1)  # a single bin still gets a readable axis
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("turns")
    axes.set_ylabel("episodes")
    axes.set_title("turns per episode", fontsize=11)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.spines[["top", "right"]].set_visible(False)
    axes.legend(**LEGEND)
    return _png(figure)


__all__ = [
    "COLOR_FAILURE",
    "COLOR_ID",
    "COLOR_OOD",
    "COLOR_SUCCESS",
    "RateBar",
    "rate_bars_png",
    "split_png",
    "task_type_png",
    "turns_histogram_png",
]
