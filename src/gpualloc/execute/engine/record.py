"""Closing the loop: an engine run's measurements, held against the prediction, as a calibration file.

The per-rank program (:mod:`gpualloc.execute.engine.rank`) writes ``rank{r}.json`` on every rank and
``engine.json`` on rank 0 into its ``--out`` folder. :func:`read_run` reads and checks them (a missing or
malformed file is one line naming the file and field); :func:`predict_run` is gpualloc's prediction of the same
plan (:func:`gpualloc.placement.outcome.simulate_plan` with the calibration the run is compared with);
:func:`compare_run` pairs them rank by rank; :func:`fit_run` turns the comparison into a calibration in the
format ``gpualloc calibrate`` writes (``gpualloc-calibration``), so that ``gpualloc place --calibration run.json``
plans with what was measured (the one calibration reader, :meth:`gpualloc.cost.model.Calibration.load`).

The fit: for each device type the run used, the scale ``s`` = measured forward + backward time of its ranks over
the predicted compute time of the same ranks (the simulator's ``busy_s``, the stage's layers at the rank's local
batch and microbatches). Only each stage's slowest replicas count (:func:`critical_ranks`): a replica with a
smaller share waits for the others inside its backward, where DDP's all-reduce blocks. Every op time of the cost
model scales by ``s`` when the type's efficiency does (``compute / s``, ``memory / s``, ``launch_s * s``; the
roofline is ``launch + max(flops / (peak * compute), bytes / (bandwidth * memory))``) and, where the base
calibration holds per-op profiles of the type, when those scale too; both are applied, so the next prediction of
that plan is the measured one, whichever estimate it uses. (A scale below 1 that would lift an efficiency over the
device's ceiling is clamped by the roofline, so the next prediction is then slower than measured.) Peak memory per
device is recorded beside the prediction under ``fit.engine_run.memory`` (the probe's peak is above the process's
baseline, so it is compared with the prediction without its reserve); the difference is the correction to add to
``place --reserve-gib``. The optimizer step is fitted the same way, apart: each type's measured ``optimizer_s``
over the simulator's optimizer step on the same ranks scales the type's optimizer cost for the run's precision and
optimizer (:meth:`gpualloc.cost.model.Calibration.optimizer_cost`: host work and traffic time by ``s``). """

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpualloc.cost.model import Calibration, CostModel, Efficiency, OptimizerCost
from gpualloc.errors import EngineError, parse_json, read_text
from gpualloc.graph.ir import OpGraph
from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.placement.plan import Plan

__all__ = ["EngineRun", "Prediction", "RankComparison", "RankRecord", "compare_run", "critical_ranks", "fit_run",
           "predict_run", "read_run", "run_summary"]

ENGINE_FORMAT = "gpualloc-engine-run"
CRITICAL_SHARE = 0.9
"""A rank predicted to compute less than this share of its stage's slowest replica is left out of the fit."""


@dataclass(frozen=True)
class RankRecord:
    """What one rank measured (its ``rank{r}.json``; times in seconds, memory in bytes)."""

    rank: int
    world_size: int
    device: int
    device_type: str
    torch_device: str
    stage: int
    replica: int
    tp_rank: int
    local_batch: int
    microbatches: int
    step_times_s: tuple[float, ...]
    stage_forward_s: float
    stage_backward_s: float
    optimizer_s: float
    peak_memory_bytes: int | None
    peak_reserved_bytes: int | None
    loss: float | None
    stages: tuple[int, ...] = ()

    @property
    def held(self) -> tuple[int, ...]:
        """Every stage the rank ran (several where an operator plan returns to its device)."""
        return self.stages or (self.stage,)

    @property
    def compute_s(self) -> float:
        """Forward plus backward time of the rank's stage in one step (all its microbatches)."""
        return self.stage_forward_s + self.stage_backward_s


@dataclass(frozen=True)
class EngineRun:
    """An engine run: rank 0's ``engine.json`` and every rank's record, by rank."""

    folder: Path
    engine: Mapping[str, Any]
    ranks: tuple[RankRecord, ...]

    @property
    def step_time_s(self) -> float:
        """The measured step: the median over steps of the slowest rank's step."""
        return float(self.engine["step_time_s"])

    @property
    def checks(self) -> Mapping[str, Any]:
        return self.engine.get("checks") or {}


def _field(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, *, optional: bool = False,
           minimum: float | None = None) -> Any:
    if key not in doc:
        if optional:
            return None
        raise EngineError(f"{where}: {key}: missing")
    value = doc[key]
    if value is None and optional:
        return None
    numeric = kind in (int, float) or kind == (int, float)
    if isinstance(value, bool) and numeric or not isinstance(value, kind):
        want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise EngineError(f"{where}: {key}: expected {want}, got {type(value).__name__}")
    if numeric and (not math.isfinite(value) or (minimum is not None and value < minimum)):
        raise EngineError(f"{where}: {key}: expected a finite number >= {minimum}, got {value!r}")
    return value


def _rank_record(path: Path) -> RankRecord:
    where = str(path)
    doc = parse_json(read_text(path, EngineError), EngineError, where)
    if not isinstance(doc, Mapping):
        raise EngineError(f"{where}: expected a JSON object (a rank record of the engine)")
    num = (int, float)
    times = _field(doc, "step_times_s", list, where)
    if not times or any(isinstance(t, bool) or not isinstance(t, num) or not math.isfinite(t) or t < 0
                        for t in times):
        raise EngineError(f"{where}: step_times_s: expected a non-empty list of finite times >= 0")
    ints = {k: _field(doc, k, int, where, minimum=0) for k in ("rank", "world_size", "device", "stage", "replica",
                                                                "tp_rank", "local_batch", "microbatches")}
    return RankRecord(
        **ints, device_type=_field(doc, "device_type", str, where),
        torch_device=_field(doc, "torch_device", str, where),
        step_times_s=tuple(float(t) for t in times),
        stage_forward_s=float(_field(doc, "stage_forward_s", num, where, minimum=0)),
        stage_backward_s=float(_field(doc, "stage_backward_s", num, where, minimum=0)),
        optimizer_s=float(_field(doc, "optimizer_s", num, where, minimum=0)),
        peak_memory_bytes=_field(doc, "peak_memory_bytes", int, where, optional=True, minimum=0),
        peak_reserved_bytes=_field(doc, "peak_reserved_bytes", int, where, optional=True, minimum=0),
        loss=_field(doc, "loss", num, where, optional=True),
        stages=tuple(_stages(doc, where)))


def _stages(doc: Mapping[str, Any], where: str) -> list[int]:
    """The optional ``stages`` list (records from before it default to the one ``stage``)."""
    held = _field(doc, "stages", list, where, optional=True) or []
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in held):
        raise EngineError(f"{where}: stages: expected a list of stage indices >= 0, got {held!r}")
    return held


def read_run(folder: str | Path) -> EngineRun:
    """Read an engine run's ``engine.json`` and the rank records it lists; errors name the file and field."""
    folder = Path(folder)
    where = str(folder / "engine.json")
    engine = parse_json(read_text(folder / "engine.json", EngineError), EngineError, where)
    if not isinstance(engine, Mapping):
        raise EngineError(f"{where}: expected a JSON object (the engine's run record)")
    if engine.get("format") != ENGINE_FORMAT:
        raise EngineError(f"{where}: format: expected {ENGINE_FORMAT!r}, got {engine.get('format')!r}")
    world = _field(engine, "world_size", int, where, minimum=1)
    _field(engine, "step_time_s", (int, float), where, minimum=0)
    names = _field(engine, "ranks", list, where)
    if len(names) != world or not all(isinstance(n, str) and "/" not in n and n not in ("", ".", "..")
                                      for n in names):
        raise EngineError(f"{where}: ranks: expected {world} rank file names (world_size), got {names!r}")
    ranks = sorted((_rank_record(folder / n) for n in names), key=lambda r: r.rank)
    if [r.rank for r in ranks] != list(range(world)):
        raise EngineError(f"{where}: ranks: the rank files hold ranks {[r.rank for r in ranks]}, expected "
                          f"0..{world - 1}")
    if len({r.device for r in ranks}) != world:
        raise EngineError(f"{where}: ranks: two ranks name the same plan device")
    return EngineRun(folder, engine, tuple(ranks))


@dataclass(frozen=True)
class Prediction:
    """gpualloc's prediction of a plan: the simulated step, per device compute and peak memory.

    Attributes:
        step_time_s: the simulated step.
        busy_s: compute time of every cluster device in the step.
        peak_mem_bytes: every device's predicted peak, its reserve included.
        reserve_bytes: the framework reserve inside each device's predicted peak.
        how: ``"profiled ops"`` or ``"roofline"`` (how op times were estimated).
        optimizer_s: every cluster device's optimizer step (the simulated step's ``O`` events on it).
    """

    step_time_s: float
    busy_s: tuple[float, ...]
    peak_mem_bytes: tuple[float, ...]
    reserve_bytes: tuple[float, ...]
    how: str
    optimizer_s: tuple[float, ...] = ()


def predict_run(plan: Plan, graph: OpGraph, cluster: ClusterSpec, calibration: Calibration | None, *,
                optimizer: str = "sgd", use_profiles: bool = True) -> Prediction:
    """``plan`` simulated (:func:`~gpualloc.placement.outcome.simulate_plan`) with ``calibration``, in fp32 with
    ``optimizer``, as the engine trains it; ``graph`` is the model at the plan's global batch. With
    ``use_profiles``, per-op profiles of the model in the calibration for every device type used give the op
    times (as ``gpualloc run`` and ``place --calibration`` predict)."""
    from gpualloc.cost.memory import MemoryRules
    from gpualloc.placement.outcome import plan_events, simulate_plan
    from gpualloc.placement.problem import PlacementProblem

    cal = calibration if calibration is not None else Calibration.load()
    profiled = None
    if use_profiles:
        from gpualloc.cost.microbench import apply_profiles  # imports torch

        profiled = apply_profiles(graph, cal, [cluster.devices[d].type.name for d in plan.devices],
                                  plan.precision)
    problem = PlacementProblem(profiled or graph, cluster, CostModel(cal), microbatches=plan.microbatches,
                               rules=MemoryRules(precision=plan.precision, optimizer=optimizer))
    sim = simulate_plan(problem, plan)
    memory = tuple(getattr(sim, "memory", ()) or ())
    reserve = tuple(float(m.reserve) for m in memory) if len(memory) == len(cluster) else (0.0,) * len(cluster)
    opt = [0.0] * len(cluster)
    for ev in plan_events(problem, plan):  # the optimizer steps: "O step" (op-level), "O s<stage>" (hybrid)
        if ev.task.startswith("O ") and ev.resource.startswith("dev:"):
            opt[int(ev.resource[4:])] += ev.end_s - ev.start_s
    return Prediction(float(sim.step_time_s), tuple(float(x) for x in sim.busy_s),
                      tuple(float(x) for x in sim.peak_mem_bytes), reserve,
                      "profiled ops" if profiled is not None else "roofline", tuple(opt))


@dataclass(frozen=True)
class RankComparison:
    """One rank measured against its prediction (seconds, bytes; ``None`` where nothing was measured)."""

    rank: int
    device: int
    label: str
    device_type: str
    torch_device: str
    stage: int
    replica: int
    local_batch: int
    measured_step_s: float
    measured_compute_s: float
    predicted_compute_s: float
    measured_peak_bytes: int | None
    predicted_peak_bytes: float
    predicted_reserve_bytes: float
    measured_reserve_bytes: int | None
    stages: tuple[int, ...] = ()
    measured_optimizer_s: float = 0.0
    predicted_optimizer_s: float = 0.0

    @property
    def compute_error(self) -> float | None:
        """Predicted over measured compute, minus one."""
        return self.predicted_compute_s / self.measured_compute_s - 1.0 if self.measured_compute_s > 0 else None

    @property
    def predicted_tensor_bytes(self) -> float:
        """The predicted peak without the framework's reserve: what the memory probe measures."""
        return self.predicted_peak_bytes - self.predicted_reserve_bytes

    @property
    def memory_error(self) -> float | None:
        m = self.measured_peak_bytes
        return self.predicted_tensor_bytes / m - 1.0 if m else None


def compare_run(run: EngineRun, prediction: Prediction, cluster: ClusterSpec) -> tuple[RankComparison, ...]:
    """Every rank's measured step, compute and peak memory beside the prediction for its plan device."""
    out = []
    for r in run.ranks:
        if not 0 <= r.device < len(cluster):
            raise EngineError(f"{run.folder / f'rank{r.rank}.json'}: device: {r.device} is not a device of cluster "
                              f"{cluster.name} ({len(cluster)} devices)")
        dev = cluster.devices[r.device]
        if dev.type.name != r.device_type:
            raise EngineError(f"{run.folder / f'rank{r.rank}.json'}: device_type: {r.device_type!r}, but plan device "
                              f"{r.device} ({dev.label}) is a {dev.type.name}")
        out.append(RankComparison(
            rank=r.rank, device=r.device, label=dev.label, device_type=r.device_type, torch_device=r.torch_device,
            stage=r.stage, stages=r.held, replica=r.replica, local_batch=r.local_batch,
            measured_step_s=float(statistics.median(r.step_times_s)), measured_compute_s=r.compute_s,
            predicted_compute_s=prediction.busy_s[r.device], measured_peak_bytes=r.peak_memory_bytes,
            predicted_peak_bytes=prediction.peak_mem_bytes[r.device],
            predicted_reserve_bytes=prediction.reserve_bytes[r.device], measured_reserve_bytes=r.peak_reserved_bytes,
            measured_optimizer_s=r.optimizer_s,
            predicted_optimizer_s=prediction.optimizer_s[r.device] if prediction.optimizer_s else 0.0))
    return tuple(out)


def _scaled(eff: Efficiency, scale: float, note: str) -> Efficiency:
    return Efficiency(compute=eff.compute / scale, memory=eff.memory / scale, launch_s=eff.launch_s * scale,
                      fitted_from=note)


def _scaled_profiles(record: Mapping[str, Any], scale: float) -> dict[str, Any]:
    profiles = record.get("profiles") or {}
    return {name: {**prof, "ops": {op: [float(t) * scale for t in times] for op, times in prof["ops"].items()}}
            for name, prof in profiles.items()}


def fit_run(run: EngineRun, rows: Sequence[RankComparison], prediction: Prediction, base: Calibration | None,
            cluster: ClusterSpec, *, source: str = "") -> Calibration:
    """``base`` (default: the shipped calibration) with each device type the run used scaled to what the run
    measured, and the run's record under ``fit.engine_run`` (see the module doc).

    Raises:
        EngineError: a device type whose ranks measured no compute time, or had none predicted.
    """
    base = base if base is not None else Calibration.load()
    fit = dict(base.fit)
    measured = dict(fit.get("measured", {}) if isinstance(fit.get("measured"), Mapping) else {})
    devices = dict(base.devices)
    optimizers = {d: {p: dict(o) for p, o in by.items()} for d, by in base.optimizers.items()}
    scales: dict[str, float] = {}
    opt_scales: dict[str, float] = {}
    model = str(run.engine.get("model", "?"))
    critical = critical_ranks(rows)
    for name in dict.fromkeys(r.device_type for r in rows):
        mine = [r for r in rows if r.device_type == name and r.rank in critical]
        if not mine:  # every rank of the type waits on another type's: fit on all of them
            mine = [r for r in rows if r.device_type == name]
        meas = sum(r.measured_compute_s for r in mine)
        pred = sum(r.predicted_compute_s for r in mine)
        if not meas > 0 or not pred > 0:
            raise EngineError(f"{run.folder}: device type {name}: its ranks measured {meas:g} s of forward and "
                              f"backward, {pred:g} s predicted: nothing to fit an efficiency on")
        scale = scales[name] = meas / pred
        old = base.efficiency(cluster.catalog.device(name))
        devices[name] = _scaled(old, scale, f"engine run of {model} ({len(mine)} rank(s)): {1 / scale:.3g} x "
                                            f"{old.fitted_from}")
        rec = dict(measured.get(name) or {})
        if rec.get("profiles"):
            rec["profiles"] = _scaled_profiles(rec, scale)
        cpu = [r for r in mine if r.torch_device == "cpu"]
        rec.update({
            "efficiency": dataclasses.asdict(devices[name]),
            "torch_device": mine[0].torch_device,
            **({"concurrent": sum(1 for r in rows if r.torch_device == "cpu")} if cpu else {}),
            "engine": {"model": model, "ranks_fitted": [r.rank for r in mine], "scale": scale,
                       "measured_compute_s": meas, "predicted_compute_s": pred,
                       "before": dataclasses.asdict(old)},
        })
        opt_scale = _fit_optimizer(run, [r for r in rows if r.device_type == name], base,
                                   cluster.catalog.device(name), optimizers, model)
        if opt_scale is not None:
            rec["engine"]["optimizer_scale"] = opt_scales[name] = opt_scale
        measured[name] = rec
    fit["measured"] = measured
    fit["engine_run"] = run_summary(run, rows, prediction, scales=scales, optimizer_scales=opt_scales, source=source)
    return dataclasses.replace(base, devices=devices, fit=fit, optimizers=optimizers)  # its precisions kept


def _fit_optimizer(run: EngineRun, rows: Sequence[RankComparison], base: Calibration, device: Any,
                   optimizers: dict[str, dict[str, dict[str, OptimizerCost]]], model: str) -> float | None:
    """Scale ``device``'s optimizer cost in ``optimizers`` (in place) by the measured over the predicted optimizer
    step of its ranks ``rows``, for the run's precision and optimizer; the scale, or None with nothing to fit on."""
    meas = sum(r.measured_optimizer_s for r in rows if r.predicted_optimizer_s > 0)
    pred = sum(r.predicted_optimizer_s for r in rows if r.predicted_optimizer_s > 0)
    if not meas > 0 or not pred > 0:
        return None
    scale = meas / pred
    precision = str(run.engine.get("precision", "fp32"))
    optimizer = str(run.engine.get("optimizer", "adam"))
    old = base.optimizer_cost(device, precision, optimizer)
    optimizers.setdefault(device.name, {}).setdefault(precision, {})[optimizer] = dataclasses.replace(
        old, fixed_s=old.fixed_s * scale, per_tensor_s=old.per_tensor_s * scale, memory=old.memory / scale,
        fitted_from=f"engine run of {model}: {1 / scale:.3g} x {old.fitted_from}")
    return scale


def critical_ranks(rows: Sequence[RankComparison]) -> frozenset[int]:
    """The ranks of each stage predicted to compute at least ``CRITICAL_SHARE`` of the stage's slowest replica.

    A replica with less work finishes its backward first and then waits inside it for DDP's gradient
    all-reduce, so its measured backward holds the other replicas' extra work; only the stage's slowest
    replicas measure their own compute (within ``1 - CRITICAL_SHARE``)."""
    most: dict[int, float] = {}
    for r in rows:
        most[r.stage] = max(most.get(r.stage, 0.0), r.predicted_compute_s)
    return frozenset(r.rank for r in rows if r.predicted_compute_s >= most[r.stage] * CRITICAL_SHARE)


def median_or_none(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def run_summary(run: EngineRun, rows: Sequence[RankComparison], prediction: Prediction, *,
                scales: Mapping[str, float] | None = None, optimizer_scales: Mapping[str, float] | None = None,
                source: str = "") -> dict[str, Any]:
    """The run against its prediction as JSON: the step, each rank's compute, optimizer step and memory, the
    checks, and (given ``scales``, ``optimizer_scales``) each device type's fitted scales and memory correction."""
    e = run.engine
    measured = run.step_time_s
    corrections: dict[str, float | None] = {}
    for name in dict.fromkeys(r.device_type for r in rows):
        diffs = [r.measured_peak_bytes - r.predicted_tensor_bytes for r in rows
                 if r.device_type == name and r.measured_peak_bytes is not None]
        corrections[name] = median_or_none(diffs)
    out: dict[str, Any] = {
        "format": ENGINE_FORMAT, "folder": str(run.folder), "source": source or None,
        "plan": e.get("plan"), "model": e.get("model"), "world_size": len(run.ranks), "backend": e.get("backend"),
        "schedule": e.get("schedule"), "steps": e.get("steps"), "warmup": e.get("warmup"),
        "measured_step_s": measured, "predicted_step_s": prediction.step_time_s,
        "step_error": prediction.step_time_s / measured - 1.0 if measured > 0 else None,
        "prediction": prediction.how, "checks": dict(run.checks),
        "ranks": [{"rank": r.rank, "device": r.label, "device_type": r.device_type, "torch_device": r.torch_device,
                   "stage": r.stage, "stages": list(r.stages or (r.stage,)), "replica": r.replica,
                   "local_batch": r.local_batch, "measured_step_s": r.measured_step_s,
                   "measured_compute_s": r.measured_compute_s,
                   "predicted_compute_s": r.predicted_compute_s, "compute_error": r.compute_error,
                   "measured_optimizer_s": r.measured_optimizer_s, "predicted_optimizer_s": r.predicted_optimizer_s,
                   "measured_peak_bytes": r.measured_peak_bytes, "predicted_peak_bytes": r.predicted_tensor_bytes,
                   "predicted_reserve_bytes": r.predicted_reserve_bytes,
                   "measured_reserve_bytes": r.measured_reserve_bytes, "memory_error": r.memory_error}
                  for r in rows],
        "memory": {"compared": "measured peak above the process baseline vs the predicted peak without its reserve",
                   "correction_bytes": corrections},
    }
    if scales is not None:
        out["scale"] = dict(scales)
    if optimizer_scales:
        out["optimizer_scale"] = dict(optimizer_scales)
    return out
