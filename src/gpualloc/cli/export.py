"""``gpualloc export PLAN --to torchtitan|megatron|deepspeed -o FILE [--json]``: a plan as a framework's config."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.text import Text

from gpualloc.cli.common import console, err_console, load_graph, output_file, print_json
from gpualloc.errors import PlacementError
from gpualloc.limits import MAX_STEPS

FRAMEWORK_NAMES = ("torchtitan", "megatron", "deepspeed")  # gpualloc.export.FRAMEWORKS (checked in tests)


def export_cmd(
    plan: Path = typer.Argument(..., metavar="PLAN", help="A plan file from `place -o` (either kind)."),
    to: str = typer.Option(..., "--to", help="torchtitan (TOML), megatron (argument list) or deepspeed (JSON)."),
    output: Path = typer.Option(None, "-o", "--output", callback=output_file,
                                help="Write the framework's file here (default: print it)."),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print what was dropped and both simulated step times as JSON."),
    graph: str = typer.Option(None, "--graph", help="The plan's graph (default: the plan file's `graph`)."),
    cluster: str = typer.Option(None, "--cluster", "-c", help="The plan's cluster (default: the plan file's)."),
    calibration: Path = typer.Option(None, "--calibration",
                                     help="Calibration to simulate with (default: the plan file's, else the "
                                          "shipped one)."),
    steps: int = typer.Option(1000, "--steps", min=1, max=MAX_STEPS,
                              help="Training steps written where the framework takes them."),
) -> None:
    """Export PLAN to a training framework: the nearest plan it can express, what was dropped, both step times.

    Both plans are simulated on the same problem (the plan's graph and cluster) with the same score as `place`."""
    if to not in FRAMEWORK_NAMES:
        raise PlacementError(f"--to: unknown framework {to!r}; known: {', '.join(FRAMEWORK_NAMES)}")
    from gpualloc.cli.place import problem_of
    from gpualloc.errors import write_text
    from gpualloc.export import export_plan
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.document import read_plan

    saved = read_plan(plan)
    graph = graph or saved.graph
    cluster = cluster or saved.cluster
    for name, value in (("graph", graph), ("cluster", cluster)):
        if not value:
            raise PlacementError(f"{plan}: {name}: the plan file names no {name}; pass --{name}")
    if calibration is None and saved.calibration:
        calibration = Path(saved.calibration)
    batch = saved.global_batch or 32
    g, clus = load_graph(graph, batch), load_cluster(cluster)
    problem = problem_of(g, clus, saved.microbatches, calibration, saved.precision)
    made = export_plan(problem, saved.plan_for(problem), to, steps=steps,
                       header=(f"gpualloc export of {plan} (graph {graph}, cluster {cluster}) to {to}",
                               f"plan: {saved.plan_for(problem).describe()}"))
    if output is not None:
        write_text(output, made.text)
    if as_json:
        print_json({**made.to_dict(), "output": str(output) if output is not None else None,
                    **({} if output is not None else {"text": made.text})})
        return
    if output is None:  # the file on stdout, the summary on stderr
        sys.stdout.write(made.text)  # as written to a file, byte for byte
    _summary(made, output, console if output is not None else err_console)


def _summary(made, output: Path | None, where) -> None:
    d = made.to_dict()
    deg = d["degrees"]
    lines = [f"{made.framework}: PP={deg['pp']} DP={deg['dp']} TP={deg['tp']}, micro batch {deg['micro_batch']} x "
             f"{deg['microbatches']} microbatch(es), global batch {deg['global_batch']}",
             f"step time: plan {made.step_time_s * 1e3:.3f} ms, exported {made.exported_step_time_s * 1e3:.3f} ms "
             f"(simulated, same problem)"]
    lines += [f"dropped: {x}" for x in made.dropped] or ["dropped: nothing (the file is the plan)"]
    if output is not None:
        lines.append(f"wrote {output}")
    for line in lines:
        where.print(Text(line), soft_wrap=True)
