"""The cost model: how long an op takes on a device, a transfer on a link, and the power drawn.

Op time on device type ``d`` (forward; backward likewise with ``BWD_FACTOR`` x the work):

1. measured: the graph's ``time_ms[d]`` when it has one;
2. transferred: when the op was measured on another device type ``r`` only, the measured time
   scaled by the roofline ratio ``roofline(d) / roofline(r)`` -- it keeps what the measurement saw
   (kernel choice, overheads FLOP counts miss) and moves it to the new device;
3. roofline: ``launch + max(flops / (peak * eta_compute), bytes / (bandwidth * eta_memory))``.

The efficiencies ``eta`` are fitted on measured data by :mod:`gpualloc.cost.calibrate` and shipped as
``data/calibration.json`` against FP32 peaks (the precision of the measurements they were fitted on); in
another precision the same efficiencies apply to that precision's peak (tensor cores for TF32, BF16, FP16)
and the bytes moved scale with its value size (:mod:`gpualloc.cost.memory`), a stated assumption.
Link time is ``latency + bytes / bandwidth``; power is ``idle + (TDP - idle) * utilisation``; both
formulas live in :mod:`gpualloc.cost.physics`, which every simulator calls too.
"""

from __future__ import annotations

import functools
import json
import weakref
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from gpualloc.cost import physics
from gpualloc.errors import CostModelError, parse_json, read_text, write_text
from gpualloc.graph.ir import OpGraph
from gpualloc.graph.layers import node_saved_act_bytes
from gpualloc.hardware.catalog import TERA, DeviceType
from gpualloc.hardware.schema import validated

BWD_FACTOR = 2.0
"""Backward work relative to forward: gradients w.r.t. inputs and w.r.t. weights, each ~ forward."""


@dataclass(frozen=True)
class Efficiency:
    """Fraction of a device's peaks that real ops reach, and the fixed cost of launching one op.

    Attributes:
        compute: achieved / peak FLOP/s for compute-bound ops (the FP32 peak; a precision's own peak for an
            efficiency measured in that precision, ``Calibration.precisions``).
        memory: achieved / peak memory bandwidth for memory-bound ops.
        launch_s: per-op overhead (kernel launch, framework dispatch), seconds.
        fitted_from: where the numbers come from (``"pipedream"``, ``"sia"``, ``"default"``, ...).
    """

    compute: float
    memory: float
    launch_s: float
    fitted_from: str = "default"


class _EfficiencyDoc(BaseModel):
    """One efficiency record of a calibration file: positive finite fractions of peak, a launch time >= 0."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    compute: float = Field(gt=0)
    memory: float = Field(gt=0)
    launch_s: float = Field(ge=0)
    fitted_from: str = "default"


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="ignore", allow_inf_nan=False))
class OptimizerCost:
    """What one optimizer step costs on a device type, in a precision (:func:`gpualloc.cost.physics.optimizer_step_s`):
    ``fixed_s``, ``per_tensor_s`` of host work for each parameter tensor, and the step's memory traffic at
    ``memory`` x the device's peak bandwidth; host and device one after the other, or the slower of the two where
    they ``overlap``. Measured by :func:`gpualloc.cost.microbench.measure_optimizer` (``gpualloc calibrate``).
    Validated as a calibration file's record is (finite, non-negative times, a positive share)."""

    fixed_s: Annotated[float, Field(ge=0)]
    per_tensor_s: Annotated[float, Field(ge=0)]
    memory: Annotated[float, Field(gt=0)]
    overlap: bool
    fitted_from: str = "measured"


OPTIMIZER_DEFAULTS = ("default", "cpu_default")
"""The keys of ``Calibration.optimizers`` that hold a GPU's and a CPU's records where a device type has none."""


class _CalibrationDoc(BaseModel):
    """A gpualloc-calibration document (what :meth:`Calibration.to_dict` writes)."""

    model_config = ConfigDict(extra="ignore")

    devices: dict[str, _EfficiencyDoc]
    default: _EfficiencyDoc
    cpu_default: _EfficiencyDoc
    fit: dict[str, Any] = Field(default_factory=dict)
    precisions: dict[str, dict[Literal["tf32", "bf16", "fp16"], _EfficiencyDoc]] = Field(default_factory=dict)
    optimizers: dict[str, dict[Literal["fp32", "tf32", "bf16", "fp16"],
                               dict[Literal["adam", "sgd", "sgd-momentum"], OptimizerCost]]] = Field(
        default_factory=dict)


@dataclass(frozen=True)
class Calibration:
    """Efficiencies per device type name, a default for the others, and the record of the fit.

    ``devices`` hold FP32 efficiencies (relative to the FP32 peak); ``precisions[device][p]`` one measured in
    precision ``p`` (relative to its peak: ``gpualloc calibrate --precisions``). Without one, a precision uses the
    FP32 efficiency at its own peak, a stated assumption that a real GPU breaks (docs/execution.md)."""

    devices: Mapping[str, Efficiency]
    default: Efficiency
    cpu_default: Efficiency
    fit: Mapping[str, Any] = field(default_factory=dict)
    precisions: Mapping[str, Mapping[str, Efficiency]] = field(default_factory=dict)
    optimizers: Mapping[str, Mapping[str, Mapping[str, OptimizerCost]]] = field(default_factory=dict)

    def efficiency(self, device: DeviceType, precision: str = "fp32") -> Efficiency:
        measured = self.precisions.get(device.name, {}).get(precision)
        if measured is not None:
            return measured
        if device.name in self.devices:
            return self.devices[device.name]
        return self.cpu_default if _is_cpu(device) else self.default

    def optimizer_cost(self, device: DeviceType, precision: str, optimizer: str) -> OptimizerCost:
        """The optimizer step's cost on ``device`` (``optimizers[device][precision][optimizer]``): the device type's
        own record, else the ``default`` (a GPU) or ``cpu_default`` one; in this calibration, else in the shipped
        one (a calibration file written before optimizers were measured). A precision without a record uses its
        storage twin's (tf32: fp32; fp16: bf16), then fp32's; SGD with momentum uses SGD's."""
        fallback = OPTIMIZER_DEFAULTS[1] if _is_cpu(device) else OPTIMIZER_DEFAULTS[0]
        tables = (self.optimizers, _shipped().optimizers) if self.optimizers else (_shipped().optimizers,)
        for key in (device.name, fallback):
            for table in tables:
                by_precision = table.get(key)
                if not by_precision:
                    continue
                for p in dict.fromkeys((precision, {"tf32": "fp32", "fp16": "bf16"}.get(precision, "fp32"), "fp32")):
                    for o in dict.fromkeys((optimizer, "sgd" if optimizer == "sgd-momentum" else optimizer)):
                        found = by_precision.get(p, {}).get(o)
                        if found is not None:
                            return found
        raise CostModelError(f"calibration: no optimizer cost for {optimizer} in {precision} on {device.name}, and "
                             "no default one")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "gpualloc-calibration",
            "version": 1,
            "devices": {k: asdict(v) for k, v in self.devices.items()},
            "default": asdict(self.default),
            "cpu_default": asdict(self.cpu_default),
            "fit": dict(self.fit),
            **({"precisions": {d: {p: asdict(e) for p, e in v.items()} for d, v in self.precisions.items()}}
               if self.precisions else {}),
            **({"optimizers": {d: {p: {o: asdict(c) for o, c in by_o.items()} for p, by_o in v.items()}
                               for d, v in self.optimizers.items()}} if self.optimizers else {}),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "calibration") -> Calibration:
        """Validate a decoded calibration document; errors name ``where`` and the field."""
        if not isinstance(data, Mapping):
            raise CostModelError(f"{where}: malformed calibration: expected a JSON object with devices, "
                                 "default and cpu_default")
        doc = validated(_CalibrationDoc, dict(data), f"{where}: malformed calibration", CostModelError)
        return cls(devices={k: Efficiency(**v.model_dump()) for k, v in doc.devices.items()},
                   default=Efficiency(**doc.default.model_dump()),
                   cpu_default=Efficiency(**doc.cpu_default.model_dump()), fit=doc.fit,
                   precisions={d: {p: Efficiency(**e.model_dump()) for p, e in v.items()}
                               for d, v in doc.precisions.items()},
                   optimizers=doc.optimizers)

    @classmethod
    def load(cls, path: str | Path | None = None) -> Calibration:
        """Load a calibration file (default: the one shipped with gpualloc)."""
        if path is None:
            text = resources.files("gpualloc.cost").joinpath("data/calibration.json").read_text()
            where = "calibration.json"
        else:
            where = str(path)
            text = read_text(path, CostModelError)
        return cls.from_dict(parse_json(text, CostModelError, where), where)

    def save(self, path: str | Path) -> None:
        write_text(path, json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n")


def _is_cpu(device: DeviceType) -> bool:
    return device.vendor == "cpu" or device.name == "cpu"


@functools.cache
def _shipped() -> Calibration:
    """The calibration shipped with gpualloc (read once)."""
    return Calibration.load()


def peak_ceiling_tflops(device: DeviceType, precision: str = "fp32") -> float | None:
    """The fastest the device can compute in ``precision``, TFLOP/s: that precision's peak, and for fp32 the
    TF32 tensor cores' where it has them (cuDNN runs FP32 convolutions on them by default, which is why the
    shipped A100 efficiency is 1.38 of its FP32 peak). No op runs faster (:func:`roofline_s`), and
    utilisation is measured against it (:mod:`gpualloc.cost.estimate`), so it never exceeds 100%."""
    from gpualloc.cost.memory import precision as get_precision

    peak = get_precision(precision).peak_tflops(device)
    if precision == "fp32" and device.tf32_tflops is not None:
        return max(peak or 0.0, device.tf32_tflops)
    return peak


def _bandwidth(device: DeviceType) -> float:
    if device.mem_bandwidth_bytes_per_s is None:
        raise CostModelError(f"device type {device.name!r} has no memory bandwidth for the optimizer step's cost")
    return float(device.mem_bandwidth_bytes_per_s)


def roofline_s(flops: np.ndarray | float, nbytes: np.ndarray | float, device: DeviceType, eff: Efficiency,
               precision: str = "fp32"):
    """Roofline time of work with ``flops`` and ``nbytes`` (fp32 sizes) on ``device`` (arrays broadcast), in
    ``precision``: its peak (the tensor cores' for tf32, bf16 and fp16) and its bytes a value."""
    from gpualloc.cost.memory import PROFILE_VALUE_BYTES
    from gpualloc.cost.memory import precision as get_precision

    prec = get_precision(precision)
    peak = prec.peak_tflops(device)
    if precision == "fp32" and (peak is None or device.mem_bandwidth_bytes_per_s is None):
        raise CostModelError(
            f"device type {device.name!r} has no FP32 peak or memory bandwidth, and the graph has no measured "
            f"time for it: give its peaks or measured time_ms[{device.name!r}]"
        )
    prec.check(device)
    if device.mem_bandwidth_bytes_per_s is None:
        raise CostModelError(f"device type {device.name!r} has no memory bandwidth for a roofline estimate")
    # the calibrated efficiency may exceed 1 of the FP32 peak (TF32 tensor cores), never the device's ceiling
    rate = min(peak * eff.compute, peak_ceiling_tflops(device, precision))
    compute = np.asarray(flops, dtype=np.float64) / (rate * TERA)
    moved = np.asarray(nbytes, dtype=np.float64) * (prec.value_bytes / PROFILE_VALUE_BYTES)
    memory = moved / (device.mem_bandwidth_bytes_per_s * eff.memory)
    return eff.launch_s + np.maximum(compute, memory)


class CostModel:
    """Op and power costs on catalog devices, with a calibration.

    Args:
        calibration: fitted efficiencies; default: the shipped ``data/calibration.json``.
        catalog: resolves device type names met in graphs' measured times (for transfer scaling).
        launch: ``serial`` or ``async``: the launch rule microbatch times are costed under.
    """

    def __init__(self, calibration: Calibration | None = None, catalog=None, launch: str = "serial") -> None:
        from gpualloc.cost.launch import LAUNCH_MODES
        from gpualloc.hardware.catalog import default_catalog

        if launch not in ("serial", "async"):
            raise CostModelError(f"launch: unknown rule {launch!r}; expected serial or async "
                                 f"(cost.launch knows {', '.join(LAUNCH_MODES)})")
        self.launch = launch
        """How much of each op's launch overhead a microbatch pays (:func:`gpualloc.cost.launch.exposed_launch_s`):
        ``serial`` (every op, the rule the shipped calibration was fitted under) or ``async``."""
        self.calibration = calibration if calibration is not None else Calibration.load()
        self.catalog = catalog if catalog is not None else default_catalog()
        # keyed by the graph object itself, dropped with it: an id() key outlives the graph, and the
        # next graph allocated at its address would get its times
        self._cache: weakref.WeakKeyDictionary[OpGraph, dict[str, tuple[np.ndarray, np.ndarray]]] = (
            weakref.WeakKeyDictionary())

    def efficiency(self, device: DeviceType, precision: str = "fp32") -> Efficiency:
        return self.calibration.efficiency(device, precision)

    def roofline_s(self, flops, nbytes, device: DeviceType, precision: str = "fp32"):
        return roofline_s(flops, nbytes, device, self.efficiency(device, precision), precision)

    def optimizer_step_s(self, param_bytes: float, device: DeviceType, optimizer_states: int, *,
                         precision: str = "fp32", tensors: float = 0.0) -> float:
        """One optimizer step over ``param_bytes`` (fp32 sizes) of weights in ``tensors`` parameter tensors on
        ``device``, training in ``precision`` (0 without weights): :func:`gpualloc.cost.physics.optimizer_step_s` of
        the step's traffic (:func:`~gpualloc.cost.physics.optimizer_traffic_bytes`) with the calibration's
        :meth:`Calibration.optimizer_cost` of the device."""
        if param_bytes <= 0:
            return 0.0
        c = self.optimizer_cost(device, optimizer_states, precision)
        traffic = float(physics.optimizer_traffic_bytes(param_bytes, optimizer_states, precision))
        return physics.optimizer_step_s(traffic, tensors, c.per_tensor_s, _bandwidth(device) * c.memory, c.fixed_s,
                                        c.overlap)

    def optimizer_cost(self, device: DeviceType, optimizer_states: int, precision: str = "fp32") -> OptimizerCost:
        """:meth:`Calibration.optimizer_cost` of the optimizer that keeps ``optimizer_states`` states a weight."""
        from gpualloc.cost.memory import optimizer_named

        return self.calibration.optimizer_cost(device, precision, optimizer_named(optimizer_states))

    def optimizer_floor_s(self, param_bytes: np.ndarray, tensors: np.ndarray, device: DeviceType,
                          optimizer_states: int, precision: str = "fp32") -> np.ndarray:
        """Per-part lower bounds that add up: for any set of the parts (layers) held by one device, their sum is at
        most :meth:`optimizer_step_s` of the set's weights and tensors. Host and device times where they run one
        after the other; where they overlap, the larger of the two *over all the parts* (max(h, d) >= h and >= d
        for every subset). The fixed cost is left out."""
        p = np.asarray(param_bytes, dtype=np.float64)
        t = np.asarray(tensors, dtype=np.float64)
        c = self.optimizer_cost(device, optimizer_states, precision)
        host = np.where(p > 0, t * c.per_tensor_s, 0.0)  # no weights, no step
        dev = physics.optimizer_traffic_bytes(p, optimizer_states, precision) / (_bandwidth(device) * c.memory)
        if not c.overlap:
            return host + dev
        return host if host.sum() >= dev.sum() else dev

    def op_times_s(self, graph: OpGraph, device: DeviceType, precision: str = "fp32") -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward time of every node of ``graph`` on ``device`` in ``precision`` (seconds, arrays).

        Measured times were taken in the graph's precision (``meta["precision"]``, fp32 by default); in another
        one they are scaled by the roofline ratio of the two precisions on the device, the rule that moves them
        between device types."""
        per_device = self._cache.setdefault(graph, {})
        hit = per_device.get((device.name, precision))
        if hit is not None:
            return hit
        measured_in = str(graph.meta.get("precision", "fp32"))
        n = len(graph)
        fwd = np.full(n, np.nan)
        bwd = np.full(n, np.nan)
        need_roofline = np.ones(n, dtype=bool)
        for i, node in enumerate(graph.nodes):
            if not node.time_ms:
                continue
            t = node.time_ms.get(device.name)
            if t is not None and precision == measured_in:
                fwd[i] = t.fwd_ms / 1e3
                bwd[i] = (t.bwd_ms if t.bwd_ms is not None else BWD_FACTOR * t.fwd_ms) / 1e3
                need_roofline[i] = False
                continue
            ref_name, ref_t = (device.name, t) if t is not None else next(iter(node.time_ms.items()))
            ref = self._resolve(ref_name) if t is None else device
            if ref is None:
                continue
            here_f, ref_f = self._pair_roofline(graph, i, (device, precision), (ref, measured_in), 1.0)
            here_b, ref_b = self._pair_roofline(graph, i, (device, precision), (ref, measured_in), BWD_FACTOR)
            fwd[i] = ref_t.fwd_ms / 1e3 * here_f / ref_f
            ref_bwd = ref_t.bwd_ms if ref_t.bwd_ms is not None else BWD_FACTOR * ref_t.fwd_ms
            bwd[i] = ref_bwd / 1e3 * here_b / ref_b
            need_roofline[i] = False
        if need_roofline.any():
            idx = np.flatnonzero(need_roofline)
            flops, nbytes = graph.flops[idx], graph.bytes_accessed[idx]
            fwd[idx] = self.roofline_s(flops, nbytes, device, precision)
            bwd[idx] = self.roofline_s(BWD_FACTOR * flops, BWD_FACTOR * nbytes, device, precision)
        fwd.setflags(write=False)
        bwd.setflags(write=False)
        per_device[(device.name, precision)] = (fwd, bwd)
        return fwd, bwd

    def _resolve(self, name: str) -> DeviceType | None:
        try:
            return self.catalog.device(name)
        except Exception:  # a device type the catalog does not know: no transfer possible
            return None

    def _pair_roofline(self, graph: OpGraph, i: int, here: tuple[DeviceType, str], ref: tuple[DeviceType, str],
                       factor: float):
        f, b = factor * graph.flops[i], factor * graph.bytes_accessed[i]
        return float(self.roofline_s(f, b, *here)), float(self.roofline_s(f, b, *ref))

    def step_time_s(self, graph: OpGraph, device: DeviceType, precision: str = "fp32") -> float:
        """Forward + backward time of the whole graph on one device, ops run one after another."""
        fwd, bwd = self.op_times_s(graph, device, precision)
        return float(fwd.sum() + bwd.sum())

    @staticmethod
    def power_w(device: DeviceType, utilisation: float | np.ndarray):
        """Board power at ``utilisation`` in [0, 1]: idle + (TDP - idle) x utilisation."""
        return physics.power_w(device.idle_w, device.tdp_w, utilisation)

    def energy_j(self, device: DeviceType, busy_s: float, wall_s: float) -> float:
        """Energy over ``wall_s`` seconds of which ``busy_s`` were busy (power linear in utilisation)."""
        return float(physics.energy_j(device.idle_w, device.tdp_w, busy_s, wall_s))


def training_memory_bytes(graph: OpGraph, device: DeviceType | None = None, rules=None, *,
                          gpu: bool | None = None) -> float:
    """Peak memory to train ``graph`` on one device (:func:`gpualloc.cost.memory.device_memory`: weights,
    gradients, optimizer state, the activations its layers save for the backward
    (:func:`gpualloc.graph.layers.node_saved_act_bytes`, the simulators' rule), the backward's and the loss's
    working sets, fragmentation margin and, given a ``device``, its framework reserve) under ``rules`` (default:
    fp32, Adam): what the op-level simulator gives a one-device plan of one microbatch. ``gpu``: whether it trains on
    a GPU (one-byte dropout masks; default: whether ``device`` is one)."""
    from gpualloc.cost.memory import MemoryRules, StageShape, bool_masks, device_memory

    rules = rules if rules is not None else MemoryRules()
    batch = graph.batch_size or 1
    on_gpu = bool_masks([device]) if gpu is None and device is not None else bool(gpu)
    shape = StageShape(graph.total_param_bytes, float(graph.param_bytes.max(initial=0.0)),
                       float(node_saved_act_bytes(graph, rules.prec.value_bytes, on_gpu).sum()) / batch, 0.0, 0.0,
                       float(graph.output_bytes.max(initial=0.0)) / batch, float(graph.loss_input_bytes.sum()) / batch)
    return float(device_memory(rules, device, shape, tp=1, dp=1, mb=batch, in_flight=1).peak)
