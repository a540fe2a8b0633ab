"""Numbers to tables and plots; no computation here."""

from __future__ import annotations

from pathlib import Path

from gpualloc.errors import atomic_output


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend: every plot here goes to a file, none to a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str | Path) -> Path:
    """Write ``fig`` to a PNG at ``path`` (120 dpi, atomically) and close it; returns the path."""
    path = Path(path)
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=120)
    pyplot().close(fig)
    return path
