"""The telemetry interface: what one training step looked like on the devices and links.

A :class:`TelemetrySource` returns one :class:`StepSample` per call: the step's time and batch, one
:class:`DeviceSample` per device and one :class:`LinkSample` per directed link it could measure.
Every sample is a frozen dataclass with units in field names. Any field a backend cannot read is
None, so a consumer works on whatever the backend has: an NVML backend reads utilisation, memory,
temperature, power and clocks but cannot time one job's kernels, while the simulator knows each
device's busy time exactly.

Consumers (the drift monitor in :mod:`gpualloc.placement.replan`) must not tell backends apart: the
same code reads a simulated step and a real one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["DeviceSample", "LinkSample", "StepSample", "TelemetrySource"]


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
