"""Prediction-driven policies: SRTF, SJF and ``gavel-srtf`` deciding on predicted durations (issue 36).

:class:`PredictionDriven` wraps a policy that ranks jobs by their work (``work_s``) or remaining work
(``remaining_s``). At each decision it brings a :class:`~gpualloc.scheduling.predict.DurationPredictor`
up to date with the jobs finished so far (the predictor's own refit schedule), predicts the remaining
work of every queued and running job given the work it has done, and hands the inner policy a view
whose ``remaining_s`` is that prediction (the median, or another quantile) and whose ``work_s`` is
work done plus it. Every other column is the policy's own view's, so under ``--knowledge blind`` the
inner policy reads no duration but the predictor's: a read of ``expected_finish_s`` still fails.

The predictor starts empty at each run (a new job table), so nothing learnt in one simulation leaks
into the next.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from gpualloc.errors import SchedulingError
from gpualloc.scheduling.base import DONE, ClusterView, Decision, Policy
from gpualloc.scheduling.knowledge import OBSERVED_FIELDS, SUBMIT_FIELDS
from gpualloc.scheduling.predict import DurationPredictor, done_work_s
from gpualloc.seeding import seeded
from gpualloc.workload.jobs import SubmitFeatures

_SHARED = (*SUBMIT_FIELDS, *OBSERVED_FIELDS, "best_speed", "type_order", "submit_features")
"""What the inner policy reads of its own view's jobs unchanged (looked up once per run, not per access)."""


class PredictedJobs:
    """A policy's jobs with ``work_s`` and ``remaining_s`` replaced by predictions.

    One per job table, so that a policy keeping state per table (Gavel's) sees the same object at
    every decision; the two columns are written in place, for the jobs asked about, at each decision.
    Other attributes are the wrapped jobs' (read once, or forwarded).
    """

    def __init__(self, jobs: Any) -> None:
        self._jobs = jobs
        n = len(jobs)
        self.work_s = np.zeros(n)
        self.remaining_s = np.zeros(n)
        for name in _SHARED:
            try:
                setattr(self, name, getattr(jobs, name))
            except AttributeError:
                pass

    def __len__(self) -> int:
        return len(self._jobs)

    def __getattr__(self, name: str) -> Any:  # only for what __init__ did not copy
        return getattr(self._jobs, name)


class PredictionDriven:
    """``inner`` deciding on predicted remaining work (see the module docstring).

    Args:
        inner: the policy (reads ``work_s`` / ``remaining_s`` only for ranking).
        predictor: the predictor (default: a new :class:`DurationPredictor` with ``seed``); it is
            reset at the start of each run (keeping its ``history``, the jobs known before any run).
        seed: the default predictor's seed.
        quantile: which quantile of the predicted remaining work the inner policy ranks by (0.5: the median).
        name: registry name (default: the inner policy's name with ``-pred``).
        history: the default predictor's finished jobs known before the run, ``(features, work)``
            (:func:`~gpualloc.scheduling.predict.replay_history`); not with ``predictor``, which holds its own.
    """

    @seeded(error=SchedulingError)
    def __init__(self, inner: Policy, predictor: DurationPredictor | None = None, *, seed: int = 0,
                 quantile: float = 0.5, name: str | None = None,
                 history: tuple[SubmitFeatures, np.ndarray] | None = None) -> None:
        if predictor is not None and history is not None:
            raise SchedulingError("give a predictor or a history, not both (the predictor holds its own)")
        self.predictor = predictor if predictor is not None else DurationPredictor(seed=seed, history=history)
        if not 0.0 < float(quantile) < 1.0:
            raise SchedulingError(f"{name or inner.name}-pred: quantile must be in (0, 1), got {quantile!r}")
        self.inner = inner
        self.quantile = float(quantile)
        self.name = name or f"{inner.name}-pred"
        self.preemptive = bool(inner.preemptive)
        self.round_s = inner.round_s
        self._source: Any = None  # the job table of the current run; its state is made at its first decision
        self._jobs: PredictedJobs | None = None

    def __repr__(self) -> str:
        return f"PredictionDriven({self.inner!r}, quantile={self.quantile})"

    def decide(self, view: ClusterView) -> Decision:
        jobs = view.jobs
        if jobs is not self._source:  # a new run: nothing learnt before it counts
            self._source, self._jobs = jobs, PredictedJobs(jobs)
            self._watch = np.zeros(0, dtype=np.int64)  # jobs that may have finished since the last decision
            self._seen_version = np.full(len(jobs), -1, dtype=np.int64)  # the fit each job's prediction is from
            self._seen_done = np.zeros(len(jobs))  # ... and the work done it was given
            self._n_done = int(np.count_nonzero(np.asarray(jobs.status) == DONE))
            self.predictor.reset()
        proxy = self._jobs
        assert proxy is not None
        # a job finishes only while running: it ran at the last decision, or that decision started it
        if self._watch.size:
            self._n_done += int(np.count_nonzero(jobs.status[self._watch] == DONE))
        predictor = self.predictor
        if predictor.update(jobs, view.now_s, n_finished=self._n_done):
            self._n_done = predictor.n_history  # the fit's own count (a start the policy did not make, e.g.)
        active = np.fromiter(view.queue, dtype=np.int64, count=len(view.queue))
        running = np.fromiter(view.running, dtype=np.int64, count=len(view.running))
        active = np.concatenate([active, running])
        if active.size:
            # a prediction changes only with the fit or the work done: a waiting job's is kept
            done = done_work_s(jobs, active)
            stale = (self._seen_version[active] != predictor.version) | (self._seen_done[active] != done)
            if stale.any():
                which, done = active[stale], done[stale]
                rem = predictor.quantiles(which, jobs, (self.quantile,))[0]
                proxy.remaining_s[which] = rem
                proxy.work_s[which] = done + rem
                self._seen_version[which] = predictor.version
                self._seen_done[which] = done
        inner_view = copy.copy(view)
        inner_view.jobs = proxy
        decision = self.inner.decide(inner_view)
        started = np.fromiter((j for j, _ in decision.starts), dtype=np.int64, count=len(decision.starts))
        stopped = set(decision.preempt)
        keep = running if not stopped else np.array([j for j in running.tolist() if j not in stopped], dtype=np.int64)
        self._watch = np.concatenate([keep, started])
        return decision


@seeded(error=SchedulingError)
def srtf_pred(*, seed: int = 0, predictor: DurationPredictor | None = None, quantile: float = 0.5,
              history: tuple[SubmitFeatures, np.ndarray] | None = None) -> PredictionDriven:
    """SRTF on predicted remaining work (``srtf-pred``). ``history``: finished jobs known before the
    run, ``(features, work)`` (:func:`~gpualloc.scheduling.predict.replay_history`)."""
    from gpualloc.scheduling.policies.simple import SRTF

    return PredictionDriven(SRTF(), predictor, seed=seed, quantile=quantile, name="srtf-pred", history=history)


@seeded(error=SchedulingError)
def sjf_pred(*, seed: int = 0, predictor: DurationPredictor | None = None, quantile: float = 0.5,
             history: tuple[SubmitFeatures, np.ndarray] | None = None) -> PredictionDriven:
    """SJF on predicted work (``sjf-pred``): done work plus the predicted remaining work."""
    from gpualloc.scheduling.policies.simple import SJF

    return PredictionDriven(SJF(), predictor, seed=seed, quantile=quantile, name="sjf-pred", history=history)


@seeded(error=SchedulingError)
def gavel_srtf_pred(*, seed: int = 0, predictor: DurationPredictor | None = None, quantile: float = 0.5,
                    history: tuple[SubmitFeatures, np.ndarray] | None = None, **options: Any) -> PredictionDriven:
    """``gavel-srtf`` on predicted remaining work (``gavel-srtf-pred``); ``options`` go to
    :class:`~gpualloc.scheduling.policies.hetero.GavelShortestFirst` (``round_s``, ``idle_weight``, ...)."""
    from gpualloc.scheduling.policies.hetero import GavelShortestFirst

    return PredictionDriven(GavelShortestFirst(**options), predictor, seed=seed, quantile=quantile,
                            name="gavel-srtf-pred", history=history)
