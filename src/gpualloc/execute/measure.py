"""Timing on real devices: CUDA events on a GPU, ``perf_counter`` on the CPU; robust summaries.

On a GPU, host timestamps around an op measure only its launch; the op's device time is between two
``torch.cuda.Event`` records. :class:`TaskClock` hides the difference: ``start(key)`` / ``stop(key)``
around each task, ``totals()`` once the device is synchronised.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["Summary", "TaskClock", "summarize", "synchronize"]


def synchronize(device: torch.device) -> None:
    """Wait for ``device`` to finish its queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TaskClock:
    """Accumulated time per key on one device (CUDA events on ``cuda``, ``perf_counter`` elsewhere)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._open: dict[object, object] = {}
        self._spans: list[tuple[object, object, object]] = []
        self._host: dict[object, float] = {}

    def start(self, key: object) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._open[key] = event
        else:
            self._open[key] = time.perf_counter()

    def stop(self, key: object) -> None:
        begin = self._open.pop(key)
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._spans.append((key, begin, end))
        else:
            self._host[key] = self._host.get(key, 0.0) + time.perf_counter() - begin  # type: ignore[operator]

    def totals(self) -> dict[object, float]:
        """Seconds per key since the last call (synchronises a GPU first)."""
        out = dict(self._host)
        if self.cuda:
            synchronize(self.device)
            for key, begin, end in self._spans:
                out[key] = out.get(key, 0.0) + begin.elapsed_time(end) / 1e3  # type: ignore[attr-defined]
        self._host.clear()
        self._spans.clear()
        return out


@dataclass(frozen=True)
class Summary:
    """Robust summary of repeated timings (seconds)."""

    median_s: float
    min_s: float
    max_s: float
    mean_s: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        return {"median_s": self.median_s, "min_s": self.min_s, "max_s": self.max_s, "mean_s": self.mean_s,
                "n": self.n}


def summarize(samples: Sequence[float]) -> Summary:
    """Median (the figure reported: robust to a noisy neighbour), min, max and mean of ``samples``."""
    if not samples:
        raise ValueError("no samples to summarize")
    return Summary(statistics.median(samples), min(samples), max(samples), statistics.fmean(samples), len(samples))
