"""Job duration prediction learned online from finished jobs only (issue 36).

A real cluster does not know how long a job will run; it knows what was submitted
(:class:`~gpualloc.workload.jobs.SubmitFeatures`: GPUs, job type, model or application, team, user,
QoS class, GPU spec, CPU and memory, clock time) and how much work each job has done so far
(``done_s``, reference seconds). :class:`DurationPredictor` learns, from the jobs that have finished
by ``now`` (and the work done so far by those that have not), a distribution of each job's total work
given those fields, and answers the *remaining* work of a job given what it has done: the median and
a central interval (80% by default).

The model (chosen for being cheap, calibrated by construction, and exact about conditioning):

* **Location**: gradient-boosted trees (scikit-learn's ``HistGradientBoostingRegressor``, squared
  error on ``log(work)``, categorical fields as categories) predict each job's log-work ``mu``.
* **Spread**: the residuals ``log(work) - mu`` of a random share (``calib_fraction``) of the finished
  jobs, which the trees were *not* fitted on (split conformal), per bin of ``mu`` (short and long jobs
  spread differently), and per submit-time group (:func:`group_keys`) for a group with
  ``min_group_jobs`` of them (its distribution's own shape). A job's total work is distributed as
  ``exp(mu + r)``, ``r`` from its bin.
  History is biased towards short jobs (a long job that arrived recently has not finished yet), so
  the jobs still running count too, as lower bounds: the residuals' distribution is the Kaplan-Meier
  estimate over both (:func:`kaplan_meier`).
* **Conditioning on work done**: a job that has done ``d`` has total work ``> d``, so its remaining
  work is ``exp(mu + r) - d`` under the distribution truncated at ``d``; its quantiles are read off
  the sorted residuals by binary search, vectorised over jobs (:class:`EmpiricalBins`). A job that has
  already run longer than every residual allows gets a Pareto tail of index 1 (Lindy: it is as likely
  to run as long again as not): remaining quantile ``p`` is ``d * p / (1 - p)``.

Until ``min_model_jobs`` jobs have finished there are no trees: ``mu = 0`` and the distribution is
that of every job's log-work (finished, and running as lower bounds), and before ``min_history`` jobs a
log-normal prior (median ``prior_median_s``, log-spread ``prior_sigma``; 3600 s is the service's
default time limit). The trees are refitted when the number of finished jobs has grown by
``refit_growth`` times since the last fit, or by ``refit_every`` jobs, whichever comes first (a replay
of all of Philly's 82,247 jobs fits 47 times), on the ``max_train_jobs`` most recently finished
jobs. The clock time of submission is left out by default: on Philly it made every score worse
(``docs/prediction.md``). Everything is deterministic given ``seed``; the trees run on one thread.

References:
    Q. Hu et al., "Characterization and prediction of deep learning workloads in large-scale GPU
    datacenters" (Helios), SC'21: durations predicted from submit-time fields and history.
    J. Lei et al., "Distribution-free predictive inference for regression", JASA 113(523), 2018
    (split conformal residuals).
    E. L. Kaplan and P. Meier, "Nonparametric estimation from incomplete observations", JASA 53(282), 1958.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from gpualloc.errors import SchedulingError
from gpualloc.scheduling.base import DONE, ClusterView
from gpualloc.seeding import seeded
from gpualloc.workload.jobs import JOB_TYPES, Job, SubmitFeatures

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
        calib_fraction: the share of those that calibrates the spread (the trees fit the rest) ...
        calib_split: ... drawn at random from the seed (``"random"``) or the newest finished
            (``"newest"``: they are biased towards short jobs; it was worse on every training trace).
        loss: the trees' loss on log-work: ``"squared_error"`` or ``"absolute_error"``.
        exclude: :class:`SubmitFeatures` columns the trees leave out, comma-separated.
        min_group_jobs: a submit-time group (:func:`group_keys`) with this many calibration residuals
            has a bin of its own (the shape of its distribution); 0: bins of ``mu`` only.
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
    calib_split: str = "random"
    residual_bins: int = 4
    min_group_jobs: int = 50
    min_bin_jobs: int = 50
    prior_median_s: float = 3600.0
    prior_sigma: float = 1.5
    loss: str = "squared_error"
    exclude: str = "submit_day_s"
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
            ("calib_split", self.calib_split in ("random", "newest"), "'random' or 'newest'"),
            ("residual_bins", self.residual_bins >= 1, ">= 1"),
            ("min_group_jobs", self.min_group_jobs >= 0, ">= 0"),
            ("min_bin_jobs", self.min_bin_jobs >= 1, ">= 1"),
            ("prior_median_s", self.prior_median_s > 0 and math.isfinite(self.prior_median_s), "> 0"),
            ("prior_sigma", self.prior_sigma > 0 and math.isfinite(self.prior_sigma), "> 0"),
            ("loss", self.loss in ("squared_error", "absolute_error"), "'squared_error' or 'absolute_error'"),
            ("exclude", all(x in SubmitFeatures.NUMERIC + SubmitFeatures.CATEGORICAL
                            for x in self.exclude.split(",") if x), "comma-separated SubmitFeatures columns"),
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

    def refit_after(self, last: int) -> int:
        """The refit schedule, one rule for the simulator's predictor and the service's: after a fit on
        ``last`` finished jobs, the count at which to refit next (every new one before the trees, then
        growth by ``refit_growth`` times or by ``refit_every`` jobs, whichever comes first)."""
        if last + 1 <= self.min_model_jobs:
            return last + 1
        return min(math.ceil(last * self.refit_growth), last + self.refit_every)


class DurationPredictor:
    """Remaining-work prediction learned online from finished jobs (see the module docstring).

    Args:
        seed: the trees' random state (the fit uses no sampling; kept so runs are reproducible by seed).
        config: hyper-parameters; keyword ``overrides`` replace some of them.

    Attributes:
        stage: what it predicts from: ``"prior"``, the finished jobs' empirical distribution
            (``"empirical"``) or its fitted ``"model"``.
        n_history: finished jobs the current fit learnt from.
        version: increases at every fit.
        fits: model fits so far (trees, not the prior or empirical stages).
    """

    @seeded(to="int", error=SchedulingError)
    def __init__(self, seed: int = 0, config: PredictorConfig | None = None, *,
                 history: tuple[SubmitFeatures, np.ndarray] | None = None, **overrides: Any) -> None:
        known = {f.name for f in fields(PredictorConfig)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise SchedulingError(f"duration predictor: unknown option(s) {', '.join(bad)} "
                                  f"(known: {', '.join(sorted(known))})")
        self.seed = int(seed)
        self.config = replace(config or PredictorConfig(), **overrides)
        self.history: tuple[SubmitFeatures, np.ndarray] | None = None
        if history is not None:
            feats, work = history
            work = np.asarray(work, dtype=float)
            if work.shape != (len(feats),) or not (np.isfinite(work).all() and (work > 0).all()):
                raise SchedulingError(f"duration predictor: history of {len(feats)} jobs needs as many works, "
                                      f"finite and > 0")
            self.history = (feats, work) if len(feats) else None
        self.reset()

    def __repr__(self) -> str:
        return f"DurationPredictor(seed={self.seed}, stage={self.stage!r}, n_history={self.n_history})"

    def reset(self) -> None:
        """Forget every finished job of the run (a new run); learn from ``history`` again, if any."""
        self.stage = "prior"
        self.n_history = 0
        self.version = 0
        self.fits = 0
        self._model: Any = None
        self._columns: list[str] = []
        self._maps: dict[str, dict[Any, float]] = {}
        self._edges = np.zeros(0)
        self._bins = EmpiricalBins([self._prior_residuals()])
        self._mu_feats: SubmitFeatures | None = None
        self._mu = np.zeros(0)
        self._mu_version = np.zeros(0, dtype=np.int64)  # per block of _BLOCK rows: the fit its mu is from
        self._groups: dict[tuple, int] = {}
        self._key_feats: SubmitFeatures | None = None
        self._keys: tuple[list[tuple], np.ndarray] = ([], np.zeros(0, dtype=np.int64))
        self._lookup = np.zeros(0, dtype=np.int64)
        self._lookup_version = -1
        if self.history is not None:
            self.fit_arrays(*self.history)
            self.n_history = 0  # the run's own finished jobs

    # ------------------------------------------------------------------------------- learning
    def next_refit(self) -> int:
        """The number of finished jobs at which the schedule refits next: every new one before the
        trees (the empirical stage sorts a few hundred numbers), then growth by ``refit_growth`` times
        or by ``refit_every`` jobs, whichever comes first."""
        base = len(self.history[1]) if self.history is not None else 0
        return self.config.refit_after(base + self.n_history) - base  # the schedule counts history's jobs too

    def due(self, n_finished: int) -> bool:
        """Whether the schedule refits once ``n_finished`` jobs have finished."""
        return n_finished >= self.next_refit()

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
        """Learn from the jobs finished by ``now_s`` (``status`` DONE and ``finish_s <= now_s``: their
        work), and from the jobs not finished that have done some work (a lower bound on theirs, what
        the cluster knows now): never from the work of a job that finishes later. ``history``, when
        given, comes first (as if it finished before any of them)."""
        finished = _finished_mask(jobs, now_s)
        idx = np.flatnonzero(finished)
        idx = idx[np.argsort(np.asarray(jobs.finish_s)[idx], kind="stable")]  # oldest finish first
        work = _finished_work(jobs, idx)
        feats = jobs.submit_features()
        others = np.flatnonzero(~finished & (np.asarray(jobs.status) != DONE))
        done = done_work_s(jobs, others)
        started = done > 0
        mine = feats.take(idx)
        if self.history is not None:
            mine, work = SubmitFeatures.concat([self.history[0], mine]), np.concatenate([self.history[1], work])
        self.fit_arrays(mine, work, feats.take(others[started]), done[started])
        self.n_history = idx.size  # the run's own (fit_arrays counted history's too)

    def fit_arrays(self, features: SubmitFeatures, work_s: np.ndarray, censored: SubmitFeatures | None = None,
                   censored_done_s: np.ndarray | None = None) -> None:
        """Learn from jobs given directly: finished ones (their submit-time ``features`` and total work,
        reference seconds, ordered by when they finished, oldest first) and, optionally, unfinished ones
        (``censored``, with the work they have done: their work is known to be larger).

        The unfinished jobs correct the history's bias towards short jobs (a long job that arrived
        recently has not finished yet): the spread is a Kaplan-Meier estimate over both (each
        unfinished job's share goes to the finished ones longer than it). The trees learn from the
        finished jobs only.
        """
        work = np.asarray(work_s, dtype=float)
        if work.shape != (len(features),):
            raise SchedulingError(f"duration predictor: {len(features)} jobs' features but work of shape {work.shape}")
        if work.size and not (np.isfinite(work).all() and (work > 0).all()):
            raise SchedulingError("duration predictor: a finished job's work must be finite and > 0")
        if censored is None:
            cens_y = np.zeros(0)
        else:
            done = np.asarray(censored_done_s, dtype=float)
            if done.shape != (len(censored),) or not (np.isfinite(done).all() and (done > 0).all()):
                raise SchedulingError("duration predictor: each unfinished job needs its work done, finite and > 0")
            cens_y = np.log(done)
        c = self.config
        n = len(work)
        self.n_history = n
        self.version += 1
        self._model = None
        self._edges = np.zeros(0)
        self._groups = {}
        if n < c.min_history:
            self.stage = "prior"
            self._bins = EmpiricalBins([self._prior_residuals()])
            return
        y = np.log(work)
        if n < c.min_model_jobs:
            self.stage = "empirical"
            self._bins = EmpiricalBins([y], [cens_y])
            return
        keep = slice(max(0, n - c.max_train_jobs), n)
        feats, y = features.take(np.arange(n)[keep]), y[keep]
        m = len(y)
        n_cal = max(int(round(c.calib_fraction * m)), min(c.min_bin_jobs, m // 2))
        if c.calib_split == "newest":
            cal = np.arange(m - n_cal, m)
        else:  # a random share, drawn from the seed and the history's size (deterministic)
            cal = np.sort(np.random.default_rng([self.seed, m]).permutation(m)[:n_cal])
        fit = np.setdiff1d(np.arange(m), cal, assume_unique=True)
        feats_fit = feats.take(fit)
        self._choose_columns(feats_fit, len(fit))
        model = self._new_model()
        with _one_thread():
            model.fit(self._matrix(feats_fit), y[fit])
            mu_cal = model.predict(self._matrix(feats.take(cal)))
            # the unfinished jobs' residual lower bounds, the same share of them as of the finished
            k = len(cens_y)
            pick = np.sort(np.random.default_rng([self.seed, m, k]).permutation(k)[:int(round(k * n_cal / m))])
            mu_cens = model.predict(self._matrix(censored.take(pick))) if pick.size else np.zeros(0)
        cens_resid = cens_y[pick] - mu_cens
        self._model = model
        self.fits += 1
        self.stage = "model"
        resid = y[cal] - mu_cal
        bins = max(1, min(c.residual_bins, len(resid) // c.min_bin_jobs))
        if bins > 1:
            edges = np.unique(np.quantile(mu_cal, np.arange(1, bins) / bins))
        else:
            edges = np.zeros(0)
        which = np.searchsorted(edges, mu_cal, side="right")
        which_c = np.searchsorted(edges, mu_cens, side="right")
        self._edges = edges
        n_mu = len(edges) + 1
        self._groups = {}
        if c.min_group_jobs > 0:
            # a submit-time group with enough calibration residuals gets a bin of its own: its shape
            keys, inv = group_keys(feats.take(cal))
            counts = np.bincount(inv, minlength=len(keys))
            own = np.flatnonzero(counts >= c.min_group_jobs)
            self._groups = {keys[g]: n_mu + k for k, g in enumerate(own.tolist())}
            lookup = np.full(len(keys), -1, dtype=np.int64)
            lookup[own] = n_mu + np.arange(own.size)
            which = np.where(lookup[inv] >= 0, lookup[inv], which)
            if pick.size:
                which_c = np.where(self._group_bins(censored.take(pick)) >= 0, self._group_bins(censored.take(pick)),
                                   which_c)
        n_bins = n_mu + len(self._groups)
        self._bins = EmpiricalBins([resid[which == b] for b in range(n_bins)],
                                   [cens_resid[which_c == b] for b in range(n_bins)])

    def _group_bins(self, feats: SubmitFeatures, idx: np.ndarray | None = None) -> np.ndarray:
        """Each row's own group bin (:func:`group_keys`), -1 where its group has none; for a table's
        features the keys are computed once."""
        if not self._groups:
            return np.full(len(feats) if idx is None else len(idx), -1, dtype=np.int64)
        if idx is None:
            keys, inv = group_keys(feats)
            lookup = np.array([self._groups.get(k, -1) for k in keys], dtype=np.int64)
        else:
            if self._key_feats is not feats:
                self._key_feats, self._keys = feats, group_keys(feats)
                self._lookup_version = -1
            keys, inv = self._keys
            inv = inv[idx]
            if self._lookup_version != self.version:  # the table's groups' bins, once per fit
                self._lookup = np.array([self._groups.get(k, -1) for k in keys], dtype=np.int64)
                self._lookup_version = self.version
            lookup = self._lookup
        return lookup[inv] if len(keys) else np.full(len(inv), -1, dtype=np.int64)

    def _prior_residuals(self) -> np.ndarray:
        from scipy.special import ndtri

        c = self.config
        k = 199
        return math.log(c.prior_median_s) + c.prior_sigma * ndtri((np.arange(k) + 0.5) / k)

    # ------------------------------------------------------------------------------- features
    def _choose_columns(self, feats: SubmitFeatures, n_fit: int) -> None:
        """The columns that vary among the jobs the trees fit on, and each categorical column's codes
        mapped to at most ``_MAX_CATEGORIES`` (the most frequent; the rest share one, unseen ones are missing)."""
        self._columns, self._maps = [], {}
        skip = set(self.config.exclude.split(","))
        for name in SubmitFeatures.NUMERIC + SubmitFeatures.CATEGORICAL[1:]:
            if name in skip:
                continue
            col = np.asarray(getattr(feats, name))[:n_fit]
            if col.size == 0 or np.all(col == col[0]):
                continue
            self._columns.append(name)
            if name in SubmitFeatures.CATEGORICAL:
                # by the category's name, not its code: another table (the run's own, history's) codes differently
                codes, counts = np.unique(col.astype(np.int64), return_counts=True)
                keys = _category_keys(feats, name)
                rank = np.lexsort((codes, -counts))  # most frequent first, then by code
                self._maps[name] = {keys[c]: float(min(i, _MAX_CATEGORIES - 1))
                                    for i, c in enumerate(codes[rank].tolist())}

    def _matrix(self, feats: SubmitFeatures) -> np.ndarray:
        out = np.empty((len(feats), len(self._columns)))
        for k, name in enumerate(self._columns):
            col = np.asarray(getattr(feats, name), dtype=float)
            if name in self._maps:
                by_name = self._maps[name]
                mapping = np.array([by_name.get(key, np.nan) for key in _category_keys(feats, name)])
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
            loss=c.loss, max_iter=c.max_iter, learning_rate=c.learning_rate,
            max_leaf_nodes=c.max_leaf_nodes, min_samples_leaf=c.min_samples_leaf,
            l2_regularization=c.l2_regularization, early_stopping=False, random_state=self.seed,
            categorical_features=np.array([name in self._maps for name in self._columns], dtype=bool))

    def location(self, feats: SubmitFeatures, idx: np.ndarray | None = None) -> np.ndarray:
        """The log-work location ``mu`` of the rows ``idx`` of ``feats`` (every row when ``None``): the
        trees' prediction, 0 before there are trees. With ``idx``, rows are computed in blocks, once per
        fit, and kept for the same ``feats`` object (a table's)."""
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
        return self.remaining_quantiles(self.location(feats, idx), done_work_s(jobs, idx), probs,
                                        self._group_bins(feats, idx))

    def predict_features(self, features: SubmitFeatures, done_s: Any, idx: Any = None) -> Prediction:
        """:meth:`predict` for jobs given by their features (the rows ``idx``, default every row) and
        the work they have done (broadcast): for a caller without a job table (the service)."""
        c = self.config
        if idx is not None:
            idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        done = np.broadcast_to(np.asarray(done_s, dtype=float), (len(features) if idx is None else idx.size,))
        lo, hi = (1.0 - c.interval) / 2.0, (1.0 + c.interval) / 2.0
        q = self.remaining_quantiles(self.location(features, idx), done, (0.5, lo, hi), self._group_bins(features, idx))
        return Prediction(q[0], q[1], q[2], c.interval)

    def remaining_quantiles(self, mu: np.ndarray, done_s: np.ndarray, probs: Any,
                            groups: np.ndarray | None = None) -> np.ndarray:
        """Quantiles ``probs`` (rows) of the remaining work of jobs with location ``mu`` that have done
        ``done_s`` (columns): :meth:`EmpiricalBins.remaining` over the residuals of each job's group bin
        (``groups``, where >= 0) or else its bin of ``mu``."""
        mu = np.asarray(mu, dtype=float)
        b = np.searchsorted(self._edges, mu, side="right") if self._edges.size else np.zeros(mu.shape, np.int64)
        if groups is not None:
            b = np.where(groups >= 0, groups, b)
        return self._bins.remaining(b, mu, done_s, probs, self.config.min_remaining_s)


class EmpiricalBins:
    """Distributions of log-work in bins, and the quantiles of remaining work they imply given work done.

    A job in bin ``b`` with location ``mu`` has total work ``exp(mu + r)``, ``r`` drawn from bin
    ``b``'s distribution: the Kaplan-Meier estimate from its samples (finished jobs) and lower bounds
    (unfinished jobs: ``r`` is known to be larger); without lower bounds, each sample equally likely.
    Given that the job has done ``d``, only ``exp(mu + r) > d`` remains possible, so its remaining work
    is ``exp(mu + r) - d`` under the distribution truncated there; where nothing is left, a Pareto tail
    of index 1: quantile ``p`` is ``d * p / (1 - p)``. Quantiles interpolate between samples (each at
    the middle of its probability mass). The predictor's bins hold residuals (``mu`` from its trees);
    with ``mu = 0`` they hold log-work itself (its prior and empirical stages, and a per-group baseline).

    Args:
        per_bin: each bin's samples (any order).
        censored: each bin's lower bounds (default: none).
        A bin with neither borrows every bin's.
    """

    def __init__(self, per_bin: list[np.ndarray], censored: list[np.ndarray] | None = None) -> None:
        events = [np.asarray(r, dtype=float).reshape(-1) for r in per_bin]
        cens = [np.asarray(r, dtype=float).reshape(-1) for r in (censored or [np.zeros(0)] * len(events))]
        if len(cens) != len(events):
            raise SchedulingError(f"duration predictor: {len(events)} bins of samples, {len(cens)} of lower bounds")
        all_e = np.concatenate(events) if events else np.zeros(0)
        all_c = np.concatenate(cens) if cens else np.zeros(0)
        if not all_e.size and not all_c.size:
            raise SchedulingError("duration predictor: no samples to learn a distribution from")
        values, weights, bins = [], [], []
        for b, (e, c) in enumerate(zip(events, cens, strict=True)):
            if not e.size and not c.size:
                e, c = all_e, all_c
            lim = _RESIDUAL_CLIP
            v, w = kaplan_meier(np.clip(e, -lim, lim), np.clip(c, -lim, lim))
            # bin b stored as r + b * offset, so that one sorted array holds every bin and one binary
            # search serves every job (|r| is clipped well below the offset)
            values.append(v + b * _BIN_OFFSET)
            weights.append(w)
            bins.append(np.full(v.size, b, dtype=np.int64))
        self._flat = np.concatenate(values)
        sizes = np.array([v.size for v in values], dtype=np.int64)
        self._ends = np.cumsum(sizes)
        self._starts = self._ends - sizes
        self._below = np.concatenate([np.cumsum(w) - w for w in weights])  # mass of the bin's smaller samples
        mid = self._below + np.concatenate(weights) / 2.0
        self._mid_key = mid + 2.0 * np.concatenate(bins)  # mid in [0, 1]: sorted over all bins too

    def __len__(self) -> int:
        return len(self._starts)

    def remaining(self, bins: np.ndarray, mu: np.ndarray, done_s: Any, probs: Any,
                  floor_s: float = 1.0) -> np.ndarray:
        """Quantiles ``probs`` (rows) of the remaining work of jobs in ``bins`` with locations ``mu`` that
        have done ``done_s`` (columns; broadcast), reference seconds, at least ``floor_s``."""
        probs = np.atleast_1d(np.asarray(probs, dtype=float))
        if np.any((probs <= 0) | (probs >= 1)):
            raise SchedulingError(f"duration predictor: quantiles must be in (0, 1), got {probs.tolist()}")
        b = np.asarray(bins, dtype=np.int64)
        mu = np.broadcast_to(np.asarray(mu, dtype=float), b.shape)
        done = np.maximum(np.broadcast_to(np.asarray(done_s, dtype=float), b.shape), 0.0)
        shift = b * _BIN_OFFSET
        with np.errstate(divide="ignore"):
            t = np.where(done > 0, np.log(np.where(done > 0, done, 1.0)) - mu, -np.inf)
        t = np.clip(t, -_RESIDUAL_CLIP - 1, _RESIDUAL_CLIP + 1)
        start, end = self._starts[b], self._ends[b]
        k = np.clip(np.searchsorted(self._flat, t + shift, side="right"), start, end)  # first sample above d
        has = k < end
        last = end - 1
        below = np.where(has, self._below[np.minimum(k, last)], 1.0)
        flat, mid_key = self._flat, self._mid_key
        out = np.empty((len(probs), b.size))
        for row, p in enumerate(probs.tolist()):
            m = below + p * (1.0 - below)  # the quantile's cumulative mass, within what remains
            j = np.clip(np.searchsorted(mid_key, m + 2.0 * b, side="right"), np.minimum(k + 1, last), last)
            i = np.minimum(np.maximum(j - 1, k), last)  # (where nothing is left, any valid index: unused)
            x0, x1 = mid_key[i] - 2.0 * b, mid_key[j] - 2.0 * b
            frac = np.clip(np.divide(m - x0, x1 - x0, out=np.zeros(b.size), where=x1 > x0), 0.0, 1.0)
            r = flat[i] + frac * (flat[j] - flat[i]) - shift
            with np.errstate(over="ignore"):
                rem = np.where(has, np.exp(mu + r) - done, done * p / (1.0 - p))
            out[row] = np.maximum(rem, floor_s)
        return out


def kaplan_meier(events: np.ndarray, censored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Kaplan-Meier distribution of values observed exactly (``events``) or known only to be larger
    (``censored``): ``(values, probabilities)``, values ascending. Each censored value's share goes to
    the values larger than it; a share left past the largest value (it was censored) sits on it.

    References:
        E. L. Kaplan and P. Meier, "Nonparametric estimation from incomplete observations", JASA 53(282), 1958.
    """
    v = np.concatenate([events, censored])
    is_event = np.concatenate([np.ones(events.size, bool), np.zeros(censored.size, bool)])
    order = np.lexsort((~is_event, v))  # by value; at a tie the event first (it was at risk)
    v, is_event = v[order], is_event[order]
    at_risk = v.size - np.arange(v.size)
    surv = np.cumprod(np.where(is_event, 1.0 - 1.0 / at_risk, 1.0))
    before = np.concatenate([[1.0], surv[:-1]])
    values, weights = v[is_event], (before / at_risk)[is_event]
    left = float(surv[-1]) if v.size else 0.0
    if left > 1e-12:
        values, weights = np.append(values, v[-1]), np.append(weights, left)
    return values, weights / weights.sum()


def group_keys(feats: SubmitFeatures) -> tuple[list[tuple], np.ndarray]:
    """Each job's finest submit-time group: its job type, GPU count and every text field by name.
    Returns ``(distinct keys, each row's index in them)``."""
    if not len(feats):
        return [], np.zeros(0, dtype=np.int64)
    text = SubmitFeatures.CATEGORICAL[1:]
    cols = [np.asarray(feats.type_code, dtype=np.int64), np.asarray(feats.num_gpus, dtype=np.int64)]
    cols += [np.asarray(getattr(feats, name), dtype=np.int64) for name in text]
    rows, inv = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
    names = [getattr(feats, f"{name}_names") for name in text]
    keys = [(int(r[0]), int(r[1]), *(n[c] for n, c in zip(names, r[2:].tolist(), strict=True))) for r in rows]
    return keys, inv.reshape(-1)


def _category_keys(feats: SubmitFeatures, name: str) -> list[Any]:
    """What each code of categorical column ``name`` stands for: its name (``type_code``: the code,
    an index in ``JOB_TYPES`` for every table)."""
    if name == "type_code":
        return list(range(len(JOB_TYPES)))
    return list(getattr(feats, f"{name}_names"))


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


def replay_history(jobs: Sequence[Job], until_s: float) -> tuple[SubmitFeatures, np.ndarray]:
    """The jobs of a trace that had finished by ``until_s`` had each run from its arrival (no queueing),
    as a predictor's ``history``, oldest finish first: what was known of a trace's past when a window
    of it starts at ``until_s`` (its jobs after that are never read)."""
    arrival = np.array([j.arrival_s for j in jobs], dtype=float)
    work = np.array([j.work_s for j in jobs], dtype=float)
    finish = arrival + work
    idx = np.flatnonzero(finish <= until_s)
    idx = idx[np.argsort(finish[idx], kind="stable")]
    return SubmitFeatures.of([jobs[i] for i in idx.tolist()]), work[idx]
