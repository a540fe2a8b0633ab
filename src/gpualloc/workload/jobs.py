"""Jobs and traces: the one representation every trace reader produces and the simulator consumes.

A job's *work* is expressed in seconds on the reference device type (``REFERENCE_DEVICE``): how long
the job runs alone on ``num_gpus`` reference GPUs. Its speed on another device type is a ratio to
that (see :mod:`gpualloc.workload.speed`), so time on type ``t`` is ``work_s / speed[t]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

from gpualloc.errors import TraceError

if TYPE_CHECKING:  # numpy is imported where the columns are built: the CLI starts without it
    import numpy as np

REFERENCE_DEVICE = "V100-16GB"
"""Device type in which job work is measured (Gavel's and Philly's traces ran on V100-class GPUs)."""


class JobType(str, Enum):
    """The design's three job categories (one-hot in the scheduler's state)."""

    SIMULATION = "simulation"
    ML_TRAINING = "ml-training"
    DATA_PROCESSING = "data-processing"

    @classmethod
    def parse(cls, value: str, where: str = "job_type") -> JobType:
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            allowed = ", ".join(t.value for t in cls)
            raise TraceError(f"{where}: unknown job type {value!r} (expected one of {allowed})") from None


JOB_TYPES: tuple[JobType, ...] = tuple(JobType)


@dataclass(frozen=True, slots=True)
class Job:
    """One job request.

    Attributes:
        id: unique id within its trace (the source's id where it has one).
        arrival_s: submission time, seconds from the start of the trace.
        job_type: category.
        work_s: run time alone on ``num_gpus`` GPUs of the reference device type, seconds.
        num_gpus: GPUs requested, all granted at once (gang scheduling), all of one device type.
        model: model or application name where known (``"resnet50"``, ``"bert"``), else ``""``.
        gpu_milli: share of each GPU the job needs, in 1/1000 (Alibaba's fractional requests); the
            simulator gives such a job a whole GPU, which is what exclusive allocation means.
        cpu_cores: CPU cores requested.
        mem_bytes: host memory requested.
        priority: larger is more important; 0 by default.
        gpu_types: device types the job may run on (canonical catalog names), preferred first: under
            team quotas (:mod:`gpualloc.scheduling.quotas`) the job starts on the first of them with
            room and falls back to the next only when it has none; empty means any type.
        single_node: all GPUs must sit on one node.
        batch_size: per-job batch size where the trace gives it (Pollux/Sia), else 0.
        team: the team that submitted the job (quotas and fair share,
            :mod:`gpualloc.scheduling.quotas`); ``""`` is the default team: no quota, borrows only.
        user: who submitted the job, where the source says (the service's users), else ``""``.
        qos: the source's quality-of-service class as written (Alibaba's ``LS``/``HP``/``BE``...; its
            coarse rank is ``priority``), else ``""``.
        submit_day_s: seconds after midnight when the job was submitted (Philly's timestamps), in
            ``[0, 86400)``; -1 where the source gives no clock time.
        time_limit_s: the time limit the user wrote, in seconds on the reference device type, where
            the source records one; ``None`` where it does not (:mod:`gpualloc.workload.estimates`
            then draws one). Only the ``estimate`` information level shows it, as the job's work.

    ``user``, ``qos`` and ``submit_day_s``, with the fields above them, are what a duration predictor
    may learn from (:mod:`gpualloc.scheduling.predict`): all known when the job is submitted.
    """

    id: str
    arrival_s: float
    job_type: JobType
    work_s: float
    num_gpus: int = 1
    model: str = ""
    gpu_milli: int = 1000
    cpu_cores: float = 0.0
    mem_bytes: int = 0
    priority: int = 0
    gpu_types: tuple[str, ...] = ()
    single_node: bool = False
    batch_size: int = 0
    team: str = ""
    user: str = ""
    qos: str = ""
    submit_day_s: float = -1.0
    time_limit_s: float | None = None

    def __post_init__(self) -> None:
        if not self.arrival_s >= 0:
            raise TraceError(f"job {self.id}: arrival_s must be >= 0, got {self.arrival_s}")
        if not self.work_s > 0:
            raise TraceError(f"job {self.id}: work_s must be > 0, got {self.work_s}")
        if self.num_gpus < 1:
            raise TraceError(f"job {self.id}: num_gpus must be >= 1, got {self.num_gpus}")
        if not 0 < self.gpu_milli <= 1000:
            raise TraceError(f"job {self.id}: gpu_milli must be in (0, 1000], got {self.gpu_milli}")
        if not (self.submit_day_s == -1.0 or 0.0 <= self.submit_day_s < 86400.0):
            raise TraceError(f"job {self.id}: submit_day_s must be in [0, 86400) or -1, got {self.submit_day_s}")
        if self.time_limit_s is not None and not 0.0 < self.time_limit_s < float("inf"):
            raise TraceError(f"job {self.id}: time_limit_s must be finite and > 0, got {self.time_limit_s}")

    @property
    def gpu_seconds(self) -> float:
        """Reference GPU-seconds of work: ``work_s * num_gpus``."""
        return self.work_s * self.num_gpus

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["job_type"] = self.job_type.value
        d["gpu_types"] = list(self.gpu_types)
        return d


@dataclass(frozen=True)
class Trace:
    """An ordered list of jobs (by arrival, ties by position in the source) and where it came from.

    Attributes:
        jobs: the jobs, sorted by ``arrival_s`` (stable).
        source: file path or generator description.
        format: reader name (``"native"``, ``"philly"``, ..., ``"synthetic"``).
    """

    jobs: tuple[Job, ...]
    source: str = ""
    format: str = "native"
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = set()
        for job in self.jobs:
            if job.id in ids:
                raise TraceError(f"{self.source or 'trace'}: duplicate job id {job.id!r}")
            ids.add(job.id)
        ordered = tuple(sorted(self.jobs, key=lambda j: j.arrival_s))
        object.__setattr__(self, "jobs", ordered)

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self):
        return iter(self.jobs)

    @classmethod
    def of(cls, jobs: Iterable[Job], source: str = "", format: str = "native", **meta: Any) -> Trace:
        return cls(tuple(jobs), source=source, format=format, meta=dict(meta))

    def head(self, n: int) -> Trace:
        """The first ``n`` jobs by arrival."""
        return Trace(self.jobs[:n], self.source, self.format, dict(self.meta))

    def shifted(self) -> Trace:
        """The same jobs with arrivals shifted so the first arrives at 0."""
        if not self.jobs:
            return self
        t0 = self.jobs[0].arrival_s
        return Trace(tuple(replace(j, arrival_s=j.arrival_s - t0) for j in self.jobs),
                     self.source, self.format, dict(self.meta))


@dataclass(frozen=True)
class SubmitFeatures:
    """What is known of each job when it is submitted, as columns (row ``i``: the ``i``-th job).

    The fields a duration predictor may learn from (:mod:`gpualloc.scheduling.predict`); nothing here
    depends on how long a job runs. Text fields are integer codes into their ``*_names`` (sorted, ``""``
    included: not known); numbers are float.

    Attributes:
        type_code: index in ``JOB_TYPES``.
        num_gpus, priority, gpu_milli, cpu_cores, mem_bytes, batch_size: as on :class:`Job`.
        submit_day_s: seconds after midnight at submission, -1 where not known.
        model, team, user, qos, gpu_spec: codes; ``gpu_spec`` is the job's ``gpu_types`` joined by ``|``.
    """

    type_code: np.ndarray
    num_gpus: np.ndarray
    priority: np.ndarray
    gpu_milli: np.ndarray
    cpu_cores: np.ndarray
    mem_bytes: np.ndarray
    batch_size: np.ndarray
    submit_day_s: np.ndarray
    model: np.ndarray
    model_names: tuple[str, ...]
    team: np.ndarray
    team_names: tuple[str, ...]
    user: np.ndarray
    user_names: tuple[str, ...]
    qos: np.ndarray
    qos_names: tuple[str, ...]
    gpu_spec: np.ndarray
    gpu_spec_names: tuple[str, ...]

    NUMERIC = ("type_code", "num_gpus", "priority", "gpu_milli", "cpu_cores", "mem_bytes", "batch_size",
               "submit_day_s")
    """Columns that are numbers (``type_code`` is a category with an order of no meaning, see ``CATEGORICAL``)."""
    CATEGORICAL = ("type_code", "model", "team", "user", "qos", "gpu_spec")
    """Columns that are categories."""

    def __len__(self) -> int:
        return len(self.num_gpus)

    @classmethod
    def of(cls, jobs: Sequence[Job]) -> SubmitFeatures:
        """The columns of ``jobs``, in one pass over them."""
        import numpy as np

        n = len(jobs)
        code = {t: i for i, t in enumerate(JOB_TYPES)}
        num = [np.fromiter(map(code.__getitem__, (j.job_type for j in jobs)), float, n)]
        num += [np.fromiter((getattr(j, name) for j in jobs), float, n) for name in cls.NUMERIC[1:]]
        texts: dict[str, Any] = {}
        for name in cls.CATEGORICAL[1:]:
            values = ["|".join(j.gpu_types) for j in jobs] if name == "gpu_spec" else [getattr(j, name) for j in jobs]
            texts[f"{name}_names"], texts[name] = _codes(values)
        return cls(*num, **texts)

    def take(self, idx: np.ndarray) -> SubmitFeatures:
        """The rows ``idx`` (the same code tables)."""
        return SubmitFeatures(**{f: (v if f.endswith("_names") else v[idx])
                                 for f, v in ((f, getattr(self, f)) for f in self.__dataclass_fields__)})

    @classmethod
    def concat(cls, parts: Sequence[SubmitFeatures]) -> SubmitFeatures:
        """The rows of ``parts`` one after another; each text column's codes are recoded into the union
        of their names (sorted, ``""`` first)."""
        import numpy as np

        if not parts:
            return cls.of([])
        out: dict[str, Any] = {name: np.concatenate([getattr(p, name) for p in parts]) for name in cls.NUMERIC}
        for name in cls.CATEGORICAL[1:]:
            names = tuple(sorted(set().union(*(getattr(p, f"{name}_names") for p in parts)) | {""}))
            index = {v: i for i, v in enumerate(names)}
            out[f"{name}_names"] = names
            out[name] = np.concatenate([
                np.array([index[v] for v in getattr(p, f"{name}_names")], dtype=np.int64)[getattr(p, name)]
                if len(p) else np.zeros(0, dtype=np.int64) for p in parts])
        return cls(**out)


def _codes(values: Sequence[str]) -> tuple[tuple[str, ...], np.ndarray]:
    """``(sorted distinct values with "" first, code of each value)``."""
    import numpy as np

    names = tuple(sorted(set(values) | {""}))
    index = {v: i for i, v in enumerate(names)}
    return names, np.fromiter(map(index.__getitem__, values), np.int64, len(values))

