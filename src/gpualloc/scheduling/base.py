"""The one interface between the cluster simulator (or the live service) and a scheduling policy.

A policy sees a :class:`ClusterView` and returns a :class:`Decision`: which queued jobs to start on
which GPUs, and (for preemptive policies) which running jobs to stop. The view holds columnar job
state in a :class:`JobTable` (one row per job of the trace, numpy arrays), so a policy can rank
thousands of queued jobs with array operations; every device-type-dependent quantity is a
jobs x device-types matrix, as in Gavel.

The view's arrays are the simulator's live state: policies must treat them as read-only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.workload.jobs import JOB_TYPES, Trace

# Job status codes in JobTable.status
PENDING, QUEUED, RUNNING, DONE = 0, 1, 2, 3


@dataclass
class JobTable:
    """Per-job state as arrays, indexed by the job's position in the trace.

    Static (from the trace and the speed model):
        arrival_s, work_s (reference seconds), num_gpus, priority, type_code (index in ``JOB_TYPES``),
        single_node (bool), speed (jobs x device types: throughput relative to the reference device;
        0 where the job may not run on that type).
    Dynamic (kept by the simulator):
        status (PENDING/QUEUED/RUNNING/DONE), remaining_s (reference seconds of work left),
        attained_gpu_s (GPU-seconds of service received so far, wall clock x GPUs, as Tiresias' LAS
        counts it), run_type (device type index while running, else -1), start_s (first start,
        NaN before), finish_s (NaN before), queued_since_s (when it last entered the queue),
        preemptions (count).
    """

    arrival_s: np.ndarray
    work_s: np.ndarray
    num_gpus: np.ndarray
    priority: np.ndarray
    type_code: np.ndarray
    single_node: np.ndarray
    speed: np.ndarray
    status: np.ndarray = field(init=False)
    remaining_s: np.ndarray = field(init=False)
    attained_gpu_s: np.ndarray = field(init=False)
    run_type: np.ndarray = field(init=False)
    start_s: np.ndarray = field(init=False)
    finish_s: np.ndarray = field(init=False)
    queued_since_s: np.ndarray = field(init=False)
    preemptions: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        self.status = np.full(n, PENDING, dtype=np.int8)
        self.remaining_s = np.asarray(self.work_s, dtype=float).copy()
        self.attained_gpu_s = np.zeros(n)
        self.run_type = np.full(n, -1, dtype=np.int64)
        self.start_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.queued_since_s = np.full(n, np.nan)
        self.preemptions = np.zeros(n, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @classmethod
    def from_trace(cls, trace: Trace, speed: np.ndarray) -> "JobTable":
        """Build the table; ``speed`` is the (jobs x device types) matrix from the speed model."""
        jobs = trace.jobs
        code = {t: i for i, t in enumerate(JOB_TYPES)}
        speed = np.asarray(speed, dtype=float)
        if speed.shape[0] != len(jobs):
            raise ValueError(f"speed matrix has {speed.shape[0]} rows for {len(jobs)} jobs")
        return cls(
            arrival_s=np.fromiter((j.arrival_s for j in jobs), float, len(jobs)),
            work_s=np.fromiter((j.work_s for j in jobs), float, len(jobs)),
            num_gpus=np.fromiter((j.num_gpus for j in jobs), np.int64, len(jobs)),
            priority=np.fromiter((j.priority for j in jobs), np.int64, len(jobs)),
            type_code=np.fromiter((code[j.job_type] for j in jobs), np.int64, len(jobs)),
            single_node=np.fromiter((j.single_node for j in jobs), bool, len(jobs)),
            speed=speed,
        )

    def best_speed(self) -> np.ndarray:
        """Each job's speed on its fastest allowed device type."""
        return self.speed.max(axis=1)


@dataclass
class ClusterView:
    """What a policy sees at a decision point.

    Attributes:
        now_s: simulated time.
        cluster: the cluster spec.
        type_names: device type names; ``speed`` columns and ``gpu_type`` values index this.
        gpu_type: device type index of each GPU.
        gpu_node: node index of each GPU.
        gpu_job: job index running on each GPU, -1 when free.
        jobs: the job table.
        queue: queued job indices, in the order they (re-)entered the queue.
        running: running job indices.
        preemption: whether the policy may preempt running jobs.
        restart_penalty_s: wall time a preempted job loses when it restarts (checkpoint reload).
    """

    now_s: float
    cluster: ClusterSpec
    type_names: tuple[str, ...]
    gpu_type: np.ndarray
    gpu_node: np.ndarray
    gpu_job: np.ndarray
    jobs: JobTable
    queue: Sequence[int]
    running: Sequence[int]
    preemption: bool = False
    restart_penalty_s: float = 0.0

    def free_mask(self) -> np.ndarray:
        return self.gpu_job < 0

    def free_by_type(self) -> np.ndarray:
        """Number of free GPUs of each device type."""
        return np.bincount(self.gpu_type[self.gpu_job < 0], minlength=len(self.type_names))

    def total_by_type(self) -> np.ndarray:
        return np.bincount(self.gpu_type, minlength=len(self.type_names))

    def find_gpus(self, job: int, type_index: int, free: np.ndarray | None = None) -> tuple[int, ...] | None:
        """GPUs of one type for ``job``, or ``None`` if they are not free.

        Consolidated best fit: the job goes on the fewest nodes, filling the nodes with the fewest
        free GPUs of that type first, so large gangs keep finding whole nodes. ``free`` overrides the
        free mask (a policy planning several starts passes its own working copy).
        """
        need = int(self.jobs.num_gpus[job])
        free = self.free_mask() if free is None else free
        cand = np.flatnonzero(free & (self.gpu_type == type_index))
        if len(cand) < need:
            return None
        nodes = self.gpu_node[cand]
        uniq, counts = np.unique(nodes, return_counts=True)
        fits = uniq[counts >= need]
        if len(fits):  # one node suffices: the fullest node that fits
            node = fits[np.argmin(counts[counts >= need])]
            return tuple(int(g) for g in cand[nodes == node][:need])
        if self.jobs.single_node[job]:
            return None
        order = np.argsort(-counts, kind="stable")  # spread over the fewest nodes: largest first
        picked: list[int] = []
        for node in uniq[order]:
            picked.extend(int(g) for g in cand[nodes == node][: need - len(picked)])
            if len(picked) == need:
                return tuple(picked)
        return None


@dataclass
class Decision:
    """A policy's answer: stop these running jobs, then start these queued jobs on these GPUs."""

    starts: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    preempt: list[int] = field(default_factory=list)


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy.

    Attributes:
        name: registry name.
        preemptive: the policy may return ``Decision.preempt``.
        round_s: when set, the simulator also asks the policy every ``round_s`` seconds (Gavel-style
            rounds), not only on arrivals and completions.
    """

    name: str
    preemptive: bool
    round_s: float | None

    def decide(self, view: ClusterView) -> Decision: ...


PolicyFactory = Callable[..., Policy]
