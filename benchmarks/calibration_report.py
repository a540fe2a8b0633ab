"""Fit the cost model on ../shared/data and print its error tables (the ones in docs/cost-model.md).

Usage: python benchmarks/calibration_report.py [--data ../shared/data] [--out benchmarks/results/calibration.json]

``--data`` must hold ``pipedream-profiles/*.txt`` and the Sia traces (``sia/traces/*/placements-*.csv``);
the folder of ``--out`` is created if missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import _args
from gpualloc.cost.calibrate import REFERENCE_DEVICE, calibrate


def main() -> None:
    here = Path(__file__).resolve().parent
    parser = _args.Parser(description=__doc__)
    parser.add_argument("--data", type=_args.folder("pipedream-profiles/*.txt", "sia/traces/*/placements-*.csv"),
                        default=str(here.parent.parent / "shared" / "data"))
    parser.add_argument("--out", type=_args.output, default=here / "results" / "calibration.json")
    args = parser.parse_args()
    cal = calibrate(args.data)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(cal.to_dict(), indent=1) + "\n")
    fit = cal.fit

    print("| device | compute | memory | launch (us) | fitted from |\n|---|---:|---:|---:|---|")
    for name, e in [*cal.devices.items(), ("other GPUs (default)", cal.default), ("cpu", cal.cpu_default)]:
        print(f"| {name} | {e.compute:.3f} | {e.memory:.3f} | {e.launch_s * 1e6:.0f} | {e.fitted_from} |")

    pd = fit["pipedream"]
    print(f"\nPipeDream, one minibatch forward+backward on the {REFERENCE_DEVICE} (median |error| "
          f"{pd['model_median_abs_error']:.0%}, max {pd['model_max_abs_error']:.0%}; per layer median "
          f"{pd['layer_median_abs_error']:.0%}):\n")
    print("| model | measured (ms) | predicted (ms) | error |\n|---|---:|---:|---:|")
    for model, r in pd["models"].items():
        print(f"| {model} | {r['measured_ms']:.1f} | {r['predicted_ms']:.1f} | {r['error']:+.0%} |")

    sia = fit["sia"]
    print("\nT4 vs V100 on the six Sia applications (whole step at the largest common batch; per-sample slope):\n")
    print("| app | batch | measured T4/V100 step time | model | error | measured per-sample ratio (slope) |")
    print("|---|---:|---:|---:|---:|---:|")
    for app, x in sia["T4"]["apps"].items():
        measured, model = 1 / x["step_speed_vs_ref"], 1 / x["predicted_speed"]
        ref_r2 = sia[REFERENCE_DEVICE]["apps"][app]["r2"]
        slope = (f"{1 / x['speed_vs_ref']:.2f}" if x["speed_vs_ref"]
                 else f"unused (R² {x['r2']:.2f} / V100 {ref_r2:.2f})")
        print(f"| {app} | {x['step_speed_bsz']} | {measured:.2f} | {model:.2f} | {model / measured - 1:+.0%} "
              f"| {slope} |")

    devices = [d for d in sia if d != REFERENCE_DEVICE]
    print("\nMeasured speed per sample relative to the V100 / the model's / error:\n")
    print("| app | " + " | ".join(devices) + " |\n|---|" + "---|" * len(devices))
    for app in sia["T4"]["apps"]:
        cells = []
        for d in devices:
            x = sia[d]["apps"][app]
            m, p = x["speed_vs_ref"], x["predicted_speed"]
            cells.append(f"{m:.2f} / {p:.2f} / {p / m - 1:+.0%}" if m else f"unused (R² {x['r2']:.2f}) / {p:.2f}")
        print(f"| {app} | " + " | ".join(cells) + " |")

    print("\nLeave-one-out: the default rule for devices without measurements, tried on each measured GPU:\n")
    print("| device | measured speed vs V100 | predicted | error |\n|---|---:|---:|---:|")
    for d, r in fit["leave_one_out"].items():
        print(f"| {d} | {r['measured_speed']:.2f} | {r['predicted_speed']:.2f} | {r['error']:+.0%} |")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    _args.guarded(main)
