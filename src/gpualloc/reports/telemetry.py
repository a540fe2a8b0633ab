"""Device telemetry as a Rich table: one row per device of a sample."""

from __future__ import annotations

from collections.abc import Sequence

from gpualloc.reports.format import gib, si
from gpualloc.reports.tables import Table


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def records_table(records: Sequence, title: str) -> Table:
    """:class:`~gpualloc.telemetry.base.DeviceRecord` rows; unreadable fields (None) show as '-'."""
    table = Table(title=title)
    for col, justify in (("gpu", "right"), ("name", "left"), ("util", "right"), ("mem util", "right"),
                         ("memory", "right"), ("power", "right"), ("energy", "right"), ("temp", "right"),
                         ("SM MHz", "right"), ("mem MHz", "right"), ("PCIe tx", "right"), ("PCIe rx", "right"),
                         ("throttle", "left"), ("procs", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in records:
        throttle = "-" if r.throttle_reasons is None else (", ".join(r.throttle_reasons) or "none")
        table.add_row(
            str(r.index), r.name, _pct(r.utilization), _pct(r.mem_utilization),
            f"{gib(r.mem_used_bytes)} / {gib(r.mem_total_bytes)}", _num(r.power_w, ".0f") + " W",
            si(r.energy_j, "J"), _num(r.temperature_c, ".0f") + " C", _num(r.sm_clock_mhz, ".0f"),
            _num(r.mem_clock_mhz, ".0f"), si(r.pcie_tx_bytes_per_s, "B/s"), si(r.pcie_rx_bytes_per_s, "B/s"),
            throttle, _num(r.processes, "d"))
    return table
