"""Job duration prediction learned online from finished jobs only (issue 36).

A real cluster does not know how long a job will run; it knows what was submitted
(:class:`~gpualloc.workload.jobs.SubmitFeatures`: GPUs, job type, model or application, team, user,
QoS class, GPU spec, CPU and memory, clock time) and how much work each job has done so far
(``done_s``, reference seconds). :class:`DurationPredictor` learns, from the jobs that have finished
by ``now``, a distribution of each job's total work given those fields, and answers the *remaining*
work of a job given what it has done: the median and a central interval (80% by default).

The model (chosen for being cheap, calibrated by construction, and exact about conditioning):

* **Location**: gradient-boosted trees (scikit-learn's ``HistGradientBoostingRegressor``, squared
  error on ``log(work)``, categorical fields as categories) predict each job's log-work ``mu``.
* **Spread**: the residuals ``log(work) - mu`` of the most recently finished jobs, which the trees
  were *not* fitted on (split conformal, forward in time: the trees learn from the older finished jobs,
  the newest ``calib_fraction`` of them calibrate), kept sorted per bin of ``mu`` (the spread of short
  and long jobs differs). A job's total work is then distributed as ``exp(mu + r)``, ``r`` drawn from
  its bin's residuals.
* **Conditioning on work done**: a job that has done ``d`` has total work ``> d``, so its remaining
  work is ``exp(mu + r) - d`` over the residuals with ``exp(mu + r) > d`` only (the empirical
  distribution truncated at ``d``); its quantiles are read off the sorted residuals by binary search,
  vectorised over jobs. A job that has already run longer than every residual allows gets a Pareto
  tail of index 1 (Lindy: it is as likely to run as long again as not): remaining quantile ``p`` is
  ``d * p / (1 - p)``.

Until ``min_model_jobs`` jobs have finished there is no model: ``mu = 0`` and the residuals are the
log-work of every finished job (the global empirical distribution), and before ``min_history`` jobs a
log-normal prior (median ``prior_median_s``, log-spread ``prior_sigma``; 3600 s is the service's
default time limit). The model is refitted when the number of finished jobs has grown by
``refit_growth`` times since the last fit, or by ``refit_every`` jobs, whichever comes first (a
simulation of all of Philly's 82,000 jobs refits about 50 times), on the ``max_train_jobs`` most
recently finished jobs. Everything is deterministic given ``seed``.

References:
    Q. Hu et al., "Characterization and prediction of deep learning workloads in large-scale GPU
    datacenters" (Helios), SC'21: durations predicted from submit-time fields and history.
    V. Vovk et al., *Algorithmic Learning in a Random World* (2005); J. Lei et al., "Distribution-free
    predictive inference for regression", JASA 113(523), 2018 (split conformal residuals).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from gpualloc.errors import SchedulingError
from gpualloc.scheduling.base import DONE, ClusterView
from gpualloc.workload.jobs import SubmitFeatures

STAGES = ("prior", "empirical", "model")
"""What a :class:`DurationPredictor` predicts from: its prior, the finished jobs' empirical
distribution, or its fitted model."""

_BIN_OFFSET = 1.0e4  # residuals of bin b are stored as r + b * offset: one sorted array for all bins
_RESIDUAL_CLIP = 50.0  # |log residual| kept below this (e^50: no job runs that long), so bins never overlap
_MAX_CATEGORIES = 250  # HistGradientBoosting's categories must be < max_bins (255)
_BLOCK = 1024  # a table's mu is computed in blocks of rows (one call to the trees costs ~1-5 ms however few rows)
_THREADS: list[Any] = []  # threadpoolctl's controller, made on first use


def _one_thread() -> Any:
    """A context in which the trees use one OpenMP thread: deterministic sums, and on a shared host
    several threads were 10x slower than one (0.1 s against 1-6 s for a 1,500-job fit on 2 busy cores)."""
    if not _THREADS:
        from threadpoolctl import ThreadpoolController

        _THREADS.append(ThreadpoolController())
    return _THREADS[0].limit(limits=1, user_api="openmp")


@dataclass(frozen=True)
class Prediction:
    """Predicted remaining work of some jobs, reference seconds (one entry per job asked about).

    Attributes:
        median_s: the median remaining work.
        lo_s, hi_s: the central interval's ends: quantiles ``(1 - interval) / 2`` and ``(1 + interval) / 2``.
        interval: the interval's nominal coverage (0.8: the true remaining work lies inside 80% of the time).
    """

    median_s: np.ndarray
    lo_s: np.ndarray
    hi_s: np.ndarray
    interval: float

    def __len__(self) -> int:
        return len(self.median_s)


@dataclass(frozen=True)
class PredictorConfig:
    """:class:`DurationPredictor`'s hyper-parameters (chosen on the Philly, Gavel msr and Pollux
    traces' training windows, never on Alibaba: ``docs/prediction.md``).

    Attributes:
        interval: nominal coverage of :class:`Prediction`'s interval, in (0, 1).
        min_history: finished jobs before the prior gives way to their empirical distribution.
        min_model_jobs: finished jobs before the trees are fitted.
        refit_growth: refit when the finished jobs have grown by this factor since the last fit ...
        refit_every: ... or by this many jobs, whichever comes first.
        max_train_jobs: fit on at most this many of the most recently finished jobs.
        calib_fraction: the newest share of those that calibrates the spread (the trees fit the rest).
        residual_bins: most bins of ``mu`` with their own residuals ...
        min_bin_jobs: ... each with at least this many residuals.
        prior_median_s, prior_sigma: the log-normal prior before ``min_history`` jobs have finished.
        max_iter, learning_rate, max_leaf_nodes, min_samples_leaf, l2_regularization: the trees'.
        min_remaining_s: the least remaining work predicted (a policy may divide by it).
    """

    interval: float = 0.8
    min_history: int = 10
    min_model_jobs: int = 200
    refit_growth: float = 1.5
    refit_every: int = 2000
    max_train_jobs: int = 20_000
    calib_fraction: float = 0.25
    residual_bins: int = 4
    min_bin_jobs: int = 50
    prior_median_s: float = 3600.0
    prior_sigma: float = 1.5
    max_iter: int = 100
    learning_rate: float = 0.1
    max_leaf_nodes: int = 15
    min_samples_leaf: int = 20
    l2_regularization: float = 1.0
    min_remaining_s: float = 1.0

    def __post_init__(self) -> None:
        checks = (
            ("interval", 0.0 < self.interval < 1.0, "in (0, 1)"),
            ("min_history", self.min_history >= 1, ">= 1"),
            ("min_model_jobs", self.min_model_jobs >= max(self.min_history, 20), ">= min_history and >= 20"),
            ("refit_growth", self.refit_growth > 1.0, "> 1"),
            ("refit_every", self.refit_every >= 1, ">= 1"),
            ("max_train_jobs", self.max_train_jobs >= self.min_model_jobs, ">= min_model_jobs"),
            ("calib_fraction", 0.0 < self.calib_fraction < 1.0, "in (0, 1)"),
            ("residual_bins", self.residual_bins >= 1, ">= 1"),
            ("min_bin_jobs", self.min_bin_jobs >= 1, ">= 1"),
            ("prior_median_s", self.prior_median_s > 0 and math.isfinite(self.prior_median_s), "> 0"),
            ("prior_sigma", self.prior_sigma > 0 and math.isfinite(self.prior_sigma), "> 0"),
            ("max_iter", self.max_iter >= 1, ">= 1"),
            ("learning_rate", self.learning_rate > 0, "> 0"),
            ("max_leaf_nodes", self.max_leaf_nodes >= 2, ">= 2"),
            ("min_samples_leaf", self.min_samples_leaf >= 1, ">= 1"),
            ("l2_regularization", self.l2_regularization >= 0, ">= 0"),
            ("min_remaining_s", self.min_remaining_s > 0, "> 0"),
        )
        for name, ok, want in checks:
            if not ok:
                raise SchedulingError(f"duration predictor: {name} must be {want}, got {getattr(self, name)!r}")


class DurationPredictor:
    """Remaining-work prediction learned online from finished jobs (see the module docstring).

    Args:
        seed: the trees' random state (the fit uses no sampling; kept so runs are reproducible by seed).
        config: hyper-parameters; keyword ``overrides`` replace some of them.

    Attributes:
        stage: one of :data:`STAGES`.
        n_history: finished jobs the current fit learnt from.
        version: increases at every fit.
        fits: model fits so far (trees, not the prior or empirical stages).
    """

    def __init__(self, seed: int = 0, config: PredictorConfig | None = None, **overrides: Any) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise SchedulingError(f"duration predictor: seed must be an integer, got {seed!r}")
        known = {f.name for f in fields(PredictorConfig)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise SchedulingError(f"duration predictor: unknown option(s) {', '.join(bad)} "
                                  f"(known: {', '.join(sorted(known))})")
        self.seed = int(seed)
        self.config = replace(config or PredictorConfig(), **overrides)
        self.reset()

    def __repr__(self) -> str:
        return f"DurationPredictor(seed={self.seed}, stage={self.stage!r}, n_history={self.n_history})"

    def reset(self) -> None:
        """Forget every finished job (a new run)."""
        self.stage = "prior"
        self.n_history = 0
        self.version = 0
        self.fits = 0
        self._model: Any = None
        self._columns: list[str] = []
        self._maps: dict[str, np.ndarray] = {}
        self._edges = np.zeros(0)
        self._set_residuals([self._prior_residuals()])
        self._mu_feats: SubmitFeatures | None = None
        self._mu = np.zeros(0)
        self._mu_version = np.zeros(0, dtype=np.int64)  # per block of _BLOCK rows: the fit its mu is from

    # ------------------------------------------------------------------------------- learning
    def due(self, n_finished: int) -> bool:
        """Whether the schedule refits once ``n_finished`` jobs have finished."""
        c, last = self.config, self.n_history
        if n_finished <= last:
            return False
        if n_finished < c.min_model_jobs:
            return True  # the empirical stage: every new finished job (a sort of a few hundred numbers)
        if last < c.min_model_jobs:
            return True
        return n_finished >= last * c.refit_growth or n_finished - last >= c.refit_every

    def update(self, jobs: Any, now_s: float, n_finished: int | None = None) -> bool:
        """Refit on the jobs finished by ``now_s`` if the schedule says so (:meth:`due`); ``True`` if it did.

        Args:
            jobs: the job table, or a policy's view of it (``status``, ``finish_s``, the finished
                jobs' work and :meth:`~gpualloc.scheduling.base.JobTable.submit_features`).
            now_s: the present; jobs that finish later are never read.
            n_finished: how many have finished, when the caller counts them (else counted here).
        """
        if n_finished is None:
            n_finished = int(np.count_nonzero(_finished_mask(jobs, now_s)))
        if not self.due(n_finished):
            return False
        self.fit(jobs, now_s)
        return True

    def fit(self, jobs: Any, now_s: float) -> None:
        """Learn from every job finished by ``now_s`` (``status`` DONE and ``finish_s <= now_s``) and
        nothing else: a job still running or queued, or one that finishes later, is never read."""
        idx = np.flatnonzero(_finished_mask(jobs, now_s))
        idx = idx[np.argsort(np.asarray(jobs.finish_s)[idx], kind="stable")]  # oldest finish first
        work = _finished_work(jobs, idx)
        self.fit_arrays(jobs.submit_features().take(idx), work)

    def fit_arrays(self, features: SubmitFeatures, work_s: np.ndarray) -> None:
        """Learn from finished jobs given directly: their submit-time ``features`` and total work
        (reference seconds), ordered by when they finished, oldest first (the newest calibrate)."""
        work = np.asarray(work_s, dtype=float)
        if work.shape != (len(features),):
            raise SchedulingError(f"duration predictor: {len(features)} jobs' features but work of shape {work.shape}")
        if work.size and not (np.isfinite(work).all() and (work > 0).all()):
            raise SchedulingError("duration predictor: a finished job's work must be finite and > 0")
        c = self.config
        n = len(work)
        self.n_history = n
        self.version += 1
        self._model = None
        self._edges = np.zeros(0)
        if n < c.min_history:
            self.stage = "prior"
            self._set_residuals([self._prior_residuals()])
            return
        y = np.log(work)
        if n < c.min_model_jobs:
            self.stage = "empirical"
            self._set_residuals([np.sort(y)])
            return
        keep = slice(max(0, n - c.max_train_jobs), n)
        feats, y = features.take(np.arange(n)[keep]), y[keep]
        m = len(y)
        n_cal = max(int(round(c.calib_fraction * m)), min(c.min_bin_jobs, m // 2))
        n_fit = m - n_cal
        self._choose_columns(feats, n_fit)
        x = self._matrix(feats)
        model = self._new_model()
        with _one_thread():
            model.fit(x[:n_fit], y[:n_fit])
            mu_cal = model.predict(x[n_fit:])
        self._model = model
        self.fits += 1
        self.stage = "model"
        resid = y[n_fit:] - mu_cal
        bins = max(1, min(c.residual_bins, len(resid) // c.min_bin_jobs))
        if bins > 1:
            edges = np.unique(np.quantile(mu_cal, np.arange(1, bins) / bins))
        else:
            edges = np.zeros(0)
        which = np.searchsorted(edges, mu_cal, side="right")
        self._edges = edges
        self._set_residuals([np.sort(resid[which == b]) for b in range(len(edges) + 1)])

    def _prior_residuals(self) -> np.ndarray:
        from scipy.special import ndtri

        c = self.config
        k = 199
        return math.log(c.prior_median_s) + c.prior_sigma * ndtri((np.arange(k) + 0.5) / k)

    def _set_residuals(self, per_bin: list[np.ndarray]) -> None:
        """Keep each bin's sorted residuals in one array, bin ``b`` shifted by ``b * _BIN_OFFSET`` (so
        the whole is sorted and one binary search serves every job); an empty bin borrows all residuals."""
        every = np.sort(np.concatenate(per_bin)) if per_bin else np.zeros(0)
        parts, starts, ends = [], [], []
        pos = 0
        for b, r in enumerate(per_bin):
            r = r if r.size else every
            r = np.clip(r, -_RESIDUAL_CLIP, _RESIDUAL_CLIP)
            parts.append(r + b * _BIN_OFFSET)
            starts.append(pos)
            pos += r.size
            ends.append(pos)
        self._flat = np.concatenate(parts)
        self._starts = np.asarray(starts, dtype=np.int64)
        self._ends = np.asarray(ends, dtype=np.int64)

    # ------------------------------------------------------------------------------- features
    def _choose_columns(self, feats: SubmitFeatures, n_fit: int) -> None:
        """The columns that vary among the jobs the trees fit on, and each categorical column's codes
        mapped to at most ``_MAX_CATEGORIES`` (the most frequent; the rest share one, unseen ones are missing)."""
        self._columns, self._maps = [], {}
        for name in SubmitFeatures.NUMERIC + SubmitFeatures.CATEGORICAL[1:]:
            col = np.asarray(getattr(feats, name))[:n_fit]
            if col.size == 0 or np.all(col == col[0]):
                continue
            self._columns.append(name)
            if name in SubmitFeatures.CATEGORICAL:
                codes, counts = np.unique(col.astype(np.int64), return_counts=True)
                size = len(getattr(feats, f"{name}_names")) if name != "type_code" else int(codes.max()) + 1
                mapping = np.full(max(size, int(codes.max()) + 1), np.nan)
                rank = np.lexsort((codes, -counts))  # most frequent first, then by code
                mapping[codes[rank]] = np.minimum(np.arange(len(codes)), _MAX_CATEGORIES - 1)
                self._maps[name] = mapping

    def _matrix(self, feats: SubmitFeatures) -> np.ndarray:
        out = np.empty((len(feats), len(self._columns)))
        for k, name in enumerate(self._columns):
            col = np.asarray(getattr(feats, name), dtype=float)
            if name in self._maps:
                mapping = self._maps[name]
                codes = col.astype(np.int64)
                inside = (codes >= 0) & (codes < len(mapping))
                out[:, k] = np.where(inside, mapping[np.where(inside, codes, 0)], np.nan)
            elif name in ("num_gpus", "cpu_cores", "mem_bytes", "batch_size"):
                out[:, k] = np.log1p(np.maximum(col, 0.0))
            elif name == "submit_day_s":
                out[:, k] = np.where(col >= 0, col / 3600.0, np.nan)
            else:
                out[:, k] = col
        return out

    def _new_model(self) -> Any:
        from sklearn.ensemble import HistGradientBoostingRegressor

        c = self.config
        return HistGradientBoostingRegressor(
            loss="squared_error", max_iter=c.max_iter, learning_rate=c.learning_rate,
            max_leaf_nodes=c.max_leaf_nodes, min_samples_leaf=c.min_samples_leaf,
            l2_regularization=c.l2_regularization, early_stopping=False, random_state=self.seed,
            categorical_features=np.array([name in self._maps for name in self._columns], dtype=bool))

    def _location(self, feats: SubmitFeatures, idx: np.ndarray | None = None) -> np.ndarray:
        """``mu`` of the rows ``idx`` of ``feats`` (every row when ``None``); for a table's features, every
        row's is computed once per fit and kept."""
        if self._model is None:
            return np.zeros(len(feats) if idx is None else len(idx))
        if idx is None:
            with _one_thread():
                return self._model.predict(self._matrix(feats))
        if self._mu_feats is not feats:
            self._mu_feats = feats
            self._mu = np.zeros(len(feats))
            self._mu_version = np.zeros(-(-len(feats) // _BLOCK), dtype=np.int64)
        blocks = np.unique(idx // _BLOCK)
        stale = blocks[self._mu_version[blocks] != self.version]
        if stale.size:  # one call to the trees for every stale block
            rows = np.concatenate([np.arange(b * _BLOCK, min((b + 1) * _BLOCK, len(feats))) for b in stale.tolist()])
            with _one_thread():
                self._mu[rows] = self._model.predict(self._matrix(feats.take(rows)))
            self._mu_version[stale] = self.version
        return self._mu[idx]

    # ------------------------------------------------------------------------------- predicting
    def predict(self, idx: Any, jobs: Any) -> Prediction:
        """Remaining work of jobs ``idx`` given the work they have done.

        Args:
            idx: job indices (row numbers of the table).
            jobs: the job table, a policy's view of it, or a :class:`~gpualloc.scheduling.base.ClusterView`
                (its ``jobs``); reads ``submit_features()`` and ``done_s`` (or ``work_s - remaining_s`` on a
                bare table, the work executed, which a cluster knows).
        """
        c = self.config
        lo, hi = (1.0 - c.interval) / 2.0, (1.0 + c.interval) / 2.0
        q = self.quantiles(idx, jobs, (0.5, lo, hi))
        return Prediction(q[0], q[1], q[2], c.interval)

    def quantiles(self, idx: Any, jobs: Any, probs: Any) -> np.ndarray:
        """Quantiles ``probs`` (rows) of the remaining work of jobs ``idx`` (columns), reference seconds."""
        if isinstance(jobs, ClusterView):
            jobs = jobs.jobs
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        feats = jobs.submit_features()
        return self.remaining_quantiles(self._location(feats, idx), done_work_s(jobs, idx), probs)

    def predict_features(self, features: SubmitFeatures, done_s: Any) -> Prediction:
        """:meth:`predict` for jobs given by their features (every row) and work done (the service's)."""
        c = self.config
        done = np.broadcast_to(np.asarray(done_s, dtype=float), (len(features),))
        lo, hi = (1.0 - c.interval) / 2.0, (1.0 + c.interval) / 2.0
        q = self.remaining_quantiles(self._location(features), done, (0.5, lo, hi))
        return Prediction(q[0], q[1], q[2], c.interval)

    def remaining_quantiles(self, mu: np.ndarray, done_s: np.ndarray, probs: Any) -> np.ndarray:
        """Quantiles ``probs`` of ``exp(mu + r) - done`` over the residuals ``r`` of each job's bin with
        ``exp(mu + r) > done`` (the Pareto tail where none is), floored at ``min_remaining_s``."""
        probs = np.atleast_1d(np.asarray(probs, dtype=float))
        if np.any((probs <= 0) | (probs >= 1)):
            raise SchedulingError(f"duration predictor: quantiles must be in (0, 1), got {probs.tolist()}")
        mu = np.asarray(mu, dtype=float)
        done = np.maximum(np.asarray(done_s, dtype=float), 0.0)
        b = np.searchsorted(self._edges, mu, side="right") if self._edges.size else np.zeros(mu.shape, np.int64)
        shift = b * _BIN_OFFSET
        with np.errstate(divide="ignore"):
            t = np.where(done > 0, np.log(np.where(done > 0, done, 1.0)) - mu, -np.inf)
        t = np.clip(t, -_RESIDUAL_CLIP - 1, _RESIDUAL_CLIP + 1)
        k = np.searchsorted(self._flat, t + shift, side="right")
        start, end = self._starts[b], self._ends[b]
        k = np.maximum(k, start)
        left = end - k  # residuals above the work done
        out = np.empty((len(probs), mu.size))
        has = left > 0
        last = np.maximum(end - 1, 0)
        for row, p in enumerate(probs.tolist()):
            pos = k + p * np.maximum(left - 1, 0)
            i0 = np.minimum(np.floor(pos).astype(np.int64), last)
            i1 = np.minimum(i0 + 1, np.maximum(k + left - 1, i0))
            frac = pos - np.floor(pos)
            r = self._flat[i0] * (1 - frac) + self._flat[i1] * frac - shift
            total = np.exp(mu + r)
            rem = np.where(has, total - done, done * p / (1.0 - p))
            out[row] = np.maximum(rem, self.config.min_remaining_s)
        return out


def _finished_mask(jobs: Any, now_s: float) -> np.ndarray:
    status = np.asarray(jobs.status)
    finish = np.asarray(jobs.finish_s)
    with np.errstate(invalid="ignore"):
        return (status == DONE) & (finish <= now_s)


def _finished_work(jobs: Any, idx: np.ndarray) -> np.ndarray:
    """The true work of finished jobs ``idx``: a view's ``finished_work_s`` (history, visible at every
    information level), or a bare table's ``work_s``."""
    hist = getattr(jobs, "finished_work_s", None)
    work = np.asarray(hist[idx] if hist is not None else jobs.work_s[idx], dtype=float)
    if work.size and not np.isfinite(work).all():
        raise SchedulingError("duration predictor: a finished job has no known work")
    return work


def done_work_s(jobs: Any, idx: np.ndarray) -> np.ndarray:
    """Reference seconds of work each job ``idx`` has done: a view's ``done_s``, or a bare table's
    ``work_s - remaining_s``."""
    done = getattr(jobs, "done_s", None)
    if done is not None:
        return np.asarray(done[idx], dtype=float)
    return np.asarray(jobs.work_s[idx], dtype=float) - np.asarray(jobs.remaining_s[idx], dtype=float)
