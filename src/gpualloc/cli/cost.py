"""``gpualloc cost``: what a graph costs on devices, and the calibration behind it."""

from __future__ import annotations

from pathlib import Path

import typer

from gpualloc.cli.common import console, device_types, load_graph, output_file, print_json
from gpualloc.reports.costs import calibration_view, estimates_view
from gpualloc.limits import MAX_BATCH

app = typer.Typer(help="The cost model: per-device estimates and the calibration behind them.",
                  no_args_is_help=True)


@app.command("estimate")
def estimate_cmd(
    graph: str = typer.Argument(..., help="A gpualloc-graph JSON file, a zoo model name or package.module:factory."),
    devices: str = typer.Option("A100,V100,T4", "--devices", help="Comma-separated device types."),
    batch: int = typer.Option(32, "--batch", max=MAX_BATCH, min=1, help="Batch size when GRAPH is a model to capture."),
    as_json: bool = typer.Option(False, "--json", help="Print the estimates as JSON."),
) -> None:
    """Estimate one training step of a graph on each device (alone, ops in sequence, then the optimizer step)."""
    g = load_graph(graph, batch)
    if as_json:
        from gpualloc.cost.estimate import estimate

        print_json({"graph": g.name, "batch_size": g.batch_size,
                    "estimates": [estimate(g, d).to_dict() for d in device_types(devices)]})
        return
    print_estimates(g, devices)


def print_estimates(g, devices: str) -> None:
    """A table of one training step of ``g`` on each of ``devices`` (comma-separated catalog names)."""
    from gpualloc.cost.estimate import estimate
    from gpualloc.cost.model import CostModel

    types = device_types(devices)
    model = CostModel()
    console.print(estimates_view(g.name, g.batch_size, [estimate(g, d, model) for d in types],
                                 [model.efficiency(d).fitted_from for d in types]))


@app.command("calibration")
def calibration_cmd(
    path: Path = typer.Option(None, "--file", help="A calibration file (default: the shipped one)."),
    as_json: bool = typer.Option(False, "--json", help="Print the calibration as JSON."),
) -> None:
    """Show the fitted efficiencies and how well they predict the measured data."""
    from gpualloc.cost.model import Calibration

    cal = Calibration.load(path)
    if as_json:
        print_json(cal.to_dict())
        return
    console.print(calibration_view(cal))


_DATA = typer.Option(Path("../shared/data"), "--data", help="The shared data folder (PipeDream, Sia).")
_OUTPUT = typer.Option(..., "-o", "--output", callback=output_file, help="Where to write the calibration JSON.")


@app.command("fit")
def fit_cmd(data: Path = _DATA, output: Path = _OUTPUT) -> None:
    """Fit the efficiencies on published measurements (PipeDream, Sia) and write a calibration file.

    Nothing is measured here: `gpualloc calibrate` measures this machine."""
    _fit(data, output)


@app.command("calibrate", hidden=True)
def calibrate_cmd(data: Path = _DATA, output: Path = _OUTPUT) -> None:
    """The old name of `gpualloc cost fit`."""
    from gpualloc.cli.common import err_console

    err_console.print("note: `gpualloc cost calibrate` is now `gpualloc cost fit` (it fits published data; "
                      "`gpualloc calibrate` measures this machine)", soft_wrap=True)
    _fit(data, output)


def _fit(data: Path, output: Path) -> None:
    from gpualloc.cost.calibrate import calibrate

    with console.status("fitting the roofline on PipeDream layers and Sia step times..."):
        cal = calibrate(data)
    cal.save(output)
    console.print(f"wrote {output}; show it with: gpualloc cost calibration --file {output}")
