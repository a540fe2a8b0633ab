"""A real run of a plan (``gpualloc run``) as a Rich view: per-device times, output check, step error."""

from __future__ import annotations

from typing import Any

from rich.console import Group

from gpualloc.reports.format import ms
from gpualloc.reports.tables import Table

_SOURCES = {"fresh": "measured now and cached", "cached": "cached", "given": "given",
            "shipped": "shipped, not measured on this machine"}


def run_view(r: Any, calibration: dict[str, Any]) -> Group:
    """The table and summary lines of an :class:`~gpualloc.execute.run.ExecutionResult`.

    Args:
        r: the run's result (measured and predicted times, per-device detail, output check).
        calibration: ``{"path": ..., "source": "given" | "cached" | "fresh" | "shipped"}``.
    """
    table = Table(title=f"{r.model} (batch {r.batch_size}, {r.microbatches} microbatch(es), {r.schedule}) on "
                        f"{r.cluster}: {r.stages} stage(s)")
    for col in ("device", "torch", "threads", "stages", "predicted busy", "measured busy", "waiting"):
        table.add_column(col, justify="left" if col in ("device", "torch") else "right")
    for d in r.devices:
        table.add_row(d.label, d.torch_device, str(d.threads), str(d.stages), ms(d.predicted_busy_s),
                      ms(d.measured_busy_s), ms(d.measured_wait_s))
    match = "[green]yes[/]" if r.output_match else "[red]NO[/]"
    lines = [
        f"output equals the unsplit model's: {match} (max |diff| {r.max_abs_diff:.2e}, "
        f"tolerance {r.output_tolerance:.2e})",
        f"step time: measured {ms(r.measured_step_s)} (median of {len(r.step_times_s)}), "
        f"predicted {ms(r.predicted_step_s)} ({r.prediction}), error {r.error:+.1%}",
        f"calibration: {calibration['path'] or 'shipped'} ({_SOURCES[calibration['source']]})",
        *(f"[yellow]warning:[/] {w}" for w in r.warnings),
    ]
    return Group(table, *lines)
