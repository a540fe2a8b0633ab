"""What a whole graph costs on one device: the numbers behind ``gpualloc cost estimate``."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from gpualloc.cost.memory import OPTIMIZER_STATES, bool_masks
from gpualloc.cost.model import CostModel, peak_ceiling_tflops, training_memory_bytes
from gpualloc.graph.ir import OpGraph
from gpualloc.graph.layers import param_tensors
from gpualloc.hardware.catalog import TERA, DeviceType


@dataclass(frozen=True)
class DeviceEstimate:
    """One training step (forward + backward, ops one after another, then the optimizer step) of a graph on
    one device: the step the placement simulator gives the graph placed on that device alone.

    ``fp32_utilisation`` is ``achieved_tflops`` over the fastest FP32 math the device has
    (:func:`~gpualloc.cost.model.peak_ceiling_tflops`: TF32 tensor cores where present), in [0, 1].
    """

    device: str
    step_time_s: float
    fwd_time_s: float
    bwd_time_s: float
    optimizer_s: float
    samples_per_s: float | None
    achieved_tflops: float
    fp32_utilisation: float | None
    memory_bytes: float
    device_mem_bytes: int
    fits: bool
    power_w: float
    energy_per_step_j: float
    measured_ops: int
    compute_bound_ops: int

    def to_dict(self) -> dict:
        return asdict(self)


def estimate(graph: OpGraph, device: DeviceType, model: CostModel | None = None,
             optimizer_states: int = OPTIMIZER_STATES["adam"]) -> DeviceEstimate:
    """Cost of one training step of ``graph`` alone on ``device`` (the device busy throughout)."""
    model = model or CostModel()
    fwd, bwd = model.op_times_s(graph, device)
    opt = model.optimizer_step_s(float(graph.param_bytes.sum()), device, optimizer_states,
                                 tensors=float(param_tensors(graph).sum()))
    step = float(fwd.sum() + bwd.sum()) + opt
    work = graph.total_flops * 3.0  # forward + backward (2x forward)
    mem = training_memory_bytes(graph, gpu=bool_masks([device]))
    measured = sum(1 for n in graph.nodes if device.name in n.time_ms)
    eff = model.efficiency(device)
    compute_bound = 0
    if device.fp32_tflops and device.mem_bandwidth_bytes_per_s:
        compute_bound = int(np.sum(graph.flops / (device.fp32_tflops * TERA * eff.compute)
                                   > graph.bytes_accessed / (device.mem_bandwidth_bytes_per_s * eff.memory)))
    power = float(model.power_w(device, 1.0))
    achieved = work / step / TERA if step > 0 else 0.0
    # Against the fastest FP32 math the device has (TF32 tensor cores included), never above 100%: the roofline
    # cannot exceed it, and a measured time (time_ms) faster than it means the FLOP count is overstated.
    ceiling = peak_ceiling_tflops(device, "fp32")
    return DeviceEstimate(
        device=device.name,
        step_time_s=step,
        fwd_time_s=float(fwd.sum()),
        bwd_time_s=float(bwd.sum()),
        optimizer_s=opt,
        samples_per_s=graph.batch_size / step if graph.batch_size and step > 0 else None,
        achieved_tflops=achieved,
        fp32_utilisation=min(1.0, achieved / ceiling) if ceiling else None,
        memory_bytes=mem,
        device_mem_bytes=device.mem_bytes,
        fits=mem <= device.mem_bytes,
        power_w=power,
        energy_per_step_j=power * step,
        measured_ops=measured,
        compute_bound_ops=compute_bound,
    )
