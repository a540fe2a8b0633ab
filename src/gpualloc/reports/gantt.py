"""Gantt chart of one simulated step: a row per device and per busy link, named by the cluster."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpualloc.reports import pyplot, save_png

PHASE_COLOURS = {"F": "#4C72B0", "B": "#DD8452", "T": "#8C8C8C", "A": "#C44E52", "O": "#8172B3"}
PHASE_NAMES = {"F": "forward", "B": "backward", "T": "transfer", "A": "gradient all-reduce (exposed)",
               "O": "optimizer step"}


def _order(resource: str):
    kind, _, rest = resource.partition(":")
    return (kind != "dev", [int(x) if x.isdigit() else x for x in rest.replace("->", " ").split()])


def row_label(resource: str, device_names: Sequence[str] | None = None) -> str:
    """``"dev:3"`` -> the cluster's name of device 3; ``"link:0->2"`` -> ``"<name 0> → <name 2>"``."""
    if device_names is None:
        return resource
    kind, _, rest = resource.partition(":")
    ends = [device_names[int(x)] for x in rest.split("->") if x.isdigit() and int(x) < len(device_names)]
    if kind == "dev" and len(ends) == 1:
        return ends[0]
    if kind == "link" and len(ends) == 2:
        return f"{ends[0]} → {ends[1]}"
    return resource


def gantt_figure(events: Sequence, *, title: str = "", device_names: Sequence[str] | None = None):
    """The Gantt chart of ``events`` (objects with start_s, end_s, resource, task) as a matplotlib Figure.

    Args:
        events: the simulator's event log.
        title: the chart's title (default: "one training step").
        device_names: the cluster's device labels by index (``n0.A100-40GB.0``), for the row labels.
    """
    plt = pyplot()
    resources = sorted({e.resource for e in events}, key=_order)
    row = {r: i for i, r in enumerate(resources)}
    scale, unit = (1.0, "s") if events and max(e.end_s for e in events) >= 10 else (1e3, "ms")
    fig, ax = plt.subplots(figsize=(12, 0.42 * len(resources) + 1.9))
    for e in events:
        ax.barh(row[e.resource], (e.end_s - e.start_s) * scale, left=e.start_s * scale, height=0.8,
                color=PHASE_COLOURS.get(e.task[:1], "#55A868"), edgecolor="none")
    ax.set_yticks(range(len(resources)), [row_label(r, device_names) for r in resources], fontsize="small")
    ax.set_ylim(len(resources) - 0.5, -0.5)  # first device on top
    ax.set_xlabel(f"time within the step ({unit})")
    ax.set_ylabel("device / link")
    ax.set_title(title or "one training step", pad=18)  # room for the legend between title and bars
    ax.grid(axis="x", alpha=0.3)
    shown = [p for p in PHASE_COLOURS if any(e.task[:1] == p for e in events)]  # the phases drawn
    handles = [plt.Rectangle((0, 0), 1, 1, color=PHASE_COLOURS[p]) for p in shown]
    # above the plot, so that it never hides a bar
    ax.legend(handles, [PHASE_NAMES[p] for p in shown], loc="lower right", bbox_to_anchor=(1.0, 1.0),
              ncol=len(shown) or 1, fontsize="small", frameon=False)
    fig.tight_layout()
    return fig


def plot_gantt(events: Sequence, path: str | Path, *, title: str = "",
               device_names: Sequence[str] | None = None) -> Path:
    """Draw ``events`` (see :func:`gantt_figure`) to a PNG at ``path``; returns the path."""
    return save_png(gantt_figure(events, title=title, device_names=device_names), path)
