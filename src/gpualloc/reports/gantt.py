"""Gantt chart of one simulated step: a row per device and per busy link."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

PHASE_COLOURS = {"F": "#4C72B0", "B": "#DD8452", "T": "#8C8C8C"}


def plot_gantt(events: Sequence, path: str | Path, *, title: str = "") -> None:
    """Draw ``events`` (objects with start_s, end_s, resource, task) to a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def order(resource: str):
        kind, _, rest = resource.partition(":")
        return (kind != "dev", [int(x) if x.isdigit() else x for x in rest.replace("->", " ").split()])

    resources = sorted({e.resource for e in events}, key=order)
    row = {r: i for i, r in enumerate(resources)}
    fig, ax = plt.subplots(figsize=(12, 0.4 * len(resources) + 1.5))
    for e in events:
        ax.barh(row[e.resource], (e.end_s - e.start_s) * 1e3, left=e.start_s * 1e3, height=0.8,
                color=PHASE_COLOURS.get(e.task[:1], "#55A868"), edgecolor="none")
    ax.set_yticks(range(len(resources)), resources)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or "one training step")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in PHASE_COLOURS.values()]
    ax.legend(handles, ["forward", "backward", "transfer"], loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
