"""Placement results as Rich tables: one row per method. The numbers come computed (placement.run)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.text import Text

from gpualloc.reports.format import ms, pct, ratio, signed_pct
from gpualloc.reports.tables import Table

COLUMNS = ("method", "step", "samples/s", "x bound", "vs static", "vs round-robin", "comm", "comm share",
           "max mem", "feasible", "partition time")


def outcomes_table(outcomes: Sequence, gains: Sequence[dict[str, float]], fills: Sequence[float],
                   title: str) -> Group:
    """Methods side by side, feasible and fastest first, with the lower bound under the table.

    Args:
        outcomes: :class:`~gpualloc.placement.outcome.Outcome` objects of one problem.
        gains: :func:`~gpualloc.placement.run.gains` of ``outcomes`` (keys ``static``, ``round-robin``).
        fills: :func:`~gpualloc.placement.run.memory_fill` of each outcome.
        title: the table's title.
    """
    table = Table(title=title, more="--json", drop_first=("partition time", "vs round-robin", "comm", "max mem",
                                                          "comm share", "samples/s", "vs static"))
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "method" else "right")
    rows = sorted(zip(outcomes, gains, fills, strict=True),
                  key=lambda t: (not t[0].result.feasible, t[0].result.step_time_s))
    for o, g, fill in rows:
        r = o.result
        table.add_row(
            o.method + (f" ({o.note})" if o.note else ""), ms(r.step_time_s),
            f"{r.throughput_samples_per_s:,.1f}" if r.throughput_samples_per_s else "-",
            ratio(o.ratio_to_bound), signed_pct(g.get("static")), signed_pct(g.get("round-robin")),
            f"{r.comm_bytes / 1e6:,.0f} MB", pct(r.comm_share), pct(fill), "yes" if r.feasible else "[red]no[/]",
            ms(o.partition_time_s))
    bounds = " / ".join(ms(b) for b in dict.fromkeys(o.lower_bound_s for o in outcomes))  # one per problem
    note = Text(f"lower bound: {bounds} (no plan of either kind is faster; gains are step-time reductions; "
                "x bound = step time / the bound)")
    return Group(table, note)
