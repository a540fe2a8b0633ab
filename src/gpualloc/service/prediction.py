"""Run-time prediction in the service, learned from its own store (issue 36).

The service does not know how long a job will run: a user may give a time limit (an estimate, as
Slurm's ``--time``), and many give none. :class:`StoreHistory` keeps a
:class:`~gpualloc.scheduling.predict.DurationPredictor` fed with the store's jobs that *ran to their
end* (state ``finished``, or ``failed`` with an exit status: the program ran and exited; a lost,
cancelled or never-started job is no duration), each one's work being its last attempt's run time x
its speed on the device type it ran on (reference seconds; a re-queued job restarts from scratch, so
the last attempt is the whole run). Jobs still running count as lower bounds (their work so far).

* **Warm start.** :meth:`StoreHistory.refit` at start-up reads the store, so a restarted service
  predicts as well as before it stopped.
* **Schedule.** The scheduler counts the jobs that end (:meth:`StoreHistory.note_ended`) and refits
  when the predictor's schedule says so (every new finished job until the trees, then at 1.5x growth
  or 2,000 jobs: :meth:`~gpualloc.scheduling.predict.DurationPredictor.next_refit`), on the
  ``max_train_jobs`` most recently finished.
* **No future.** A fit reads only jobs whose end is recorded in the store at or before ``now``.

Submit-time features (:func:`feature_job`): GPUs, job type, allowed device types (``gpu_spec``),
team, user, priority, hour of day (``submit_day_s``, UTC; left out by the predictor's defaults), and
the model name the user gave, else the job's name with its trailing run number dropped
(``train-7`` -> ``train``), as the ``model`` category: people resubmit the same job under the same
name, the strongest signal a service has (Helios, SC'21, predicts from job names the same way).

The prediction-driven policies (``srtf-pred``, ``sjf-pred``, ``gavel-srtf-pred``) are given this
predictor (:class:`StorePredictor`): they rank by its predictions and leave its learning to the
service.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.scheduling.predict import DurationPredictor, Prediction, PredictorConfig
from gpualloc.seeding import seeded
from gpualloc.service.models import JobRecord, JobState
from gpualloc.workload.jobs import Job, JobType, SubmitFeatures
from gpualloc.workload.speed import speed_matrix

MIN_WORK_S = 1e-3
"""The least work recorded for a job (a job that exits at once has a run time of about 0)."""
_RUN_SUFFIX = re.compile(r"(?:(?:[-_.:#/ ]+(?:run|try|attempt|v|seed)?|(?:run|try|attempt|v|seed))[-_.:#/ ]*\d+)+$",
                         re.IGNORECASE)


def name_key(name: str) -> str:
    """A job name without its trailing run numbers (``"bert-ft-12"`` -> ``"bert-ft"``,
    ``"train_run3"`` -> ``"train"``; digits need a separator or ``run``/``try``/``attempt``/``v``/``seed``
    before them, so ``"resnet50"`` stays), lower-case; a name that is only digits is kept."""
    key = _RUN_SUFFIX.sub("", name.strip()).strip().lower()
    return key or name.strip().lower()


def feature_job(rec: JobRecord, epoch: float = 0.0) -> Job:
    """The submit-time fields of ``rec`` as a :class:`Job` for :meth:`SubmitFeatures.of` (module
    docstring: ``model`` is the model name, else the job's name key). Its ``work_s`` is a placeholder."""
    s = rec.spec
    clock = rec.submitted_at % 86400.0
    return Job(id=str(rec.id), arrival_s=max(0.0, rec.submitted_at - epoch), job_type=JobType(s["job_type"]),
               work_s=1.0, num_gpus=int(s["num_gpus"]), model=s.get("model") or name_key(rec.name),
               priority=int(s["priority"]), gpu_types=tuple(s["gpu_types"]), single_node=bool(s["single_node"]),
               team=rec.team or "", user=rec.user or "", submit_day_s=clock if math.isfinite(clock) else -1.0)


def features_of(records: Sequence[JobRecord]) -> SubmitFeatures:
    """:class:`SubmitFeatures` of ``records`` (:func:`feature_job`)."""
    return SubmitFeatures.of([feature_job(r) for r in records])


class StorePredictor(DurationPredictor):
    """A :class:`DurationPredictor` that only the service teaches: a policy's :meth:`reset` (a new job
    table) keeps what it learnt, and a policy's :meth:`update` (learning from its job table, whose
    finished rows the service retires) does nothing: :class:`StoreHistory` fits it from the store."""

    def reset(self) -> None:
        if getattr(self, "_ready", False):
            return
        super().reset()
        self._ready = True

    def update(self, jobs: Any, now_s: float, n_finished: int | None = None) -> bool:
        return False


class StoreHistory:
    """The service's duration predictor and the store history it learns from.

    Args:
        store: the service's store (``ran_to_end``, ``ran_to_end_count``).
        cluster: the cluster (jobs' speeds on the device type they ran on).
        seed: the predictor's seed.
        options: :class:`~gpualloc.scheduling.predict.PredictorConfig` fields to change.
        clock: Unix time.

    Attributes:
        predictor: the :class:`StorePredictor`.
        n_ended: jobs of the store that ran to their end (what the refit schedule counts).
        lock: held while the predictor is refitted or read outside the scheduler's thread.
    """

    @seeded(error=SchedulingError)
    def __init__(self, store: Any, cluster: ClusterSpec, *, seed: int = 0, options: dict[str, Any] | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.store, self.cluster = store, cluster
        self.predictor = StorePredictor(seed=seed, config=PredictorConfig(), **dict(options or {}))
        self.clock = clock if clock is not None else store.clock
        self.lock = threading.Lock()
        self.n_ended = 0
        self._fitted_on = -1  # jobs that had run to their end at the last fit (-1: none yet)
        self._type_index = {t.name: i for i, t in enumerate(cluster.device_types)}

    @property
    def stage(self) -> str:
        """The predictor's stage: ``prior`` (no history yet), ``empirical`` or ``model``."""
        return self.predictor.stage

    # ----------------------------------------------------------------------------- learning
    def work_s(self, records: Sequence[JobRecord]) -> np.ndarray:
        """Reference seconds each of ``records`` ran in its last attempt: run time x speed on its device
        type (NaN where it never started)."""
        if not records:
            return np.zeros(0)
        speed = speed_matrix([r.to_job(0.0) for r in records], self.cluster.device_types)
        out = np.full(len(records), np.nan)
        for i, r in enumerate(records):
            t = self._type_index.get(r.device_type or "")
            if t is not None and r.started_at is not None and r.finished_at is not None:
                out[i] = max(r.finished_at - r.started_at, 0.0) * speed[i, t]
        return out

    def refit(self, running: Sequence[tuple[JobRecord, float]] = ()) -> None:
        """Fit the predictor on the store's jobs that ran to their end by now, newest
        ``max_train_jobs``, oldest first (``running``: ``(record, work done so far)`` of jobs running
        now, lower bounds on their work)."""
        now = self.clock()
        count = self.store.ran_to_end_count()
        recs = self.store.ran_to_end(limit=self.predictor.config.max_train_jobs, until=now)
        self.n_ended = self._fitted_on = max(count, len(recs))
        work = self.work_s(recs)
        ok = np.isfinite(work)
        recs = [r for r, good in zip(recs, ok, strict=True) if good]
        work = np.maximum(work[ok], MIN_WORK_S)
        cens = [(r, d) for r, d in running if d > 0]
        cens_feats = features_of([r for r, _ in cens]) if cens else None
        cens_done = np.array([d for _, d in cens], dtype=float) if cens else None
        feats = features_of(recs)
        with self.lock:
            self.predictor.fit_arrays(feats, work, cens_feats, cens_done)

    def note_ended(self, rec: JobRecord) -> None:
        """``rec`` was just recorded as ended: count it if it ran to its end."""
        if ran_to_end(rec):
            self.n_ended += 1

    def next_refit(self) -> int:
        """The count of jobs that ran to their end at which to refit next: the predictor's schedule
        (every new one before its trees, then 1.5x growth or 2,000 more, whichever first), counted on
        the store's jobs (a fit reads at most ``max_train_jobs`` of them)."""
        return 0 if self._fitted_on < 0 else self.predictor.config.refit_after(self._fitted_on)

    def due(self) -> bool:
        """Whether the refit schedule says to refit now."""
        return self.n_ended >= self.next_refit()

    # ---------------------------------------------------------------------------- predicting
    def predict(self, records: Sequence[JobRecord], done_s: np.ndarray) -> Prediction | None:
        """Remaining work (reference seconds) of ``records`` that have done ``done_s``; None while the
        predictor has no history (stage ``prior``)."""
        if self.predictor.stage == "prior" or not records:
            return None
        feats = features_of(records)
        with self.lock:
            return self.predictor.predict_features(feats, np.asarray(done_s, dtype=float))


    def describe(self, records: Sequence[JobRecord], now: float | None = None) -> list[dict[str, Any] | None]:
        """What the API shows of each record's remaining run time (``PREDICTION_FIELDS`` of
        :mod:`gpualloc.service.models`): for a queued, allocated or running job, the prediction in
        seconds on the device type it runs on (a queued job: on its fastest allowed type), or only its
        stage ``prior`` while no job has run to its end; None for an ended job."""
        now = self.clock() if now is None else now
        active = [i for i, r in enumerate(records) if not r.state.terminal]
        out: list[dict[str, Any] | None] = [None] * len(records)
        if not active:
            return out
        stage = self.predictor.stage
        if stage == "prior":
            for i in active:
                out[i] = {"prediction_stage": "prior"}
            return out
        recs = [records[i] for i in active]
        speed = speed_matrix([r.to_job(0.0) for r in recs], self.cluster.device_types)
        rate = np.maximum(speed.max(axis=1), 1e-9)  # a queued job: its fastest allowed type
        done = np.zeros(len(recs))
        for k, r in enumerate(recs):
            t = self._type_index.get(r.device_type or "")
            if r.state is JobState.RUNNING and t is not None and r.started_at is not None:
                rate[k] = max(speed[k, t], 1e-9)
                done[k] = max(now - r.started_at, 0.0) * rate[k]
        pred = self.predict(recs, done)
        if pred is None:  # the stage changed meanwhile
            return self.describe(records, now)
        for k, i in enumerate(active):
            out[i] = {"predicted_remaining_s": float(pred.median_s[k] / rate[k]),
                      "predicted_remaining_lo_s": float(pred.lo_s[k] / rate[k]),
                      "predicted_remaining_hi_s": float(pred.hi_s[k] / rate[k]),
                      "prediction_interval": float(pred.interval), "prediction_stage": stage}
        return out


def ran_to_end(rec: JobRecord) -> bool:
    """Whether ``rec`` is a job whose run time is a duration to learn from (module docstring)."""
    return (rec.state is JobState.FINISHED or (rec.state is JobState.FAILED and rec.exit_code is not None)) \
        and rec.started_at is not None and rec.finished_at is not None
