"""Plots of scheduling runs: JCT CDF, GPU utilisation and queue length over time, one line per policy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gpualloc.scheduling.metrics import jct_s
from gpualloc.scheduling.simulator import SimResult


def _plt():
    import logging

    import matplotlib

    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)  # no font-fallback chatter
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_runs(results: Sequence[SimResult], folder: str | Path, *, title: str = "") -> list[Path]:
    """Write ``jct_cdf.png``, ``utilization.png`` and ``queue.png`` to ``folder``; returns the paths."""
    plt = _plt()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        jct = np.sort(jct_s(r))
        if len(jct):
            ax.plot(jct / 3600, np.arange(1, len(jct) + 1) / len(jct), label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(f"JCT CDF {title}".strip())
    ax.legend()
    ax.grid(alpha=0.3)
    paths.append(_save(fig, folder / "jct_cdf.png", plt))

    for name, ylabel, values in (("utilization.png", "busy GPUs (fraction)", lambda r: r.busy_gpus / r.n_gpus),
                                 ("queue.png", "queued jobs", lambda r: r.queue_len)):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in results:
            if len(r.times_s):
                ax.step(r.times_s / 3600, values(r), where="post", label=r.policy, linewidth=0.9)
        ax.set_xlabel("time (h)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel} over time {title}".strip())
        ax.legend()
        ax.grid(alpha=0.3)
        paths.append(_save(fig, folder / name, plt))
    return paths


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
