"""The ``gpualloc`` command: one sub-command group per area."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import typer
from rich.text import Text

from gpualloc import __version__
from gpualloc.cli import cost, graph, hw, monitor, place, reproduce, simulate, train
from gpualloc.cli import calibrate as calibrate_cli, run as run_cli
from gpualloc.cli import launch as launch_cli
from gpualloc.cli import export as export_cli
from gpualloc.cli import service as service_cli
from gpualloc.cli.common import OrderedGroup, console, disk_cache, err_console, output_folder, set_cache
from gpualloc.errors import GpuallocError, GpuallocWarning
from gpualloc.limits import MAX_BATCH

app = typer.Typer(
    name="gpualloc",
    help="Allocate GPU resources for deep learning: place a model's operators on heterogeneous GPUs, "
    "and schedule jobs on a GPU cluster.",
    cls=OrderedGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
)
app.add_typer(hw.app, name="hw")
app.add_typer(graph.app, name="graph")
app.add_typer(cost.app, name="cost")
app.add_typer(place.app, name="place")
app.add_typer(simulate.app, name="simulate")
app.add_typer(train.app, name="train")
app.add_typer(reproduce.app, name="reproduce")
app.add_typer(monitor.app, name="monitor")
app.command("run")(run_cli.run_cmd)
app.command("calibrate")(calibrate_cli.calibrate_cmd)
app.command("launch")(launch_cli.launch_cmd)
app.command("export")(export_cli.export_cmd)
service_cli.register(app)  # serve, submit, jobs, cancel, policy


def _version(value: bool) -> None:
    if value:
        console.print(f"gpualloc {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    no_cache: bool = typer.Option(False, "--no-cache", envvar="GPUALLOC_NO_CACHE",
                                  help="Neither read nor write the cache of traced zoo graphs and dqn gate verdicts "
                                       "($GPUALLOC_CACHE_DIR, else $XDG_CACHE_HOME/gpualloc or ~/.cache/gpualloc)."),
) -> None:
    """gpualloc: placement inside a training job and scheduling across jobs, on one cost model."""
    set_cache(not no_cache)


@app.command("demo")
def demo(
    out: Path = typer.Option(Path("out/demo"), "--out", callback=output_folder, help="Folder for the demo's files."),
    batch: int = typer.Option(32, "--batch", max=MAX_BATCH, min=1, help="Batch size."),
) -> None:
    """The main job on built-in defaults: ResNet-50 costed and placed, 200 jobs scheduled.

    Capture ResNet-50, cost a training step on A100/V100/T4, place it on 4 A100 + 4 V100 with every
    method, and schedule 200 jobs on adlro16 under every policy."""
    from gpualloc.graph.cached import capture_cached
    from gpualloc.graph.ir import summarize
    from gpualloc.reports.graphs import capture_line, heaviest_nodes_table, summary_view

    path = out / "resnet50.json"  # --out is created by its callback (output_folder)
    console.rule("[bold]1. capture ResNet-50 (torch.export + FLOP counter)")
    with console.status(f"tracing resnet50 at batch {batch}..."):
        g = capture_cached("resnet50", batch=batch, cache=disk_cache())
    g.save(path)
    console.print(capture_line(path, summarize(g)))
    console.rule("[bold]2. the graph")
    console.print(summary_view(summarize(g)))
    console.print(heaviest_nodes_table(g, 5))
    console.rule("[bold]3. one training step on A100 vs V100 vs T4 (calibrated cost model)")
    cost.print_estimates(g, "A100,V100,T4")
    console.rule("[bold]4. place it on hetero8 (4 A100 + 4 V100): every method vs the lower bound")
    problem = place.make_problem(str(path), "hetero8", microbatches=1, batch=batch)
    place.print_outcomes(problem, place.compare_all(problem, seed=0),
                         f"{g.name} on hetero8 ({len(problem.cluster)} devices, 1 microbatch(es))")
    console.rule("[bold]5. schedule 200 synthetic jobs on adlro16 (8 V100 + 4 T4 + 4 MI50) under every policy")
    spec, jobs = simulate.workload("adlro16", None, None, 200, 0.8, None, None, seed=0)
    plots = out / "sched-plots"
    rows = simulate.compare_policies(jobs, spec, simulate.DEFAULT_POLICIES.split(","), seed=0, plots=plots)
    simulate.print_policies(rows, f"{len(jobs):,} jobs on {spec.name} ({len(spec)} GPUs)")
    console.print(f"plots: {plots}/jct_cdf.png, utilization.png, queue.png")
    console.print("\nNext: gpualloc place --help | gpualloc simulate --help | gpualloc reproduce --help")


# Typer vendors its own click; its UsageError is the parent of the BadParameter it re-exports.
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _error_line(message: str) -> None:
    # Text, not markup: messages quote user input such as "nodes[0]".
    err_console.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)


def _warning_line(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning) -> None:
    """Our warnings as one line, without the source location and line Python adds; others as Python shows them."""
    if issubclass(category, GpuallocWarning):
        err_console.print(Text.assemble(("warning: ", "bold yellow"), str(message)), soft_wrap=True)
    else:
        _default(message, category, filename, lineno, file, line)


def main() -> None:
    """Entry point: bad input, whether a domain error or a usage error, is one line on stderr and exit status 2."""
    warnings.showwarning = _warning_line
    try:
        code = app(standalone_mode=False)
    except GpuallocError as err:
        _error_line(str(err))
        sys.exit(2)
    except _UsageError as err:
        if type(err).__name__ == "NoArgsIsHelpError" or err.ctx is None:  # a bare group: its help, as Typer shows it
            from typer import rich_utils

            rich_utils.rich_format_error(err)
            sys.exit(err.exit_code)
        _error_line(f"{err.format_message()} (see '{err.ctx.command_path} --help')")
        sys.exit(err.exit_code)
    except typer.Abort:
        err_console.print("Aborted.")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
