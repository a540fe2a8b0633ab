"""``gpualloc cost``: what a graph costs on devices, and the calibration behind it."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from gpualloc.cli.common import console, gib, load_graph, ms, print_json

app = typer.Typer(help="The cost model: per-device estimates and the calibration behind them.",
                  no_args_is_help=True)


@app.command("estimate")
def estimate_cmd(
    graph: str = typer.Argument(..., help="A gpualloc-graph JSON file, a zoo model name or package.module:factory."),
    devices: str = typer.Option("A100,V100,T4", "--devices", help="Comma-separated device types."),
    batch: int = typer.Option(32, "--batch", min=1, help="Batch size when GRAPH is a model to capture."),
    as_json: bool = typer.Option(False, "--json", help="Print the estimates as JSON."),
) -> None:
    """Estimate one training step of a graph on each device (alone, ops in sequence)."""
    from gpualloc.cost.estimate import estimate
    from gpualloc.cost.model import CostModel
    from gpualloc.hardware.catalog import default_catalog

    g = load_graph(graph, batch)
    cat = default_catalog()
    types = [cat.device(name.strip()) for name in devices.split(",") if name.strip()]
    model = CostModel()
    rows = [estimate(g, d, model) for d in types]
    if as_json:
        print_json({"graph": g.name, "batch_size": g.batch_size, "estimates": [r.to_dict() for r in rows]})
        return
    table = Table(title=f"{g.name} (batch {g.batch_size}): one training step on one device")
    for col in ("device", "step", "fwd", "bwd", "samples/s", "TFLOP/s", "FP32 util", "memory", "fits",
                "J/step", "efficiency from"):
        table.add_column(col, justify="left" if col in ("device", "efficiency from") else "right")
    for r, d in zip(rows, types):
        table.add_row(
            r.device, ms(r.step_time_s), ms(r.fwd_time_s), ms(r.bwd_time_s),
            f"{r.samples_per_s:,.1f}" if r.samples_per_s else "-", f"{r.achieved_tflops:.1f}",
            f"{r.fp32_utilisation:.0%}" if r.fp32_utilisation is not None else "-",
            f"{gib(r.memory_bytes)} / {gib(r.device_mem_bytes)}", "yes" if r.fits else "[red]no[/]",
            f"{r.energy_per_step_j:.1f}", model.efficiency(d).fitted_from,
        )
    console.print(table)
    fastest = min(rows, key=lambda r: r.step_time_s)
    console.print("relative step time: " + ", ".join(
        f"{r.device} {r.step_time_s / fastest.step_time_s:.2f}x" for r in rows))


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
    table = Table(title="Fitted efficiencies (FP32 peaks)")
    for col in ("device", "compute", "memory", "launch us", "fitted from"):
        table.add_column(col)
    for name, e in [*cal.devices.items(), ("(other GPUs)", cal.default), ("(cpu)", cal.cpu_default)]:
        table.add_row(name, f"{e.compute:.3f}", f"{e.memory:.3f}", f"{e.launch_s * 1e6:.1f}", e.fitted_from)
    console.print(table)
    fit = cal.fit
    if "pipedream" in fit:
        pd = fit["pipedream"]
        t = Table(title=f"PipeDream per-layer fit on {fit['reference_device']}: one minibatch (fwd+bwd), "
                        f"median layer error {pd['layer_median_abs_error']:.0%}")
        for col in ("model", "measured", "predicted", "error"):
            t.add_column(col, justify="right" if col != "model" else "left")
        for name, m in pd["models"].items():
            t.add_row(name, f"{m['measured_ms']:.1f} ms", f"{m['predicted_ms']:.1f} ms", f"{m['error']:+.0%}")
        console.print(t)
    if "sia" in fit:
        t = Table(title=f"Sia: measured speed per sample vs {fit['reference_device']} (marginal time per sample)")
        for col in ("device", "app", "ms/sample", "R^2", "measured speed", "model speed", "error"):
            t.add_column(col)
        for dev, rec in fit["sia"].items():
            for app, a in rec["apps"].items():
                measured = a["speed_vs_ref"]
                pred = a.get("predicted_speed")
                err = f"{pred / measured - 1:+.0%}" if measured and pred else "-"
                t.add_row(dev, app, f"{a['ms_per_sample']:.3f}", f"{a['r2']:.2f}",
                          f"{measured:.2f}x" if measured else "(unused)", f"{pred:.2f}x" if pred else "-", err)
        console.print(t)
    if fit.get("leave_one_out"):
        t = Table(title="Leave-one-out: the default rule (for devices without measurements) on measured GPUs")
        for col in ("device", "measured speed", "predicted", "error"):
            t.add_column(col)
        for dev, r in fit["leave_one_out"].items():
            t.add_row(dev, f"{r['measured_speed']:.2f}x", f"{r['predicted_speed']:.2f}x", f"{r['error']:+.0%}")
        console.print(t)
    if "command" in fit:
        console.print(f"regenerate: {fit['command']}")


@app.command("calibrate")
def calibrate_cmd(
    data: Path = typer.Option(Path("../shared/data"), "--data", help="The shared data folder (PipeDream, Sia)."),
    output: Path = typer.Option(..., "-o", "--output", help="Where to write the calibration JSON."),
) -> None:
    """Fit the efficiencies on the measured data and write a calibration file."""
    from gpualloc.cost.calibrate import calibrate

    with console.status("fitting the roofline on PipeDream layers and Sia step times..."):
        cal = calibrate(data)
    cal.save(output)
    console.print(f"wrote {output}; show it with: gpualloc cost calibration --file {output}")
