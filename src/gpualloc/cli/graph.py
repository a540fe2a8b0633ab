"""``gpualloc graph``: capture, import and inspect operator graphs."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer
from rich.table import Table

from gpualloc.cli.common import console, gib, print_json, si
from gpualloc.graph.ir import OpGraph, summarize

app = typer.Typer(help="Operator graphs: capture from PyTorch, import published profiles, inspect.",
                  no_args_is_help=True)


class Granularity(str, Enum):
    op = "op"
    layer = "layer"


class ImportFormat(str, Enum):
    pipedream = "pipedream"
    gpualloc = "gpualloc"


@app.command("capture")
def capture_cmd(
    model: str = typer.Argument(..., help="A zoo name (resnet50, bert-base, gpt2-small, ...) or package.module:factory."),
    output: Path = typer.Option(..., "-o", "--output", help="Where to write the gpualloc-graph JSON."),
    batch: int = typer.Option(1, "--batch", min=1, help="Batch size the graph is captured at."),
    granularity: Granularity = typer.Option(Granularity.op, "--granularity", help="op: every aten op; layer: one node per module."),
) -> None:
    """Trace a PyTorch model (torch.export) into an operator graph with per-op FLOPs and bytes."""
    from gpualloc.graph.capture import capture

    with console.status(f"tracing {model} at batch {batch}..."):
        graph = capture(model, batch=batch, granularity=granularity.value)
    graph.save(output)
    s = summarize(graph)
    console.print(f"wrote {output}: {s['nodes']} nodes, {s['edges']} edges, {si(s['total_flops'], 'FLOP')} forward, "
                  f"{gib(s['param_bytes'])} parameters")


@app.command("import")
def import_cmd(
    file: Path = typer.Argument(..., help="The profile to import.", exists=True, dir_okay=False),
    fmt: ImportFormat = typer.Option(..., "--format", help="Format of FILE."),
    output: Path = typer.Option(None, "-o", "--output", help="Where to write the gpualloc-graph JSON."),
    device: str = typer.Option("V100", "--device", help="Device type the profile was measured on."),
) -> None:
    """Import a published profile (PipeDream per-layer times) as an operator graph."""
    from gpualloc.graph.importers import import_pipedream
    from gpualloc.hardware.catalog import default_catalog

    if fmt is ImportFormat.pipedream:
        graph = import_pipedream(file, device=default_catalog().device(device).name)
    else:
        graph = OpGraph.load(file)
    s = summarize(graph)
    if output is not None:
        graph.save(output)
        console.print(f"wrote {output}: {s['nodes']} nodes, {s['edges']} edges")
    else:
        _print_summary(s)


@app.command("show")
def show_cmd(
    file: Path = typer.Argument(..., help="A gpualloc-graph JSON file."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    top: int = typer.Option(10, "--top", help="How many of the heaviest nodes to list."),
) -> None:
    """Summarise a graph: nodes, edges, total FLOPs, parameters, activations, critical path."""
    graph = OpGraph.load(file)
    s = summarize(graph)
    if as_json:
        print_json(s)
        return
    _print_summary(s)
    if top > 0 and len(graph):
        table = Table(title=f"Heaviest {min(top, len(graph))} nodes by forward FLOPs")
        for col in ("id", "kind", "name", "FLOPs", "params", "output"):
            table.add_column(col)
        order = graph.flops.argsort()[::-1][:top]
        for i in order:
            n = graph.nodes[i]
            table.add_row(n.id, n.kind, n.name[:48], si(n.flops), si(n.param_bytes, "B"), si(n.output_bytes, "B"))
        console.print(table)


@app.command("schema")
def schema_cmd() -> None:
    """Print the JSON Schema of the gpualloc-graph format."""
    from gpualloc.graph.schema import json_schema

    print_json(json_schema())


def _print_summary(s: dict) -> None:
    batch = f", batch {s['batch_size']}" if s["batch_size"] else ""
    console.print(f"[bold]{s['name']}[/]{batch}: {s['nodes']} nodes, {s['edges']} edges")
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
    console.print(table)
