"""Calibrate the cost model on the machine at hand: microbenchmarks and per-op timings of real graphs.

:func:`calibrate_device` measures one torch device (``cpu`` with a given number of threads, or
``cuda:i``) and fits the :class:`~gpualloc.cost.model.Efficiency` the roofline needs for its catalog
device type:

1. **Microbenchmarks**: square FP32 (and BF16/FP16) matmuls at several sizes (achieved FLOP/s), a large
   on-device copy (achieved bandwidth, read + write), host<->device copies of pinned memory on a GPU,
   and the time of a trivial op (the per-op overhead). They set the scale of the fit and are kept in
   the calibration file's record.
2. **Per-op timings of captured graphs**: each model is captured (:func:`gpualloc.graph.capture.capture`)
   and exported in training mode with real weights; an ``fx.Interpreter`` runs it op by op, timing
   each forward op (CUDA events on a GPU, ``perf_counter`` on the CPU) and hooking each op's output
   gradient: the autograd engine runs one op's backward between its hook and the next hook, so the
   gaps between hook timestamps are per-op backward times. An op of the training trace that the
   captured graph folds away (active dropout, ``num_batches_tracked`` increments) is booked to the
   node that owns it (:func:`gpualloc.graph.runnable.owners`). Medians over ``repeats`` passes are
   scaled to whole forward and backward passes timed as the module runs them. These per-op times are
   kept as *profiles* in the calibration file: a later prediction for the same model uses them
   directly (:func:`apply_profiles`).
3. **Fit**: a grid search for (compute, memory, launch) that best predicts the measured time of
   contiguous runs of ops (each model cut into ``chunks`` runs of equal measured time), forward and
   backward together, in squared log error. Contiguous runs are what a pipeline stage is made of, so
   the fit is judged on what placement needs: whole stages, not single ops.

The resulting efficiencies are relative to the catalog peaks of the device type (the ``cpu`` type is a
32-core Xeon: a thread or two of another CPU gets a small ``compute``), which is what the cost model
multiplies. Efficiencies depend on the thread count; the record keeps it, and ``gpualloc run`` warns
when a CPU worker runs with another one.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpualloc.cost.memory import PROFILE_VALUE_BYTES
from gpualloc.cost.memory import precision as get_precision
from gpualloc.cost.calibrate import fit_optimizer
from gpualloc.cost.model import BWD_FACTOR, Calibration, Efficiency, OptimizerCost, roofline_s
from gpualloc.errors import CostModelError
from gpualloc.graph.ir import OpGraph
from gpualloc.hardware.catalog import TERA, Catalog, DeviceType, default_catalog
from gpualloc.seeding import seeded

__all__ = [
    "CopyPoint",
    "DeviceMeasurement",
    "GraphTiming",
    "MatmulPoint",
    "cached_cpu_calibration",
    "calibrate_device",
    "catalog_type_for",
    "catalog_type_named",
    "set_tf32",
    "fit_efficiency",
    "fit_launch",
    "host_cpu_model",
    "measure_device",
    "merge_calibration",
    "record_profiles",
    "quick_cache_name",
    "time_graph",
]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class MatmulPoint:
    """One square matmul ``n x n @ n x n``: median time and achieved TFLOP/s."""

    n: int
    dtype: str
    seconds: float
    tflops: float


@dataclass(frozen=True)
class CopyPoint:
    """One copy: ``"device"`` (on-device, read + write counted), ``"h2d"`` or ``"d2h"`` (pinned host)."""

    kind: str
    nbytes: int
    seconds: float
    bandwidth_bytes_per_s: float


@dataclass(frozen=True)
class GraphTiming:
    """Measured training-mode times of one captured graph.

    Attributes:
        graph: the captured graph (op granularity).
        fwd_s: forward time per node (``graph.nodes`` order), scaled to sum to ``fwd_total_s``.
        bwd_s: backward time per node, scaled to sum to ``bwd_total_s``.
        fwd_total_s: one forward pass as the exported module runs it (median).
        bwd_total_s: one backward pass (median).
        precision: what the model trained in while timed (:data:`PROFILE_PRECISIONS`).
    """

    graph: OpGraph
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    fwd_total_s: float
    bwd_total_s: float
    precision: str = "fp32"


@dataclass(frozen=True)
class DeviceMeasurement:
    """Everything measured on one device."""

    torch_device: str
    device_type: str
    threads: int
    matmul: tuple[MatmulPoint, ...]
    copies: tuple[CopyPoint, ...]
    op_overhead_s: float
    graphs: tuple[GraphTiming, ...]
    concurrent: int = 1

    @property
    def peak_tflops(self) -> float:
        """Best achieved FP32 matmul throughput."""
        return self.peak_tflops_in("fp32")

    def peak_tflops_in(self, precision: str) -> float:
        """Best achieved matmul throughput in ``precision`` (fp32, tf32 or bf16)."""
        dtype = MATMUL_DTYPES[precision]
        best = [p.tflops for p in self.matmul if p.dtype == dtype]
        if not best:
            raise CostModelError(f"no {precision} matmul was measured")
        return max(best)

    def graphs_in(self, precision: str) -> tuple[GraphTiming, ...]:
        return tuple(t for t in self.graphs if t.precision == precision)

    @property
    def copy_bandwidth_bytes_per_s(self) -> float:
        dev = [c.bandwidth_bytes_per_s for c in self.copies if c.kind == "device"]
        if not dev:
            raise CostModelError("no on-device copy was measured")
        return max(dev)


# ------------------------------------------------------------------------------------------ timing
@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` torch intra-op threads, then restore the previous count."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device, *, repeats: int = 5, warmup: int = 1,
              budget_s: float = 1.0) -> float:
    """Median seconds of ``fn()`` (CUDA events on a GPU); stops early once ``budget_s`` is spent."""
    for _ in range(warmup):
        fn()
    _sync(device)
    samples: list[float] = []
    spent = time.perf_counter()
    for _ in range(max(1, repeats)):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        if time.perf_counter() - spent > budget_s and len(samples) >= 2:
            break
    return statistics.median(samples)


# ------------------------------------------------------------------------------------------ microbenchmarks
TF32 = "tf32"
"""A matmul "dtype" of :func:`bench_matmul`: FP32 tensors with TF32 tensor cores allowed (CUDA only)."""

PROFILE_PRECISIONS = ("fp32", "tf32", "bf16")
"""The precisions models are timed in (the ones the engine trains in: fp16 needs loss scaling it does not run)."""

MATMUL_DTYPES = {"fp32": "float32", "tf32": TF32, "bf16": "bfloat16"}
"""The matmul (:func:`bench_matmul`) that sets each profile precision's scale."""

PRECISION_PEAKS = {"float32": "fp32_tflops", TF32: "tf32_tflops", "bfloat16": "bf16_tflops",
                   "float16": "tensor_tflops"}
"""The catalog field holding each measured matmul precision's dense peak (:class:`DeviceType`)."""


def bench_matmul(device: torch.device, sizes: Sequence[int],
                 dtypes: Sequence[torch.dtype | str]) -> list[MatmulPoint]:
    """Square matmuls of each size in each dtype; :data:`TF32` times FP32 tensors with TF32 allowed."""
    out = []
    for dtype in dtypes:
        tf32 = dtype == TF32
        for n in sizes:
            gen = torch.Generator().manual_seed(n)
            real = torch.float32 if tf32 else dtype
            a = torch.randn(n, n, generator=gen).to(device=device, dtype=real)
            b = torch.randn(n, n, generator=gen).to(device=device, dtype=real)
            before = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32 or before
            try:
                secs = time_call(lambda a=a, b=b: torch.mm(a, b), device)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = before
            name = TF32 if tf32 else str(dtype).removeprefix("torch.")
            out.append(MatmulPoint(n, name, secs, 2.0 * n**3 / secs / TERA))
    return out


def precision_peaks(measurement: DeviceMeasurement, device_type: DeviceType) -> dict[str, dict[str, float | None]]:
    """Per measured matmul precision: the best TFLOP/s, the catalog's dense peak and their ratio."""
    out: dict[str, dict[str, float | None]] = {}
    for p in measurement.matmul:
        best = max(p.tflops, out.get(p.dtype, {}).get("measured_tflops") or 0.0)
        field_name = PRECISION_PEAKS.get(p.dtype)
        peak = getattr(device_type, field_name, None) if field_name else None
        out[p.dtype] = {"measured_tflops": best, "catalog_tflops": peak,
                        "fraction_of_catalog": best / peak if peak else None}
    return out


def bench_copies(device: torch.device, nbytes: int) -> list[CopyPoint]:
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    secs = time_call(lambda: dst.copy_(src), device)
    out = [CopyPoint("device", 2 * n * 4, secs, 2 * n * 4 / secs)]
    if device.type == "cuda":
        host = torch.empty(n, dtype=torch.float32, pin_memory=True)
        secs = time_call(lambda: src.copy_(host, non_blocking=True), device)
        out.append(CopyPoint("h2d", n * 4, secs, n * 4 / secs))
        secs = time_call(lambda: host.copy_(src, non_blocking=True), device)
        out.append(CopyPoint("d2h", n * 4, secs, n * 4 / secs))
    return out


def bench_op_overhead(device: torch.device) -> float:
    """Seconds of one trivial op (an in-place add on one element): dispatch plus launch."""
    x = torch.zeros(1, device=device)
    reps = 200

    def many() -> None:
        for _ in range(reps):
            x.add_(1.0)

    return time_call(many, device, repeats=5) / reps


# ------------------------------------------------------------------------------------------ per-op timings
class _OpTimer(torch.fx.Interpreter):
    """Runs a GraphModule node by node, timing every ``call_function``; with ``backward_stamps``, it
    also hooks each op's output gradient, so that the backward pass leaves a timestamp per op."""

    def __init__(self, gm: torch.fx.GraphModule, device: torch.device, *, backward_stamps: bool) -> None:
        super().__init__(gm)
        self.device = device
        self.cuda = device.type == "cuda"
        self.backward_stamps = backward_stamps
        self.fwd: list[tuple[str, Any, Any]] = []
        self.bwd: list[tuple[str, Any]] = []

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op != "call_function":
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        start = self._now()
        out = self.call_function(n.target, args, kwargs)
        self.fwd.append((n.name, start, self._now()))
        first = next((t for t in _leaves(out) if isinstance(t, torch.Tensor)), None)
        if self.backward_stamps and first is not None and first.requires_grad:
            first.register_hook(lambda grad, name=n.name: self.bwd.append((name, self._now())) and None)
        return out

    def _elapsed(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def forward_times(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return {name: self._elapsed(s, e) for name, s, e in self.fwd}

    def backward_times(self, end: Any) -> dict[str, float]:
        """Seconds from each op's gradient hook to the next one (or to ``end``): the backward work the
        autograd engine does for that op once its output gradient is complete."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        out: dict[str, float] = {}
        stamps = self.bwd + [("", end)]
        for (name, t0), (_, t1) in zip(stamps, stamps[1:], strict=False):
            out[name] = out.get(name, 0.0) + max(self._elapsed(t0, t1), 0.0)
        return out


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _leaves(v)]
    return [value]


def _loss(out: Any) -> torch.Tensor:
    """The mean of each floating-point output, summed (the synthetic loss of ``gpualloc run``)."""
    return sum(o.float().mean() for o in _leaves(out) if isinstance(o, torch.Tensor) and o.is_floating_point())


@seeded(to="int", error=CostModelError)
def time_graph(model: str, batch: int, device: torch.device, *, repeats: int = 3, seed: int = 0,
               precision: str = "fp32") -> GraphTiming:
    """Per-op forward and backward times, and whole-pass times, of ``model`` training at ``batch`` in
    ``precision``, as the engine trains it: fp32 without TF32, tf32 (TF32 in CUDA matmuls and convolutions), or
    bf16 (:func:`~gpualloc.graph.recipe.bf16_recipe`: bf16 weights and activations, norms in fp32)."""
    from gpualloc.graph.capture import capture
    from gpualloc.graph.recipe import bf16_recipe, cast_inputs
    from gpualloc.graph.runnable import build_model

    if precision not in PROFILE_PRECISIONS:
        raise CostModelError(f"precision {precision!r}: models are timed in {', '.join(PROFILE_PRECISIONS)}")
    graph = capture(model, batch=batch)
    module, args = build_model(model, batch, seed=seed)
    if precision == "bf16":
        module, args = bf16_recipe(module), cast_inputs(args, precision)
    with _tf32_for(precision, device):
        return _time_exported(model, graph, module, args, device, repeats, precision)


@contextmanager
def _tf32_for(precision: str, device: torch.device) -> Iterator[None]:
    """TF32 on CUDA for a tf32 timing, off for every other (the engine's rule, :func:`set_tf32`)."""
    if device.type != "cuda":
        yield
        return
    before = set_tf32(precision == "tf32")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _time_exported(model: str, graph: OpGraph, module: torch.nn.Module, args: tuple[torch.Tensor, ...],
                   device: torch.device, repeats: int, precision: str) -> GraphTiming:
    from gpualloc.graph.runnable import export_runnable, owners

    # exported on the device itself: a tensor the forward makes (BERT's position ids) is traced with the
    # device it was made on, and a graph exported on the CPU would keep making it there
    module, args = module.to(device), tuple(a.to(device) for a in args)
    gm = export_runnable(module, args, training=True, name=model).module
    own = owners(gm, graph)

    fwd_runs: list[dict[str, float]] = []
    bwd_runs: list[dict[str, float]] = []
    for r in range(repeats + 1):  # the first pass warms up
        timer = _OpTimer(gm, device, backward_stamps=True)
        loss = _loss(timer.run(*args))
        fwd_times = timer.forward_times()
        loss.backward()
        bwd_times = timer.backward_times(timer._now())
        gm.zero_grad(set_to_none=True)
        del loss
        if r:
            fwd_runs.append(fwd_times)
            bwd_runs.append(bwd_times)
    fwd = _per_node(fwd_runs, own, graph)
    bwd = _per_node(bwd_runs, own, graph)

    def whole_step() -> tuple[float, float]:
        _sync(device)
        t0 = time.perf_counter()
        loss = _loss(gm(*args))
        _sync(device)
        t1 = time.perf_counter()
        loss.backward()
        _sync(device)
        t2 = time.perf_counter()
        gm.zero_grad(set_to_none=True)
        return t1 - t0, t2 - t1

    whole_step()
    steps = [whole_step() for _ in range(repeats)]
    fwd_total = statistics.median(s[0] for s in steps)
    bwd_total = statistics.median(s[1] for s in steps)
    # op times are measured one op at a time; the whole passes are what a step costs: scale to them
    if fwd.sum() > 0:
        fwd *= fwd_total / fwd.sum()
    if bwd.sum() > 0:
        bwd *= bwd_total / bwd.sum()
    fwd.setflags(write=False)
    bwd.setflags(write=False)
    return GraphTiming(graph, fwd, bwd, fwd_total, bwd_total, precision)


def _per_node(runs: list[dict[str, float]], own: dict[str, str], graph: OpGraph) -> np.ndarray:
    """Median over runs of each fx node's time, summed into the graph node that owns it."""
    out = np.zeros(len(graph))
    for name in runs[0]:
        node_id = own.get(name)
        if node_id is not None:
            out[graph.index[node_id]] += statistics.median(r.get(name, 0.0) for r in runs)
    return out


# ------------------------------------------------------------------------------------------ fit
COMPUTE_GRID = np.geomspace(0.05, 2.0, 64)
MEMORY_GRID = np.geomspace(0.01, 2.0, 64)
LAUNCH_GRID_S = np.concatenate([[0.0], np.geomspace(0.5e-6, 300e-6, 28)])


def _chunks(times: np.ndarray, k: int) -> np.ndarray:
    """Chunk index of each op: ``k`` contiguous runs of about equal total time."""
    total = times.sum()
    if total <= 0:
        return np.zeros(len(times), dtype=np.int64)
    mid = np.cumsum(times) - times / 2
    return np.minimum((mid / total * k).astype(np.int64), k - 1)


def fit_efficiency(timings: Sequence[GraphTiming], device: DeviceType, *, peak_tflops: float,
                   bandwidth_bytes_per_s: float, chunks: int = 4,
                   precision: str = "fp32") -> tuple[Efficiency, dict[str, Any]]:
    """Fit (compute, memory, launch) on graphs measured in ``precision``; see the module docstring.

    Args:
        timings: measured graphs.
        device: the catalog type the efficiencies are relative to.
        peak_tflops / bandwidth_bytes_per_s: measured scales (the precision's matmul, copy); the grids are
            relative to them.
        chunks: contiguous runs per graph that the objective compares.
        precision: what the graphs were timed in: the efficiency is relative to its catalog peak, and the bytes
            an op moves scale with its value size, as :func:`~gpualloc.cost.model.roofline_s` charges them.

    Returns:
        The efficiency and a report: per graph the measured and predicted fwd+bwd time and error, and
        the median absolute error over the runs.
    """
    if not timings:
        raise CostModelError("no measured graph to fit on")
    prec = get_precision(precision)
    catalog_peak = prec.peak_tflops(device)
    if catalog_peak is None or device.mem_bandwidth_bytes_per_s is None:
        raise CostModelError(f"device type {device.name!r} has no {precision} peak or memory bandwidth")
    value_scale = prec.value_bytes / PROFILE_VALUE_BYTES
    flops, nbytes, secs, group = [], [], [], []
    base = 0
    for t in timings:
        g = t.graph
        chunk = _chunks(t.fwd_s, chunks) + base
        for factor, times in ((1.0, t.fwd_s), (BWD_FACTOR, t.bwd_s)):
            flops.append(factor * g.flops)
            nbytes.append(factor * value_scale * g.bytes_accessed)
            secs.append(times)
            group.append(chunk)
        base += chunks
    f, b, s, grp = (np.concatenate(x) for x in (flops, nbytes, secs, group))
    onehot = np.zeros((len(s), base))
    onehot[np.arange(len(s)), grp] = 1.0
    measured = s @ onehot
    keep = measured > 0
    log_measured = np.log(measured[keep])
    peak = peak_tflops * TERA
    mem = b[None, :] / (bandwidth_bytes_per_s * MEMORY_GRID[:, None])
    n_ops = onehot.sum(axis=0)[keep]
    best = (math.inf, 0.0, 0.0, 0.0)
    for ec in COMPUTE_GRID:
        core = (np.maximum((f / (peak * ec))[None, :], mem) @ onehot)[:, keep]  # (memory grid, groups)
        pred = core[None, :, :] + LAUNCH_GRID_S[:, None, None] * n_ops[None, None, :]
        err = ((np.log(pred) - log_measured) ** 2).sum(axis=2)
        i, j = np.unravel_index(int(np.argmin(err)), err.shape)
        if err[i, j] < best[0]:
            best = (float(err[i, j]), float(ec), float(MEMORY_GRID[j]), float(LAUNCH_GRID_S[i]))
    _, ec, em, launch = best
    eff = Efficiency(
        compute=ec * peak_tflops / catalog_peak,
        memory=em * bandwidth_bytes_per_s / device.mem_bandwidth_bytes_per_s,
        launch_s=launch,
        fitted_from="measured",
    )
    return eff, fit_report(timings, device, eff, chunks, precision)


def fit_report(timings: Sequence[GraphTiming], device: DeviceType, eff: Efficiency, chunks: int = 4,
               precision: str = "fp32") -> dict[str, Any]:
    """How well ``eff`` predicts each measured graph (timed in ``precision``): whole fwd+bwd and its contiguous
    runs."""
    graphs = {}
    chunk_errors = []
    for t in timings:
        g = t.graph
        pf = roofline_s(g.flops, g.bytes_accessed, device, eff, precision)
        pb = roofline_s(BWD_FACTOR * g.flops, BWD_FACTOR * g.bytes_accessed, device, eff, precision)
        measured = t.fwd_total_s + t.bwd_total_s
        predicted = float(pf.sum() + pb.sum())
        chunk = _chunks(t.fwd_s, chunks)
        for c in range(chunks):
            m = chunk == c
            meas_c = float(t.fwd_s[m].sum() + t.bwd_s[m].sum())
            if meas_c > 0:
                chunk_errors.append(float((pf[m].sum() + pb[m].sum()) / meas_c - 1.0))
        graphs[g.name] = {
            "batch_size": g.batch_size, "nodes": len(g), "measured_fwd_s": t.fwd_total_s,
            "measured_bwd_s": t.bwd_total_s, "measured_step_s": measured, "predicted_step_s": predicted,
            "error": predicted / measured - 1.0,
        }
    return {
        "graphs": graphs,
        "chunks_per_graph": chunks,
        "chunk_median_abs_error": float(np.median(np.abs(chunk_errors))) if chunk_errors else None,
        "chunk_max_abs_error": float(np.max(np.abs(chunk_errors))) if chunk_errors else None,
    }


# ------------------------------------------------------------------------------------------ the whole thing
_VENDOR_WORDS = frozenset({"NVIDIA", "AMD", "TESLA", "GEFORCE", "QUADRO", "RTX", "RADEON", "INSTINCT"})
"""Words of a device name that name its maker or product line, not the device."""


def _tokens(label: str) -> list[str]:
    return [t for t in label.upper().replace(" ", "-").replace("_", "-").split("-") if t]


def catalog_type_named(device_name: str, mem_gib: float, catalog: Catalog | None = None) -> DeviceType | None:
    """The catalog type of a GPU that reports ``device_name`` (``torch.cuda.get_device_name``) and ``mem_gib``.

    A label (a type's name or alias) matches when its model word (its first word that is not a vendor's:
    "H100", "A100", "TITAN") is a whole word of the device's name; the longest label found whole in the name
    wins ("A100-SXM4-80GB" -> A100-80GB), then the type whose memory is closest. None: no label matches.
    """
    cat = catalog or default_catalog()
    words = _tokens(device_name)
    name = "-".join(words)
    best: tuple[int, float, DeviceType] | None = None
    for dt in cat.devices.values():
        for label in (dt.name, *dt.aliases):
            key = _tokens(label)
            model = next((t for t in key if t not in _VENDOR_WORDS), None)
            if model is None or model not in words:
                continue
            whole = f"-{'-'.join(key)}-" in f"-{name}-"
            score = (len("-".join(key)) if whole else len(model), -abs(dt.mem_bytes / 2**30 - mem_gib))
            if best is None or score > best[:2]:
                best = (*score, dt)
    return None if best is None else best[2]


def catalog_type_for(torch_device: str, catalog: Catalog | None = None) -> DeviceType:
    """The catalog device type of a torch device: ``cpu`` for the CPU; for a GPU, by its name and memory
    (:func:`catalog_type_named`)."""
    cat = catalog or default_catalog()
    device = torch.device(torch_device)
    if device.type == "cpu":
        return cat.device("cpu")
    if device.type != "cuda" or not torch.cuda.is_available():
        raise CostModelError(f"cannot calibrate {torch_device!r}: not the cpu and no CUDA device is available")
    name = torch.cuda.get_device_name(device)
    found = catalog_type_named(name, torch.cuda.get_device_properties(device).total_memory / 2**30, cat)
    if found is None:
        raise CostModelError(f"{torch_device} is {name!r}, which the catalog does not know: "
                             "name its type with --as TYPE")
    return found


def _neighbour(model: str, batch: int, threads: int, seed: int, ready: Any, stop: Any) -> None:
    """A neighbouring CPU worker's load: train ``model`` eagerly until ``stop`` is set."""
    from gpualloc.graph.runnable import build_model

    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    module, args = build_model(model, batch, seed=seed)
    module.train()
    ready.set()
    while not stop.is_set():
        _loss(module(*args)).backward()
        module.zero_grad(set_to_none=True)


@contextmanager
@seeded(to="int", error=CostModelError)
def neighbours(count: int, model: str, batch: int, threads: int, seed: int = 0) -> Iterator[None]:
    """Run ``count`` processes training ``model`` beside the measurement (CPU workers of one pipeline
    share caches, memory bandwidth and the package's power budget: a share of a CPU measured alone is
    faster than the same share with its neighbours busy)."""
    if count <= 0:
        yield
        return
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = []
    try:
        for _ in range(count):
            ready = ctx.Event()
            proc = ctx.Process(target=_neighbour, args=(model, batch, threads, seed, ready, stop), daemon=True)
            proc.start()
            procs.append((proc, ready))
        for proc, ready in procs:
            while not ready.wait(timeout=1.0):
                if not proc.is_alive():
                    raise CostModelError(f"a neighbour process training {model} died (exit code {proc.exitcode})")
        yield
    finally:
        stop.set()
        for proc, _ in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)


@seeded(to="int", error=CostModelError)
def measure_device(torch_device: str, device_type: DeviceType, *, threads: int | None = None,
                   models: Sequence[tuple[str, int]] = (("resnet-tiny", 4),), repeats: int = 3,
                   matmul_sizes: Sequence[int] | None = None, copy_bytes: int | None = None, seed: int = 0,
                   concurrent: int = 1, matmul_dtypes: Sequence[torch.dtype | str] | None = None,
                   precisions: Sequence[str] = ("fp32",), progress: Progress | None = None) -> DeviceMeasurement:
    """Run the microbenchmarks and time ``models`` (``(model, batch)`` pairs) on ``torch_device``, in each of
    ``precisions`` (:data:`PROFILE_PRECISIONS`; fp32 always).

    On the CPU, ``concurrent - 1`` neighbour processes train the same model with the same threads
    while it is timed, as the other CPU workers of a pipeline will (see :func:`neighbours`).
    """
    device = torch.device(torch_device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    sizes = matmul_sizes or ((1024, 2048, 4096, 8192) if cuda else (128, 256, 512, 1024))
    default_dtypes = (torch.float32, TF32, torch.float16, torch.bfloat16) if cuda else (torch.float32, torch.bfloat16)
    dtypes = matmul_dtypes or default_dtypes
    note = progress or (lambda _msg: None)
    with torch_threads(None if cuda else threads), _tf32_for("fp32", device):
        note("matmul")
        mm = bench_matmul(device, sizes, dtypes)
        note("memory copies")
        copies = bench_copies(device, copy_bytes or ((256 if cuda else 64) << 20))
        note("op overhead")
        overhead = bench_op_overhead(device)
        graphs = []
        for prec in dict.fromkeys(("fp32", *precisions)):
            for model, batch in models:
                note(f"per-op timings of {model} at batch {batch}" + ("" if prec == "fp32" else f" in {prec}"))
                busy = 0 if cuda else concurrent - 1
                with neighbours(busy, model, batch, int(threads or torch.get_num_threads()), seed):
                    graphs.append(time_graph(model, batch, device, repeats=repeats, seed=seed, precision=prec))
    return DeviceMeasurement(torch_device, device_type.name, int(threads or torch.get_num_threads()) if not cuda else 1,
                             tuple(mm), tuple(copies), overhead, tuple(graphs), concurrent if not cuda else 1)


# ------------------------------------------------------------------------------------------------ optimizer step
OPTIMIZER_GRIDS = {"cpu": ((8, 1 << 10), (64, 1 << 10), (512, 1 << 10), (8, 1 << 18), (64, 1 << 18), (8, 1 << 21),
                           (32, 1 << 21)),
                   "cuda": ((8, 1 << 10), (64, 1 << 10), (512, 1 << 10), (8, 1 << 20), (64, 1 << 20), (512, 1 << 18),
                            (8, 1 << 24), (32, 1 << 24), (128, 1 << 22))}
"""Synthetic parameter sets, ``(tensors, elements each)``, an optimizer step is timed on: from many small tensors
(the host's work per tensor) to few large ones (the memory traffic)."""
STORAGE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@seeded(to="int", error=CostModelError)
def time_optimizer_step(params: Sequence[torch.Tensor], optimizer: str, precision: str, *, steps: int = 10,
                        warmup: int = 3, seed: int = 0) -> float:
    """Median seconds of one ``step()`` of the engine's ``optimizer`` (:data:`gpualloc.graph.recipe.OPTIMIZERS`;
    below fp32 through :class:`~gpualloc.graph.recipe.MasterWeights`, as the engine trains) over ``params`` (leaf
    tensors on one device), random gradients set before each step, outside the timing."""
    from gpualloc.graph.recipe import OPTIMIZERS, MasterWeights

    params = list(params)
    device = params[0].device
    cls = OPTIMIZERS[optimizer]
    opt: Any = cls(params, lr=1e-3) if precision in ("fp32", "tf32") else MasterWeights(params, cls, lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(seed)
    grads = [torch.randn(p.shape, generator=gen, device=device, dtype=p.dtype) for p in params]
    times = []
    for i in range(warmup + steps):
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        _sync(device)
        t0 = time.perf_counter()
        opt.step()
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    for p in params:
        p.grad = None
    return statistics.median(times)


@seeded(to="int", error=CostModelError)
def measure_optimizer(torch_device: str, optimizer: str, precision: str, *,
                      grid: Sequence[tuple[int, int]] | None = None, steps: int = 10, warmup: int = 3,
                      seed: int = 0) -> list[dict[str, float]]:
    """:func:`time_optimizer_step` on each synthetic parameter set of ``grid`` (default :data:`OPTIMIZER_GRIDS`):
    rows of ``tensors``, ``param_bytes`` (fp32 sizes) and ``seconds``."""
    device = torch.device(torch_device)
    rows = []
    for n, size in grid or OPTIMIZER_GRIDS["cuda" if device.type == "cuda" else "cpu"]:
        params = [torch.zeros(size, dtype=STORAGE[precision], device=device).requires_grad_(True) for _ in range(n)]
        rows.append({"tensors": n, "param_bytes": 4.0 * n * size,
                     "seconds": time_optimizer_step(params, optimizer, precision, steps=steps, warmup=warmup,
                                                    seed=seed)})
        del params
    return rows


def set_tf32(allowed: bool) -> tuple[bool, bool]:
    """Allow or forbid TF32 in CUDA matmuls and cuDNN convolutions; the flags before, to restore them.

    FP32 means FP32 wherever gpualloc measures or trains: calibration, and the engine's ranks for every plan but
    a tf32 one (the plans are scored in their precision). PyTorch's own default leaves
    TF32 on for cuDNN alone: on an H100, a ResNet-50 step at batch 64 took 37.3 ms with it on against 80.6 ms
    off (docs/execution.md)."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allowed
    return before


def efficiency_from(measurement: DeviceMeasurement, device_type: DeviceType,
                    chunks: int = 4, precision: str = "fp32") -> tuple[Efficiency, dict[str, Any]]:
    """The fitted efficiency in ``precision`` (from the graphs timed in it when any were, else, for fp32, from
    the microbenchmarks)."""
    graphs = measurement.graphs_in(precision)
    if graphs or precision != "fp32":
        return fit_efficiency(graphs, device_type, peak_tflops=measurement.peak_tflops_in(precision),
                              bandwidth_bytes_per_s=measurement.copy_bandwidth_bytes_per_s, chunks=chunks,
                              precision=precision)
    eff = Efficiency(compute=measurement.peak_tflops / device_type.fp32_tflops,
                     memory=measurement.copy_bandwidth_bytes_per_s / device_type.mem_bandwidth_bytes_per_s,
                     launch_s=measurement.op_overhead_s, fitted_from="measured (microbenchmarks only)")
    return eff, {"graphs": {}}


def _profiles(timings: Sequence[GraphTiming]) -> dict[str, Any]:
    """Per model: the batch and each node's measured forward and backward seconds."""
    return {t.graph.name: {"batch_size": t.graph.batch_size,
                           "ops": {n.id: [float(f), float(b)]
                                   for n, f, b in zip(t.graph.nodes, t.fwd_s, t.bwd_s, strict=True)}}
            for t in timings}


def record_profiles(rec: dict[str, Any], precision: str = "fp32") -> dict[str, Any]:
    """The per-model profiles timed in ``precision`` in a device's record (:func:`record`): fp32's at its top,
    another precision's under ``precision_fits``; empty where none were timed."""
    if precision == "fp32":
        return rec.get("profiles", {})
    return rec.get("precision_fits", {}).get(precision, {}).get("profiles", {})


def record(measurement: DeviceMeasurement, eff: Efficiency, report: dict[str, Any],
           device_type: DeviceType, by_precision: dict[str, tuple[Efficiency, dict[str, Any]]] | None = None,
           ) -> dict[str, Any]:
    """The JSON record of a device calibration (kept in the calibration file's ``fit.measured``): fp32's
    profiles and fit at the top, each other timed precision's under ``precision_fits``."""
    return {
        "torch_device": measurement.torch_device,
        "threads": measurement.threads,
        "concurrent": measurement.concurrent,
        "host": platform.node(),
        "processor": platform.processor() or platform.machine(),
        "gpu": torch.cuda.get_device_name(torch.device(measurement.torch_device))
        if measurement.torch_device.startswith("cuda") else None,
        "torch": torch.__version__,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "efficiency": dataclasses.asdict(eff),
        "matmul": [dataclasses.asdict(p) for p in measurement.matmul],
        "copies": [dataclasses.asdict(c) for c in measurement.copies],
        "op_overhead_s": measurement.op_overhead_s,
        "profiles": _profiles(measurement.graphs_in("fp32")),
        "precision_fits": {p: {"efficiency": dataclasses.asdict(e), "profiles": _profiles(measurement.graphs_in(p)),
                               **rep} for p, (e, rep) in (by_precision or {}).items()},
        "peak_fp32_tflops_measured": measurement.peak_tflops,
        "precisions": precision_peaks(measurement, device_type),
        "copy_bandwidth_bytes_per_s_measured": measurement.copy_bandwidth_bytes_per_s,
        **report,
    }


def merge_calibration(base: Calibration, device_type: str, eff: Efficiency, rec: dict[str, Any],
                      by_precision: dict[str, Efficiency] | None = None,
                      optimizers: dict[str, dict[str, OptimizerCost]] | None = None) -> Calibration:
    """``base`` with ``device_type``'s efficiencies replaced by measured ones (other devices kept): fp32's, and
    those of ``by_precision`` (an earlier measurement's other precisions are dropped with it); and its optimizer
    costs by ``optimizers`` (``{precision: {optimizer: cost}}``) where given."""
    fit = dict(base.fit)
    measured = dict(fit.get("measured", {}))
    measured[device_type] = rec
    fit["measured"] = measured
    precisions = {k: v for k, v in base.precisions.items() if k != device_type}
    if by_precision:
        precisions[device_type] = dict(by_precision)
    opt = dict(base.optimizers)
    if optimizers:
        opt[device_type] = {p: dict(v) for p, v in optimizers.items()}
    return Calibration(devices={**base.devices, device_type: eff}, default=base.default,
                       cpu_default=base.cpu_default, fit=fit, precisions=precisions, optimizers=opt)


@seeded(to="int", error=CostModelError)
def calibrate_device(torch_device: str = "cpu", *, threads: int | None = None,
                     models: Sequence[tuple[str, int]] = (("resnet-tiny", 4),), repeats: int = 3,
                     base: Calibration | None = None, device_type: str | None = None, chunks: int = 4,
                     catalog: Catalog | None = None, seed: int = 0, concurrent: int = 1,
                     matmul_sizes: Sequence[int] | None = None, copy_bytes: int | None = None,
                     matmul_dtypes: Sequence[torch.dtype | str] | None = None,
                     precisions: Sequence[str] = ("fp32",), optimizers: Sequence[str] = ("adam", "sgd"),
                     progress: Progress | None = None) -> tuple[Calibration, dict[str, Any]]:
    """Measure ``torch_device`` and return ``base`` (default: the shipped calibration) with its
    device type's efficiencies fitted on the measurements, and the record of the fit.

    Args:
        torch_device: ``"cpu"`` or ``"cuda:i"``.
        threads: torch threads on the CPU (default: torch's current count).
        models: ``(model, batch)`` pairs to time op by op (zoo names or ``package.module:factory``).
        repeats: timed passes per measurement (the median is kept).
        base: the calibration to update.
        device_type: catalog type to calibrate (default: guessed from the device).
        chunks: contiguous runs per graph the fit compares.
        catalog: device catalog.
        seed: weights and inputs of the timed models.
        concurrent: CPU workers that will share the CPU; ``concurrent - 1`` neighbours run the timed
            model beside each per-op measurement.
        matmul_sizes / copy_bytes / matmul_dtypes: microbenchmark sizes and matmul types (default: see
            :func:`measure_device`).
        precisions: what the models are timed and fitted in besides fp32 (tf32 on a GPU, bf16): a plan in one
            of them is predicted from its own profiles and efficiency (``Calibration.efficiency``).
        optimizers: the engine's optimizers whose step is timed and fitted (:func:`measure_optimizer`,
            :func:`fit_optimizer`) in fp32 and in each of ``precisions`` that stores weights in another type.
        progress: called with a short label before each measurement.
    """
    from gpualloc.graph.recipe import OPTIMIZERS

    cat = catalog or default_catalog()
    for o in optimizers:
        if o not in OPTIMIZERS:
            raise CostModelError(f"--optimizers: {o!r}: the engine trains with {', '.join(OPTIMIZERS)}")
    dt = cat.device(device_type) if device_type else catalog_type_for(torch_device, cat)
    others = [p for p in dict.fromkeys(precisions) if p != "fp32"]
    for p in others:
        check_profile_precision(p, dt, torch_device)
    if others and not models:
        raise CostModelError(f"--precisions {','.join(others)}: time at least one model to fit them on")
    measurement = measure_device(torch_device, dt, threads=threads, models=models, repeats=repeats, seed=seed,
                                 matmul_sizes=matmul_sizes, copy_bytes=copy_bytes, concurrent=concurrent,
                                 matmul_dtypes=matmul_dtypes, precisions=others, progress=progress)
    eff, report = efficiency_from(measurement, dt, chunks)
    fits = {p: efficiency_from(measurement, dt, chunks, p) for p in others}
    rec = record(measurement, eff, report, dt, fits)
    opt_costs: dict[str, dict[str, OptimizerCost]] = {}
    for p in dict.fromkeys(("fp32", *others)):
        if p == "tf32":  # fp32 storage: fp32's step
            continue
        for o in optimizers:
            if progress:
                progress(f"optimizer step: {o} in {p}")
            with torch_threads(None if torch_device.startswith("cuda") else threads):
                rows = measure_optimizer(torch_device, o, p, seed=seed)
            cost, fit_rec = fit_optimizer(rows, dt, o, p, asynchronous=torch_device.startswith("cuda"))
            opt_costs.setdefault(p, {})[o] = cost
            rec.setdefault("optimizer_fits", {}).setdefault(p, {})[o] = {**dataclasses.asdict(cost), **fit_rec}
    return merge_calibration(base if base is not None else Calibration.load(), dt.name, eff, rec,
                             {p: e for p, (e, _) in fits.items()}, opt_costs), rec


def check_profile_precision(precision: str, device_type: DeviceType, torch_device: str) -> None:
    """One line unless models can be timed and fitted in ``precision`` on ``torch_device``: a precision the engine
    trains in (:data:`PROFILE_PRECISIONS`), with a catalog peak for the device type, and tf32 on a GPU only."""
    if precision not in PROFILE_PRECISIONS:
        raise CostModelError(f"--precisions: {precision!r}: models are timed in {', '.join(PROFILE_PRECISIONS)} "
                             "(the precisions the engine trains in)")
    get_precision(precision).check(device_type)
    if precision == "tf32" and not torch_device.startswith("cuda"):
        raise CostModelError("--precisions: tf32 runs on CUDA tensor cores only; on the CPU it is fp32")


# ------------------------------------------------------------------------------------------ quick CPU calibration
QUICK_MATMUL_SIZES = (256, 512, 1024)
QUICK_COPY_BYTES = 32 << 20
QUICK_MODEL = ("resnet-tiny", 8)
"""The model whose whole training pass sets a quick calibration's per-op overhead."""
QUICK_STEPS = 4
"""Progress labels a quick calibration reports: three microbenchmarks, then the model."""


def fit_launch(timing: GraphTiming, device: DeviceType, eff: Efficiency) -> Efficiency:
    """``eff`` with the per-op overhead that makes the roofline reproduce ``timing``'s measured forward +
    backward pass, compute and memory kept: what small ops cost beyond their FLOPs and bytes (dispatch,
    autograd, kernels far from their peak). Never below ``eff.launch_s``."""
    g = timing.graph
    bare = dataclasses.replace(eff, launch_s=0.0)
    core = float(roofline_s(g.flops, g.bytes_accessed, device, bare).sum()
                 + roofline_s(BWD_FACTOR * g.flops, BWD_FACTOR * g.bytes_accessed, device, bare).sum())
    per_op = (timing.fwd_total_s + timing.bwd_total_s - core) / (2 * max(len(g), 1))
    return dataclasses.replace(eff, launch_s=float(max(eff.launch_s, per_op)),
                               fitted_from=f"measured (microbenchmarks; per-op overhead from {g.name})")


def host_cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what :mod:`platform` knows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def quick_cache_name(threads: int, concurrent: int = 1, cpu_model: str | None = None) -> str:
    """File name of a quick CPU calibration: one per CPU model, thread count, concurrent workers and
    torch version, the four things a CPU efficiency depends on here."""
    key = f"{cpu_model or host_cpu_model()}-t{threads}-c{concurrent}-torch{torch.__version__}"
    slug = "".join(c if c.isalnum() or c in ".+" else "-" for c in key)
    return f"cpu-{'-'.join(p for p in slug.split('-') if p)}.json"


@seeded(to="int", error=CostModelError)
def cached_cpu_calibration(folder: str | Path, *, threads: int, concurrent: int = 1,
                           base: Calibration | None = None, seed: int = 0,
                           progress: Progress | None = None) -> tuple[Calibration, Path, bool]:
    """A quick CPU calibration from ``folder``, measured and stored there (mode 0600) when missing.

    A quick calibration runs :func:`measure_device` at a small size: FP32 matmuls and an on-device copy
    (compute and memory efficiencies, as :func:`efficiency_from` reads them off microbenchmarks), and one
    small model's whole training pass with ``concurrent - 1`` neighbours busy (the per-op overhead,
    :func:`fit_launch`). It takes seconds, against minutes for ``gpualloc calibrate``, and is coarser:
    it fixes the order of magnitude of a CPU prediction, not its last 20 %.

    Args:
        folder: the cache folder (created when missing).
        threads: torch threads of each CPU worker.
        concurrent: CPU workers that share the CPU (neighbours run beside the measurement).
        base: the calibration the CPU efficiency is merged into (default: the shipped one).
        seed: weights and inputs of the timed models.
        progress: called with a short label before each measurement.

    Returns:
        The calibration, its file, and whether it was measured now (False: read from the cache).

    Raises:
        CostModelError: the cache folder or file cannot be written.
    """
    path = Path(folder) / quick_cache_name(threads, concurrent)
    if path.is_file():
        try:
            return Calibration.load(path), path, False
        except (CostModelError, UnicodeDecodeError):
            pass  # a damaged cache entry is measured again and replaced, not an error
    dt = default_catalog().device("cpu")
    m = measure_device("cpu", dt, threads=threads, models=(QUICK_MODEL,), repeats=3, seed=seed,
                       matmul_sizes=QUICK_MATMUL_SIZES, copy_bytes=QUICK_COPY_BYTES, concurrent=concurrent,
                       matmul_dtypes=(torch.float32,), progress=progress)
    eff, _ = efficiency_from(dataclasses.replace(m, graphs=()), dt)
    eff = fit_launch(m.graphs[0], dt, eff)
    rec = record(m, eff, {"quick": True, **fit_report(m.graphs, dt, eff)}, dt)
    cal = merge_calibration(base if base is not None else Calibration.load(), dt.name, eff, rec)
    _write_private(path, json.dumps(cal.to_dict(), indent=1) + "\n")
    return cal, path, True


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by its owner only, atomically (a crash leaves no half-written cache)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o600)  # O_CREAT's mode is masked by the umask; the cache must not be wider
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise CostModelError(f"{path}: cannot write the calibration cache: {err.strerror or err} "
                             "(pass --calibration FILE or --no-calibrate)") from err


def apply_profiles(graph: OpGraph, calibration: Calibration, device_types: Sequence[str],
                   precision: str = "fp32") -> OpGraph | None:
    """``graph`` with measured per-op times from ``calibration``'s profiles in ``precision``, or None.

    A profile is the per-op timing of a model that ``gpualloc calibrate`` timed in a precision (fp32, and each
    of its ``--precisions``); it applies to a graph of the same model (``graph.meta["model"]`` or its name)
    whose every node it timed, scaled linearly from the profiled batch to the graph's, for a plan in that
    precision: the graph says so (``meta["precision"]``), and a plan in another precision moves the times by the
    roofline ratio of the two (:meth:`~gpualloc.cost.model.CostModel.op_times_s`). It is used only when every
    one of ``device_types`` has a profile of that model: a graph timed on some types only would have its other
    types' times transferred from the measured ones (see :mod:`gpualloc.cost.model`), mixing two kinds of
    estimate.
    """
    from gpualloc.graph.ir import OpTiming

    model = str(graph.meta.get("model", graph.name))
    measured = calibration.fit.get("measured", {}) if isinstance(calibration.fit, dict) else {}
    per_type: dict[str, tuple[float, dict[str, list[float]]]] = {}
    for name in dict.fromkeys(device_types):
        prof = record_profiles(measured.get(name, {}), precision).get(model)
        if not prof or not graph.batch_size:
            return None
        ops = prof.get("ops", {})
        if any(node.id not in ops for node in graph.nodes):
            return None
        per_type[name] = (graph.batch_size / float(prof["batch_size"]), ops)
    if not per_type:
        return None
    nodes = [
        dataclasses.replace(node, time_ms={
            name: OpTiming(1e3 * scale * ops[node.id][0], 1e3 * scale * ops[node.id][1])
            for name, (scale, ops) in per_type.items()})
        for node in graph.nodes
    ]
    return OpGraph(graph.name, nodes, graph.edges, batch_size=graph.batch_size,
                   meta={**graph.meta, "times": "profiled", "precision": precision}, tied=graph.tied)
