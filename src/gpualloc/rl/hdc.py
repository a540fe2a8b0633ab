"""Hyperdimensional (HD) encoding of the cluster state: the design's "semantic & structural
decomposition" module, optional input of the scheduling agent.

Every symbol (a GPU model, a job type, a role such as "priority") is a random bipolar hypervector
(+-1, ``dim`` entries) drawn from a hash of its name and the seed, so a GPU type never seen in
training still gets a stable vector: the encoder needs no vocabulary and no cluster. Continuous
values (utilisation, priority, GPUs asked) are *levels*: level 0 is random and each next level flips
a fresh ``dim / 2 / (levels - 1)`` entries, so ``cos(level i, level j) = 1 - |i - j| / (levels - 1)``.
Structure comes from two operations:

* **bind** (element-wise product): ``gpu = type (x) level(util)``; its own inverse, dissimilar to both.
* **bundle** (weighted element-wise sum, then sign; ties go to a seeded random vector): a set whose
  members stay similar to it. A job is ``bundle(PRIORITY (x) level(p), TYPE (x) type, GPUS (x) level(g))``;
  the state bundles the GPU types and the queued jobs, each half weighing as much as the other.

:meth:`HDEncoder.project` maps a hypervector to ``out_dim`` float32 features in ``[-1, 1]``: the sums
of ``out_dim`` fixed blocks of its entries, scaled to unit variance. As every entry of a state is
already random (the symbols are), this is a sparse random projection: cosines are kept approximately,
at a sixth of the cost of a dense one (and no ``out_dim x dim`` matrix to keep in cache).

Use in the scheduling agent (``features="hd"``): build one ``HDEncoder`` per agent and save
``encoder.to_dict()`` with it; once per run (per job table) take ``codes = table_codes(view,
encoder)``; at each decision point call ``hd_features(view, encoder, jobs=point.slots,
codes=codes)`` (a :class:`~gpualloc.rl.features.DecisionPoint`'s queued-job slots; default the
whole queue) and put the ``out_dim`` values where the plain per-type block would go. Pass
``utilization=metrics.utilization`` to encode measured GPU utilisation instead of the busy share.

References:
    P. Kanerva, "Hyperdimensional computing: an introduction to computing in distributed
    representation with high-dimensional random vectors", Cognitive Computation 1(2), 2009.
    D. Kleyko et al., "A survey on hyperdimensional computing aka vector symbolic architectures,
    part I", ACM Computing Surveys 55(6), 2022.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from gpualloc.errors import AgentError
from gpualloc.limits import check_size
from gpualloc.scheduling.base import ClusterView
from gpualloc.seeding import seeded
from gpualloc.workload.jobs import JOB_TYPES, JobType

__all__ = ["HDEncoder", "JobCodes", "bind", "hd_features", "table_codes"]

MAX_DIM = 1 << 17
"""Largest hypervector: far beyond the 10,000 where HD capacity stops improving."""
MAX_LOG2_GPUS = 10.0
"""GPUs asked enter as ``log2(gpus) / MAX_LOG2_GPUS``: 1 to 1,024 GPUs span the levels."""
PRIORITY_SCALE = 1.0
"""Priority ``p`` enters as ``0.5 + 0.5 p / (|p| + PRIORITY_SCALE)``, any integer into (0, 1); the
usual 0, 1, 2 (0.5, 0.75, 0.83) get distinct levels from ``levels=8`` up."""
PROJECTION_CLIP = 4.0
"""Projected values are ~N(0, 1); they are divided by this and clipped to [-1, 1] (clips 6e-5)."""


class JobCodes(NamedTuple):
    """Per-job rows of an encoder's job tables (:meth:`HDEncoder.job_codes`); :meth:`take` selects jobs."""

    prio_type: np.ndarray
    gpus: np.ndarray
    levels: int

    def take(self, jobs: np.ndarray) -> JobCodes:
        """The codes of the jobs at indices ``jobs``."""
        return JobCodes(self.prio_type[jobs], self.gpus[jobs], self.levels)


def bind(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise product: dissimilar to both inputs, and its own inverse (``bind(bind(a, b), b) == a``)."""
    return a * b


class HDEncoder:
    """Seeded hypervectors for GPU types, utilisation levels and jobs, and their projection.

    Args:
        dim: hypervector length (64..131,072).
        out_dim: features :meth:`project` returns (1..dim).
        levels: quantisation levels of a value in [0, 1] (2..dim / 2).
        seed: an int, or a numpy Generator (one int is drawn from it); None draws a fresh one.
            Saved as :attr:`seed`, so ``HDEncoder(**encoder.to_dict())`` is the same encoder.

    Raises:
        AgentError: an argument out of range.
    """

    @seeded(to="int", error=AgentError)
    def __init__(self, dim: int = 4096, out_dim: int = 32, levels: int = 16, seed=0) -> None:
        self.dim = check_size(dim, "HDEncoder dim", MAX_DIM, AgentError, minimum=64)
        self.out_dim = check_size(out_dim, "HDEncoder out_dim", dim, AgentError)
        self.levels = check_size(levels, "HDEncoder levels", dim // 2, AgentError, minimum=2)
        self.seed = seed
        # Hypervectors are int8 throughout: 4x less memory traffic than float32, and a (jobs x dim)
        # temporary stays under malloc's mmap threshold (128 KiB), which float32 crosses at 8 jobs.
        self._symbols: dict[str, np.ndarray] = {}
        self._stacks: dict[tuple[str, ...], np.ndarray] = {}
        # level i = base with the first flips[i] entries of a random order negated
        rank = self._rng("level-order").permutation(dim)
        flips = np.rint(np.arange(levels) * (dim // 2) / (levels - 1)).astype(np.int64)
        self._levels = _frozen(np.where(rank[None, :] < flips[:, None], -1, 1) * self._vec("level:base"))
        self._tie = self._vec("bundle:tie-break")
        # job record fields pre-bound with their roles; priority and type summed per (level, type) pair
        kinds = np.stack([self._vec(f"job-type:{t.value}") for t in JOB_TYPES])
        prio_type = (self._vec("role:priority") * self._levels)[:, None, :] + self._vec("role:job-type") * kinds
        self._prio_type = _frozen(prio_type.reshape(levels * len(JOB_TYPES), dim))
        self._gpus = _frozen(self._vec("role:gpus") * self._levels)
        # projection blocks: out_dim near-equal runs of entries; a block of n entries is scaled by 1/sqrt(n)
        self._blocks = (np.arange(out_dim) * dim) // out_dim
        self._block_scale = (1.0 / np.sqrt(np.diff(self._blocks, append=dim))).astype(np.float32)

    def to_dict(self) -> dict:
        """The arguments that rebuild this encoder (for an agent's checkpoint)."""
        return {"dim": self.dim, "out_dim": self.out_dim, "levels": self.levels, "seed": self.seed}

    @classmethod
    def from_dict(cls, data: dict) -> HDEncoder:
        """Inverse of :meth:`to_dict`; unknown keys raise :class:`AgentError`."""
        unknown = sorted(set(data) - {"dim", "out_dim", "levels", "seed"})
        if unknown:
            raise AgentError(f"HDEncoder: unknown field(s) {', '.join(map(str, unknown))}")
        return cls(**data)

    # ------------------------------------------------------------------------------- symbols
    def _rng(self, name: str) -> np.random.Generator:
        digest = hashlib.blake2b(f"{self.seed}\0{name}".encode(), digest_size=8).digest()
        return np.random.default_rng(int.from_bytes(digest, "little"))

    def _vec(self, name: str) -> np.ndarray:
        """The +-1 vector of a symbol name (cached, read-only)."""
        hv = self._symbols.get(name)
        if hv is None:
            hv = self._symbols[name] = _frozen(self._rng(name).integers(0, 2, self.dim) * 2 - 1)
        return hv

    def _type_rows(self, type_names: Sequence[str]) -> np.ndarray:
        """The vectors of ``type_names`` stacked (cached per cluster: one lookup per decision point)."""
        key = tuple(type_names)
        rows = self._stacks.get(key)
        if rows is None:
            rows = self._stacks[key] = _frozen(np.stack([self.encode_gpu_type(n) for n in key]))
        return rows

    def encode_gpu_type(self, name: str) -> np.ndarray:
        """The bipolar vector of a GPU model name; stable for names never seen before (read-only)."""
        return self._vec(f"gpu-type:{name}")

    def _level_index(self, x, field: str) -> np.ndarray:
        """Nearest level of each value of ``x``, which must lie in [0, 1] (``field`` names it in errors)."""
        x = np.asarray(x, dtype=np.float64)
        bad = _outside_unit(x)
        if bad is not None:
            raise AgentError(f"HDEncoder: {field}={float(x[bad])} must lie in [0, 1]")
        return np.rint(x * (self.levels - 1)).astype(np.intp)

    def encode_level(self, x: float) -> np.ndarray:
        """Level vector of ``x`` in [0, 1]: nearby values give similar vectors."""
        return self._levels[int(self._level_index(x, "level"))]

    # ----------------------------------------------------------------------------- composites
    def _sign(self, total: np.ndarray) -> np.ndarray:
        s = np.sign(total).astype(np.int8)
        s += (s == 0) * self._tie  # a zero sum takes the seeded tie-break's entry
        return s

    def bundle(self, hvs, weights=None) -> np.ndarray:
        """Sign of the (weighted) sum of the rows of ``hvs``; zero sums take the seeded tie-break."""
        hvs = np.asarray(hvs)
        w = np.ones(len(hvs)) if weights is None else np.asarray(weights, np.float64)
        if hvs.ndim != 2 or hvs.shape[1] != self.dim or w.shape != (len(hvs),):
            raise AgentError(f"HDEncoder.bundle: expected (n, {self.dim}) vectors and n weights, got "
                             f"{hvs.shape} and {w.shape}")
        return self._sign(w @ hvs)

    def encode_gpu(self, type_name: str, utilisation: float) -> np.ndarray:
        """``type (x) level(utilisation)``."""
        return bind(self.encode_gpu_type(type_name), self.encode_level(utilisation))

    def job_codes(self, priority, type_code, gpus) -> JobCodes:
        """The table rows that encode each job: once per job table, then :meth:`encode_state` per decision.

        Args:
            priority: per-job priority (any finite number).
            type_code: per-job :data:`~gpualloc.workload.jobs.JOB_TYPES` index.
            gpus: per-job GPUs asked (>= 1).
        """
        priority, gpus = np.asarray(priority, np.float64), np.asarray(gpus, np.float64)
        code = np.asarray(type_code, np.intp)
        # every field as a value in [0, 1], so that one range check refuses NaN, infinities, gpus < 1
        # and unknown job type codes
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.stack([0.5 + 0.5 * priority / (np.abs(priority) + PRIORITY_SCALE),
                          np.minimum(np.log2(gpus) / MAX_LOG2_GPUS, 1.0), code / (len(JOB_TYPES) - 1)])
        bad = _outside_unit(x)
        if bad is not None:
            row, job = bad
            rule = ("priority={} must be finite", "gpus={} must be >= 1",
                    f"job type code {{}} must be in 0..{len(JOB_TYPES) - 1}")[row]
            raise AgentError(f"HDEncoder: job {job}: " + rule.format((priority, gpus, code)[row][job]))
        p, g, _ = np.rint(x * (self.levels - 1)).astype(np.intp)
        return JobCodes(p * len(JOB_TYPES) + code, g, self.levels)

    def _records(self, codes: JobCodes) -> np.ndarray:
        """(jobs, dim): sign of role (x) value summed over the three fields (never a tie)."""
        if codes.levels != self.levels:
            raise AgentError(f"HDEncoder: job codes for {codes.levels} levels, encoder has {self.levels}")
        return np.sign(self._prio_type[codes.prio_type] + self._gpus[codes.gpus])

    def encode_job(self, priority: float, job_type: JobType | str, gpus: int) -> np.ndarray:
        """``bundle(PRIORITY (x) level(priority), TYPE (x) job_type, GPUS (x) level(log2 gpus))``."""
        return self._records(self.job_codes([priority], [_job_type_code(job_type)], [gpus]))[0]

    def encode_state(self, type_names: Sequence[str], type_util, codes: JobCodes | None = None) -> np.ndarray:
        """Bundle of the GPU types at their utilisation and of the jobs of ``codes`` (:meth:`job_codes`)."""
        if len(type_util) != len(type_names):
            raise AgentError(f"HDEncoder: {len(type_util)} utilisations for {len(type_names)} GPU types")
        n_t, n_j = len(type_names), 0 if codes is None else len(codes.gpus)
        # integer weights: both halves weigh n_t * n_j, and sums (and ties) stay exact
        total = np.zeros(self.dim, np.int32)
        if n_t:
            gpu = self._levels[self._level_index(type_util, "utilisation")]
            gpu *= self._type_rows(type_names)
            total = _row_sum(gpu) * np.int32(max(n_j, 1))
        if n_j:
            total = total + _row_sum(self._records(codes)) * np.int32(max(n_t, 1))
        return self._sign(total)

    def encode_arrays(self, type_names: Sequence[str], type_util, priority=(), type_code=(), gpus=()) -> np.ndarray:
        """:meth:`encode_cluster_state` from arrays: per-type utilisation; per-job priority,
        :data:`~gpualloc.workload.jobs.JOB_TYPES` index and GPUs."""
        return self.encode_state(type_names, type_util, self.job_codes(priority, type_code, gpus))

    def encode_cluster_state(self, utilisation: Mapping[str, float],
                             jobs: Iterable[tuple[float, JobType | str, int]] = ()) -> np.ndarray:
        """Bundle of ``encode_gpu(type, util)`` per GPU type and ``encode_job(*job)`` per queued job.

        Args:
            utilisation: GPU type name -> share of its GPUs in use, in [0, 1].
            jobs: ``(priority, job_type, gpus)`` of the queued jobs (a set: order is not encoded).
        """
        jobs = list(jobs)
        return self.encode_arrays(list(utilisation), list(utilisation.values()), [j[0] for j in jobs],
                                  [_job_type_code(j[1]) for j in jobs], [j[2] for j in jobs])

    def features(self, type_names: Sequence[str], type_util, codes: JobCodes | None = None) -> np.ndarray:
        """``project(encode_state(...))``: the norm of a bipolar vector is known (the agent's hot path)."""
        hv = self.encode_state(type_names, type_util, codes)
        return _squash(np.add.reduceat(hv, self._blocks, dtype=np.float32), self._block_scale)

    def project(self, hv) -> np.ndarray:
        """``out_dim`` float32 features in [-1, 1] of ``hv`` (or of each row of a 2-D batch).

        Block ``k`` gives ``sum(hv[block k]) / sqrt(len(block k))``, with ``hv`` first rescaled to the
        norm of a bipolar vector: each value is ~N(0, 1) over random inputs, and similar vectors give
        similar features.
        """
        hv = np.asarray(hv, dtype=np.float32)
        if hv.shape[-1] != self.dim:
            raise AgentError(f"HDEncoder.project: vector of length {hv.shape[-1]}, encoder dim {self.dim}")
        norm = np.sqrt(np.einsum("...i,...i->...", hv, hv))[..., None]
        rescale = np.sqrt(np.float32(self.dim)) / np.where(norm > 0, norm, np.float32(1))  # 1 when bipolar
        return _squash(np.add.reduceat(hv, self._blocks, axis=-1), self._block_scale * rescale)


def _outside_unit(x: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first value of ``x`` outside [0, 1] (NaN included), or None."""
    if x.size and not (x.min() >= 0.0 and x.max() <= 1.0):  # min and max propagate NaN
        return tuple(int(i) for i in np.argwhere(~((x >= 0.0) & (x <= 1.0)))[0])
    return None


def _row_sum(rows: np.ndarray) -> np.ndarray:
    """Column sums of +-1 rows in the narrowest exact integer type (a sum that needs no cast is
    several times faster)."""
    n = len(rows)
    return rows.sum(axis=0, dtype=np.int8 if n <= 127 else np.int16 if n <= 32_767 else np.int32)


def _squash(z: np.ndarray, scale) -> np.ndarray:
    """``z * scale`` (~N(0, 1)) into [-1, 1], in place on the float32 ``z``."""
    z *= np.asarray(scale, np.float32) / PROJECTION_CLIP
    return np.clip(z, -1.0, 1.0, out=z)


def _frozen(a: np.ndarray) -> np.ndarray:
    """``a`` as int8, read-only: the encoder's tables are shared by every caller."""
    a = np.ascontiguousarray(a, dtype=np.int8)
    a.flags.writeable = False
    return a


def _job_type_code(job_type: JobType | str) -> int:
    try:
        return JOB_TYPES.index(JobType(getattr(job_type, "value", job_type)))
    except ValueError:
        raise AgentError(f"HDEncoder: unknown job type {job_type!r}") from None


def hd_features(view: ClusterView, encoder: HDEncoder, *, jobs: Sequence[int] | None = None,
                utilization: np.ndarray | None = None, codes: JobCodes | None = None) -> np.ndarray:
    """The HD block for one decision point: per-type utilisation and the queued jobs, projected.

    Args:
        view: the simulator's (or service's) view.
        encoder: the agent's encoder.
        jobs: job indices to encode (e.g. ``DecisionPoint.slots``); default the whole queue.
        utilization: per-GPU utilisation in [0, 1] (``GpuMetrics.utilization``; NaN counts as 0);
            default 1 for a GPU running a job, 0 for a free or failed one.
        codes: ``encoder.job_codes(t.priority, t.type_code, t.num_gpus)`` of the view's whole job
            table ``t``, computed once per run (:func:`table_codes`); default: computed for ``jobs``
            at each call, which adds about 60% to a call.

    Returns:
        ``encoder.out_dim`` float32 values in [-1, 1].
    """
    n_types = len(view.type_names)
    if utilization is None:
        per_type = np.bincount(view.gpu_type[view.gpu_job >= 0], minlength=n_types)
    else:
        busy = np.clip(np.nan_to_num(np.asarray(utilization, np.float64)), 0.0, 1.0)
        if busy.shape != view.gpu_type.shape:
            raise AgentError(f"hd_features: {busy.size} utilisation values for {view.gpu_type.size} GPUs")
        per_type = np.bincount(view.gpu_type, weights=busy, minlength=n_types)
    type_util = per_type / np.maximum(view.total_by_type(), 1)  # in [0, 1]: at most every GPU of the type
    jobs = view.queue if jobs is None else jobs
    q = np.fromiter(jobs, dtype=np.intp, count=len(jobs))
    if codes is None:
        return encoder.features(view.type_names, type_util, table_codes(view, encoder, q))
    if len(codes.gpus) != len(view.jobs):
        raise AgentError(f"hd_features: job codes for {len(codes.gpus)} jobs, the view has {len(view.jobs)}")
    return encoder.features(view.type_names, type_util, codes.take(q))


def table_codes(view: ClusterView, encoder: HDEncoder, jobs: np.ndarray | None = None) -> JobCodes:
    """``encoder``'s codes of the view's jobs (all of them by default), for :func:`hd_features`."""
    t = view.jobs
    q = slice(None) if jobs is None else jobs
    return encoder.job_codes(t.priority[q], t.type_code[q], t.num_gpus[q])
