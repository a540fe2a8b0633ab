"""Simulated device telemetry: the simulators' devices read like real ones.

:class:`SimTelemetry` is a :class:`~gpualloc.telemetry.base.DeviceTelemetry` over a cluster's
devices. Each :meth:`~SimTelemetry.sample` reports the devices at the current simulated time and
then moves the clock on by ``step_s``. What runs where comes from a :class:`DeviceLoad`:

* :class:`gpualloc.scheduling.timeline.ClusterTimeline`: a cluster simulation under a scheduling
  policy, with the GPUs each job held between decision points (it lives with the scheduler, which
  sits above this layer; so does the ``sim`` backend's factory, ``sim_backend``);
* :class:`PlacementLoad`: one training job placed by the placement simulator
  (:class:`gpualloc.placement.replan.SimulatedTelemetry`), drift included.

From the load's utilisation the devices' physics follow, vectorised over devices:

* power ``idle_w + (tdp_w - idle_w) x utilization`` (:func:`gpualloc.cost.physics.power_w`, the cost
  model's energy model);
* energy: power integrated over simulated time since the backend started;
* temperature: a first-order lag (time constant :data:`THERMAL_TAU_S`) towards
  ``AMBIENT_C + FULL_LOAD_RISE_C x power / tdp``;
* ``sm_clock_ratio`` from the load (1 unless the placement run's drift slows the device), with
  throttle reason ``hw_slowdown`` below 1 and ``gpu_idle`` on an idle device, as NVML reports;
* no clock frequencies: the catalog has none, so those fields are None.

Measurement noise (``noise``) multiplies each busy device's utilisation by ``1 + noise x N(0, 1)``,
drawn from ``seed``; two backends with the same arguments give the same samples.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from gpualloc.cost import physics
from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.seeding import seeded
from gpualloc.telemetry.base import Backend, DeviceInfo, DeviceRecord, TelemetryError

__all__ = [
    "AMBIENT_C",
    "FULL_LOAD_RISE_C",
    "THERMAL_TAU_S",
    "DeviceLoad",
    "LoadState",
    "PlacementLoad",
    "SimTelemetry",
]

AMBIENT_C = 30.0
"""Temperature of an idle, cooled device (inlet air plus the idle rise of a datacenter GPU)."""
FULL_LOAD_RISE_C = 50.0
"""Rise above ``AMBIENT_C`` at TDP: 80 C at full load, below the ~85 C where GPUs start to throttle."""
THERMAL_TAU_S = 60.0
"""Time constant of the heat sink: a step in power reaches 63% of its temperature change in this time."""


@dataclass(frozen=True)
class LoadState:
    """What runs on each device at one instant; arrays over devices, NaN where the load cannot tell.

    Attributes:
        utilization: busy fraction, 0..1.
        mem_used_bytes: device memory in use.
        processes: processes (jobs) on each device.
        mem_utilization: memory-bandwidth busy fraction, 0..1.
        sm_clock_ratio: SM clock over its maximum (1 = full speed).
        pcie_tx_bytes_per_s, pcie_rx_bytes_per_s: host traffic.
    """

    utilization: np.ndarray
    mem_used_bytes: np.ndarray
    processes: np.ndarray
    mem_utilization: np.ndarray
    sm_clock_ratio: np.ndarray
    pcie_tx_bytes_per_s: np.ndarray
    pcie_rx_bytes_per_s: np.ndarray


@runtime_checkable
class DeviceLoad(Protocol):
    """Anything that can say what runs on each device at a simulated time."""

    def at(self, time_s: float) -> LoadState:
        """The load at ``time_s`` (callers ask for non-decreasing times)."""
        ...


# ------------------------------------------------------------------------------------------ placement run
class PlacementLoad:
    """One training job from the placement simulator as device load: a :class:`DeviceLoad`.

    ``at(t)`` trains the job (``source.advance``) until its clock reaches ``t`` and reads its latest
    step: per device the busy fraction, the plan's peak memory and the speed factor (a drift event
    that slows a device lowers its clock ratio). Devices the plan leaves unused are idle. The step
    sample carries no memory-bandwidth or PCIe readings, so those are NaN (None in the records).

    Args:
        source: the job, e.g. ``SimulatedTelemetry(problem, plan, DriftSchedule())``.
    """

    def __init__(self, source: Any) -> None:
        self.source = source

    def at(self, time_s: float) -> LoadState:
        step_s = self.source.step().step_time_s
        if step_s > 0 and time_s > self.source.time_s:
            self.source.advance(max(1, math.ceil((time_s - self.source.time_s) / step_s)))
        s = self.source.sample()
        k = len(s.devices)
        util = np.array([d.utilization if d.utilization is not None else np.nan for d in s.devices])
        mem = np.array([d.mem_used_bytes if d.mem_used_bytes is not None else np.nan for d in s.devices])
        ratio = np.array([d.sm_clock_ratio if d.sm_clock_ratio is not None else np.nan for d in s.devices])
        busy = np.asarray(s.device_busy_s) if s.device_busy_s is not None else np.nan_to_num(util)
        nan = np.full(k, np.nan)
        return LoadState(util, mem, (busy > 0).astype(np.int64), nan, ratio, nan, nan)


# ------------------------------------------------------------------------------------------ the backend
class SimTelemetry(Backend):
    """A :class:`~gpualloc.telemetry.base.DeviceTelemetry` over simulated devices.

    Args:
        cluster: the devices (names, memory, idle and TDP power).
        load: what runs on them over time.
        step_s: simulated seconds between two samples.
        start_s: simulated time of the first sample.
        noise: relative measurement noise on a busy device's utilisation.
        seed: the noise's seed.
    """

    @seeded(error=TelemetryError)
    def __init__(self, cluster: ClusterSpec, load: DeviceLoad, *, step_s: float = 1.0, start_s: float = 0.0,
                 noise: float = 0.0, seed: int | np.random.Generator | None = 0) -> None:
        if not step_s > 0:
            raise TelemetryError(f"sim: step_s must be > 0, got {step_s!r}")
        if not noise >= 0:
            raise TelemetryError(f"sim: noise must be >= 0, got {noise!r}")
        self.cluster = cluster
        self.load = load
        self.step_s = float(step_s)
        self.time_s = float(start_s)
        self.noise = float(noise)
        self._rng = np.random.default_rng(seed)  # returns a Generator unchanged
        types = [d.type for d in cluster.devices]
        self._idle_w = np.array([t.idle_w for t in types], dtype=np.float64)
        self._tdp_w = np.array([t.tdp_w for t in types], dtype=np.float64)
        self._mem_total = [int(t.mem_bytes) for t in types]
        ns = uuid.uuid5(uuid.NAMESPACE_URL, "gpualloc-sim")
        self._info = [DeviceInfo(d.index, d.type.name, f"GPU-{uuid.uuid5(ns, f'{cluster.name}/{d.index}')}",
                                 int(d.type.mem_bytes), float(d.type.tdp_w)) for d in cluster.devices]
        self._energy_j = np.zeros(len(types))
        self._temp_c: np.ndarray | None = None
        self._last_s: float | None = None

    @classmethod
    @seeded(error=TelemetryError)
    def from_placement(cls, source: Any, *, step_s: float = 1.0, noise: float = 0.0,
                       seed: int | np.random.Generator | None = 0) -> SimTelemetry:
        """Devices of a placed training job (:class:`PlacementLoad` over a ``SimulatedTelemetry``)."""
        return cls(source.problem.cluster, PlacementLoad(source), step_s=step_s, start_s=source.time_s,
                   noise=noise, seed=seed)

    def sample(self) -> list[DeviceRecord]:
        t = self.time_s
        state = self.load.at(t)
        util = np.asarray(state.utilization, dtype=np.float64)
        if self.noise > 0:
            jitter = 1.0 + self.noise * self._rng.standard_normal(util.size)
            util = np.where(util > 0, np.clip(util * jitter, 0.0, 1.0), util)
        u = np.nan_to_num(util)
        power = physics.power_w(self._idle_w, self._tdp_w, u)
        target = AMBIENT_C + FULL_LOAD_RISE_C * power / self._tdp_w
        if self._temp_c is None or self._last_s is None:
            self._temp_c = target
        else:
            dt = t - self._last_s
            self._energy_j = self._energy_j + power * dt
            self._temp_c = target + (self._temp_c - target) * math.exp(-dt / THERMAL_TAU_S)
        self._last_s = t
        self.time_s = t + self.step_s
        ratio = np.asarray(state.sm_clock_ratio, dtype=np.float64)
        cols = [util, np.asarray(state.mem_utilization, dtype=np.float64),
                np.asarray(state.mem_used_bytes, dtype=np.float64), power, self._energy_j, self._temp_c, ratio,
                np.asarray(state.pcie_tx_bytes_per_s, dtype=np.float64),
                np.asarray(state.pcie_rx_bytes_per_s, dtype=np.float64)]
        # One conversion for all devices: NaN -> None, numpy -> Python floats.
        rows = zip(*([None if v != v else v for v in c.tolist()] for c in cols), strict=False)
        procs = np.asarray(state.processes).tolist()
        out = []
        for info, total, n, (ut, mu, mem, pw, en, temp, r, tx, rx) in zip(
                self._info, self._mem_total, procs, rows, strict=False):
            reasons = () if ut is None or ut > 0 else ("gpu_idle",)
            if r is not None and r < 1.0:
                reasons += ("hw_slowdown",)
            out.append(DeviceRecord(
                index=info.index, name=info.name, uuid=info.uuid, time_s=t, utilization=ut, mem_utilization=mu,
                mem_used_bytes=None if mem is None else int(mem), mem_total_bytes=total, power_w=pw, energy_j=en,
                temperature_c=temp, sm_clock_mhz=None, mem_clock_mhz=None,
                sm_clock_ratio=None if r is None else min(r, 1.0), pcie_tx_bytes_per_s=tx,
                pcie_rx_bytes_per_s=rx, throttle_reasons=reasons, processes=int(n)))
        return out
