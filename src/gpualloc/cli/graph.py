"""``gpualloc graph``: capture, import and inspect operator graphs."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from gpualloc.cli.common import console, err_console, output_file, print_json
from gpualloc.reports.graphs import capture_line, heaviest_nodes_table, summary_view
from gpualloc.limits import MAX_BATCH, MAX_TOP

app = typer.Typer(help="Operator graphs: capture from PyTorch, import published profiles, inspect.",
                  no_args_is_help=True)


class Granularity(str, Enum):
    op = "op"
    layer = "layer"


class ImportFormat(str, Enum):
    pipedream = "pipedream"
    sailor = "sailor"
    gpualloc = "gpualloc"


@app.command("capture")
def capture_cmd(
    model: str = typer.Argument(
        ..., help="A zoo name (resnet50, bert-base, gpt2-small, ...) or package.module:factory."),
    output: Path = typer.Option(..., "-o", "--output", callback=output_file,
                                help="Where to write the gpualloc-graph JSON."),
    batch: int = typer.Option(1, "--batch", max=MAX_BATCH, min=1, help="Batch size the graph is captured at."),
    granularity: Granularity = typer.Option(Granularity.op, "--granularity",
                                            help="op: every aten op; layer: one node per module."),
    input_shape: list[str] = typer.Option(
        None, "--input-shape", metavar="D1,D2,...",
        help="Shape of one input without the batch (3,224,224); repeat for each positional input of forward. "
             "For a model without example_inputs; overrides its own."),
    input_dtype: list[str] = typer.Option(
        None, "--input-dtype", metavar="DTYPE",
        help="dtype of each --input-shape (float32, bfloat16, int64, ...), or one for all. [default: float32]"),
) -> None:
    """Trace a PyTorch model (torch.export) into an operator graph with per-op FLOPs and bytes.

    A factory's inputs: --input-shape, else the model's example_inputs(batch) method, else its module's.
    """
    from gpualloc.graph.capture import capture, shaped_inputs
    from gpualloc.graph.ir import summarize

    if input_dtype and not input_shape:
        raise typer.BadParameter("needs --input-shape", param_hint="--input-dtype")
    inputs = shaped_inputs(input_shape, input_dtype or ()) if input_shape else None  # checked before tracing
    with console.status(f"tracing {model} at batch {batch}..."):
        graph = capture(model, batch=batch, granularity=granularity.value, example_inputs=inputs)
    graph.save(output)
    console.print(capture_line(output, summarize(graph)))


@app.command("import")
def import_cmd(
    file: Path = typer.Argument(..., help="The profile to import (sailor: the sailor-profiles folder or "
                                "one profiles/<MODEL> folder of it).", exists=True),
    fmt: ImportFormat = typer.Option(..., "--format", help="Format of FILE."),
    output: Path = typer.Option(None, "-o", "--output", callback=output_file,
                                help="Where to write the gpualloc-graph JSON."),
    device: str = typer.Option("V100", "--device", help="pipedream: device type the profile was measured on."),
    model: str = typer.Option(None, "--model", help="sailor: the model (OPT-350, GPT-Neo-2.7, LLAMA-3-8, OPT-30)."),
    gpu: list[str] = typer.Option(None, "--gpu", help="sailor: a profiled GPU (A100-40 or A100-40GB); repeat "
                                  "for a mixed cluster; default every GPU profiled for the model."),
    batch: int = typer.Option(None, "--batch", min=1, max=MAX_BATCH,
                              help="The graph's batch_size. sailor: the global batch, default the microbatch; "
                              "pipedream: the profiled batch, default inferred from the layers."),
    seq_len: int = typer.Option(None, "--seq-len", min=1, help="sailor: must be the profiled sequence length."),
    microbatch: int = typer.Option(None, "--microbatch", min=1, max=MAX_BATCH,
                                   help="sailor: the profiled microbatch whose TP-1 times fill time_ms."),
) -> None:
    """Import a published profile (PipeDream per-layer times, Sailor per-layer profiles) as an operator graph."""
    from gpualloc.graph.importers import import_pipedream, import_sailor
    from gpualloc.graph.ir import OpGraph, summarize
    from gpualloc.hardware.catalog import default_catalog

    given = [name for name, value in (("--model", model), ("--gpu", gpu), ("--seq-len", seq_len),
                                      ("--microbatch", microbatch)) if value]
    if given and fmt is not ImportFormat.sailor:
        raise typer.BadParameter(f"{', '.join(given)}: for --format sailor only", param_hint="--format")
    if fmt is ImportFormat.pipedream:
        graph = import_pipedream(file, device=default_catalog().device(device).name, batch_size=batch)
    elif fmt is ImportFormat.sailor:
        graph = import_sailor(file, model=model, gpus=gpu or None, batch_size=batch, seq_len=seq_len,
                              microbatch=microbatch)
        for reason in graph.meta["profile"].get("skipped", {}).values():
            err_console.print(f"note: skipped {reason}", highlight=False, soft_wrap=True)
    else:
        graph = OpGraph.load(file)
    s = summarize(graph)
    if output is not None:
        graph.save(output)
        console.print(f"wrote {output}: {s['nodes']} nodes, {s['edges']} edges")
    else:
        console.print(summary_view(s))


@app.command("show")
def show_cmd(
    file: Path = typer.Argument(..., help="A gpualloc-graph JSON file."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    top: int = typer.Option(10, "--top", min=0, max=MAX_TOP, help="How many of the heaviest nodes to list."),
) -> None:
    """Summarise a graph: nodes, edges, total FLOPs, parameters, activations, critical path."""
    from gpualloc.graph.ir import OpGraph, summarize

    graph = OpGraph.load(file)
    s = summarize(graph)
    if as_json:
        print_json(s)
        return
    console.print(summary_view(s))
    if top > 0 and len(graph):
        console.print(heaviest_nodes_table(graph, top))


@app.command("schema")
def schema_cmd() -> None:
    """Print the JSON Schema of the gpualloc-graph format."""
    from gpualloc.graph.schema import json_schema

    print_json(json_schema())
