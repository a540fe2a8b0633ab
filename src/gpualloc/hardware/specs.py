"""What one kind of device and one kind of link are: the frozen :class:`DeviceType` and :class:`LinkType`.

They sit apart from :mod:`gpualloc.hardware.catalog` (which loads them from ``devices.toml`` through the
input models of :mod:`gpualloc.hardware.schema`) so that the schema can build them without importing the
catalog back: no import cycle. ``gpualloc.hardware.catalog`` re-exports both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

TERA = 1e12


@dataclass(frozen=True)
class DeviceType:
    """One kind of accelerator (or the host CPU).

    Attributes:
        name: canonical name, e.g. ``"A100-80GB"``.
        vendor: ``"nvidia"``, ``"amd"``, ``"intel"`` or ``"other"``.
        architecture: e.g. ``"ampere"``, ``"cdna2"``.
        tensor_tflops: dense FP16/BF16 tensor-core peak, TFLOP/s.
        fp32_tflops: FP32 (non-tensor) peak, TFLOP/s.
        fp64_tflops: FP64 peak, TFLOP/s.
        tf32_tflops: dense TF32 tensor peak, TFLOP/s (None: no TF32, training in TF32 is refused).
        bf16_tflops: dense BF16 peak, TFLOP/s (None: no BF16 support, training in BF16 is refused).
        reserve_bytes: device memory the framework keeps for itself (CUDA context, communication buffers,
            allocator cache); None: the default of :func:`gpualloc.cost.memory.reserve_bytes`.
        mem_bytes: device memory.
        mem_bandwidth_bytes_per_s: device memory bandwidth.
        tdp_w: board power limit.
        idle_w: power drawn when idle.
        link: name of the best link between two devices of this type inside one node.
        source: where the numbers come from (vendor datasheet or whitepaper).
        aliases: other names accepted on input, e.g. ``("A100",)``.
    """

    name: str
    vendor: str
    architecture: str
    tensor_tflops: float | None
    fp32_tflops: float | None
    fp64_tflops: float | None
    mem_bytes: int
    mem_bandwidth_bytes_per_s: float | None
    tdp_w: float
    idle_w: float
    link: str = "pcie3"
    source: str = ""
    aliases: tuple[str, ...] = ()
    tf32_tflops: float | None = None
    bf16_tflops: float | None = None
    reserve_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["aliases"] = list(self.aliases)
        return d


@dataclass(frozen=True)
class LinkType:
    """A kind of interconnect. Bandwidth is per direction, for one device pair.

    What a transfer over it costs is :func:`gpualloc.cost.physics.transfer_time_s` (the hardware layer
    describes links; the formula lives with the other costs).

    Attributes:
        name: e.g. ``"nvlink3"``, ``"pcie4"``, ``"ib-hdr"``.
        kind: ``"nvlink"``, ``"infinity-fabric"``, ``"pcie"`` or ``"network"``.
        bandwidth_bytes_per_s: usable bandwidth per direction.
        latency_s: one-way latency of a small message.
        source: where the numbers come from.
    """

    name: str
    kind: str
    bandwidth_bytes_per_s: float
    latency_s: float
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
