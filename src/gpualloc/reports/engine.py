"""An engine run under torchrun (``gpualloc launch``) as a Rich view: measured vs predicted per rank, checks."""

from __future__ import annotations

from typing import Any

from rich.console import Group

from gpualloc.reports.format import ms, signed_pct, si
from gpualloc.reports.tables import Table

_SOURCES = {"fresh": "measured now and cached", "cached": "cached", "given": "given",
            "shipped": "shipped, not measured on this machine"}


def _bytes(value: float | None) -> str:
    return si(value, "B")


def _check_line(name: str, check: dict[str, Any]) -> str:
    ok = check.get("ok")
    verdict = "[green]yes[/]" if ok else ("[red]NO[/]" if ok is not None else "not checked")
    detail = ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
                       for k, v in check.items() if k not in ("ok", "variant"))
    return f"{name} equals the unsplit model's: {verdict}" + (f" ({detail})" if detail else "")


def engine_run_view(report: dict[str, Any]) -> Group:
    """The table and summary lines of ``gpualloc launch``'s report (:func:`gpualloc.cli.launch.finish_run`)."""
    table = Table(title=f"{report.get('model')}: {report.get('plan_description')} under torchrun "
                        f"({report.get('world_size')} ranks, {report.get('backend')}, {report.get('schedule')})",
                  drop_first=("predicted reserve", "torch", "batch"), more="--json")
    for col in ("rank", "device", "torch", "stage", "replica", "batch", "step", "measured compute",
                "predicted compute", "error", "optimizer measured / predicted", "measured peak", "predicted peak",
                "predicted reserve"):
        table.add_column(col, justify="left" if col in ("device", "torch") else "right")
    for r in report["ranks"]:
        opt = (f"{ms(r['measured_optimizer_s'])} / {ms(r['predicted_optimizer_s'])}"
               if r.get("predicted_optimizer_s") else "-")
        table.add_row(str(r["rank"]), r["device"], r["torch_device"],
                      ",".join(map(str, r.get("stages") or [r["stage"]])), str(r["replica"]),
                      str(r["local_batch"]), ms(r["measured_step_s"]), ms(r["measured_compute_s"]),
                      ms(r["predicted_compute_s"]), signed_pct(r["compute_error"]), opt,
                      _bytes(r["measured_peak_bytes"]), _bytes(r["predicted_peak_bytes"]),
                      _bytes(r["predicted_reserve_bytes"]))
    cal = report.get("calibration") or {}
    err = report.get("step_error")
    lines = [
        f"step time: measured {ms(report['measured_step_s'])} (median of {report.get('steps')}), predicted "
        f"{ms(report['predicted_step_s'])} ({report.get('prediction')}), error "
        f"{signed_pct(err) if err is not None else '-'}",
        *(_check_line(name, check) for name, check in (report.get("checks") or {}).items()
          if isinstance(check, dict)),
        *sorted({f"checked on the model's variant: {c['variant']}" for c in (report.get("checks") or {}).values()
                 if isinstance(c, dict) and c.get("variant")}),
        "peak memory: measured above the process's baseline, predicted without the framework reserve",
    ]
    if cal:
        lines.append(f"calibration: {cal.get('path') or 'shipped'} ({_SOURCES.get(cal.get('source'), '?')})")
    for name, scale in (report.get("scale") or {}).items():
        lines.append(f"{name}: measured compute is {scale:.3g} x the prediction; the written calibration scales "
                     f"its efficiency by {1 / scale:.3g}")
    for name, scale in (report.get("optimizer_scale") or {}).items():
        lines.append(f"{name}: the measured optimizer step is {scale:.3g} x the prediction; the written calibration "
                     "scales its optimizer cost to match")
    return Group(table, *lines)
