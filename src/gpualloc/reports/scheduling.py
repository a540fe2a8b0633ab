"""Scheduling results as Rich tables: one row per policy. The numbers come computed (scheduling.metrics)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.text import Text

from gpualloc.reports.format import hours, pct, ratio, signed_pct
from gpualloc.reports.tables import Table

# Times in hours, the unit in the header so the cells stay narrow enough for an 80-column terminal.
COLUMNS = ("policy", "avg JCT h", "p50 h", "p99 h", "queue h", "jobs/h", "util", "eff. util", "sat. util",
           "makespan h", "slowdown", "x bound", "vs fcfs", "HyperScore", "preempt", "wall")
DROP_FIRST = ("wall", "preempt", "sat. util", "eff. util", "p50 h", "queue h", "makespan h", "slowdown", "jobs/h",
              "HyperScore", "util", "vs fcfs", "p99 h", "x bound")
"""On a narrow terminal, the columns left out first (``reports.tables.Table``): policy and avg JCT stay."""


def policies_table(rows: Sequence[dict[str, Any]], title: str, more: str = "") -> Group:
    """Policies side by side, lowest average JCT first.

    Args:
        rows: :func:`~gpualloc.scheduling.metrics.with_ratios` of the runs' summaries (keys ``x_bound``
            and ``vs_fcfs`` included).
        title: the table's title.
        more: how to see the columns a narrow terminal leaves out (``"--json"``).
    """
    table = Table(title=title, drop_first=DROP_FIRST, more=more)
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=col == "policy")
    for r in sorted(rows, key=lambda r: r["avg_jct_s"]):
        table.add_row(
            r["policy"], hours(r["avg_jct_s"]), hours(r["p50_jct_s"]), hours(r["p99_jct_s"]), hours(r["avg_queue_s"]),
            f"{r['throughput_jobs_per_h']:.3f}", pct(r["utilization"]), pct(r["effective_utilization"]),
            pct(r.get("saturated_utilization")), hours(r["makespan_s"]), f"{r['avg_slowdown']:.2f}",
            ratio(r.get("x_bound")), signed_pct(r.get("vs_fcfs")), f"{r['hyperscore']:.3f}",
            str(r["preemptions"]), f"{r['sim_wall_s']:.2f} s")
    note = Text("h = hours; x bound = avg JCT / oracle-lb avg JCT (each job alone on its fastest GPU type); "
                "vs fcfs = avg JCT reduction")
    bound = next((r.get("capacity_lower_bound_avg_jct_s") for r in rows if r["policy"] == "oracle-lb"), None)
    runs = [r for r in rows if r["policy"] != "oracle-lb" and r["avg_jct_s"] == r["avg_jct_s"]]
    if bound is None or not bound > 0 or not runs:
        return Group(table, note)
    best = min(runs, key=lambda r: r["avg_jct_s"])
    capacity = Text(f"capacity lower bound: {hours(bound)} h average JCT; no schedule of these jobs on this cluster "
                    f"does better (the oracle-lb, or all GPUs pooled under SRPT; both know every job's true duration, "
                    f"whatever --knowledge); best here: {best['policy']} at "
                    f"{ratio(best['avg_jct_s'] / bound)}x the bound.")
    return Group(table, note, capacity)


TEAM_COLUMNS = ("policy", "team", "weight", "jobs", "avg JCT h", "p99 h", "got/entitled", "preempt")
TEAM_DROP_FIRST = ("preempt", "weight", "p99 h", "jobs")


def teams_table(rows: Sequence[dict[str, Any]], more: str = "") -> Table:
    """Per policy and team: average JCT and GPU-seconds received against entitled, by device type.

    Args:
        rows: policy rows with ``teams`` (:func:`~gpualloc.scheduling.metrics.team_summary`); rows
            without are left out (the oracle-lb).
        more: how to see the columns a narrow terminal leaves out.
    """
    runs = [r for r in rows if r.get("teams")]
    types = list(runs[0]["teams"][0]["by_type"]) if runs and runs[0]["teams"] else []
    short = [t.split("-")[0] for t in types]
    table = Table(title="per team: GPU-seconds received / entitled (quota x time with jobs waiting or running)",
                  drop_first=TEAM_DROP_FIRST, more=more)
    for col in (*TEAM_COLUMNS[:6], *(f"{s} got/ent." for s in short), *TEAM_COLUMNS[6:]):
        table.add_column(col, justify="left" if col in ("policy", "team") else "right",
                         no_wrap=col in ("policy", "team"))
    for r in sorted(runs, key=lambda r: r["avg_jct_s"]):
        for t in r["teams"]:
            per_type = [ratio(t["by_type"][name]["received_vs_entitled"]) for name in types]
            table.add_row(r["policy"], t["team"], f"{t['weight']:g}", str(t["jobs"]), hours(t["avg_jct_s"]),
                          hours(t["p99_jct_s"]), *per_type, ratio(t["received_vs_entitled"]), str(t["preemptions"]))
    return table

