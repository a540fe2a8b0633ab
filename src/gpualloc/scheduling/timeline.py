"""A cluster simulation as device load: what the ``sim`` telemetry backend shows.

Here the scheduling layer meets the telemetry layer below it: :class:`ClusterTimeline` records, through
a wrapping policy, which GPUs each job held during a :func:`~gpualloc.scheduling.simulator.simulate`
run, and serves it as a :class:`~gpualloc.telemetry.sim.DeviceLoad`; :func:`cluster_run_telemetry`
wraps it in a :class:`~gpualloc.telemetry.sim.SimTelemetry`, and :func:`sim_backend` is the factory
the telemetry registry names ``sim`` (:data:`gpualloc.telemetry.backends.BACKENDS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import ClusterSpec, load_cluster
from gpualloc.scheduling.base import ClusterView, Decision, Policy
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.simulator import SimResult, simulate
from gpualloc.seeding import seeded
from gpualloc.telemetry.sim import LoadState, SimTelemetry
from gpualloc.workload.jobs import Trace
from gpualloc.workload.traces import generate, read_trace

__all__ = ["ClusterTimeline", "cluster_run_telemetry", "sim_backend"]


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

    @seeded(error=SchedulingError)
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
        rng = np.random.default_rng(seed)  # returns a Generator unchanged
        self.job_util = rng.uniform(0.55, 0.98, n_jobs)
        self.job_mem_fraction = rng.uniform(0.25, 0.90, n_jobs)
        self.job_mem_bw = rng.uniform(0.20, 0.70, n_jobs)
        self.job_pcie = rng.uniform(0.1e9, 4e9, (2, n_jobs))
        self._mem_cap = cluster.gpu_mem_bytes

    @classmethod
    @seeded(error=SchedulingError)
    def run(cls, trace: Trace, cluster: ClusterSpec, policy: Policy | str = "fcfs", *,
            seed: int | None = 0, loop: bool = False, **simulate_options: Any) -> tuple[ClusterTimeline, SimResult]:
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
        inner = make_policy(policy) if isinstance(policy, str) else policy
        rec = _Recorder(inner, len(cluster))
        result = simulate(trace, cluster, rec, seed=seed, **simulate_options)
        rec.finish(result.end_s)
        finish = np.nan_to_num(result.finish_s[np.asarray(rec.job, dtype=np.int64)], nan=np.inf)
        end = np.minimum(np.asarray(rec.end_s, dtype=float), finish)
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


@seeded(error=SchedulingError)
def cluster_run_telemetry(cluster: ClusterSpec, trace: Trace, policy: Policy | str = "fcfs", *,
                          seed: int | None = 0, step_s: float = 600.0, start_s: float | None = None,
                          noise: float = 0.02, loop: bool = True, **simulate_options: Any) -> SimTelemetry:
    """Devices of a cluster simulation (see :class:`ClusterTimeline`).

    ``start_s`` defaults to the first decision point at which half the GPUs are busy, so the first
    sample shows a loaded cluster rather than the empty one before the first arrivals.
    """
    timeline, result = ClusterTimeline.run(trace, cluster, policy, seed=seed, loop=loop, **simulate_options)
    if start_s is None:
        warm = np.flatnonzero(np.asarray(result.busy_gpus) * 2 >= len(cluster))
        start_s = float(result.times_s[warm[0]]) if warm.size else 0.0
    return SimTelemetry(cluster, timeline, step_s=step_s, start_s=start_s, noise=noise, seed=seed)


@seeded(error=SchedulingError)
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
    spec = cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)
    jobs_trace = read_trace(trace) if trace is not None else generate(jobs, spec, load, seed=seed)
    return cluster_run_telemetry(spec, jobs_trace, policy, seed=seed, step_s=step_s, noise=noise,
                                 drop_unplaceable=True)
