"""Simulated device telemetry: the simulators' devices read like real ones.

:class:`SimTelemetry` is a :class:`~gpualloc.telemetry.base.DeviceTelemetry` over a cluster's
devices. Each :meth:`~SimTelemetry.sample` reports the devices at the current simulated time and
then moves the clock on by ``step_s``. What runs where comes from a :class:`DeviceLoad`:

* :class:`ClusterTimeline`: a cluster simulation (:func:`gpualloc.scheduling.simulator.simulate`)
  under a scheduling policy, with the GPUs each job held between decision points;
* :class:`PlacementLoad`: one training job placed by the placement simulator
  (:class:`gpualloc.placement.replan.SimulatedTelemetry`), drift included.

From the load's utilisation the devices' physics follow, vectorised over devices:

* power ``idle_w + (tdp_w - idle_w) x utilization`` (the cost model's energy model);
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from gpualloc.hardware.cluster import ClusterSpec, load_cluster
from gpualloc.scheduling.base import ClusterView, Decision, Policy
from gpualloc.telemetry.base import DeviceInfo, DeviceRecord, TelemetryError

__all__ = [
    "AMBIENT_C",
    "FULL_LOAD_RISE_C",
    "THERMAL_TAU_S",
    "ClusterTimeline",
    "DeviceLoad",
    "LoadState",
    "PlacementLoad",
    "SimTelemetry",
    "sim_backend",
]

AMBIENT_C = 30.0
"""Temperature of an idle, cooled device (inlet air plus the idle rise of a datacenter GPU)."""
FULL_LOAD_RISE_C = 50.0
"""Rise above ``AMBIENT_C`` at TDP: 80 C at full load, below the ~85 C where GPUs start to throttle."""
THERMAL_TAU_S = 60.0
"""Time constant of the heat sink: a step in power reaches 63% of its temperature change in this time."""


def _rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


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


# ------------------------------------------------------------------------------------------ cluster run
class _Recorder:
    """A policy that lets ``policy`` decide and writes down which GPUs each job holds from then on.

    Between two decision points only completions (and failures) change the GPUs' jobs, so the holding
    intervals ``(gpu, job, start_s)`` opened here, closed at the next decision point where the GPU's
    job changed and cut at the job's finish, are the cluster's occupancy at every instant.
    """

    def __init__(self, policy: Policy, n_gpus: int) -> None:
        self.policy = policy
        self.name, self.preemptive, self.round_s = policy.name, policy.preemptive, policy.round_s
        self.current = np.full(n_gpus, -1, dtype=np.int64)
        self.since = np.zeros(n_gpus)
        self.gpu: list[int] = []
        self.job: list[int] = []
        self.start_s: list[float] = []
        self.end_s: list[float] = []

    def decide(self, view: ClusterView) -> Decision:
        decision = self.policy.decide(view)
        after = np.where(view.gpu_job >= 0, view.gpu_job, -1).astype(np.int64)
        for j in decision.preempt:
            after[after == j] = -1
        for j, gpus in decision.starts:
            after[list(gpus)] = j
        self._change(after, float(view.now_s))
        return decision

    def _change(self, after: np.ndarray, now: float) -> None:
        for g in np.flatnonzero(after != self.current):
            if self.current[g] >= 0:
                self._close(int(g), now)
            if after[g] >= 0:
                self.since[g] = now
        self.current = after

    def _close(self, g: int, now: float) -> None:
        self.gpu.append(g)
        self.job.append(int(self.current[g]))
        self.start_s.append(float(self.since[g]))
        self.end_s.append(now)

    def finish(self, end_s: float) -> None:
        for g in np.flatnonzero(self.current >= 0):
            self._close(int(g), end_s)
        self.current[:] = -1


class ClusterTimeline:
    """Which job each GPU of a cluster run held, and when: a :class:`DeviceLoad`.

    Build one with :meth:`run`. A GPU holding a job is busy at the job's intensity: each job gets,
    from ``seed``, a utilisation in [0.55, 0.98] (training jobs rarely keep a GPU busier; input
    pipelines and communication leave gaps), device memory in [25%, 90%] of the GPU's, a memory
    bandwidth share in [20%, 70%] of its utilisation and PCIe traffic up to 4 GB/s each way. A failed
    GPU is counted busy until the next decision point (the simulator does not pause at failures).

    Args:
        cluster: the cluster simulated.
        gpu, job, start_s, end_s: the holding intervals ``[start_s, end_s)``, one per stretch of a job
            on a GPU.
        n_jobs: jobs in the trace.
        run_end_s: the run's last finish.
        loop: after ``end_s``, start over from 0 (a demo that never runs dry) instead of idling.
        seed: the jobs' intensities.
    """

    def __init__(self, cluster: ClusterSpec, gpu: Sequence[int], job: Sequence[int], start_s: Sequence[float],
                 end_s: Sequence[float], n_jobs: int, run_end_s: float, *, loop: bool = False,
                 seed: int | np.random.Generator | None = 0) -> None:
        self.cluster = cluster
        self.gpu = np.asarray(gpu, dtype=np.int64)
        self.job = np.asarray(job, dtype=np.int64)
        self.start_s = np.asarray(start_s, dtype=np.float64)
        self.end_s = np.asarray(end_s, dtype=np.float64)
        self.run_end_s = float(run_end_s)
        self.loop = loop
        rng = _rng(seed)
        self.job_util = rng.uniform(0.55, 0.98, n_jobs)
        self.job_mem_fraction = rng.uniform(0.25, 0.90, n_jobs)
        self.job_mem_bw = rng.uniform(0.20, 0.70, n_jobs)
        self.job_pcie = rng.uniform(0.1e9, 4e9, (2, n_jobs))
        self._mem_cap = np.array([d.type.mem_bytes for d in cluster.devices], dtype=np.float64)

    @classmethod
    def run(cls, trace: Any, cluster: ClusterSpec, policy: Policy | str = "fcfs", *,
            seed: int | None = 0, loop: bool = False, **simulate_options: Any) -> tuple["ClusterTimeline", Any]:
        """Simulate ``trace`` on ``cluster`` under ``policy`` and keep the GPUs' occupancy.

        Args:
            trace: a :class:`~gpualloc.workload.jobs.Trace`.
            cluster: the cluster.
            policy: a policy or its registry name.
            seed: the simulation's and the jobs' intensities' seed.
            loop: as for the constructor.
            **simulate_options: passed to :func:`gpualloc.scheduling.simulator.simulate`.

        Returns:
            The timeline and the run's :class:`~gpualloc.scheduling.simulator.SimResult`.
        """
        from gpualloc.scheduling.policies import make_policy
        from gpualloc.scheduling.simulator import simulate

        inner = make_policy(policy) if isinstance(policy, str) else policy
        rec = _Recorder(inner, len(cluster))
        result = simulate(trace, cluster, rec, seed=seed, **simulate_options)
        rec.finish(result.end_s)
        finish = np.nan_to_num(result.finish_s[np.asarray(rec.job, dtype=np.int64)], nan=np.inf) \
            if rec.job else np.zeros(0)
        end = np.minimum(np.asarray(rec.end_s), finish) if rec.job else np.zeros(0)
        return cls(cluster, rec.gpu, rec.job, rec.start_s, end, len(trace), result.end_s, loop=loop,
                   seed=seed), result

    def at(self, time_s: float) -> LoadState:
        t = time_s % self.run_end_s if self.loop and self.run_end_s > 0 else time_s
        k = len(self.cluster)
        live = (self.start_s <= t) & (t < self.end_s)
        gpus, jobs = self.gpu[live], self.job[live]
        util = np.zeros(k)
        util[gpus] = self.job_util[jobs]
        mem = np.zeros(k)
        mem[gpus] = self.job_mem_fraction[jobs] * self._mem_cap[gpus]
        mem_bw = np.zeros(k)
        mem_bw[gpus] = self.job_mem_bw[jobs] * self.job_util[jobs]
        tx, rx = np.zeros(k), np.zeros(k)
        tx[gpus] = self.job_pcie[0, jobs] * self.job_util[jobs]
        rx[gpus] = self.job_pcie[1, jobs] * self.job_util[jobs]
        procs = np.bincount(gpus, minlength=k)
        return LoadState(util, mem, procs, mem_bw, np.ones(k), tx, rx)


# ------------------------------------------------------------------------------------------ placement run
class PlacementLoad:
    """One training job from the placement simulator as device load: a :class:`DeviceLoad`.

    ``at(t)`` trains the job (``source.advance``) until its clock reaches ``t`` and reads its latest
    step: per device the busy fraction, the plan's peak memory and the speed factor (a drift event
    that slows a device lowers its clock ratio). Devices the plan leaves unused are idle. The step
    sample carries no memory-bandwidth or PCIe readings, so those are NaN (None in the records).

    Args:
        source: the job, e.g. ``SimulatedTelemetry(problem, assignment, DriftSchedule())``.
    """

    def __init__(self, source: Any) -> None:
        self.source = source
        self._cap = np.asarray(source.problem.mem_cap_bytes, dtype=np.float64)

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
class SimTelemetry:
    """A :class:`~gpualloc.telemetry.base.DeviceTelemetry` over simulated devices.

    Args:
        cluster: the devices (names, memory, idle and TDP power).
        load: what runs on them over time.
        step_s: simulated seconds between two samples.
        start_s: simulated time of the first sample.
        noise: relative measurement noise on a busy device's utilisation.
        seed: the noise's seed.
    """

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
        self._rng = _rng(seed)
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
    def from_cluster_run(cls, cluster: ClusterSpec, trace: Any, policy: Policy | str = "fcfs", *,
                         seed: int | None = 0, step_s: float = 600.0, start_s: float | None = None,
                         noise: float = 0.02, loop: bool = True, **simulate_options: Any) -> "SimTelemetry":
        """Devices of a cluster simulation (see :class:`ClusterTimeline`).

        ``start_s`` defaults to the first decision point at which half the GPUs are busy, so the first
        sample shows a loaded cluster rather than the empty one before the first arrivals.
        """
        timeline, result = ClusterTimeline.run(trace, cluster, policy, seed=seed, loop=loop, **simulate_options)
        if start_s is None:
            warm = np.flatnonzero(np.asarray(result.busy_gpus) * 2 >= len(cluster))
            start_s = float(result.times_s[warm[0]]) if warm.size else 0.0
        return cls(cluster, timeline, step_s=step_s, start_s=start_s, noise=noise, seed=seed)

    @classmethod
    def from_placement(cls, source: Any, *, step_s: float = 1.0, noise: float = 0.0,
                       seed: int | np.random.Generator | None = 0) -> "SimTelemetry":
        """Devices of a placed training job (:class:`PlacementLoad` over a ``SimulatedTelemetry``)."""
        return cls(source.problem.cluster, PlacementLoad(source), step_s=step_s, start_s=source.time_s,
                   noise=noise, seed=seed)

    def devices(self) -> list[DeviceInfo]:
        return list(self._info)

    def sample(self) -> list[DeviceRecord]:
        t = self.time_s
        state = self.load.at(t)
        util = np.asarray(state.utilization, dtype=np.float64)
        if self.noise > 0:
            jitter = 1.0 + self.noise * self._rng.standard_normal(util.size)
            util = np.where(util > 0, np.clip(util * jitter, 0.0, 1.0), util)
        u = np.nan_to_num(util)
        power = self._idle_w + (self._tdp_w - self._idle_w) * u
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
        rows = zip(*([None if v != v else v for v in c.tolist()] for c in cols))
        procs = np.asarray(state.processes).tolist()
        out = []
        for info, total, n, (ut, mu, mem, pw, en, temp, r, tx, rx) in zip(self._info, self._mem_total, procs, rows):
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

    def close(self) -> None:
        """Nothing to release; present for the interface."""

    def __enter__(self) -> "SimTelemetry":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sim_backend(cluster: str | Path | ClusterSpec = "adlro16", *, trace: str | Path | None = None, jobs: int = 200,
                load: float = 0.8, policy: str = "fcfs", seed: int = 0, step_s: float = 600.0,
                noise: float = 0.02) -> SimTelemetry:
    """The ``sim`` backend: a cluster (default adlro16) running a trace under a policy.

    Args:
        cluster: preset, shorthand, file or spec.
        trace: a trace file (format from its contents); default: ``jobs`` synthetic jobs at ``load``.
        jobs, load: the synthetic trace (:func:`gpualloc.workload.traces.generate`).
        policy: scheduling policy name.
        seed: trace, simulation, job intensities and noise.
        step_s: simulated seconds per sample (jobs last minutes to days, so a sample per second of
            simulated time would show a still picture).
        noise: relative utilisation noise.

    Jobs no device type of the cluster can hold are dropped (``drop_unplaceable``): a monitor shows
    the jobs that run rather than refusing a trace written for a larger cluster.
    """
    from gpualloc.workload.traces import generate, read_trace

    spec = cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)
    jobs_trace = read_trace(trace) if trace is not None else generate(jobs, spec, load, seed=seed)
    return SimTelemetry.from_cluster_run(spec, jobs_trace, policy, seed=seed, step_s=step_s, noise=noise,
                                         drop_unplaceable=True)
