"""Cost-model results as Rich tables: per-device step estimates and the calibration behind them."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.text import Text

from gpualloc.reports.format import gib, ms, si
from gpualloc.reports.tables import Table


def estimates_view(graph_name: str, batch: int | None, rows: Sequence, fitted_from: Sequence[str]) -> Group:
    """One training step of a graph on each device, then each step time relative to the fastest.

    Args:
        graph_name, batch: the graph's name and batch size, for the title.
        rows: :class:`~gpualloc.cost.estimate.DeviceEstimate` per device.
        fitted_from: where each device's efficiency comes from (``CostModel.efficiency(d).fitted_from``).
    """
    table = Table(title=f"{graph_name} (batch {batch}): one training step on one device", more="--json",
                  drop_first=("efficiency from", "J/step", "fwd", "bwd", "samples/s", "memory"))
    for col in ("device", "step", "fwd", "bwd", "samples/s", "TFLOP/s", "FP32 util", "memory", "fits",
                "J/step", "efficiency from"):
        table.add_column(col, justify="left" if col in ("device", "efficiency from") else "right")
    for r, source in zip(rows, fitted_from, strict=True):
        table.add_row(
            r.device, ms(r.step_time_s), ms(r.fwd_time_s), ms(r.bwd_time_s),
            f"{r.samples_per_s:,.1f}" if r.samples_per_s else "-", f"{r.achieved_tflops:.1f}",
            f"{r.fp32_utilisation:.0%}" if r.fp32_utilisation is not None else "-",
            f"{gib(r.memory_bytes)} / {gib(r.device_mem_bytes)}", "yes" if r.fits else "[red]no[/]",
            f"{r.energy_per_step_j:.1f}", source,
        )
    fastest = min(r.step_time_s for r in rows)
    relative = Text("relative step time: " + ", ".join(f"{r.device} {r.step_time_s / fastest:.2f}x" for r in rows))
    note = Text("FP32 util: achieved TFLOP/s over the device's fastest FP32 math (TF32 tensor cores where it has "
                "them: PyTorch runs FP32 convolutions there by default)", style="dim")
    return Group(table, relative, note)


def calibration_view(cal) -> Group:
    """A :class:`~gpualloc.cost.model.Calibration`: fitted efficiencies, then each fit's error tables."""
    parts: list[RenderableType] = []
    table = Table("device", "compute", "memory", "launch us", "fitted from",
                  title="Fitted efficiencies (FP32 peaks; a measured precision's of its own peak)")
    measured_in = [(f"{d} ({p})", e) for d, by in cal.precisions.items() for p, e in by.items()]
    for name, e in [*cal.devices.items(), *measured_in, ("(other GPUs)", cal.default), ("(cpu)", cal.cpu_default)]:
        table.add_row(name, f"{e.compute:.3f}", f"{e.memory:.3f}", f"{e.launch_s * 1e6:.1f}", e.fitted_from)
    parts.append(table)
    if cal.optimizers:
        t = Table("device", "precision", "optimizer", "fixed us", "us a tensor", "traffic (of peak bandwidth)",
                  "host and device", "fitted from", title="Optimizer step (docs/cost-model.md)")
        for dev, by_prec in cal.optimizers.items():
            for prec, by_opt in by_prec.items():
                for opt, c in by_opt.items():
                    t.add_row(dev, prec, opt, f"{c.fixed_s * 1e6:.0f}", f"{c.per_tensor_s * 1e6:.1f}",
                              f"{c.memory:.2f}", "overlapped" if c.overlap else "in turn", c.fitted_from)
        parts.append(t)
    fit = cal.fit
    if "pipedream" in fit:
        pd = fit["pipedream"]
        t = Table(title=f"PipeDream per-layer fit on {fit['reference_device']}: one minibatch (fwd+bwd), "
                        f"median layer error {pd['layer_median_abs_error']:.0%}")
        for col in ("model", "measured", "predicted", "error"):
            t.add_column(col, justify="right" if col != "model" else "left")
        for name, m in pd["models"].items():
            t.add_row(name, f"{m['measured_ms']:.1f} ms", f"{m['predicted_ms']:.1f} ms", f"{m['error']:+.0%}")
        parts.append(t)
    if "sia" in fit:
        t = Table("device", "app", "ms/sample", "R^2", "measured speed", "model speed", "error",
                  title=f"Sia: measured speed per sample vs {fit['reference_device']} (marginal time per sample)")
        for dev, rec in fit["sia"].items():
            for app, a in rec["apps"].items():
                measured = a["speed_vs_ref"]
                pred = a.get("predicted_speed")
                err = f"{pred / measured - 1:+.0%}" if measured and pred else "-"
                t.add_row(dev, app, f"{a['ms_per_sample']:.3f}", f"{a['r2']:.2f}",
                          f"{measured:.2f}x" if measured else "(unused)", f"{pred:.2f}x" if pred else "-", err)
        parts.append(t)
    if fit.get("leave_one_out"):
        t = Table("device", "measured speed", "predicted", "error",
                  title="Leave-one-out: the default rule (for devices without measurements) on measured GPUs")
        for dev, r in fit["leave_one_out"].items():
            t.add_row(dev, f"{r['measured_speed']:.2f}x", f"{r['predicted_speed']:.2f}x", f"{r['error']:+.0%}")
        parts.append(t)
    if "command" in fit:
        parts.append(Text(f"regenerate: {fit['command']}"))
    return Group(*parts)


def device_calibration_view(name: str, rec: dict, output: object) -> Group:
    """One measured device of ``gpualloc calibrate``: its microbenchmarks, the fitted efficiency, and the
    per-model step times measured vs predicted (``rec`` is the device's record in ``Calibration.fit``)."""
    eff = rec["efficiency"]
    parts: list[RenderableType] = [
        Text.assemble((name, "bold"), f" measured as {rec['torch_device']} ({rec['threads']} thread(s), "
                      f"{rec['concurrent']} concurrent worker(s)): "
                      f"FP32 matmul up to {si(rec['peak_fp32_tflops_measured'] * 1e12, 'FLOP/s')}, copy "
                      f"{si(rec['copy_bandwidth_bytes_per_s_measured'], 'B/s')}, op overhead "
                      f"{rec['op_overhead_s'] * 1e6:.1f} us"),
        Text(f"fitted efficiency: compute {eff['compute']:.4f}, memory {eff['memory']:.4f}, "
             f"launch {eff['launch_s'] * 1e6:.1f} us (of the catalog peaks)"),
    ]
    if rec.get("graphs"):
        table = Table(title="one training step (fwd + bwd), measured vs the fitted roofline")
        for col in ("model", "batch", "measured", "predicted", "error"):
            table.add_column(col, justify="left" if col == "model" else "right")
        for g, r in rec["graphs"].items():
            table.add_row(g, str(r["batch_size"]), ms(r["measured_step_s"]), ms(r["predicted_step_s"]),
                          f"{r['error']:+.1%}")
        parts.append(table)
        parts.append(Text(f"contiguous runs of ops (what stages are made of): median |error| "
                          f"{rec['chunk_median_abs_error']:.1%}, max {rec['chunk_max_abs_error']:.1%}"))
    for prec, fit in (rec.get("precision_fits") or {}).items():
        e, runs = fit["efficiency"], fit.get("chunk_median_abs_error")
        parts.append(Text(f"{prec}: compute {e['compute']:.4f}, memory {e['memory']:.4f}, launch "
                          f"{e['launch_s'] * 1e6:.1f} us (of the {prec} peak)"
                          + ("" if runs is None else f"; contiguous runs of ops: median |error| {runs:.1%}")))
    for prec, by_opt in (rec.get("optimizer_fits") or {}).items():
        for opt, f in by_opt.items():
            parts.append(Text(f"optimizer step, {opt} in {prec}: {f['fixed_s'] * 1e6:.0f} us + "
                              f"{f['per_tensor_s'] * 1e6:.1f} us a tensor "
                              f"{'overlapping' if f['overlap'] else 'then'} its traffic at {f['memory']:.2f} of the "
                              f"peak bandwidth (|error| {f['rms_relative_error']:.0%} on {len(f['rows'])} sets)"))
    parts.append(Text(f"wrote {output}; use it with: gpualloc run MODEL --plan plan.json --calibration {output}"))
    return Group(*parts)
