"""The service's jobs as a Rich table (``gpualloc jobs``); rows are the API's job objects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpualloc.reports.tables import Table


def jobs_table(rows: Sequence[dict[str, Any]]) -> Table:
    """One row per job: id, name, team and user (``-``: none recorded), state, GPUs asked and held,
    attempts, exit code, error (cut to 60). On a narrow terminal user, attempts, devices and team go first."""
    table = Table("id", "name", "team", "user", "state", "gpus", "type", "devices", "attempts", "exit", "error",
                  drop_first=("user", "attempts", "devices", "team"), more="--json")
    for j in rows:
        table.add_row(str(j["id"]), j["name"], j.get("team") or "-", j.get("user") or "-", j["state"],
                      str(j["spec"]["num_gpus"]), j["device_type"] or "-",
                      ",".join(map(str, j["gpus"])) or "-", str(j["attempts"]),
                      "-" if j["exit_code"] is None else str(j["exit_code"]), (j["error"] or "")[:60])
    return table
