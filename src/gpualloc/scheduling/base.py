"""The one interface between the cluster simulator (or the live service) and a scheduling policy.

A policy sees a :class:`ClusterView` and returns a :class:`Decision`: which queued jobs to start on
which GPUs, and (for preemptive policies) which running jobs to stop. The view holds columnar job
state in a :class:`JobTable` (one row per job of the trace, numpy arrays), so a policy can rank
thousands of queued jobs with array operations; every device-type-dependent quantity is a
jobs x device-types matrix, as in Gavel.

The view's arrays are the simulator's live state: policies must treat them as read-only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Protocol, runtime_checkable

import numpy as np

from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.workload.jobs import JOB_TYPES, SubmitFeatures, Trace

# Job status codes in JobTable.status
PENDING, QUEUED, RUNNING, DONE = 0, 1, 2, 3

# ClusterView.gpu_job values that are not job indices
GPU_FREE, GPU_DOWN = -1, -2


@dataclass
class JobTable:
    """Per-job state as arrays, indexed by the job's position in the trace.

    Static (from the trace and the speed model):
        arrival_s, work_s (reference seconds), num_gpus, priority, type_code (index in ``JOB_TYPES``),
        single_node (bool), speed (jobs x device types: throughput relative to the reference device;
        0 where the job may not run on that type), team (index in ``team_names``; 0 is ``""``, the
        default team), pref_rank (jobs x device types: the type's place in the job's ``gpu_types``,
        0 = preferred; ``PREF_NONE`` for a type it does not list; all 0 for a job without a list).
        Quotas (:mod:`gpualloc.scheduling.quotas`) read team and pref_rank; nothing else does.
    Dynamic (kept by the simulator):
        status (PENDING/QUEUED/RUNNING/DONE), remaining_s (reference seconds of work left),
        attained_gpu_s (GPU-seconds of service received so far, wall clock x GPUs, as Tiresias' LAS
        counts it), run_type (device type index while running, else -1), start_s (first start,
        NaN before), finish_s (NaN before), queued_since_s (when it last entered the queue),
        preemptions (count), expected_finish_s (while running: when the job will finish if left
        alone, restart penalty included; NaN otherwise).
    """

    arrival_s: np.ndarray
    work_s: np.ndarray
    num_gpus: np.ndarray
    priority: np.ndarray
    type_code: np.ndarray
    single_node: np.ndarray
    speed: np.ndarray
    team: np.ndarray | None = None
    team_names: tuple[str, ...] = ("",)
    pref_rank: np.ndarray | None = None
    status: np.ndarray = field(init=False)
    remaining_s: np.ndarray = field(init=False)
    attained_gpu_s: np.ndarray = field(init=False)
    run_type: np.ndarray = field(init=False)
    start_s: np.ndarray = field(init=False)
    finish_s: np.ndarray = field(init=False)
    queued_since_s: np.ndarray = field(init=False)
    preemptions: np.ndarray = field(init=False)
    expected_finish_s: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if self.team is None:
            self.team = np.zeros(n, dtype=np.int64)
        if self.pref_rank is None:
            self.pref_rank = np.zeros(np.shape(self.speed), dtype=np.int64)
        self.status = np.full(n, PENDING, dtype=np.int8)
        self.remaining_s = np.asarray(self.work_s, dtype=float).copy()
        self.attained_gpu_s = np.zeros(n)
        self.run_type = np.full(n, -1, dtype=np.int64)
        self.start_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.queued_since_s = np.full(n, np.nan)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.expected_finish_s = np.full(n, np.nan)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @classmethod
    def from_trace(cls, trace: Trace, speed: np.ndarray, type_names: Sequence[str] = ()) -> JobTable:
        """Build the table; ``speed`` is the (jobs x device types) matrix from the speed model, whose
        columns are ``type_names`` (needed for the jobs' type preferences; without it none is kept)."""
        jobs = trace.jobs
        code = {t: i for i, t in enumerate(JOB_TYPES)}
        speed = np.asarray(speed, dtype=float)
        if speed.shape[0] != len(jobs):
            raise ValueError(f"speed matrix has {speed.shape[0]} rows for {len(jobs)} jobs")
        # one pass over the jobs for every column: each job object is visited once (on all of Philly,
        # a pass per column cost twice as much, in cache misses more than in work)
        columns: tuple[list, ...] = ([], [], [], [], [], [], [], [])
        arrival, work, gpus, prio, kind, single, teams, prefs = (c.append for c in columns)
        for j in jobs:
            arrival(j.arrival_s)
            work(j.work_s)
            gpus(j.num_gpus)
            prio(j.priority)
            kind(j.job_type)
            single(j.single_node)
            teams(j.team)
            prefs(j.gpu_types)
        team_names, team = team_codes(columns[6])
        pref = np.zeros(speed.shape, dtype=np.int64)
        if type_names:
            column = {name: i for i, name in enumerate(type_names)}
            rows: dict[tuple[str, ...], np.ndarray] = {}
            for i, types in enumerate(columns[7]):
                if types:
                    row = rows.get(types)
                    if row is None:
                        row = rows[types] = preference_ranks(types, column, len(type_names))
                    pref[i] = row
        n = len(jobs)
        table = cls(
            arrival_s=np.fromiter(columns[0], float, n),
            work_s=np.fromiter(columns[1], float, n),
            num_gpus=np.fromiter(columns[2], np.int64, n),
            priority=np.fromiter(columns[3], np.int64, n),
            type_code=np.fromiter(map(code.__getitem__, columns[4]), np.int64, n),
            single_node=np.fromiter(columns[5], bool, n),
            speed=speed, team=team, team_names=team_names, pref_rank=pref,
        )
        table.__dict__["_source_jobs"] = jobs  # for submit_features(), built when first asked
        return table

    def fresh(self) -> JobTable:
        """A table of the same jobs, as before any simulation: the static columns are shared (treat
        them as read-only), the dynamic state is new."""
        table = JobTable(**{f.name: getattr(self, f.name) for f in fields(self) if f.init})
        for key in ("_source_jobs", "_submit_features"):
            if key in self.__dict__:
                table.__dict__[key] = self.__dict__[key]
        return table

    def submit_features(self) -> SubmitFeatures:
        """Each job's submit-time fields (what a duration predictor learns from), computed once: from the
        trace's jobs for a table built by :meth:`from_trace`, else from the table's own columns (type,
        GPUs, priority, team; the other fields not known)."""
        feats = self.__dict__.get("_submit_features")
        if feats is None:
            jobs = self.__dict__.get("_source_jobs")
            if jobs is not None:
                feats = SubmitFeatures.of(jobs)
            else:
                n = len(self)
                zeros, codes, none = np.zeros(n), np.zeros(n, dtype=np.int64), ("",)
                feats = SubmitFeatures(
                    type_code=self.type_code.astype(float), num_gpus=self.num_gpus.astype(float),
                    priority=self.priority.astype(float), gpu_milli=np.full(n, 1000.0), cpu_cores=zeros,
                    mem_bytes=zeros, batch_size=zeros, submit_day_s=np.full(n, -1.0), model=codes, model_names=none,
                    team=np.asarray(self.team, dtype=np.int64), team_names=tuple(self.team_names), user=codes,
                    user_names=none, qos=codes, qos_names=none, gpu_spec=codes, gpu_spec_names=none)
            self.__dict__["_submit_features"] = feats
        return feats

    def best_speed(self) -> np.ndarray:
        """Each job's speed on its fastest allowed device type."""
        return self.speed.max(axis=1)

    def type_order(self) -> np.ndarray:
        """Jobs x types: each row lists device type indices from the job's fastest to its slowest
        (ties by type index); types where the job may not run come last. Computed once."""
        order = self.__dict__.get("_type_order")
        if order is None:
            order = np.argsort(-self.speed, axis=1, kind="stable")
            self.__dict__["_type_order"] = order
        return order


PREF_NONE = 1 << 20
"""``JobTable.pref_rank`` of a device type the job's ``gpu_types`` list leaves out."""


def team_codes(teams: Sequence[str]) -> tuple[tuple[str, ...], np.ndarray]:
    """``(team_names, code per job)``: the default team ``""`` is always code 0, the others follow
    sorted by name."""
    present = set(teams)
    names = ("", *sorted(present - {""}))
    if len(names) == 1:  # no team named (most traces): all the default team
        return names, np.zeros(len(teams), dtype=np.int64)
    index = {name: i for i, name in enumerate(names)}
    return names, np.fromiter(map(index.__getitem__, teams), np.int64, len(teams))


def preference_ranks(gpu_types: Sequence[str], column: dict[str, int], n_types: int) -> np.ndarray:
    """One ``JobTable.pref_rank`` row: each listed type's place in ``gpu_types`` (first listed = 0),
    ``PREF_NONE`` for the cluster's other types; all 0 when the list is empty (no preference)."""
    row = np.zeros(n_types, dtype=np.int64)
    if gpu_types:
        row[:] = PREF_NONE
        for rank, name in enumerate(gpu_types):
            t = column.get(name)
            if t is not None and row[t] == PREF_NONE:
                row[t] = rank
    return row


@dataclass
class ClusterView:
    """What a policy sees at a decision point.

    Attributes:
        now_s: simulated time.
        cluster: the cluster spec.
        type_names: device type names; ``speed`` columns and ``gpu_type`` values index this.
        gpu_type: device type index of each GPU.
        gpu_node: node index of each GPU.
        gpu_job: job index running on each GPU, ``GPU_FREE`` (-1) when free, ``GPU_DOWN`` (-2) while
            failed (neither free nor running a job).
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

    # free_mask, free_by_type and free_by_type_node return new arrays: callers (FreeGpus) may change them

    def free_mask(self) -> np.ndarray:
        """Per GPU: whether it is free."""
        return self.gpu_job == GPU_FREE

    def free_by_type(self) -> np.ndarray:
        """Number of free GPUs of each device type."""
        return np.bincount(self.gpu_type[self.free_mask()], minlength=len(self.type_names))

    def free_by_type_node(self) -> np.ndarray:
        """Types x nodes: number of free GPUs of each device type on each node."""
        n_types, n_nodes = len(self.type_names), len(self.cluster.nodes)
        free = self.free_mask()
        flat = self.gpu_type[free] * n_nodes + self.gpu_node[free]
        return np.bincount(flat, minlength=n_types * n_nodes).reshape(n_types, n_nodes)

    def free_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """``(free_mask, free_by_type_node, free_by_type, shared)`` in one call. ``shared``: the arrays
        are the view's own, read-only and current only until the decision is applied (the simulator's
        view); :class:`FreeGpus` copies them before its first change."""
        return self.free_mask(), self.free_by_type_node(), self.free_by_type(), False

    def gpus_by_type_node(self) -> list[list[np.ndarray]]:
        """``[type][node]``: indices of the GPUs of that type on that node, ascending. Computed once."""
        table = self.__dict__.get("_gpus_by_type_node")
        if table is None:
            n_nodes = len(self.cluster.nodes)
            table = [[np.flatnonzero((self.gpu_type == t) & (self.gpu_node == n)) for n in range(n_nodes)]
                     for t in range(len(self.type_names))]
            self.__dict__["_gpus_by_type_node"] = table
        return table

    def type_node_lists(self) -> tuple[list[int], list[int]]:
        """``(gpu_type, gpu_node)`` as Python lists (indexing them is cheaper than numpy scalars in
        per-GPU loops). Computed once; the GPUs of a view never change type or node."""
        lists = self.__dict__.get("_type_node_lists")
        if lists is None:
            lists = self.__dict__["_type_node_lists"] = (self.gpu_type.tolist(), self.gpu_node.tolist())
        return lists

    def free_index(self) -> FreeIndex | None:
        """A :class:`FreeIndex` of the free GPUs that the view's owner keeps current (the simulator's
        view), for :class:`FreeGpus` to place from; ``None`` here."""
        return None

    def gpus_of(self, job: int) -> tuple[int, ...]:
        """The GPUs running ``job`` (empty when it is not running)."""
        return tuple(int(g) for g in np.flatnonzero(self.gpu_job == job))

    def free_gpus(self) -> FreeGpus:
        """A working copy of the free GPUs, for planning several starts in one decision."""
        return FreeGpus(self)

    def total_by_type(self) -> np.ndarray:
        return np.bincount(self.gpu_type, minlength=len(self.type_names))

    def find_gpus(self, job: int, type_index: int, free: np.ndarray | None = None) -> tuple[int, ...] | None:
        """GPUs of one type for ``job``, or ``None`` if they are not free (:func:`best_fit`).

        ``free`` overrides the free mask (a policy planning several starts passes its own working copy).
        """
        if free is None:
            free, on_node = self.free_mask(), self.free_by_type_node()[type_index]
        else:
            on_node = np.bincount(self.gpu_node[free & (self.gpu_type == type_index)],
                                  minlength=len(self.cluster.nodes))
        return best_fit(int(self.jobs.num_gpus[job]), bool(self.jobs.single_node[job]), on_node,
                        self.gpus_by_type_node()[type_index], free)


Starts = list[tuple[int, tuple[int, ...]]]
"""``Decision.starts``: ``(job index, its GPUs)`` per start, in order."""


@dataclass
class Decision:
    """A policy's answer: stop these running jobs, then start these queued jobs on these GPUs."""

    starts: Starts = field(default_factory=list)
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


_FEW_NODES = 16  # best_fit loops in Python up to this many nodes, with numpy beyond


def best_fit(need: int, single_node: bool, free_on_node: np.ndarray, node_gpus: Sequence[np.ndarray],
             free: np.ndarray) -> tuple[int, ...] | None:
    """Consolidated best fit: which free GPUs of one device type a job gets.

    The job goes on the fewest nodes: on one node when one has room (the fullest such node, so large
    gangs keep finding whole nodes), else over the nodes with the most free GPUs first (never for a
    single-node job). Inside a node it takes the lowest GPU indices. :meth:`ClusterView.find_gpus`,
    :class:`FreeGpus` and the simulator's view all place with this one function.

    Args:
        need: GPUs wanted.
        single_node: all on one node.
        free_on_node: free GPUs of the type on each node.
        node_gpus: the type's GPU indices on each node, ascending.
        free: free mask over all GPUs.

    Returns:
        The GPUs, or ``None`` when they cannot be had.
    """
    if len(free_on_node) > _FEW_NODES:
        free_on_node = np.asarray(free_on_node, dtype=np.int64)
        # free - need as unsigned: a node without room wraps around to a huge value, so the least is
        # the fullest node that fits (lowest index on ties) when one does
        node = int((free_on_node - need).view(np.uint64).argmin())
        if free_on_node[node] >= need:  # one node suffices
            g = node_gpus[node]
            return tuple(g[free[g]][:need].tolist())
        counts = free_on_node.tolist()
    else:  # the same choice in plain Python: numpy's per-call cost dominates on a few nodes
        counts = free_on_node.tolist() if isinstance(free_on_node, np.ndarray) else [int(c) for c in free_on_node]
        node, fewest = -1, 0
        for k, c in enumerate(counts):
            if c >= need and (node < 0 or c < fewest):
                node, fewest = k, c
        if node >= 0:
            g = node_gpus[node]
            return tuple(g[free[g]][:need].tolist())
    if single_node or sum(counts) < need:
        return None
    picked: list[int] = []
    for k in sorted(range(len(counts)), key=lambda i: -counts[i]):  # fewest nodes: the emptiest first (stable)
        g = node_gpus[k]
        picked.extend(g[free[g]][: need - len(picked)].tolist())
        if len(picked) == need:
            return tuple(picked)
    return None


class FreeIndex:
    """The free GPUs of each device type by node, kept so that the one-node case of :func:`best_fit`
    costs O(GPUs per node) instead of a pass over the nodes.

    Per (type, node) a bitmask of its free GPUs (bit ``i``: the node's ``i``-th GPU of the type, by
    ascending index); per type, for each count ``c``, a bitmask of the nodes with exactly ``c`` free
    GPUs of it. The fullest node with room for ``need`` GPUs, lowest index on ties, is then the lowest
    set bit of the first nonzero bucket from ``need`` up, and its lowest free GPUs are its mask's
    lowest bits: the GPUs :func:`best_fit` picks. The simulator moves GPUs in and out as they change
    hands (:meth:`take`, :meth:`give`); :class:`FreeGpus` reads it until its plan changes a GPU.

    Args:
        node_gpus: ``[type][node]``: the type's GPU indices on each node, ascending
            (:meth:`ClusterView.gpus_by_type_node`).
        free: free mask over all GPUs.
        live: ``(free mask, types x nodes free counts, free counts by type)``: arrays that :meth:`take`
            and :meth:`give` keep in step (the simulator's own), in the same pass over the GPUs.

    Attributes:
        total: free GPUs in all.
    """

    def __init__(self, node_gpus: Sequence[Sequence[np.ndarray]], free: np.ndarray,
                 live: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        n_nodes = len(node_gpus[0]) if len(node_gpus) else 0
        n_gpus = len(free)
        self._n_nodes = n_nodes
        self._gpus: list[list[int]] = []  # by key = type * n_nodes + node
        self._key = [0] * n_gpus
        self._bit = [0] * n_gpus
        self._mask: list[int] = []
        self._buckets: list[list[int]] = []
        free_l = np.asarray(free, dtype=bool).tolist()
        for t, by_node in enumerate(node_gpus):
            cap = max((len(g) for g in by_node), default=0)
            buckets = [0] * (cap + 1)
            for node, gpus in enumerate(by_node):
                gl = [int(g) for g in gpus]
                key = t * n_nodes + node
                mask = 0
                for i, g in enumerate(gl):
                    self._key[g], self._bit[g] = key, 1 << i
                    if free_l[g]:
                        mask |= 1 << i
                self._gpus.append(gl)
                self._mask.append(mask)
                buckets[mask.bit_count()] |= 1 << node
            self._buckets.append(buckets)
        self.total = int(sum(free_l))
        # the live arrays, the counts flat (type * nodes + node, the key): one index instead of two
        self._live = None if live is None else (live[0], live[1].reshape(-1), live[2])
        if live is not None and not np.shares_memory(self._live[1], live[1]):
            raise ValueError("FreeIndex: the free counts must be a contiguous types x nodes array")

    def take(self, gpus: Sequence[int]) -> None:
        """``gpus`` (free ones) are no longer free."""
        self._move(gpus, False, -1)

    def give(self, gpus: Sequence[int]) -> None:
        """``gpus`` (not free ones) are free again."""
        self._move(gpus, True, 1)

    def _move(self, gpus: Sequence[int], to_free: bool, step: int) -> None:
        key_of, bit_of, masks, buckets, n_nodes = self._key, self._bit, self._mask, self._buckets, self._n_nodes
        live = self._live
        for g in gpus:
            key = key_of[g]
            m = masks[key]
            c = m.bit_count()
            masks[key] = m ^ bit_of[g]  # the GPU's bit flips: set when it comes free, cleared when taken
            t = key // n_nodes
            b = buckets[t]
            node = 1 << (key % n_nodes)
            b[c] ^= node
            b[c + step] |= node
            if live is not None:
                free, count, by_type = live
                free[g] = to_free
                count[key] += step
                by_type[t] += step
        self.total += step * len(gpus)

    def one_node(self, type_index: int, need: int) -> tuple[int, ...] | None:
        """The GPUs :func:`best_fit` gives ``need`` GPUs of ``type_index`` when one node has room for
        them; ``None`` when none has (then only a gang over several nodes could fit)."""
        buckets = self._buckets[type_index]
        for c in range(max(need, 1), len(buckets)):
            nodes = buckets[c]
            if nodes:
                key = type_index * self._n_nodes + (nodes & -nodes).bit_length() - 1
                free, gl = self._mask[key], self._gpus[key]
                picked = []
                for _ in range(need):
                    low = free & -free
                    picked.append(gl[low.bit_length() - 1])
                    free ^= low
                return tuple(picked)
        return None

    def state(self) -> tuple[list[int], list[list[int]]]:
        """``(masks by type * nodes + node, buckets by type)``, copies (to compare with a rebuilt index)."""
        return list(self._mask), [list(b) for b in self._buckets]


class FreeGpus:
    """A policy's working copy of the free GPUs while it plans a decision.

    ``take`` the GPUs of each planned start and ``give`` back those of each planned preemption; the
    view itself is never changed. :meth:`find` follows :meth:`ClusterView.find_gpus` (consolidated
    best fit) and :meth:`place` tries the job's device types from its fastest.

    Attributes:
        free: free mask over all GPUs.
        count: types x nodes free GPU counts.
        by_type: free GPUs per device type.
        total: free GPUs in all.

    Until the first ``take`` or ``give`` the arrays may be the view's own, read-only (copy on write:
    most decisions start one job and never change the copy).
    """

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self.free, self.count, self.by_type, self._shared = view.free_state()
        # the view owner's index answers one-node fits while the plan has changed nothing
        self._index = view.free_index() if self._shared else None
        self.total = self._index.total if self._index is not None else sum(self.by_type.tolist())
        self._node_gpus = view.gpus_by_type_node()
        self._type_node = view.type_node_lists()

    def find(self, job: int, type_index: int) -> tuple[int, ...] | None:
        """GPUs of one type for ``job`` among the free ones, or ``None``."""
        jobs = self.view.jobs
        need = int(jobs.num_gpus[job])
        if self.by_type[type_index] < need:
            return None
        if self._index is not None:
            gpus = self._index.one_node(type_index, need)
            if gpus is not None:
                return gpus
        single = bool(jobs.single_node[job])
        gpus = best_fit(need, single, self.count[type_index], self._node_gpus[type_index], self.free)
        if gpus is None and single:
            # enough free GPUs of the type, but split across nodes: tell the view's owner (the
            # simulator migrates jobs to make room, :mod:`gpualloc.scheduling.consolidate`)
            misses = getattr(self.view, "fragment_misses", None)
            if misses is not None:
                misses.append((job, type_index))
        return gpus

    def place(self, job: int) -> tuple[int, tuple[int, ...]] | None:
        """``(type index, GPUs)`` on the fastest type where ``job`` may run and its GPUs are free, or ``None``."""
        jobs = self.view.jobs
        row = jobs.speed[job]
        for t in jobs.type_order()[job].tolist():
            if row[t] <= 0:
                return None  # the rest are forbidden too
            gpus = self.find(job, t)
            if gpus is not None:
                return t, gpus
        return None

    def find_freeing(self, job: int, type_index: int, victims: Iterable[tuple[int, tuple[int, ...]]]
                     ) -> tuple[tuple[int, ...] | None, list[int], list[int]]:
        """:meth:`find`, giving back the GPUs of ``victims`` (``(running job, its GPUs)``, in order) one job
        at a time until ``job`` fits.

        Returns ``(gpus, stopped, spared)``: the GPUs (not taken), the victims whose GPUs they use, and
        the victims given back whose GPUs they do not need, taken again (they keep running). When even
        every victim does not make room: ``None`` and every victim given back spared.
        """
        gpus = self.find(job, type_index)
        given: list[tuple[int, tuple[int, ...]]] = []
        victims = iter(victims)
        while gpus is None and (victim := next(victims, None)) is not None:
            self.give(victim[1])
            given.append(victim)
            gpus = self.find(job, type_index)
        used = set(gpus or ())
        stopped: list[int] = []
        spared: list[int] = []
        for v, v_gpus in given:
            if used.intersection(v_gpus):
                stopped.append(v)
            else:
                self.take(v_gpus)
                spared.append(v)
        return gpus, stopped, spared

    def copy(self) -> FreeGpus:
        """An independent working copy (to try a plan and drop it)."""
        other = FreeGpus.__new__(FreeGpus)
        other.__dict__.update(self.__dict__)
        other.free, other.count, other.by_type = self.free.copy(), self.count.copy(), self.by_type.copy()
        other._shared, other._index = False, None
        return other

    def take(self, gpus: Sequence[int]) -> None:
        """Mark ``gpus`` as used by a planned start."""
        self._move(gpus, False, -1)

    def start(self, job: int) -> tuple[int, ...] | None:
        """:meth:`place` ``job`` and :meth:`take` its GPUs; the GPUs, or ``None`` if it does not fit."""
        placed = self.place(job)
        if placed is None:
            return None
        self.take(placed[1])
        return placed[1]

    def give(self, gpus: Sequence[int]) -> None:
        """Mark ``gpus`` as free again (a planned preemption)."""
        self._move(gpus, True, 1)

    def _move(self, gpus: Sequence[int], to_free: bool, step: int) -> None:
        if self._shared:
            self.free, self.count, self.by_type = self.free.copy(), self.count.copy(), self.by_type.copy()
            self._shared, self._index = False, None
        gpu_type, gpu_node = self._type_node
        free, count, by_type = self.free, self.count, self.by_type
        for g in gpus:
            t = gpu_type[g]
            free[g] = to_free
            count[t, gpu_node[g]] += step
            by_type[t] += step
        self.total += step * len(gpus)
