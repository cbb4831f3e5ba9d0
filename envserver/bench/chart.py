"""The report's chart: env steps per second of each variant, one horizontal bar chart per workload.

matplotlib is optional (``pip install 'envserver[plot]'``): it is imported only when a chart is
drawn, and only its object-oriented API with the Agg canvas, never ``pyplot``, so that drawing
leaves the process's backend and figures as they were.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from envserver.bench.variants import Workload

__all__ = ["ENVSERVER_PREFIXES", "PLOT_EXTRA", "Bar", "bars_of", "write_chart"]

#: What installs matplotlib for the chart.
PLOT_EXTRA = "envserver[plot]"
#: Variants whose names start so are envserver's; the others (Gymnasium's vector envs, SB3's
#: SubprocVecEnv, PufferLib's Multiprocessing, the raw ZeroMQ floor) are there for reference.
ENVSERVER_PREFIXES = ("Remote", "make_vec")
#: Colours of envserver's bars and of the reference variants' bars.
ENVSERVER_COLOUR, REFERENCE_COLOUR = "tab:blue", "tab:gray"
#: Inches per bar, and per subplot besides its bars (title, axis).
BAR_HEIGHT_IN, SUBPLOT_EXTRA_IN = 0.28, 0.9


class Bar(NamedTuple):
    """One variant's bar.

    Attributes:
        name: The variant's name (its row in the table).
        rate: Its median env steps per second; None when it failed or did not run.
        envserver: Whether it is envserver's (otherwise it is there for reference).
    """

    name: str
    rate: float | None
    envserver: bool


def bars_of(workload: Workload) -> list[Bar]:
    """The bars of one workload, in its table's order."""
    return [
        Bar(
            variant.name,
            statistics.median(variant.rates) if variant.rates and not variant.error else None,
            variant.name.startswith(ENVSERVER_PREFIXES),
        )
        for variant in workload.variants
    ]


def _draw(axes: Any, title: str, bars: list[Bar]) -> None:
    """One workload's horizontal bars, the first variant on top, each labelled with its rate."""
    positions = range(len(bars))
    rates = [bar.rate or 0.0 for bar in bars]
    colours = [ENVSERVER_COLOUR if bar.envserver else REFERENCE_COLOUR for bar in bars]
    axes.barh(positions, rates, color=colours)
    axes.set_yticks(positions, [bar.name for bar in bars], fontsize=8)
    axes.invert_yaxis()
    axes.set_title(title, fontsize=9, loc="left")
    axes.set_xlabel("env steps/s (median over rounds)", fontsize=8)
    axes.tick_params(axis="x", labelsize=8)
    axes.xaxis.set_major_formatter("{x:,.0f}")
    axes.set_xlim(0, max(rates, default=0.0) * 1.15 or 1.0)  # room for the labels
    for position, bar in zip(positions, bars):
        label = " failed" if bar.rate is None else f" {bar.rate:,.0f}"
        axes.text(bar.rate or 0.0, position, label, va="center", fontsize=7)


def write_chart(workloads: Sequence[Workload], path: Path, title: str) -> None:
    """Draws each workload's env steps per second, one subplot each, into a PNG.

    Args:
        workloads: The workloads, as their tables are in the report.
        path: The PNG to write.
        title: The figure's title (the report's).

    Raises:
        ImportError: matplotlib cannot be imported (``pip install 'envserver[plot]'``).
        ValueError: ``workloads`` is empty.
    """
    if not workloads:
        raise ValueError("no workloads to chart")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    bars = [bars_of(workload) for workload in workloads]
    heights = [SUBPLOT_EXTRA_IN + BAR_HEIGHT_IN * len(b) for b in bars]
    figure = Figure(figsize=(11, sum(heights) + 0.8), layout="constrained")
    FigureCanvasAgg(figure)  # the figure draws on Agg, whatever the process's backend is
    grid = figure.subplots(len(workloads), 1, squeeze=False, height_ratios=heights)
    for axes, workload, workload_bars in zip(grid[:, 0], workloads, bars):
        _draw(axes, workload.title, workload_bars)
    figure.suptitle(title)
    figure.legend(
        handles=[
            Patch(color=ENVSERVER_COLOUR, label="envserver"),
            Patch(
                color=REFERENCE_COLOUR,
                label="for reference (Gymnasium, SB3, PufferLib, raw ZeroMQ floor)",
            ),
        ],
        loc="outside lower center",
        ncols=2,
        fontsize=8,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
