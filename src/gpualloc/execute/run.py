"""Apply a placement plan to a real model, check it, train it, and compare the step with the simulator.

:func:`execute_plan` is what ``gpualloc run`` does:

1. build the model with seeded weights and export it twice at the microbatch size (training trace to
   train, eval trace to check), cut both by the plan (:func:`gpualloc.execute.split.split_model`);
2. start one worker per used device (:class:`gpualloc.execute.pipeline.Pipeline`), CPU threads split
   between the CPU workers;
3. run the eval stages forward over every microbatch and compare the output with the unsplit model's
   (``output_match``);
4. run ``warmup`` + ``steps`` training steps; the measured step time is the median of the timed ones;
   then one more, untimed, in which every worker measures its memory
   (:class:`~gpualloc.execute.measure.MemoryProbe`);
5. simulate the same plan (:func:`gpualloc.placement.simulate.simulate_step`) with the cost model of the
   given calibration, using its per-op profiles of this model where it has them
   (:func:`gpualloc.cost.microbench.apply_profiles`), else the calibrated roofline; ``error`` is
   ``predicted / measured - 1``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from gpualloc.cost.memory import MemoryRules
from gpualloc.cost.microbench import apply_profiles
from gpualloc.cost.model import Calibration, CostModel
from gpualloc.errors import ExecutionError
from gpualloc.execute.measure import MemoryReport, summarize
from gpualloc.execute.pipeline import Pipeline
from gpualloc.execute.split import split_model
from gpualloc.execute.worker import OPTIMIZERS, threads_per_worker
from gpualloc.graph.ir import OpGraph
from gpualloc.graph.runnable import build_model, export_runnable
from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.simulate import StepResult, inflight_limits, simulate_step

__all__ = ["DeviceRun", "ExecuteOptions", "ExecutionResult", "checked_options", "execute_plan", "predict",
           "torch_devices_for", "worker_threads"]

Progress = Callable[[str, int, int], None]

OUTPUT_ATOL = 1e-4
OUTPUT_RTOL = 1e-3
"""Outputs match when ``max |split - unsplit| <= OUTPUT_ATOL + OUTPUT_RTOL * max |unsplit|``: FP32 sums
taken in another order (another microbatch size, thread count or device) differ in the last bits."""


@dataclass(frozen=True)
class DeviceRun:
    """One cluster device that ran stages: what the simulator predicted and what was measured.

    Attributes:
        index: cluster device index.
        label: cluster device label (``n0.cpu.1``).
        torch_device: ``cpu`` or ``cuda:i``.
        threads: torch threads of its worker.
        stages: stages it ran.
        predicted_busy_s: simulated compute time in one step.
        measured_busy_s: measured forward + backward time of its stages (median over steps).
        measured_wait_s: time its worker waited for others (median).
        measured_optimizer_s: its optimizer update (median).
        predicted_peak_bytes: the simulator's peak memory of the device (None where it has none).
        memory: measured and counted memory of its worker in one training step (None when not measured).
    """

    index: int
    label: str
    torch_device: str
    threads: int
    stages: int
    predicted_busy_s: float
    measured_busy_s: float
    measured_wait_s: float
    measured_optimizer_s: float
    predicted_peak_bytes: float | None = None
    memory: MemoryReport | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["memory"] = self.memory.to_dict() if self.memory is not None else None
        return out


@dataclass(frozen=True)
class ExecutionResult:
    """A plan run on real devices, beside the simulator's prediction for it.

    Attributes:
        model: the model run.
        graph: the captured graph's name.
        batch_size: samples per step.
        microbatches: microbatches per step.
        schedule: pipeline schedule.
        cluster: the cluster the plan is for.
        measured_step_s: median measured training step (forward, backward, optimizer).
        step_times_s: every timed step.
        predicted_step_s: the simulator's step time for the plan.
        error: ``predicted / measured - 1``.
        output_match: the split model's output equals the unsplit model's (within the tolerance).
        max_abs_diff: largest absolute output difference.
        output_tolerance: the tolerance ``output_match`` used.
        prediction: ``"profiled ops"`` (measured per-op times from the calibration) or ``"roofline"``.
        calibration: where the calibration came from.
        stages: stages the model was cut into.
        devices: per used device, predicted and measured.
        warmup: untimed steps run first.
        warnings: anything that makes the comparison less meaningful (e.g. thread counts that differ
            from the calibration's).
        optimizer: the optimizer trained with.
    """

    model: str
    graph: str
    batch_size: int
    microbatches: int
    schedule: str
    cluster: str
    measured_step_s: float
    step_times_s: tuple[float, ...]
    predicted_step_s: float
    error: float
    output_match: bool
    max_abs_diff: float
    output_tolerance: float
    prediction: str
    calibration: str
    stages: int
    devices: tuple[DeviceRun, ...]
    warmup: int
    warnings: tuple[str, ...] = ()
    optimizer: str = "sgd"

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["step_times_s"] = list(self.step_times_s)
        out["devices"] = [d.to_dict() for d in self.devices]
        out["warnings"] = list(self.warnings)
        out["steps"] = len(self.step_times_s)
        return out


def torch_devices_for(cluster: ClusterSpec, devices: Sequence[str] | None = None) -> dict[int, str]:
    """Torch device of each cluster device: ``devices`` when given (one per cluster device), else
    ``cpu`` for CPU types and ``cuda:0``, ``cuda:1``, ... for the others in cluster order."""
    if devices is not None:
        if len(devices) != len(cluster):
            raise ExecutionError(f"{len(devices)} torch devices given for a cluster of {len(cluster)} devices")
        out = {i: str(torch.device(d)) for i, d in enumerate(devices)}
    else:
        out, gpu = {}, 0
        for dev in cluster.devices:
            if dev.type.vendor == "cpu" or dev.type.name == "cpu":
                out[dev.index] = "cpu"
            else:
                out[dev.index] = f"cuda:{gpu}"
                gpu += 1
    for i, name in out.items():
        d = torch.device(name)
        if d.type == "cuda" and (not torch.cuda.is_available() or (d.index or 0) >= torch.cuda.device_count()):
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise ExecutionError(f"device {cluster.devices[i].label} needs {name}, but this machine has {have} "
                                 "CUDA device(s): pass torch devices explicitly (--devices cpu,cpu,...)")
        if d.type not in ("cpu", "cuda"):
            raise ExecutionError(f"unsupported torch device {name!r}: use cpu or cuda:i")
    return out


def worker_threads(torch_devices: Mapping[int, str], threads: int | None = None) -> dict[int, int]:
    """Torch threads of each worker (cluster device index -> torch device): ``threads`` (default: the
    CPUs this process may use) split as :func:`gpualloc.execute.worker.threads_per_worker` does."""
    total = threads or len(os.sched_getaffinity(0))
    return dict(zip(torch_devices, threads_per_worker(list(torch_devices.values()), total), strict=True))


def _max_abs(out: Sequence[Any], ref: Sequence[Any]) -> tuple[float, float]:
    if len(out) != len(ref):
        raise ExecutionError(f"the split model returns {len(out)} outputs, the model {len(ref)}")
    diff, scale = 0.0, 0.0
    for a, b in zip(out, ref, strict=True):
        if a.shape != b.shape:
            return float("inf"), 0.0
        diff = max(diff, float((a.double() - b.double()).abs().max()) if a.numel() else 0.0)
        scale = max(scale, float(b.double().abs().max()) if b.numel() else 0.0)
    return diff, scale


@dataclass(frozen=True)
class ExecuteOptions:
    """How :func:`execute_plan` runs a plan (everything but the model, graph, plan and cluster)."""

    microbatches: int = 1
    """Microbatches per step (must divide the batch)."""
    calibration: Calibration | None = None
    """Cost model calibration (default: the shipped one)."""
    calibration_name: str = "shipped"
    """Where the calibration came from, for the report."""
    steps: int = 5
    """Timed training steps (the median is reported)."""
    warmup: int = 1
    """Untimed training steps first."""
    schedule: str = "1f1b"
    """``"1f1b"`` or ``"gpipe"``, for both the run and the simulation."""
    torch_devices: Sequence[str] | None = None
    """Torch device per cluster device (default: see :func:`torch_devices_for`)."""
    threads: int | None = None
    """CPU threads to split between workers (default: the CPUs this process may use)."""
    use_profiles: bool = True
    """Predict from the calibration's per-op profiles of this model when it has them."""
    seed: int = 0
    """Weights and inputs."""
    lr: float = 1e-4
    """Learning rate."""
    timeout_s: float = 600.0
    """Longest wait for any worker."""
    optimizer: str = "sgd"
    """The workers' optimizer: ``"sgd"`` or ``"adam"`` (:data:`gpualloc.execute.worker.OPTIMIZERS`)."""
    measure_memory: bool = True
    """Run one more, untimed, step in which every worker measures its memory."""


def checked_options(options: ExecuteOptions | None, overrides: Mapping[str, Any], where: str) -> ExecuteOptions:
    """``options`` (default: the defaults) with ``overrides``, checked; errors name ``where`` and the field."""
    try:
        o = replace(options or ExecuteOptions(), **overrides)
    except TypeError as err:
        raise ExecutionError(f"{where}: {err}") from err
    if o.steps < 1 or o.warmup < 0:
        raise ExecutionError(f"need steps >= 1 and warmup >= 0, got steps={o.steps}, warmup={o.warmup}")
    if o.optimizer not in OPTIMIZERS:
        raise ExecutionError(f"optimizer: expected one of {', '.join(OPTIMIZERS)}, got {o.optimizer!r}")
    return o


def execute_plan(model: str, graph: OpGraph, assignment: np.ndarray, cluster: ClusterSpec,
                 options: ExecuteOptions | None = None, *, progress: Progress | None = None,
                 **overrides: Any) -> ExecutionResult:
    """Run ``graph``'s plan ``assignment`` for ``model`` on real devices and predict it.

    Args:
        model: zoo name or ``package.module:factory`` (the model ``graph`` was captured from).
        graph: the captured graph the plan is for (its batch is the step's batch).
        assignment: device index per node of ``graph``.
        cluster: the cluster the plan is for.
        options: how to run it (:class:`ExecuteOptions`); default its defaults.
        progress: called ``(phase, done, total)`` as the run advances.
        **overrides: fields of :class:`ExecuteOptions` replacing those of ``options``.

    Raises:
        ExecutionError: a device is missing, the model will not split, or a worker fails.
    """
    o = checked_options(options, overrides, "execute_plan")
    microbatches, schedule = o.microbatches, o.schedule
    batch = graph.batch_size
    if not batch or batch % microbatches:
        raise ExecutionError(f"{microbatches} microbatches do not divide the batch of {batch}")
    a = np.asarray(assignment, dtype=np.int64)
    if a.shape != (len(graph),) or (a.size and (a.min() < 0 or a.max() >= len(cluster))):
        raise ExecutionError(f"the assignment does not fit graph {graph.name!r} on {len(cluster)} devices")
    note = progress or (lambda _p, _d, _t: None)
    cal = o.calibration if o.calibration is not None else Calibration.load()

    note("building and splitting the model", 0, 1)
    module, args = build_model(model, batch, seed=o.seed)
    mb_args = tuple(x[: batch // microbatches] for x in args)
    programs = {
        "train": split_model(export_runnable(module, mb_args, training=True, name=model).module, graph, a),
        "check": split_model(export_runnable(module, mb_args, training=False, name=model).module, graph, a),
    }
    used = list(programs["train"].devices)
    placed = torch_devices_for(cluster, o.torch_devices)
    per_worker = worker_threads({d: placed[d] for d in used}, o.threads)

    with torch.no_grad():
        ref = module.eval()(*args)
    ref_flat = tuple(t for t in _leaves(ref) if isinstance(t, torch.Tensor))

    step_times: list[float] = []
    worker_samples: dict[int, list[tuple[float, float, float]]] = {d: [] for d in used}
    limits = inflight_limits(graph, a, len(cluster), microbatches)
    with Pipeline(programs, {d: placed[d] for d in used}, per_worker, args, microbatches=microbatches,
                  inflight_limits={d: int(limits[d]) for d in used},
                  schedule=schedule, lr=o.lr, timeout_s=o.timeout_s, optimizer=o.optimizer) as pipe:
        note("checking the output", 0, 1)
        out = pipe.forward("check")
        diff, scale = _max_abs(out, ref_flat)
        tolerance = OUTPUT_ATOL + OUTPUT_RTOL * scale
        for i in range(o.warmup + o.steps):
            note("training", i, o.warmup + o.steps)
            timing = pipe.train_step("train")
            if i >= o.warmup:
                step_times.append(timing.step_s)
                for w in timing.workers:
                    worker_samples[w.device].append((w.busy_s, w.wait_s, w.optimizer_s))
        memory = {}
        if o.measure_memory:
            note("training: one more step, measuring memory", o.warmup + o.steps, o.warmup + o.steps + 1)
            memory = {w.device: w.memory for w in pipe.train_step("train", memory=True).workers}
        note("training", o.warmup + o.steps, o.warmup + o.steps)

    sim, how = predict(graph, a, cluster, cal, microbatches=microbatches, schedule=schedule,
                       use_profiles=o.use_profiles, optimizer=o.optimizer)
    measured = summarize(step_times).median_s

    warnings = _calibration_warnings(cal, cluster, used, placed, per_worker)
    devices = []
    for d in used:
        samples = worker_samples[d]
        devices.append(DeviceRun(
            index=d, label=cluster.devices[d].label, torch_device=placed[d], threads=per_worker[d],
            stages=sum(1 for s in programs["train"].stages if s.device == d),
            predicted_busy_s=float(sim.busy_s[d]),
            measured_busy_s=summarize([s[0] for s in samples]).median_s,
            measured_wait_s=summarize([s[1] for s in samples]).median_s,
            measured_optimizer_s=summarize([s[2] for s in samples]).median_s,
            predicted_peak_bytes=None if sim.peak_mem_bytes[d] is None else float(sim.peak_mem_bytes[d]),
            memory=memory.get(d),
        ))
    return ExecutionResult(
        model=model, graph=graph.name, batch_size=int(batch), microbatches=microbatches, schedule=schedule,
        cluster=cluster.name, measured_step_s=measured, step_times_s=tuple(step_times),
        predicted_step_s=sim.step_time_s, error=sim.step_time_s / measured - 1.0 if measured > 0 else float("inf"),
        output_match=bool(diff <= tolerance), max_abs_diff=diff, output_tolerance=tolerance,
        prediction=how, calibration=o.calibration_name,
        stages=len(programs["train"].stages), devices=tuple(devices), warmup=o.warmup, warnings=tuple(warnings),
        optimizer=o.optimizer,
    )


def predict(graph: OpGraph, assignment: np.ndarray, cluster: ClusterSpec, calibration: Calibration, *,
            microbatches: int = 1, schedule: str = "1f1b", use_profiles: bool = True,
            optimizer: str = "sgd") -> tuple[StepResult, str]:
    """The simulator's step for a plan trained with ``optimizer``, and how op times were estimated
    (``"profiled ops"`` when the calibration has per-op profiles of this model for every device type used,
    else ``"roofline"``)."""
    a = np.asarray(assignment, dtype=np.int64)
    types = [cluster.devices[d].type.name for d in np.unique(a)]
    profiled = apply_profiles(graph, calibration, types) if use_profiles else None
    problem = PlacementProblem(profiled or graph, cluster, CostModel(calibration), microbatches=microbatches,
                               rules=MemoryRules(precision="fp32", optimizer=optimizer))
    return simulate_step(problem, a, schedule=schedule), "profiled ops" if profiled is not None else "roofline"


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _leaves(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    return [value]


def _calibration_warnings(cal: Calibration, cluster: ClusterSpec, used: Sequence[int], placed: Mapping[int, str],
                          threads: Mapping[int, int]) -> list[str]:
    measured = cal.fit.get("measured", {}) if isinstance(cal.fit, dict) else {}
    out = []
    for name in dict.fromkeys(cluster.devices[d].type.name for d in used):
        rec = measured.get(name)
        if rec is None:
            out.append(f"device type {name} is not calibrated on this machine (run `gpualloc calibrate`): "
                       f"its efficiency is {cal.efficiency(cluster.catalog.device(name)).fitted_from!r}")
            continue
        cpu_threads = {threads[d] for d in used if cluster.devices[d].type.name == name and placed[d] == "cpu"}
        if cpu_threads and rec.get("threads") not in cpu_threads:
            out.append(f"{name} was calibrated with {rec.get('threads')} thread(s), its workers run with "
                       f"{', '.join(map(str, sorted(cpu_threads)))}")
        cpu_workers = sum(1 for d in used if placed[d] == "cpu")
        if cpu_threads and rec.get("concurrent", 1) != cpu_workers:
            out.append(f"{name} was calibrated with {rec.get('concurrent', 1)} concurrent worker(s), the plan runs "
                       f"{cpu_workers} CPU workers (gpualloc calibrate --concurrent {cpu_workers})")
    return out
