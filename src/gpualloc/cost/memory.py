"""Training memory of one device, part by part, and the precision a plan trains in.

One rule, called by every planner, baseline and simulator. A device that holds ``n`` parameters of a stage
(``tp``-way tensor parallel, ``dp`` data-parallel replicas) and trains ``mb`` samples a microbatch with
``in_flight`` microbatches held for their backward pins:

* **weights**: the model copy in the compute precision (4 bytes fp32/tf32, 2 bf16/fp16), ``n / tp``;
* **grads**: the same size again, plus PyTorch DDP's gradient buckets when ``dp > 1`` (DDP copies the
  gradients into flat bucket buffers for the all-reduce unless ``gradient_as_bucket_view``, so the
  gradients are held twice; Li et al., VLDB 2020);
* **optimizer**: the states of the optimizer in fp32 (Adam 2, SGD with momentum 1, plain SGD 0 tensors per
  weight) plus, in mixed precision, the fp32 master weights: Adam costs 16 bytes a parameter in every
  precision (4 + 4 + 8 in fp32; 2 + 2 + 12 mixed; Rajbhandari et al., ZeRO, SC 2020, section 3.1);
* **sharding** (ZeRO stages, the same paper): ZeRO-1 divides the optimizer by ``dp``; ZeRO-2 the gradients
  too (one bucket stays whole); ZeRO-3 / FSDP the weights too, plus the gathered weights and gradients of the
  two largest layers in flight (the unit being computed and the one prefetched);
* **activations**: the bytes the layers save for backward, per sample (measured in fp32: saved-tensor
  hooks on the real model, or the profile's own count), times the precision's bytes over 4, ``mb``,
  ``in_flight`` and ``1 / tp``; with activation recomputation only each layer's input is kept per microbatch
  in flight, and one layer's full activations while it is recomputed; plus the backward's working set, the
  gradient of the stage's largest layer output for one microbatch, and on the stage that computes the loss
  two more copies of the model's output for one microbatch (:data:`LOSS_FP32_COPIES`: a cross-entropy's
  backward holds four, a language model's logits among the largest tensors of a step);
* **two moments**: the peak is the larger of the backward (activations in flight beside the gradients:
  all of them when microbatches accumulate, else the larger of the two, as the backward frees one while it
  makes the other) and the optimizer step (gradients, and Adam's temporaries: for every local parameter at
  once on a GPU, where ``torch.optim.Adam`` runs ``foreach``, one tensor at a time on a CPU); measured on CPU
  against real ``DistributedDataParallel`` by ``benchmarks/ddp_memory.py``;
* a **fragmentation** margin on all of the above (the caching allocator rounds blocks to 512 B and splits
  2 MB / 20 MB segments; 5% by default);
* the **reserve** the framework holds outside the tensors: CUDA context, cuBLAS workspaces, NCCL buffers.
  Sailor (eth-easl/sailor, SOSP'25) measured 2 GB with one GPU a TP group and 3 GB with more on A100 and
  V100 under Megatron-DeepSpeed, shown by nvidia-smi but not by PyTorch; that is the default for GPUs. A
  device type's ``reserve_gib`` (catalog or cluster file) and ``MemoryRules.reserve_bytes`` override it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from gpualloc.errors import CostModelError
from gpualloc.hardware.catalog import DeviceType

GB = 1e9
PROFILE_VALUE_BYTES = 4
"""Graphs and profiles give sizes in fp32 bytes (the precision they were captured or measured in)."""


@dataclass(frozen=True)
class Precision:
    """A training precision: the bytes of a value in compute, fp32 master weights or not, and its peak.

    Attributes:
        name: ``fp32``, ``tf32``, ``bf16`` or ``fp16``.
        value_bytes: bytes of an activation, a model weight and a gradient in compute.
        mixed: the optimizer keeps fp32 master weights beside the low-precision model (Micikevicius et al.,
            Mixed Precision Training, ICLR 2018).
        peak_field: the catalog field of the device's peak in this precision.
    """

    name: str
    value_bytes: int
    mixed: bool
    peak_field: str

    def peak_tflops(self, device: DeviceType) -> float | None:
        """The device's dense peak in this precision (None: it cannot run it)."""
        if self.name == "fp16" and device.vendor not in GPU_VENDORS:
            return None  # no fp16 training on CPUs (PyTorch's CPU autocast is bf16 only)
        return getattr(device, self.peak_field)

    def check(self, device: DeviceType) -> None:
        """Raise :class:`CostModelError` when ``device`` cannot train in this precision."""
        if self.peak_tflops(device) is None:
            raise CostModelError(f"precision {self.name}: device type {device.name!r} does not support it "
                                 f"(no {self.peak_field} in the catalog); choose another --precision")


PRECISIONS: dict[str, Precision] = {
    "fp32": Precision("fp32", 4, False, "fp32_tflops"),
    "tf32": Precision("tf32", 4, False, "tf32_tflops"),
    "bf16": Precision("bf16", 2, True, "bf16_tflops"),
    "fp16": Precision("fp16", 2, True, "tensor_tflops"),
}

OPTIMIZER_STATES: dict[str, int] = {"adam": 2, "sgd-momentum": 1, "sgd": 0}
"""fp32 state tensors an optimizer keeps per weight (Adam: first and second moments)."""


def optimizer_named(states: int) -> str:
    """The optimizer of :data:`OPTIMIZER_STATES` that keeps ``states`` state tensors a weight."""
    for name, n in OPTIMIZER_STATES.items():
        if n == int(states):
            return name
    raise CostModelError(f"optimizer_states: no optimizer keeps {states!r} states a weight; expected one of "
                         f"{sorted(OPTIMIZER_STATES.values())}")

SHARDINGS = ("none", "zero1", "zero2", "fsdp")
"""Nothing sharded; optimizer states (ZeRO-1); and gradients (ZeRO-2); and weights (ZeRO-3 / FSDP)."""

WHOLE_TENSOR_SHARDS = ("zero1",)
"""The shardings whose replicas each step whole parameter tensors, a share of the list (the engine's ZeRO-1:
``ZeroRedundancyOptimizer``); under the others (FSDP2's ``fully_shard``, ZeRO-2 and FSDP) each replica steps a
shard of every tensor. An optimizer step pays host work per tensor it steps."""

FRAGMENTATION = 0.05
GPU_RESERVE_BYTES = 2.0 * GB
TP_RESERVE_BYTES = 1.0 * GB
"""The default reserve: 2 GB on a GPU, 1 GB more when it is part of a TP group (Sailor's measurements)."""


def precision(name: str) -> Precision:
    """The precision called ``name``; a :class:`CostModelError` naming the choices otherwise."""
    try:
        return PRECISIONS[name]
    except KeyError:
        raise CostModelError(f"precision: unknown {name!r}; expected one of {', '.join(PRECISIONS)}") from None


@dataclass(frozen=True)
class MemoryRules:
    """What a plan's memory is counted under (one object, carried by the problem).

    Attributes:
        precision: training precision (see :data:`PRECISIONS`).
        optimizer: ``adam``, ``sgd-momentum`` or ``sgd``.
        fragmentation: margin on the tensors' bytes for the caching allocator.
        reserve_bytes: framework reserve on every device; None: each device type's own or the default.
        bucket_mb: DDP / ZeRO-2 gradient bucket size.
    """

    precision: str = "fp32"
    optimizer: str = "adam"
    fragmentation: float = FRAGMENTATION
    reserve_bytes: float | None = None
    bucket_mb: float = 25.0

    def __post_init__(self) -> None:
        precision(self.precision)
        if self.optimizer not in OPTIMIZER_STATES:
            raise CostModelError(f"optimizer: unknown {self.optimizer!r}; expected one of "
                                 f"{', '.join(OPTIMIZER_STATES)}")
        if not 0 <= self.fragmentation <= 1:
            raise CostModelError(f"fragmentation: must be in [0, 1], got {self.fragmentation}")
        if self.reserve_bytes is not None and not 0 <= self.reserve_bytes <= 1e15:
            raise CostModelError(f"reserve: must be in 0..1e15 bytes, got {self.reserve_bytes}")

    @property
    def prec(self) -> Precision:
        return PRECISIONS[self.precision]

    def optimizer_bytes_per_param(self) -> int:
        """fp32 optimizer states, plus the fp32 master weights in mixed precision."""
        return 4 * OPTIMIZER_STATES[self.optimizer] + (4 if self.prec.mixed else 0)

    def bytes_per_param(self) -> int:
        """Weights + gradients + optimizer of one unsharded parameter, without DDP's buckets (Adam: 16)."""
        return 2 * self.prec.value_bytes + self.optimizer_bytes_per_param()


GPU_VENDORS = ("nvidia", "amd")
"""Vendors whose devices PyTorch drives through CUDA or ROCm (fp16 training, ``foreach`` optimizers, the reserve,
one-byte dropout masks)."""


def bool_masks(devices) -> bool:
    """Whether dropout saves one-byte masks on ``devices`` (catalog types): on GPUs, whose ``native_dropout``
    does; a CPU saves them in the input's dtype (:func:`gpualloc.graph.layers.saved_act_bytes`)."""
    devices = list(devices)
    return bool(devices) and all(d.vendor in GPU_VENDORS for d in devices)


def reserve_bytes(device: DeviceType | None, rules: MemoryRules, tp: int = 1) -> float:
    """The framework's reserve on a device of ``device`` type in a TP group of ``tp`` (see the module doc);
    none without a device (the tensors alone)."""
    if device is None:
        return 0.0
    if rules.reserve_bytes is not None:
        return float(rules.reserve_bytes)
    if device.reserve_bytes is not None:
        return float(device.reserve_bytes)
    if device.vendor in GPU_VENDORS:
        return GPU_RESERVE_BYTES + (TP_RESERVE_BYTES if tp > 1 else 0.0)
    return 0.0  # a CPU "device": the process's own baseline is outside what the plan allocates


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory at its peak, in bytes; ``peak`` is what must fit the device."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    fragmentation: float
    reserve: float
    phase: str = "backward"
    """The moment of the peak (``backward`` or ``optimizer step``); the parts are those alive then."""

    @property
    def peak(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.fragmentation + self.reserve

    def to_dict(self) -> dict[str, float | str]:
        return {**asdict(self), "peak": self.peak}


NO_MEMORY = DeviceMemory(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, "")
"""What an unused device holds for the plan."""


@dataclass(frozen=True)
class StageShape:
    """What a device's memory depends on in its stage, sizes in fp32 bytes as the graph gives them.

    Attributes:
        param_bytes: the stage's parameters (all TP ranks together).
        largest_layer_param_bytes: its largest layer's (FSDP gathers one layer at a time).
        act_bytes_per_sample: activations the stage's layers save for backward, per sample.
        input_bytes_per_sample: every layer's input, per sample (what recomputation keeps).
        largest_layer_act_bytes_per_sample: the largest layer's saved activations (recomputed one at a time).
        largest_output_bytes_per_sample: the largest output of a layer (its gradient is allocated, beside the
            saved tensors, while the backward runs through that layer: the backward's working set).
        loss_input_bytes_per_sample: the model outputs this stage computes, which the loss reads (the last
            stage's; 0 elsewhere): see :data:`LOSS_FP32_COPIES`.
    """

    param_bytes: float
    largest_layer_param_bytes: float
    act_bytes_per_sample: float
    input_bytes_per_sample: float
    largest_layer_act_bytes_per_sample: float
    largest_output_bytes_per_sample: float = 0.0
    loss_input_bytes_per_sample: float = 0.0


LOSS_FP32_COPIES = 2
"""Copies of the loss's input (the model's output, e.g. a language model's logits) that a cross-entropy adds at
its backward to what the other terms count. Four are alive in ``log_softmax``'s backward: the input, its
log-probabilities (saved), their gradient and the input's gradient. The saved activations count one (the
log-probabilities where they were measured, the output by the output rule) and the working set one (the
gradient of the largest output); these are the other two, counted in fp32 (autocast and the engine compute
the loss in fp32 whatever the training precision). Measured on CPU by ``benchmarks/loss_memory.py``."""


def device_memory(rules: MemoryRules, device: DeviceType | None, shape: StageShape, *, tp: int, dp: int, mb: int,
                  in_flight: int, sharding: str = "none", recompute: bool = False,
                  microbatches: int = 1, foreach: bool | None = None) -> DeviceMemory:
    """The peak memory of one device of a stage replica (see the module docstring for every term); without
    a ``device``, no reserve. The sizes of ``shape`` may be numpy arrays (one device each).

    The peak is the larger of two moments, and the parts reported are those of that moment:

    * **backward**: weights, optimizer state, DDP's buckets, the activations in flight and the gradients. With
      more than one microbatch (``microbatches``) the gradients accumulated since the first backward live beside
      the activations; with one, the backward frees activations as it makes gradients (``zero_grad`` sets them
      to None, PyTorch's default), so the two count as the larger of them;
    * **optimizer step**: weights, optimizer state, gradients and buckets, and the step's temporaries: Adam's
      ``sqrt(v) + eps`` for every local parameter at once on a GPU (``torch.optim.Adam`` runs ``foreach`` there),
      for one tensor at a time on a CPU (counted as two of the largest layer's); ``foreach`` overrides the
      device's default.
    """
    if sharding not in SHARDINGS:
        raise CostModelError(f"sharding: unknown {sharding!r}; expected one of {', '.join(SHARDINGS)}")
    vb = rules.prec.value_bytes
    n = shape.param_bytes / PROFILE_VALUE_BYTES / tp  # parameters on this device
    n_layer = shape.largest_layer_param_bytes / PROFILE_VALUE_BYTES / tp
    shard = max(int(dp), 1)
    weights, grads, buffers = n * vb, n * vb, 0.0 * n
    optimizer = n * rules.optimizer_bytes_per_param()
    if sharding in ("none", "zero1") and shard > 1:
        buffers = n * vb  # DDP's bucket copies of the gradients
    if sharding != "none":
        optimizer = optimizer / shard
    if sharding == "zero2":
        grads, buffers = grads / shard, np.minimum(rules.bucket_mb * 1e6, grads)
    elif sharding == "fsdp":
        weights = weights / shard + 2 * n_layer * vb  # the unit computed and the one prefetched, gathered
        grads = grads / shard + n_layer * vb  # one unit's full gradient before its reduce-scatter
    scale = vb / PROFILE_VALUE_BYTES * mb / tp
    if recompute:
        acts = scale * (shape.input_bytes_per_sample * in_flight + shape.largest_layer_act_bytes_per_sample)
    else:
        acts = scale * shape.act_bytes_per_sample * in_flight
    acts = acts + scale * shape.largest_output_bytes_per_sample  # the gradient of the largest output, once
    acts = acts + LOSS_FP32_COPIES * shape.loss_input_bytes_per_sample * mb / tp  # the loss's, in fp32
    grads_in_backward = grads if microbatches > 1 else np.maximum(grads - acts, 0.0)
    if foreach is None:
        foreach = device is not None and device.vendor in GPU_VENDORS
    local = n / (shard if sharding != "none" else 1)
    temps = OPTIMIZER_TEMPORARIES[rules.optimizer] * PROFILE_VALUE_BYTES * (local if foreach else 2 * n_layer)
    backward = weights + optimizer + buffers + grads_in_backward + acts
    step = weights + optimizer + temps + buffers + grads
    at_step = step > backward
    pick = (lambda x, y: np.where(at_step, x, y)) if np.ndim(at_step) else (lambda x, y: x if at_step else y)
    tensors = np.maximum(backward, step)
    phase = ("optimizer step" if np.all(at_step) else "backward" if not np.any(at_step) else "per node")
    return DeviceMemory(weights, buffers + pick(grads, grads_in_backward), pick(optimizer + temps, optimizer),
                        pick(0.0 * acts, acts), rules.fragmentation * tensors, reserve_bytes(device, rules, tp), phase)


OPTIMIZER_TEMPORARIES: dict[str, int] = {"adam": 1, "sgd-momentum": 0, "sgd": 0}
"""fp32 temporaries an optimizer's step allocates per parameter it updates (Adam: its denominator)."""


MEMORY_BINDS_AT = 0.9
"""Fill of the fullest device from which memory, not time, is named as what binds the plan."""


def memory_report(labels: list[str], memory: tuple[DeviceMemory, ...]) -> dict[str, dict[str, float | str]]:
    """Each used device's breakdown (``weights``, ``grads``, ``optimizer``, ``activations``, ``fragmentation``,
    ``reserve``, ``peak``; bytes) and the ``phase`` of its peak, by device label."""
    return {label: m.to_dict() for label, m in zip(labels, memory, strict=True) if m.peak > 0}


def binding_constraint(labels: list[str], memory: tuple[DeviceMemory, ...], caps, time_parts: dict[str, float]
                       ) -> dict[str, object]:
    """What limits the plan: memory on its fullest device when that is over capacity or above
    :data:`MEMORY_BINDS_AT` of it, else the largest of ``time_parts`` (e.g. compute, communication, bubble
    seconds). Always names the fullest device, its fill and its largest part."""
    fills = [m.peak / float(c) if c > 0 else float("inf") for m, c in zip(memory, caps, strict=True)]
    j = max(range(len(fills)), key=fills.__getitem__)
    parts = {k: v for k, v in memory[j].to_dict().items() if k not in ("peak", "phase")}
    out: dict[str, object] = {"fullest_device": labels[j], "fill": fills[j], "largest_part": max(parts, key=parts.get)}
    if fills[j] > 1.0:
        out["name"] = "memory (over capacity)"
    elif fills[j] >= MEMORY_BINDS_AT:
        out["name"] = "memory"
    else:
        out["name"] = max(time_parts, key=time_parts.get) if time_parts else "compute"
    return out
