"""Fit the cost model's efficiencies on measured data, and record how well the fit predicts.

Two published sources, both in ``../shared/data``:

* **PipeDream per-layer profiles** (14 models, forward and backward ms per layer at batch 128 on a
  V100-class GPU). They anchor the *absolute* roofline of the reference device: the compute and memory
  efficiencies and the per-op launch overhead that best predict every layer's measured time
  (least squares in log time, weighted by time so that the layers that matter dominate).
* **Sia single-GPU step times** (6 applications at several batch sizes on T4, V100, A100,
  RTX 2080 Ti, RTX 6000). A linear fit ``step = t0 + c * batch`` per application and device separates
  the fixed per-step overhead ``t0`` from the marginal time per sample ``c``; the ratio
  ``c_ref / c_dev`` is the device's measured speed relative to the reference. Each device's
  efficiencies are set so the roofline reproduces the median of that ratio over the applications.

Device types with no measurements (H100, AMD Instinct, ...) get the geometric mean of the fitted
GPUs' efficiencies; the leave-one-out error of that rule on the measured GPUs is recorded as the
expected error for them. All of it is written to ``data/calibration.json`` and shown by
``gpualloc cost calibration``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpualloc.cost import physics
from gpualloc.cost.memory import OPTIMIZER_STATES
from gpualloc.cost.model import BWD_FACTOR, Calibration, Efficiency, OptimizerCost, roofline_s
from gpualloc.errors import CostModelError, parse_json
from gpualloc.graph.ir import OpGraph
from gpualloc.hardware.catalog import TERA, Catalog, DeviceType, default_catalog

REFERENCE_DEVICE = "V100-16GB"
SIA_CLUSTERS: Mapping[str, str] = {
    "aws": "T4",
    "azure": "V100-16GB",
    "dgx-ext": "A100-40GB",
    "rtx": "RTX-2080Ti",
    "quad": "RTX-6000",
}
"""Sia's cluster names and the GPU each one has (Sia paper, section 6 and its artifact README)."""

CPU_DEFAULT = Efficiency(compute=0.3, memory=0.5, launch_s=10e-6, fitted_from="assumed")
"""Until ``gpualloc calibrate --device cpu`` measures it, the CPU uses these assumed values."""


# --------------------------------------------------------------------------- PipeDream: absolute fit
def layer_samples(graphs: Iterable[OpGraph], device: str = REFERENCE_DEVICE):
    """Per-layer (flops, bytes, measured seconds, graph index) for forward and backward passes."""
    flops, nbytes, secs, owner = [], [], [], []
    for gi, g in enumerate(graphs):
        for i, node in enumerate(g.nodes):
            t = node.time_ms.get(device)
            if t is None or node.kind == "input":
                continue
            # Zero times stay in: the profiler books some ops (in-place adds) at 0 ms, and a model
            # that predicts whole steps must account for their time somewhere.
            for factor, ms in ((1.0, t.fwd_ms), (BWD_FACTOR, t.bwd_ms)):
                if ms is None:
                    continue
                flops.append(factor * g.flops[i])
                nbytes.append(factor * g.bytes_accessed[i])
                secs.append(ms / 1e3)
                owner.append(gi)
    return np.array(flops), np.array(nbytes), np.array(secs), np.array(owner, dtype=np.int64)


LAUNCH_GRID_S = (0.0, 5e-6, 10e-6, 20e-6, 40e-6)
"""Per-op overheads tried: eager-mode dispatch plus kernel launch, a few to a few tens of microseconds."""


def fit_roofline(flops: np.ndarray, nbytes: np.ndarray, secs: np.ndarray, owner: np.ndarray,
                 device: DeviceType) -> Efficiency:
    """Grid search for (compute, memory, launch) that best predicts each model's measured step.

    The objective is the sum over models of the squared log error of the predicted forward+backward
    time of one minibatch: what the placement simulator needs right is whole steps, not single layers.
    """
    if len(secs) == 0:
        raise CostModelError("no measured layers to fit the roofline on")
    peak = device.fp32_tflops * TERA
    bw = device.mem_bandwidth_bytes_per_s
    onehot = np.zeros((len(secs), int(owner.max()) + 1))
    onehot[np.arange(len(secs)), owner] = 1.0
    log_measured = np.log(secs @ onehot)
    etas_c = np.geomspace(0.05, 3.0, 80)  # above 1: kernels that beat the FLOP count (Winograd, FFT)
    etas_m = np.geomspace(0.02, 1.5, 80)
    mem = nbytes[None, :] / (bw * etas_m[:, None])  # (M, layers)
    best = (math.inf, (0.0, 0.0, 0.0))
    for ec in etas_c:
        core = np.maximum((flops / (peak * ec))[None, :], mem)
        for launch in LAUNCH_GRID_S:
            per_model = (launch + core) @ onehot  # (M, models)
            err = ((np.log(per_model) - log_measured) ** 2).sum(axis=1)
            j = int(np.argmin(err))
            if err[j] < best[0]:
                best = (float(err[j]), (float(ec), float(etas_m[j]), float(launch)))
    ec, em, launch = best[1]
    return Efficiency(compute=ec, memory=em, launch_s=launch, fitted_from="pipedream")


def pipedream_fit_report(graphs: list[OpGraph], device: DeviceType, eff: Efficiency) -> dict[str, Any]:
    """Per model: measured vs predicted forward+backward time of one minibatch; per layer: median error."""
    flops, nbytes, secs, owner = layer_samples(graphs, device.name)
    pred = roofline_s(flops, nbytes, device, eff)
    models = {}
    for gi, g in enumerate(graphs):
        m = owner == gi
        measured, predicted = float(secs[m].sum()), float(pred[m].sum())
        models[g.name] = {"measured_ms": 1e3 * measured, "predicted_ms": 1e3 * predicted,
                          "error": predicted / measured - 1.0}
    timed = secs > 0
    rel = np.abs(pred[timed] / secs[timed] - 1.0)
    errors = np.array([abs(v["error"]) for v in models.values()])
    return {
        "layers": int(timed.sum()),
        "layer_median_abs_error": float(np.median(rel)),
        "model_median_abs_error": float(np.median(errors)),
        "model_max_abs_error": float(errors.max()),
        "models": models,
    }


# --------------------------------------------------------------------------- Sia: relative speeds
def read_sia_single_gpu(root: Path) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """``{(app, cluster): (local_bsz, step_time_s)}`` from the one-GPU rows of ``placements-*.csv``."""
    out: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    for app_dir in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        for cluster in SIA_CLUSTERS:
            path = app_dir / f"placements-{cluster}.csv"
            if not path.exists():
                continue
            bsz, step = [], []
            with path.open(newline="") as fh:
                reader = csv.DictReader(fh)
                missing = {"placement", "local_bsz", "step_time"} - set(reader.fieldnames or ())
                if missing:
                    raise CostModelError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
                for lineno, row in enumerate(reader, start=2):
                    if row["placement"].strip() != "1":
                        continue
                    try:
                        bsz.append(float(row["local_bsz"]))
                        step.append(float(row["step_time"]))
                    except ValueError as err:
                        raise CostModelError(f"{path}:{lineno}: {err}") from err
            if len(bsz) >= 3:
                out[(app_dir.name, cluster)] = (np.array(bsz), np.array(step))
    return out


def marginal_time(bsz: np.ndarray, step: np.ndarray) -> tuple[float, float, float]:
    """Least-squares ``step = t0 + c * bsz``; returns (c seconds per sample, t0 seconds, R^2)."""
    c, t0 = np.polyfit(bsz, step, 1)
    resid = step - (t0 + c * bsz)
    total = ((step - step.mean()) ** 2).sum()
    r2 = 1.0 - (resid ** 2).sum() / total if total > 0 else 0.0
    return float(c), float(t0), float(r2)


def sia_speed_ratios(root: Path, min_r2: float = 0.8) -> dict[str, Any]:
    """Measured speed of each Sia GPU relative to the reference, per application and overall (median)."""
    raw = read_sia_single_gpu(root)
    fits = {key: marginal_time(*val) for key, val in raw.items()}
    ref_cluster = next(c for c, d in SIA_CLUSTERS.items() if d == REFERENCE_DEVICE)
    per_device: dict[str, dict[str, Any]] = {}
    for cluster, device in SIA_CLUSTERS.items():
        apps = {}
        for (app, cl), (c, t0, r2) in fits.items():
            if cl != cluster or (app, ref_cluster) not in fits:
                continue
            c_ref, _, r2_ref = fits[(app, ref_cluster)]
            usable = c > 0 and c_ref > 0 and r2 >= min_r2 and r2_ref >= min_r2
            apps[app] = {"ms_per_sample": 1e3 * c, "overhead_ms": 1e3 * t0, "r2": r2,
                         "speed_vs_ref": c_ref / c if usable else None, "used": usable,
                         **_whole_step_speed(raw[(app, ref_cluster)], raw[(app, cluster)])}
        speeds = [a["speed_vs_ref"] for a in apps.values() if a["used"]]
        per_device[device] = {"cluster": cluster, "apps": apps,
                              "speed_vs_ref": float(np.median(speeds)) if speeds else None}
    return per_device


def _whole_step_speed(ref: tuple[np.ndarray, np.ndarray], dev: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
    """Measured whole-step speed (reference step time / device step time) at the largest common batch."""
    common = sorted(set(ref[0].tolist()) & set(dev[0].tolist()))
    if not common:
        return {"step_speed_vs_ref": None, "step_speed_bsz": None}
    b = common[-1]
    t_ref = float(ref[1][ref[0] == b][0])
    t_dev = float(dev[1][dev[0] == b][0])
    return {"step_speed_vs_ref": t_ref / t_dev, "step_speed_bsz": int(b)}


# --------------------------------------------------------------------------- the whole calibration
def _scaled(ref: Efficiency, ref_dev: DeviceType, dev: DeviceType, speed: float, source: str) -> Efficiency:
    """Efficiencies that make ``dev`` run the reference's ops ``speed`` times faster."""
    return Efficiency(
        compute=ref.compute * speed * ref_dev.fp32_tflops / dev.fp32_tflops,
        memory=ref.memory * speed * ref_dev.mem_bandwidth_bytes_per_s / dev.mem_bandwidth_bytes_per_s,
        launch_s=ref.launch_s,
        fitted_from=source,
    )


def _geomean_efficiency(effs: list[Efficiency]) -> Efficiency:
    return Efficiency(
        compute=float(np.exp(np.mean([math.log(e.compute) for e in effs]))),
        memory=float(np.exp(np.mean([math.log(e.memory) for e in effs]))),
        launch_s=float(np.median([e.launch_s for e in effs])),
        fitted_from="geomean of fitted GPUs",
    )


def fit_optimizer(rows: Sequence[dict[str, float]], device: DeviceType, optimizer: str, precision: str, *,
                  asynchronous: bool) -> tuple[OptimizerCost, dict[str, Any]]:
    """The :class:`~gpualloc.cost.model.OptimizerCost` that best reproduces ``rows`` (:func:`measure_optimizer`):
    least squares on the relative error, with host and device one after the other and, on an ``asynchronous``
    device (a GPU), also overlapped; the form with the smaller error is kept. Returns it and the fit's record."""
    from scipy.optimize import least_squares

    n = np.array([r["tensors"] for r in rows], dtype=np.float64)
    traffic = physics.optimizer_traffic_bytes(np.array([r["param_bytes"] for r in rows]), OPTIMIZER_STATES[optimizer],
                                              precision)
    t = np.array([r["seconds"] for r in rows], dtype=np.float64)
    bandwidth = float(device.mem_bandwidth_bytes_per_s or 0.0)
    if bandwidth <= 0 or len(rows) < 3 or not np.all(np.isfinite(t) & (t > 0)):
        raise CostModelError(f"optimizer fit on {device.name}: needs the device's bandwidth and three positive "
                             "timings")
    best = None
    for overlap in ((False, True) if asynchronous else (False,)):
        def model(x, overlap=overlap):
            fixed, per_tensor, memory = np.exp(x)
            host, dev = n * per_tensor, traffic / (bandwidth * memory)
            return fixed + (np.maximum(host, dev) if overlap else host + dev)

        res = least_squares(lambda x, m=model: m(x) / t - 1.0, np.log([1e-5, 1e-6, 0.5]))
        rms = float(np.sqrt(np.mean(res.fun ** 2)))
        if best is None or rms < best[0]:
            best = (rms, overlap, np.exp(res.x))
    assert best is not None
    rms, overlap, (fixed, per_tensor, memory) = best
    if not np.all(np.isfinite([rms, fixed, per_tensor, memory])):
        raise CostModelError(f"optimizer fit on {device.name}: {optimizer} in {precision} did not converge")
    cost = OptimizerCost(float(fixed), float(per_tensor), float(memory), bool(overlap), "measured")
    return cost, {"rms_relative_error": rms, "rows": list(rows)}


OPTIMIZER_TIMINGS = "optimizer_steps.json"
"""Package data: optimizer steps timed on synthetic parameter sets per device type (``benchmarks/optimizer_step.py
--record``), fitted into the shipped calibration's ``optimizers`` by :func:`optimizer_costs`."""


def optimizer_costs(catalog: Catalog) -> tuple[dict[str, dict[str, dict[str, OptimizerCost]]], dict[str, Any]]:
    """The shipped calibration's optimizer costs: each device type's timings (:data:`OPTIMIZER_TIMINGS`) fitted
    (:func:`fit_optimizer`); a GPU without timings gets the geometric mean of the timed GPUs' (host work per tensor
    as measured, traffic at the same share of its own peak bandwidth), the CPU the timed CPU's. Returns the costs
    and the record of the fits."""
    from importlib import resources

    data = parse_json(resources.files("gpualloc.cost").joinpath("data", OPTIMIZER_TIMINGS).read_text(),
                      CostModelError, OPTIMIZER_TIMINGS)
    costs: dict[str, dict[str, dict[str, OptimizerCost]]] = {}
    record: dict[str, Any] = {}
    for name, rec in data.items():
        dev = catalog.device(name)
        cuda = rec["device"].startswith("cuda")
        for prec, by_opt in rec["timings"].items():
            for opt, rows in by_opt.items():
                cost, fit = fit_optimizer(rows, dev, opt, prec, asynchronous=cuda)
                costs.setdefault(name, {}).setdefault(prec, {})[opt] = cost
                record.setdefault(name, {"command": rec["command"], "torch": rec["torch"], "host": rec["host"],
                                         "gpu": rec["gpu"]}).setdefault(prec, {})[opt] = fit["rms_relative_error"]
    for key, cpu in (("default", False), ("cpu_default", True)):
        timed = [n for n in data if (catalog.device(n).vendor == "cpu" or n == "cpu") == cpu]
        merged: dict[str, dict[str, OptimizerCost]] = {}
        for prec in sorted({p for n in timed for p in costs[n]}):
            for opt in sorted({o for n in timed for o in costs[n].get(prec, {})}):
                group = [costs[n][prec][opt] for n in timed if opt in costs[n].get(prec, {})]
                geo = {f: float(np.exp(np.mean([np.log(max(getattr(c, f), 1e-12)) for c in group])))
                       for f in ("fixed_s", "per_tensor_s", "memory")}
                merged.setdefault(prec, {})[opt] = OptimizerCost(
                    **geo, overlap=sum(c.overlap for c in group) * 2 >= len(group),
                    fitted_from=f"timed on {', '.join(n for n in timed if opt in costs[n].get(prec, {}))}")
        if merged:
            costs[key] = merged
    return costs, record



def calibrate(data_root: str | Path, catalog: Catalog | None = None) -> Calibration:
    """Fit the efficiencies from ``data_root`` (the ``shared/data`` folder) and record the errors."""
    from gpualloc.graph.importers import import_pipedream

    catalog = catalog or default_catalog()
    root = Path(data_root)
    profiles = sorted((root / "pipedream-profiles").glob("*.txt"))
    profiles = [p for p in profiles if p.name != "LICENSE.txt"]
    if not profiles:
        raise CostModelError(f"{root / 'pipedream-profiles'}: no profiles found")
    ref_dev = catalog.device(REFERENCE_DEVICE)
    graphs = [import_pipedream(p, device=ref_dev.name) for p in profiles]
    flops, nbytes, secs, owner = layer_samples(graphs, ref_dev.name)
    ref_eff = fit_roofline(flops, nbytes, secs, owner, ref_dev)
    pipedream = pipedream_fit_report(graphs, ref_dev, ref_eff)

    sia = sia_speed_ratios(root / "sia" / "traces")
    devices: dict[str, Efficiency] = {ref_dev.name: ref_eff}
    for name, rec in sia.items():
        if name != ref_dev.name and rec["speed_vs_ref"] is not None:
            devices[name] = _scaled(ref_eff, ref_dev, catalog.device(name), rec["speed_vs_ref"], "sia")
    default = _geomean_efficiency(list(devices.values()))

    # How well would the default rule have predicted each measured GPU? (leave one out, on the
    # ResNet-50 profile's layer mix.)
    mix = next(g for g in graphs if g.name == "resnet50")
    f_mix, b_mix, _, _ = layer_samples([mix], ref_dev.name)
    ref_time = roofline_s(f_mix, b_mix, ref_dev, ref_eff).sum()
    loo = {}
    for name in devices:
        if name == ref_dev.name:
            continue
        others = _geomean_efficiency([e for n, e in devices.items() if n != name])
        predicted = ref_time / roofline_s(f_mix, b_mix, catalog.device(name), others).sum()
        measured = sia[name]["speed_vs_ref"]
        loo[name] = {"measured_speed": measured, "predicted_speed": float(predicted),
                     "error": float(predicted / measured - 1.0)}
    for name, rec in sia.items():
        for app in rec["apps"].values():
            app["predicted_speed"] = sia[name]["speed_vs_ref"] if name != ref_dev.name else 1.0
    fit = {
        "reference_device": ref_dev.name,
        "precision": "fp32",
        "sources": {
            "pipedream": "msr-fiddle/pipedream profiler/*/profiles/<model>/graph.txt (MIT)",
            "sia": "siasosp23/artifacts sia-simulator/traces (Apache-2.0, derived from adaptdl)",
        },
        "pipedream": pipedream,
        "sia": sia,
        "leave_one_out": loo,
        "command": "gpualloc cost fit --data ../shared/data -o src/gpualloc/cost/data/calibration.json",
    }
    optimizers, fit["optimizers"] = optimizer_costs(catalog)
    return Calibration(devices=devices, default=default, cpu_default=CPU_DEFAULT, fit=fit, optimizers=optimizers)
