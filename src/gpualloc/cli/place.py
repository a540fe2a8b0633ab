"""``gpualloc place``: partition a graph over a cluster, score plans, compare every method."""

from __future__ import annotations

from pathlib import Path

import typer

from gpualloc.cli.common import (DefaultToRun, console, err_console, load_graph, output_file, print_json,
                                 progress_bar)
from gpualloc.limits import MAX_BATCH, MAX_MICROBATCHES, MAX_SEED

app = typer.Typer(cls=DefaultToRun, no_args_is_help=True,
                  help="Place a graph on a cluster: `place GRAPH --cluster C --method M`, `place evaluate`, "
                       "`place compare`.")

GRAPH_HELP = "A gpualloc-graph JSON, a PipeDream profile (.txt), a zoo model name or package.module:factory."
CLUSTER_HELP = "Preset (8xA100, adlro16, mixed-gen), shorthand (4xA100+4xV100) or a TOML/YAML file."


CALIBRATION_HELP = "A calibration file from `gpualloc calibrate` (default: the shipped one)."


# The options the three commands share, declared once.
_GRAPH = typer.Argument(..., metavar="GRAPH", help=GRAPH_HELP)
_CLUSTER = typer.Option(..., "--cluster", "-c", help=CLUSTER_HELP)
_MICROBATCHES = typer.Option(1, "--microbatches", max=MAX_MICROBATCHES, min=1, help="Pipeline microbatches per step.")
_BATCH = typer.Option(32, "--batch", max=MAX_BATCH, min=1, help="Batch size when GRAPH is a model to capture.")
_CALIBRATION = typer.Option(None, "--calibration", help=CALIBRATION_HELP)
_SEED = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Random seed.")
_PLOT = typer.Option(None, "--plot", callback=output_file, help="Write a Gantt chart of one step (PNG).")
_PRECISION = typer.Option("fp32", "--precision",
                          help="Training precision: fp32, tf32, bf16 or fp16 (mixed, fp32 master weights); compute at "
                               "that precision's peak, memory at its bytes; refused on devices without it.")
_LAUNCH = typer.Option("serial", "--launch",
                       help="Launch overhead rule: serial (every op pays it, as the shipped calibration was fitted) "
                            "or async (a GPU launch hides behind the previous op; docs/cost-model.md).")
_RESERVE = typer.Option(None, "--reserve-gib", min=0.0, max=1e6,
                        help="Memory the framework keeps on every device (default: 2 GiB a GPU, 3 in a TP group; "
                             "docs/placement-hybrid.md).")
SCHEDULE_HELP = "Pipeline schedule: 1f1b, gpipe, or auto (simulate both, keep the faster)."
_LAUNCHABLE = typer.Option(False, "--launchable",
                           help="Keep the hybrid planner (and best) to plans `gpualloc launch` runs: one replica count "
                                "and TP degree in every stage, a replica's share the same in every stage, whole "
                                "microbatches, fp32, no ZeRO-2 (docs/engine.md).")


def make_problem(graph: str, cluster: str, microbatches: int, batch: int, calibration: Path | None = None,
                 precision: str = "fp32", reserve_gib: float | None = None, launch: str = "serial"):
    """The placement problem of the command-line arguments (graph source, cluster spec, calibration file,
    precision and reserve). A calibration with per-op profiles of the model on every device type of the
    cluster gives the op times, as `gpualloc run` predicts with them."""
    from gpualloc.hardware.cluster import load_cluster

    return problem_of(load_graph(graph, batch), load_cluster(cluster), microbatches, calibration, precision,
                      reserve_gib, launch)


def problem_of(g, clus, microbatches: int, calibration: Path | None = None, precision: str = "fp32",
               reserve_gib: float | None = None, launch: str = "serial"):
    """:func:`make_problem` on a loaded graph and cluster."""
    from gpualloc.cost.memory import MemoryRules
    from gpualloc.cost.model import Calibration, CostModel
    from gpualloc.placement.problem import PlacementProblem

    rules = MemoryRules(precision=precision, reserve_bytes=None if reserve_gib is None else reserve_gib * 2**30)
    cal = Calibration.load(calibration) if calibration is not None else None
    if cal is not None:
        from gpualloc.cost.microbench import apply_profiles  # imports torch: only with a calibration file

        g = apply_profiles(g, cal, [d.type.name for d in clus.devices], precision) or g
    return PlacementProblem(g, clus, CostModel(cal, launch=launch), microbatches=microbatches, rules=rules)


def compare_all(problem, *, seed: int, quiet: bool = False, schedule: str = "1f1b", launchable: bool = False) -> list:
    """Every registered method (partitioners and hybrid planners) on ``problem``, with a progress bar unless
    ``quiet``; ``launchable`` keeps the hybrid planner and best to plans the engine runs."""
    from gpualloc.placement.hybrid.search import HYBRID_METHODS
    from gpualloc.placement.partition import PARTITIONERS
    from gpualloc.placement.run import compare

    methods = [*PARTITIONERS, *HYBRID_METHODS]
    with progress_bar(unit="methods") as progress:
        task = progress.add_task("partitioning", total=len(methods), visible=not quiet)
        return compare(problem, methods, seed=seed, progress=lambda m: progress.advance(task), hybrid=True,
                       schedule=schedule, launchable=launchable)


def engine_note(problem, outcomes) -> None:
    """One note line on stderr (table output only: ``--json`` output stays as it was) when the first of
    ``outcomes`` that is a hybrid plan, or ``best``'s, is one the engine would refuse: its first reason and the
    flag."""
    from gpualloc.placement.hybrid.plan import HybridPlan
    from gpualloc.placement.hybrid.runnable import LAUNCHABLE_FLAG, reasons

    for o in outcomes:
        if isinstance(o.plan, HybridPlan) or o.method == "best":
            why = reasons(o.plan, problem.graph)
            if why:
                how = LAUNCHABLE_FLAG if o.method in ("hybrid", "best") else f"--method hybrid {LAUNCHABLE_FLAG}"
                if why[0].startswith("plan: precision"):
                    how = f"--precision fp32 {how}"
                err_console.print(f"note: `gpualloc launch` would refuse the {o.method} plan ({why[0]}); "
                                  f"{how} keeps the planner to plans the engine runs",
                                  highlight=False, soft_wrap=True, markup=False)
                return


def comparison_doc(problem, outcomes, cluster: str) -> dict:
    """The JSON of ``place compare``: every outcome with its gains over the reference methods."""
    from gpualloc.placement.outcome import lower_bound_s
    from gpualloc.placement.run import gains

    return {"graph": problem.graph.name, "cluster": cluster, "microbatches": problem.microbatches,
            "lower_bound_s": lower_bound_s(problem),
            "results": [{**o.to_dict(problem, with_plan=False),
                         **{f"gain_vs_{ref.replace('-', '_')}": None if v != v else v for ref, v in g.items()}}
                        for o, g in zip(outcomes, gains(outcomes), strict=True)]}


def print_outcomes(problem, outcomes, title: str) -> None:
    """The outcomes as a table (ratios from placement.run, rendering from reports)."""
    from gpualloc.placement.run import gains, memory_fill
    from gpualloc.reports.placement import outcomes_table

    console.print(outcomes_table(outcomes, gains(outcomes), [memory_fill(problem, o) for o in outcomes], title))


@app.command("run")
def run_cmd(
    graph: str = _GRAPH,
    cluster: str = _CLUSTER,
    method: str = typer.Option("best", "--method", "-m",
                               help="Partitioner (see `place compare`), hybrid (data x pipeline x tensor "
                                    "parallel), ddp, ddp-speed, megatron, metis, best, or dqn (the learned agent)."),
    agent: Path = typer.Option(None, "--agent", help="Agent checkpoint for --method dqn (default: the bundled one)."),
    microbatches: int = _MICROBATCHES,
    batch: int = _BATCH,
    calibration: Path = _CALIBRATION,
    precision: str = _PRECISION,
    reserve_gib: float = _RESERVE,
    launch: str = _LAUNCH,
    seed: int = _SEED,
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    output: Path = typer.Option(None, "-o", "--output", callback=output_file,
                                help="Write the plan (re-scorable) as JSON."),
    plot: Path = _PLOT,
    schedule: str = typer.Option(None, "--schedule", help=f"{SCHEDULE_HELP} Default: auto for best, else 1f1b."),
    launchable: bool = _LAUNCHABLE,
) -> None:
    """Partition GRAPH over CLUSTER with one method and simulate the step."""
    from gpualloc.placement.run import place

    problem = make_problem(graph, cluster, microbatches, batch, calibration, precision, reserve_gib, launch)
    outcome = place(problem, method, seed=seed, hybrid=True, schedule=schedule, launchable=launchable,
                    **({"agent": agent} if agent is not None else {}))
    if not (launchable or as_json):
        engine_note(problem, [outcome])
    _finish(problem, outcome, cluster, as_json, output, plot, calibration)


@app.command("evaluate")
def evaluate_cmd(
    graph: str = _GRAPH,
    cluster: str = _CLUSTER,
    plan: Path = typer.Option(..., "--plan", help="A plan JSON (from `place -o`, or hand-made)."),
    microbatches: int = typer.Option(None, "--microbatches", max=MAX_MICROBATCHES, min=1,
                                     help="Pipeline microbatches of an op-level plan (default: the plan's)."),
    batch: int = _BATCH,
    calibration: Path = _CALIBRATION,
    precision: str = _PRECISION,
    reserve_gib: float = _RESERVE,
    launch: str = _LAUNCH,
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    plot: Path = _PLOT,
    schedule: str = typer.Option(None, "--schedule", help=f"{SCHEDULE_HELP} Default: the plan's, else 1f1b."),
) -> None:
    """Score a plan file (either version) with the same simulator and bound as `place`."""
    from gpualloc.placement.document import read_plan
    from gpualloc.placement.run import evaluate

    from gpualloc.hardware.cluster import load_cluster

    g, clus = load_graph(graph, batch), load_cluster(cluster)  # the arguments in command-line order
    saved = read_plan(plan)
    problem = problem_of(g, clus, microbatches or saved.microbatches, calibration, precision, reserve_gib, launch)
    outcome = evaluate(problem, saved, schedule=schedule)
    _finish(problem, outcome, cluster, as_json, None, plot)


@app.command("compare")
def compare_cmd(
    graph: str = _GRAPH,
    cluster: str = _CLUSTER,
    microbatches: int = _MICROBATCHES,
    batch: int = _BATCH,
    calibration: Path = _CALIBRATION,
    precision: str = _PRECISION,
    reserve_gib: float = _RESERVE,
    launch: str = _LAUNCH,
    seed: int = _SEED,
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    schedule: str = typer.Option("1f1b", "--schedule", help=SCHEDULE_HELP),
    launchable: bool = _LAUNCHABLE,
) -> None:
    """Every method side by side: step time, ratio to the lower bound, gains over static and round-robin."""
    problem = make_problem(graph, cluster, microbatches, batch, calibration, precision, reserve_gib, launch)
    outcomes = compare_all(problem, seed=seed, quiet=as_json, schedule=schedule, launchable=launchable)
    if not (launchable or as_json):
        engine_note(problem, [o for o in outcomes if o.method in ("hybrid", "best")])
    if as_json:
        print_json(comparison_doc(problem, outcomes, cluster))
        return
    print_outcomes(problem, outcomes, f"{problem.graph.name} on {cluster} ({len(problem.cluster)} devices; op-level "
                                      f"plans at {microbatches} microbatch(es), hybrid plans pick their own)")


def _finish(problem, outcome, cluster: str, as_json: bool, output: Path | None, plot: Path | None,
            calibration: Path | None = None) -> None:
    if output is not None:
        from gpualloc.placement.document import write_plan

        # the calibration the plan was scored with: `run` predicts with it unless told otherwise
        scored_with = str(calibration.resolve()) if calibration is not None else None
        write_plan(output, problem, outcome.plan, cluster,
                   extra={**outcome.to_dict(problem), "calibration": scored_with})
    if plot is not None:
        from gpualloc.placement.outcome import plan_events
        from gpualloc.reports.gantt import plot_gantt

        plot_gantt(plan_events(problem, outcome.plan), plot,
                   title=f"{problem.graph.name}: {outcome.method} on {cluster}",
                   device_names=[d.label for d in problem.cluster.devices])
    if as_json:
        print_json(outcome.to_dict(problem))
        return
    print_outcomes(problem, [outcome], f"{problem.graph.name} on {cluster}: {outcome.method}")
    if output is not None:
        console.print(f"wrote {output}")
    if plot is not None:
        console.print(f"wrote {plot}")
