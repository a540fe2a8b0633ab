"""Operator graphs as Rich tables: the summary of :func:`gpualloc.graph.ir.summarize` and the heaviest nodes."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text

from gpualloc.reports.format import gib, si
from gpualloc.reports.tables import Table


def capture_line(path: object, s: dict[str, Any]) -> str:
    """One line after a capture: where the graph went and its size."""
    return (f"wrote {path}: {s['nodes']} nodes, {s['edges']} edges, {si(s['total_flops'], 'FLOP')} forward, "
            f"{gib(s['param_bytes'])} parameters")


def summary_view(s: dict[str, Any]) -> Group:
    """A graph's name and batch, then its totals as a two-column table."""
    batch = f", batch {s['batch_size']}" if s["batch_size"] else ""
    head = Text.assemble((s["name"], "bold"), f"{batch}: {s['nodes']} nodes, {s['edges']} edges")
    rows = [
        ("forward FLOPs", si(s["total_flops"], "FLOP")),
        ("parameters", gib(s["param_bytes"])),
        ("activations", gib(s["activation_bytes"])),
        ("bytes on edges", gib(s["edge_bytes"])),
        ("critical path", f"{si(s['critical_path_flops'], 'FLOP')} over {s['critical_path_nodes']} nodes"),
        ("measured on", ", ".join(s["measured_on"]) or "-"),
        ("kinds", ", ".join(f"{k} {v}" for k, v in list(s["kinds"].items())[:8])),
    ]
    if "flops_per_sample" in s:
        rows.insert(1, ("forward FLOPs per sample", si(s["flops_per_sample"], "FLOP")))
    table = Table(show_header=False)
    table.add_column()
    table.add_column()
    for r in rows:
        table.add_row(*r)
    return Group(head, table)


def heaviest_nodes_table(graph, top: int) -> Table:
    """The ``top`` nodes of an :class:`~gpualloc.graph.ir.OpGraph` by forward FLOPs, with their sizes."""
    nodes = [graph.nodes[i] for i in graph.flops.argsort()[::-1][:top]]
    table = Table("id", "kind", "name", "FLOPs", "params", "output",
                  title=f"Heaviest {len(nodes)} nodes by forward FLOPs")
    for n in nodes:
        table.add_row(n.id, n.kind, n.name[:48], si(n.flops), si(n.param_bytes, "B"), si(n.output_bytes, "B"))
    return table
