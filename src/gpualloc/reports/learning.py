"""Learning curves of the DQN agents, as PNG files."""

from __future__ import annotations

from pathlib import Path

from gpualloc.reports import pyplot, save_png


def placer_learning_curve(log, path: str | Path, title: str) -> Path:
    """Episode returns (moving average) and greedy evaluations over training steps of a
    :class:`~gpualloc.rl.dqn.train.TrainLog`, as a PNG."""
    import numpy as np

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    returns = np.asarray(log.episode_returns)
    if len(returns):
        ends = np.cumsum(log.episode_lengths)
        w = max(1, len(returns) // 50)
        smooth = np.convolve(returns, np.ones(w) / w, mode="valid")
        ax.plot(ends[w - 1:], smooth, label=f"training return (moving mean of {w})", linewidth=1)
    if log.evals:
        ax.plot([e.step for e in log.evals], [e.mean for e in log.evals], "o-", label="greedy eval (held out)")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return save_png(fig, path)
