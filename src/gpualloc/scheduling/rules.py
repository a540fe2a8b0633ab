"""The rules every scheduling decision obeys, written once: the simulator and the service both call them.

* :func:`fits_types` / :func:`placeable` / :func:`unplaceable_reason`: can a job ever run on a cluster
  (a device type it may use with enough GPUs, on one node when it must stay on one).
* :func:`check_preempt` / :func:`check_start`: is one item of a :class:`~gpualloc.scheduling.base.Decision`
  valid on the current state (a known job in the right state, the right number of distinct, free GPUs
  of one allowed type, on one node when required). They raise :class:`InvalidDecision`.
* :func:`validate_decision`: every rule a whole decision breaks, without changing anything.

Consolidated best fit (which free GPUs a job gets) is :func:`gpualloc.scheduling.base.best_fit`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.scheduling.base import GPU_DOWN, GPU_FREE, QUEUED, RUNNING, ClusterView, Decision, JobTable


# ------------------------------------------------------------------------------ can it ever fit

def fits_types(cluster: ClusterSpec, num_gpus: np.ndarray | Sequence[int], single_node: np.ndarray | Sequence[bool],
               speed: np.ndarray) -> np.ndarray:
    """Jobs x device types: the job may run on the type (``speed > 0``) and the whole cluster has
    enough GPUs of it (on one node for single-node jobs).

    Args:
        cluster: the machines; columns follow ``cluster.type_names``.
        num_gpus: GPUs each job needs.
        single_node: each job must run on one node.
        speed: jobs x types throughput (0 = may not run there).
    """
    speed = np.asarray(speed, dtype=float)
    need = np.asarray(num_gpus, dtype=np.int64)
    single = np.asarray(single_node, dtype=bool)
    cap = np.where(single[:, None], cluster.largest_node_per_type[None, :], cluster.gpus_per_type[None, :])
    return (speed > 0) & (need[:, None] <= cap)


def placeable(cluster: ClusterSpec, num_gpus: np.ndarray | Sequence[int], single_node: np.ndarray | Sequence[bool],
              speed: np.ndarray) -> np.ndarray:
    """Per job: whether some device type of ``cluster`` can ever hold it (see :func:`fits_types`)."""
    return fits_types(cluster, num_gpus, single_node, speed).any(axis=1)


def unplaceable_reason(cluster: ClusterSpec, num_gpus: int, single_node: bool, speed: np.ndarray) -> str | None:
    """Why one job can never run on ``cluster`` (``"needs 12 GPUs of one type on one node; largest
    node has 8"``), or ``None`` when it can. ``speed`` is the job's row over ``cluster.type_names``."""
    speed = np.asarray(speed, dtype=float)
    allowed = speed > 0
    if fits_types(cluster, [num_gpus], [single_node], speed[None, :])[0].any():
        return None
    if not allowed.any():
        return f"may run on none of the device types of cluster {cluster.name} ({', '.join(cluster.type_names)})"
    if single_node:
        return (f"needs {num_gpus} GPUs of one type on one node; "
                f"largest node has {int(cluster.largest_node_per_type[allowed].max())}")
    return f"needs {num_gpus} GPUs of one type; largest type has {int(cluster.gpus_per_type[allowed].max())}"


# ------------------------------------------------------------------------------ is it valid

class InvalidDecision(SchedulingError):
    """One item of a decision breaks a rule; the message names the job (``job A: ...``).

    Attributes:
        job: the job index the item names, as given (``None`` for a malformed start).
        reason: what is wrong, e.g. ``"GPU 3 is not free (down)"``.
    """

    def __init__(self, job: object, reason: str, who: str = "") -> None:
        self.job, self.reason = job, reason
        super().__init__(f"{who}: {reason}" if who else reason)


def _invalid(j: object, reason: str, n_jobs: int, label: Callable[[int], str] | None) -> InvalidDecision:
    if _is_index(j) and 0 <= j < n_jobs:
        who = f"job {(label or str)(int(j))}"
    else:
        who = f"job index {j!r}"
    return InvalidDecision(j, reason, who)


def _is_index(j: object) -> bool:
    return isinstance(j, (int, np.integer))


def check_preempt(j: object, jobs: JobTable, *, preemption: bool,
                  label: Callable[[int], str] | None = None) -> int:
    """The job index of one ``Decision.preempt`` entry, checked: preemption is allowed and the job
    exists and runs.

    Raises:
        InvalidDecision: naming the job.
    """
    if not preemption:
        raise _invalid(j, "preempted, but preemption is off for this run", len(jobs), label)
    if not _is_index(j) or not 0 <= j < len(jobs):
        raise _invalid(j, "preempted, but there is no such job", len(jobs), label)
    j = int(j)
    if jobs.status[j] != RUNNING:
        raise _invalid(j, "preempted, but it is not running", len(jobs), label)
    return j


def check_start(item: object, jobs: JobTable, gpu_job: np.ndarray, gpu_type: np.ndarray | Sequence[int],
                gpu_node: np.ndarray | Sequence[int], type_names: Sequence[str],
                label: Callable[[int], str] | None = None) -> tuple[int, tuple[int, ...], int]:
    """One ``Decision.starts`` entry ``(job, gpus)``, checked against the current state: the job is
    queued; it gets exactly ``num_gpus`` distinct GPUs of the cluster, all free, of one device type it
    may run on, on one node when it must stay on one.

    Args:
        item: the entry.
        jobs: the job table (``status``, ``num_gpus``, ``speed``, ``single_node``).
        gpu_job: owner of each GPU (``GPU_FREE``, ``GPU_DOWN`` or a job index).
        gpu_type, gpu_node: device type and node index of each GPU.
        type_names: device type names (messages).
        label: job index -> name for messages (default: the index).

    Returns:
        ``(job, gpus, type index)``.

    Raises:
        InvalidDecision: the first rule broken, naming the job.
    """
    n = len(jobs)
    try:
        j, gpus = item  # type: ignore[misc]
    except (TypeError, ValueError):
        raise InvalidDecision(None, f"start {item!r} is not (job, gpus)") from None
    if not (type(j) is int or _is_index(j)) or not 0 <= j < n:  # the type test first: the common case, cheaply
        raise _invalid(j, "started, but there is no such job", n, label)
    j = int(j)
    if jobs.status[j] != QUEUED:
        raise _invalid(j, "started, but it is not queued", n, label)
    try:
        gl = tuple(map(int, gpus))
    except (TypeError, ValueError):
        raise _invalid(j, f"GPUs {gpus!r} are not a sequence of GPU indices", n, label) from None
    need = int(jobs.num_gpus[j])
    if len(gl) != need:
        raise _invalid(j, f"needs {need} GPUs, given {len(gl)}", n, label)
    n_gpus = len(gpu_job)
    for g in gl:
        if not 0 <= g < n_gpus:
            raise _invalid(j, f"GPU {g} is not in the cluster", n, label)
        owner = gpu_job[g]
        if owner != GPU_FREE:
            owner = int(owner)
            what = "down" if owner == GPU_DOWN else f"running job {(label or str)(owner)}"
            raise _invalid(j, f"GPU {g} is not free ({what})", n, label)
    if need > 1 and len(set(gl)) != need:
        raise _invalid(j, f"GPUs {gl} repeat a GPU", n, label)
    t = int(gpu_type[gl[0]])
    if need > 1 and any(gpu_type[g] != t for g in gl):
        raise _invalid(j, f"GPUs {gl} mix device types", n, label)
    if not jobs.speed[j, t] > 0:
        raise _invalid(j, f"may not run on {type_names[t]}", n, label)
    if need > 1 and jobs.single_node[j] and any(gpu_node[g] != gpu_node[gl[0]] for g in gl):
        raise _invalid(j, f"needs one node, GPUs {gl} span several", n, label)
    return j, gl, t


def validate_decision(decision: Decision, view: ClusterView,
                      label: Callable[[int], str] | None = None, *,
                      preemption: bool | None = None) -> list[InvalidDecision]:
    """Every rule ``decision`` breaks on ``view``, in the decision's order; empty when it is valid.

    ``preemption`` overrides ``view.preemption`` (the simulator's migrations preempt and restart jobs
    under any policy, :mod:`gpualloc.scheduling.consolidate`).

    The decision is played on a scratch copy of the state, as it would be applied: preemptions first
    (their GPUs come free and their jobs are queued again), then starts in order (each takes its
    GPUs). An invalid item is skipped and leaves the state as it was. ``view`` is not changed.
    """
    if not isinstance(decision, Decision):
        return [InvalidDecision(None, f"decision is a {type(decision).__name__}, not a Decision")]
    problems: list[InvalidDecision] = []
    jobs = view.jobs
    gpu_job = np.array(view.gpu_job, copy=True)
    gpu_type, gpu_node = view.type_node_lists()
    status = _Moved(jobs.status)  # not a copy of the whole column: a decision moves a few jobs
    scratch = _Scratch(jobs, status)
    for j in decision.preempt:
        try:
            j = check_preempt(j, scratch, preemption=view.preemption if preemption is None else preemption,
                              label=label)
        except InvalidDecision as err:
            problems.append(err)
            continue
        for g in view.gpus_of(j):  # still the view's: a job is preempted at most once, before any start
            gpu_job[g] = GPU_FREE
        status[j] = QUEUED
    for item in decision.starts:
        try:
            j, gpus, _ = check_start(item, scratch, gpu_job, gpu_type, gpu_node, view.type_names, label)
        except InvalidDecision as err:
            problems.append(err)
            continue
        for g in gpus:  # a gang is a few GPUs: cheaper than fancy indexing
            gpu_job[g] = j
        status[j] = RUNNING
    return problems


class _Moved:
    """A status column seen through the moves a decision has made so far."""

    def __init__(self, base: np.ndarray) -> None:
        self.base, self.moved = base, {}

    def __getitem__(self, j: int) -> int:
        return self.moved[j] if j in self.moved else self.base[j]

    def __setitem__(self, j: int, value: int) -> None:
        self.moved[j] = value


class _Scratch:
    """A job table whose ``status`` is a working copy (what :func:`check_start` reads)."""

    def __init__(self, jobs: JobTable, status: _Moved) -> None:
        self.status, self.num_gpus, self.speed, self.single_node = status, jobs.num_gpus, jobs.speed, jobs.single_node
        self._n = len(jobs)

    def __len__(self) -> int:
        return self._n
