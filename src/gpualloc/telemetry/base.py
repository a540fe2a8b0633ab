"""The telemetry interface: what one training step looked like on the devices and links.

A :class:`TelemetrySource` returns one :class:`StepSample` per call: the step's time and batch, one
:class:`DeviceSample` per device and one :class:`LinkSample` per directed link it could measure.
Every sample is a frozen dataclass with units in field names. Any field a backend cannot read is
None, so a consumer works on whatever the backend has: an NVML backend reads utilisation, memory,
temperature, power and clocks but cannot time one job's kernels, while the simulator knows each
device's busy time exactly.

Consumers (the drift monitor in :mod:`gpualloc.placement.replan`) must not tell backends apart: the
same code reads a simulated step and a real one.

A device monitor (:class:`DeviceTelemetry`: NVML, the simulator, a recording; see
``docs/telemetry.md``) reports what the devices are doing regardless of any one job: one
:class:`DeviceRecord` per device per sample. :meth:`DeviceRecord.to_sample` turns a reading into a
:class:`DeviceSample` for step-level consumers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol, runtime_checkable

from gpualloc.errors import GpuallocError

__all__ = [
    "RECORD_FIELDS",
    "Backend",
    "THROTTLE_REASON_BITS",
    "DeviceInfo",
    "DeviceRecord",
    "DeviceSample",
    "DeviceTelemetry",
    "LinkSample",
    "StepSample",
    "TelemetryError",
    "TelemetryExhausted",
    "TelemetrySource",
    "throttle_mask",
    "throttle_names",
]


@dataclass(frozen=True)
class DeviceSample:
    """One device at one instant.

    Attributes:
        device: index in the cluster's device list.
        time_s: when the sample was taken (seconds since the start of the run).
        utilization: fraction of the time a kernel was running, 0..1.
        mem_used_bytes: device memory in use.
        mem_total_bytes: device memory capacity.
        temperature_c: GPU temperature in degrees Celsius.
        power_w: power draw.
        sm_clock_ratio: current SM clock over its maximum; below 1 while the device throttles.
        mem_bandwidth_util: fraction of the memory bandwidth in use, 0..1.
    """

    device: int
    time_s: float
    utilization: float | None = None
    mem_used_bytes: float | None = None
    mem_total_bytes: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_ratio: float | None = None
    mem_bandwidth_util: float | None = None


@dataclass(frozen=True)
class LinkSample:
    """The bandwidth measured on the directed link ``src -> dst`` (None where nothing was sent)."""

    src: int
    dst: int
    time_s: float
    bandwidth_bytes_per_s: float | None = None


@dataclass(frozen=True)
class StepSample:
    """One training step as the telemetry saw it.

    Attributes:
        iteration: index of the step (0-based) the sample describes.
        time_s: when the step ended (seconds since the start of the run).
        step_time_s: how long the step took.
        batch_size: samples in the step.
        devices: one sample per device, in device order.
        links: samples of the links that carried data (any order).
        device_busy_s: compute time of the job on each device during the step, where the backend can
            attribute it (a profiler, the simulator); None otherwise, and consumers fall back on
            ``utilization x step_time_s``.
    """

    iteration: int
    time_s: float
    step_time_s: float
    batch_size: int
    devices: tuple[DeviceSample, ...]
    links: tuple[LinkSample, ...] = ()
    device_busy_s: tuple[float, ...] | None = None


@runtime_checkable
class TelemetrySource(Protocol):
    """Anything that can report the latest training step."""

    def sample(self) -> StepSample:
        """The most recent step's sample."""
        ...


# ------------------------------------------------------------------------------------------ device telemetry
class TelemetryError(GpuallocError):
    """A telemetry backend cannot start or read: no NVML library or driver, a bad recording file."""


class TelemetryExhausted(TelemetryError):
    """A finite source (a recording played once) has no more samples: the end, not a failure."""


THROTTLE_REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
"""Clock throttle (NVML: "clocks event") reasons by name, with NVML's bit in the reason mask
(``nvmlClocksThrottleReason*`` / ``nvmlClocksEventReason*``; DCGM exports the same mask as
``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``)."""


def throttle_names(mask: int) -> tuple[str, ...]:
    """The names of the reasons set in an NVML reason mask, in bit order (unknown bits are dropped)."""
    return tuple(name for name, bit in THROTTLE_REASON_BITS.items() if mask & bit)


def throttle_mask(names: tuple[str, ...]) -> int:
    """The NVML reason mask of ``names`` (names without a bit are ignored)."""
    mask = 0
    for name in names:
        mask |= THROTTLE_REASON_BITS.get(name, 0)
    return mask


@dataclass(frozen=True)
class DeviceInfo:
    """What a device is (constant while a backend is open).

    Attributes:
        index: the backend's device index (NVML's index; the cluster's device index in simulation).
        name: model name, e.g. ``"NVIDIA A100-SXM4-80GB"`` or a catalog name such as ``"V100-16GB"``.
        uuid: a stable id, ``"GPU-..."``; None where unknown.
        mem_total_bytes: device memory.
        power_limit_w: the enforced board power limit.
    """

    index: int
    name: str
    uuid: str | None = None
    mem_total_bytes: int | None = None
    power_limit_w: float | None = None


@dataclass(frozen=True)
class DeviceRecord:
    """One device at one instant, as a device monitor (nvidia-smi, DCGM) reports it.

    Every reading is None where the backend or the device cannot report it; a consumer never sees a
    made-up 0.

    Attributes:
        index: device index (as :class:`DeviceInfo`).
        name: model name.
        uuid: stable id, or None.
        time_s: when the sample was taken, on the backend's clock: Unix time for NVML, simulated
            seconds for the simulator, the recorded value on replay.
        utilization: fraction of the last sample period in which a kernel ran, 0..1.
        mem_utilization: fraction of the period in which device memory was read or written, 0..1.
        mem_used_bytes: device memory in use.
        mem_total_bytes: device memory capacity.
        power_w: power draw.
        energy_j: energy used since the counter started (driver load for NVML, backend start in
            simulation).
        temperature_c: GPU temperature in degrees Celsius.
        sm_clock_mhz: current SM clock.
        mem_clock_mhz: current memory clock.
        sm_clock_ratio: current SM clock over its maximum; below 1 while the device throttles.
        pcie_tx_bytes_per_s: PCIe transmit throughput.
        pcie_rx_bytes_per_s: PCIe receive throughput.
        throttle_reasons: names from :data:`THROTTLE_REASON_BITS` active now (``()`` = none).
        processes: processes using the device.
    """

    index: int
    name: str
    uuid: str | None = None
    time_s: float | None = None
    utilization: float | None = None
    mem_utilization: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    energy_j: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    sm_clock_ratio: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    throttle_reasons: tuple[str, ...] | None = None
    processes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (``throttle_reasons`` as a list), null where unknown."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.throttle_reasons is not None:
            d["throttle_reasons"] = list(self.throttle_reasons)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceRecord:
        """Inverse of :meth:`to_dict`; missing keys are None."""
        kw = {f.name: data.get(f.name) for f in fields(cls)}
        if kw["throttle_reasons"] is not None:
            kw["throttle_reasons"] = tuple(kw["throttle_reasons"])
        return cls(**kw)

    def to_sample(self, time_s: float | None = None) -> DeviceSample:
        """This reading as a :class:`DeviceSample`, so step-level consumers can read real devices."""
        t = self.time_s if time_s is None else time_s
        return DeviceSample(self.index, 0.0 if t is None else t, self.utilization,
                            None if self.mem_used_bytes is None else float(self.mem_used_bytes),
                            None if self.mem_total_bytes is None else float(self.mem_total_bytes),
                            self.temperature_c, self.power_w, self.sm_clock_ratio, self.mem_utilization)


RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(DeviceRecord))
"""The fields of :class:`DeviceRecord`, in order (the columns of a recording, after ``sample``)."""


@runtime_checkable
class DeviceTelemetry(Protocol):
    """A device monitor: NVML on real GPUs, the simulator, or a recording.

    ``sample()`` returns one :class:`DeviceRecord` per device, in :meth:`devices` order, taken now
    (or at the next simulated or recorded instant); a finite source raises
    :class:`TelemetryExhausted` once it has none left. ``close()`` releases what the backend holds and
    may be called more than once.
    """

    def devices(self) -> list[DeviceInfo]:
        """The devices this backend reports on."""
        ...

    def sample(self) -> list[DeviceRecord]:
        """One record per device."""
        ...

    def close(self) -> None:
        """Release the backend (idempotent)."""
        ...


class Backend:
    """What the backends (NVML, the simulator, a recording) share: :meth:`devices` lists their ``_info``, and
    each is a context manager that closes itself on exit. ``close()`` releases nothing unless a backend
    overrides it."""

    _info: list[DeviceInfo]

    def devices(self) -> list[DeviceInfo]:
        return list(self._info)

    def close(self) -> None:
        """Nothing to release; present for the interface."""

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
