"""The service's jobs as a Rich table (``gpualloc jobs``); rows are the API's job objects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpualloc.reports.tables import Table

NO_HISTORY = "no history yet"
"""The ``remaining`` cell of an active job before any job has run to its end (nothing to predict from)."""


def duration_text(seconds: float) -> str:
    """A duration in the unit that suits it: ``45 s``, ``12 min``, ``1.2 h``, ``3.5 d``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def remaining_text(job: dict[str, Any]) -> str:
    """A job's predicted remaining run time as ``~1.2 h (0.4–3.0 h, 80 %)`` (median, then the interval
    and its coverage; each end in its own unit where they differ), ``no history yet`` before any job
    has run to its end, ``-`` for an ended job or none."""
    median = job.get("predicted_remaining_s")
    if median is None:
        return NO_HISTORY if job.get("prediction_stage") == "prior" else "-"
    lo, hi, cover = (job.get(k) for k in ("predicted_remaining_lo_s", "predicted_remaining_hi_s",
                                          "prediction_interval"))
    if lo is None or hi is None or cover is None:
        return f"~{duration_text(median)}"
    lo_text, hi_text = duration_text(lo), duration_text(hi)
    lo_num, lo_unit = lo_text.split(" ", 1)
    span = f"{lo_num}–{hi_text}" if lo_unit == hi_text.split(" ", 1)[1] else f"{lo_text}–{hi_text}"
    return f"~{duration_text(median)} ({span}, {cover * 100:.0f} %)"


def jobs_table(rows: Sequence[dict[str, Any]]) -> Table:
    """One row per job: id, name, team and user (``-``: none recorded), state, GPUs asked and held,
    attempts, predicted remaining run time (:func:`remaining_text`), exit code, error (cut to 60). On a
    narrow terminal user, attempts, devices and team go first."""
    table = Table("id", "name", "team", "user", "state", "gpus", "type", "devices", "attempts", "remaining", "exit",
                  "error", drop_first=("user", "attempts", "devices", "team"), more="--json")
    for j in rows:
        table.add_row(str(j["id"]), j["name"], j.get("team") or "-", j.get("user") or "-", j["state"],
                      str(j["spec"]["num_gpus"]), j["device_type"] or "-",
                      ",".join(map(str, j["gpus"])) or "-", str(j["attempts"]), remaining_text(j),
                      "-" if j["exit_code"] is None else str(j["exit_code"]), (j["error"] or "")[:60])
    return table
