"""Baseline policies: FCFS, static affinity, SJF, SRTF and EASY backfilling.

Every policy places a chosen job on the device type where it runs fastest among those with enough
free GPUs (consolidated best fit, :meth:`ClusterView.find_gpus`), except :class:`StaticAffinity`,
whose point is a fixed job-type -> device-type map.

References:
    D. A. Lifka, "The ANL/IBM SP scheduling system", JSSPP 1995 (EASY backfilling).
    A. W. Mu'alem and D. G. Feitelson, "Utilization, predictability, workloads, and user runtime
    estimates in scheduling the IBM SP2 with backfilling", IEEE TPDS 12(6), 2001.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gpualloc.errors import CatalogError, SchedulingError
from gpualloc.scheduling.base import ClusterView, Decision, FreeGpus, Starts
from gpualloc.scheduling.rules import fits_types
from gpualloc.workload.jobs import JOB_TYPES, JobType


def _est_run_s(view: ClusterView, job: int, type_index: int) -> float:
    """Wall seconds ``job`` needs from a start now on ``type_index`` (restart penalty included)."""
    jobs = view.jobs
    pen = view.restart_penalty_s if not np.isnan(jobs.start_s[job]) else 0.0
    return pen + float(jobs.remaining_s[job]) / float(jobs.speed[job, type_index])


class FCFS:
    """First come, first served, strictly in queue order: when the head job does not fit, nothing
    behind it starts (head-of-line blocking). A job interrupted by a failure re-enters at the back."""

    name = "fcfs"
    preemptive = False
    round_s: float | None = None
    reads_running_progress = False  # the simulator may skip bringing running jobs' progress up to date
    # when the head does not fit, it will not until a GPU comes free (arrivals queue behind it; a
    # job that does not fit cannot fit in fewer free GPUs): the simulator need not ask again until then
    idle_until_gpus_free = True

    def decide(self, view: ClusterView) -> Decision:
        return Decision(start_in_order(view, view.queue, keep_pool=False)[0] if view.queue else [])


def start_in_order(view: ClusterView, queue: Sequence[int], keep_pool: bool = True) -> tuple[Starts, FreeGpus]:
    """Start ``queue``'s jobs in order, each on its fastest type with room, until one does not fit;
    returns the starts and the working copy of the free GPUs after them. When every job started, the
    last one's GPUs are not taken from it (nothing is left to plan; most decisions start one job, and
    the working copy is then never copied).

    With ``keep_pool=False`` (the caller ignores the working copy) the last start's GPUs are not taken
    either when the next job cannot fit for want of GPUs of any type it may use: the starts are the
    same, and the copy is spared (on a busy cluster, most decisions start the head and stop at the next).
    """
    pool = view.free_gpus()
    starts: Starts = []
    last = len(queue) - 1
    for i, j in enumerate(queue):
        if pool.total == 0:
            break
        placed = pool.place(j)
        if placed is None:
            break
        starts.append((j, placed[1]))
        if i < last:
            if not keep_pool and not _may_fit_after(view, pool, queue[i + 1], placed):
                break
            pool.take(placed[1])
    return starts, pool


def _may_fit_after(view: ClusterView, pool: FreeGpus, job: int, placed: tuple[int, tuple[int, ...]]) -> bool:
    """Whether some type ``job`` may use keeps at least its GPU count free once ``placed`` is taken
    (when not, :meth:`FreeGpus.place` would find nothing for it)."""
    need = int(view.jobs.num_gpus[job])
    t_placed, k = placed[0], len(placed[1])
    by_type = pool.by_type
    for t, s in enumerate(view.jobs.speed[job].tolist()):
        if s > 0 and by_type[t] - (k if t == t_placed else 0) >= need:
            return True
    return False


def default_affinity(view: ClusterView) -> dict[str, str]:
    """The design's fixed map from job type to device type, derived from the cluster's types:

    * ``ml-training`` -> the type with the highest tensor peak (a V100-class GPU);
    * ``simulation`` -> of the remaining types, the one with the highest FP64 peak;
    * ``data-processing`` -> of the types still left, the one with the lowest FP32 peak.

    When the cluster has fewer than three types, a category that finds none left takes the best type
    by its own criterion among all types.
    """
    types = {d.type.name: d.type for d in view.cluster.devices}
    present = [types[name] for name in view.type_names]

    def peak(value: float | None) -> float:
        return -1.0 if value is None else float(value)

    out: dict[str, str] = {}
    left = list(present)
    rules = [
        (JobType.ML_TRAINING, lambda d: peak(d.tensor_tflops), max),
        (JobType.SIMULATION, lambda d: peak(d.fp64_tflops), max),
        (JobType.DATA_PROCESSING, lambda d: peak(d.fp32_tflops), min),
    ]
    for job_type, key, pick in rules:
        pool = left or present
        chosen = pick(pool, key=key)  # first of equals: order of appearance in the cluster
        out[job_type.value] = chosen.name
        if chosen in left:
            left.remove(chosen)
    return out


class StaticAffinity:
    """A fixed job-type -> device-type map (the design's baseline), FIFO within each device type.

    Each job runs only on its job type's device type. Only when that type cannot hold it at all (the
    job may not run there, or the cluster has too few GPUs of it) does it go to its fastest type that
    can. Jobs of one device type start in queue order, and a head that does not fit blocks that type
    only.

    Args:
        affinity: ``{job type: device type name}`` (catalog names or aliases); job types left out
            take :func:`default_affinity`'s choice.
    """

    name = "static-affinity"
    preemptive = False
    round_s: float | None = None
    reads_running_progress = False  # reads queued jobs' work only (see FCFS)

    def __init__(self, affinity: Mapping[str, str] | None = None) -> None:
        self.affinity = dict(affinity or {})
        for key in self.affinity:
            JobType.parse(key, "static-affinity")
        self._cache_key: tuple[int, tuple[str, ...]] | None = None
        self._target: np.ndarray = np.zeros(0, dtype=np.int64)

    def targets(self, view: ClusterView) -> np.ndarray:
        """Device type index of every job (computed once per job table)."""
        key = (id(view.jobs), view.type_names)
        if key == self._cache_key:
            return self._target
        mapping = default_affinity(view) | self.affinity
        catalog = view.cluster.catalog
        index = {name: i for i, name in enumerate(view.type_names)}
        by_code = np.zeros(len(JOB_TYPES), dtype=np.int64)
        for code, job_type in enumerate(JOB_TYPES):
            wanted = mapping[job_type.value]
            try:
                name = catalog.device(wanted).name
            except CatalogError:
                name = wanted
            if name not in index:
                raise SchedulingError(f"static-affinity: {job_type.value} -> {wanted!r}: cluster "
                                      f"{view.cluster.name} has no such device type "
                                      f"({', '.join(view.type_names)})")
            by_code[code] = index[name]
        jobs = view.jobs
        target = by_code[jobs.type_code]
        holds = fits_types(view.cluster, jobs.num_gpus, jobs.single_node, jobs.speed)
        cannot = ~holds[np.arange(len(target)), target]
        if cannot.any():  # fall back to the fastest type that can hold the job
            alt = np.argmax(np.where(holds, jobs.speed, -1.0), axis=1)
            target = np.where(cannot, alt, target)
        self._cache_key, self._target = key, target
        return target

    def decide(self, view: ClusterView) -> Decision:
        target = self.targets(view)
        pool = view.free_gpus()
        q = np.fromiter(view.queue, dtype=np.int64, count=len(view.queue))
        tq = target[q]
        starts: Starts = []
        for t in np.flatnonzero(pool.by_type > 0).tolist():
            for j in q[tq == t].tolist():  # this type's FIFO: stop at the first job that does not fit
                gpus = pool.find(j, t)
                if gpus is None:
                    break
                pool.take(gpus)
                starts.append((j, gpus))
                if pool.by_type[t] <= 0:
                    break
        return Decision(starts)


class SJF:
    """Shortest job first: queued jobs by run time on their fastest type (``work_s / best speed``),
    shortest first; a job that does not fit is skipped, not waited for. Non-preemptive."""

    name = "sjf"
    preemptive = False
    round_s: float | None = None
    reads_running_progress = False  # reads queued jobs' work only (see FCFS)

    def decide(self, view: ClusterView) -> Decision:
        q = np.fromiter(view.queue, dtype=np.int64, count=len(view.queue))
        jobs = view.jobs
        key = jobs.work_s[q] / jobs.speed[q].max(axis=1)
        order = q[np.argsort(key, kind="stable")]
        pool = view.free_gpus()
        starts: Starts = []
        for j in order[jobs.num_gpus[order] <= pool.by_type.max(initial=0)].tolist():  # those that could fit now
            if pool.total == 0:
                break
            gpus = pool.start(j)
            if gpus is not None:
                starts.append((j, gpus))
        return Decision(starts)


class SRTF:
    """Shortest remaining time first, preemptive.

    Queued jobs go in order of remaining time on their fastest type. A job that does not fit may
    preempt running jobs of one device type whose remaining time is strictly longer than its own,
    longest first, until it fits; if even that cannot make room it is skipped. Preempted jobs keep
    their work and pay the restart penalty when they run again.
    """

    name = "srtf"
    preemptive = True
    round_s: float | None = None

    def decide(self, view: ClusterView) -> Decision:
        jobs = view.jobs
        q = np.fromiter(view.queue, dtype=np.int64, count=len(view.queue))
        q_left = jobs.remaining_s[q] / jobs.speed[q].max(axis=1)
        order = q[np.argsort(q_left, kind="stable")]
        run = np.fromiter(view.running, dtype=np.int64, count=len(view.running))
        run_left = jobs.remaining_s[run] / jobs.speed[run].max(axis=1)
        by_left = np.argsort(-run_left, kind="stable")
        run, run_left = run[by_left], run_left[by_left]
        run_type = jobs.run_type[run]
        pool = view.free_gpus()
        total = view.total_by_type()
        starts: Starts = []
        preempt: list[int] = []
        victim = np.zeros(len(run), dtype=bool)
        for j in order.tolist():
            gpus = pool.start(j)
            if gpus is not None:
                starts.append((j, gpus))
                continue
            if not view.preemption or not len(run):
                continue
            left = float(jobs.remaining_s[j] / jobs.speed[j].max())
            need = int(jobs.num_gpus[j])
            for t in jobs.type_order()[j].tolist():
                if jobs.speed[j, t] <= 0:
                    break
                if total[t] < need:
                    continue
                cand = np.flatnonzero((run_type == t) & ~victim & (run_left > left))
                if pool.by_type[t] + int(jobs.num_gpus[run[cand]].sum()) < need:
                    continue
                freed: list[int] = []
                gpus = None
                for k in cand.tolist():
                    pool.give(view.gpus_of(int(run[k])))
                    freed.append(k)
                    gpus = pool.find(j, t)
                    if gpus is not None:
                        break
                if gpus is None:
                    for k in freed:
                        pool.take(view.gpus_of(int(run[k])))
                    continue
                victim[freed] = True
                preempt.extend(int(run[k]) for k in freed)
                pool.take(gpus)
                starts.append((j, gpus))
                break
        return Decision(starts, preempt)


class EasyBackfill:
    """EASY backfilling: FCFS, plus later jobs may jump ahead when they do not delay the head.

    Jobs start in queue order while they fit. For the first that does not (the head), a reservation
    is computed from the running jobs' expected finish times (``JobTable.expected_finish_s``; the
    simulator's true run times stand in for user estimates): for each device type the head may use,
    the earliest time enough GPUs of it are free, the *shadow time*; the head reserves the type with
    the earliest one. A later job then starts if it fits now and either runs on another type, ends
    before the shadow time, or uses no more than the reserved type's *extra* GPUs (those free at the
    shadow time that the head does not need). GPU counts per type stand for the reservation; node
    boundaries are not modelled in it.
    """

    name = "easy-backfill"
    preemptive = False
    round_s: float | None = None
    reads_running_progress = False  # reads queued jobs' work only (see FCFS)

    def decide(self, view: ClusterView) -> Decision:
        queue = list(view.queue)
        starts, pool = start_in_order(view, queue)
        i = len(starts)
        if i >= len(queue) or pool.total == 0:
            return Decision(starts)
        head = queue[i]
        t_res, shadow, extra = self._reservation(view, pool, head, starts)
        jobs = view.jobs
        free_max = pool.by_type.max(initial=0)
        for j in queue[i + 1:]:
            if pool.total == 0:
                break
            need = int(jobs.num_gpus[j])
            if need > free_max:
                continue
            for t in jobs.type_order()[j].tolist():
                if jobs.speed[j, t] <= 0:
                    break
                if pool.by_type[t] < need:
                    continue
                use_extra = False
                if t == t_res and view.now_s + _est_run_s(view, j, t) > shadow:
                    if need > extra:
                        continue
                    use_extra = True
                gpus = pool.find(j, t)
                if gpus is None:
                    continue
                if use_extra:
                    extra -= need
                pool.take(gpus)
                starts.append((j, gpus))
                free_max = pool.by_type.max(initial=0)
                break
        return Decision(starts)

    @staticmethod
    def _reservation(view: ClusterView, pool: FreeGpus, head: int,
                     starts: Starts) -> tuple[int, float, int]:
        """``(device type, shadow time, extra GPUs)`` of the head job's reservation."""
        jobs, now = view.jobs, view.now_s
        need = int(jobs.num_gpus[head])
        run = np.fromiter(view.running, dtype=np.int64, count=len(view.running))
        ends = [(float(jobs.expected_finish_s[r]), int(jobs.run_type[r]), int(jobs.num_gpus[r]))
                for r in run.tolist()]
        ends += [(now + _est_run_s(view, j, view.gpu_type[g[0]]), int(view.gpu_type[g[0]]), len(g))
                 for j, g in starts]
        ends.sort()
        total = view.total_by_type()
        best = (-1, np.inf, 0)
        for t in jobs.type_order()[head].tolist():
            if jobs.speed[head, t] <= 0:
                break
            if total[t] < need:
                continue
            avail = int(pool.by_type[t])
            shadow = now if avail >= need else np.inf
            if avail < need:
                for end, rt, k in ends:
                    if rt == t:
                        avail += k
                        if avail >= need:
                            shadow = end
                            break
            if shadow < best[1]:
                best = (t, shadow, avail - need)
        return best
