"""Plots of scheduling runs: the JCT CDF (one line per policy), and GPU utilisation and queue length over
time as small multiples (one panel per policy, shared axes: eight overlapping step lines are unreadable)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from gpualloc.reports import pyplot, save_png
from gpualloc.scheduling.metrics import jct_s
from gpualloc.scheduling.simulator import SimResult

OVER_TIME: dict[str, tuple[str, Callable[[SimResult], np.ndarray]]] = {
    "utilization.png": ("busy GPUs (fraction)", lambda r: r.busy_gpus / r.n_gpus),
    "queue.png": ("queued jobs", lambda r: r.queue_len),
}
"""File name -> (y label, the per-event values of a run) of the over-time panels."""


def _plt():
    import logging

    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)  # no font-fallback chatter
    return pyplot()


def jct_cdf_figure(results: Sequence[SimResult], *, title: str = ""):
    """One CDF of job completion times per policy (log time axis), as a Figure."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for r in results:
        jct = np.sort(jct_s(r))
        if len(jct):
            ax.plot(jct / 3600, np.arange(1, len(jct) + 1) / len(jct), label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h, log scale)")
    ax.set_ylabel("fraction of jobs completed")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"JCT CDF {title}".strip())
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", title="policy")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def over_time_figure(results: Sequence[SimResult], ylabel: str, values: Callable[[SimResult], np.ndarray], *,
                     title: str = ""):
    """Small multiples: ``values`` of each run over time, one panel per policy, shared axes."""
    plt = _plt()
    n = max(len(results), 1)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols + 1.0, 2.3 * rows + 1.0), sharex=True, sharey=True,
                             squeeze=False)
    for ax, r in zip(axes.flat, results, strict=False):
        if len(r.times_s):
            y = values(r)
            ax.fill_between(r.times_s / 3600, y, step="post", alpha=0.35, color="C0", linewidth=0)
            ax.step(r.times_s / 3600, y, where="post", color="C0", linewidth=0.8)
        ax.set_title(r.policy, fontsize="medium")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(results):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    for ax in axes[-1, :]:
        ax.set_xlabel("time (h)")
    fig.suptitle(f"{ylabel} over time, per policy {title}".strip())
    fig.tight_layout()
    return fig


def run_figures(results: Sequence[SimResult], *, title: str = "") -> dict[str, object]:
    """Every figure of :func:`plot_runs`, by file name."""
    figs = {"jct_cdf.png": jct_cdf_figure(results, title=title)}
    for name, (ylabel, values) in OVER_TIME.items():
        figs[name] = over_time_figure(results, ylabel, values, title=title)
    return figs


def plot_runs(results: Sequence[SimResult], folder: str | Path, *, title: str = "") -> list[Path]:
    """Write ``jct_cdf.png``, ``utilization.png`` and ``queue.png`` to ``folder``; returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return [save_png(fig, folder / name) for name, fig in run_figures(results, title=title).items()]
