"""Users' run-time estimates (time limits): the trace's own where it has one, else a seeded noise model.

Under the ``estimate`` information level (:mod:`gpualloc.scheduling.knowledge`) a policy sees each
job's time limit instead of its work. None of the bundled traces records a limit (Philly, Gavel's
msr, the Pollux workloads, Tiresias and Alibaba give run times, not requests), so the limit is drawn
from a model of how users choose one. The model follows the published studies of real logs:

* estimates are **upper bounds** chosen from a **few round values**: about 20 values account for
  about 90% of the jobs, and the largest allowed limit is always among the most popular (Tsafrir,
  Etsion and Feitelson, "Modeling User Runtime Estimates", JSSPP 2005);
* they are **heavily inflated**: the accuracy (run time / estimate) of the jobs that do not reach
  their limit is spread roughly evenly over (0, 1] (Mu'alem and Feitelson, "Utilization,
  Predictability, Workloads, and User Runtime Estimates in Scheduling the IBM SP2 with Backfilling",
  IEEE TPDS 12(6), 2001), and users keep this when asked to be accurate (Lee, Schwartzman, Hardy
  and Snavely, "Are User Runtime Estimates Inherently Inaccurate?", JSSPP 2004);
* a **fraction of jobs reaches its limit** (killed there by the batch system): for them the
  recorded run time *is* the limit.

:class:`EstimateModel` holds the parameters (their values and sources are in ``docs/knowledge.md``);
:func:`user_estimates` draws one estimate per job, deterministic per seed. Every estimate is at
least the job's work: the trace's run time is what happened, limit included, so no job runs past
a modelled limit. A trace's own ``Job.time_limit_s`` is used as is, even below the work (the job is
then extended past it: ``docs/knowledge.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpualloc.errors import TraceError
from gpualloc.seeding import seeded
from gpualloc.workload.jobs import Job

_MIN = 60.0
_HOUR = 3600.0

POPULAR_LIMITS_S: tuple[float, ...] = tuple(m * _MIN for m in (5, 10, 15, 20, 30, 45)) + tuple(
    h * _HOUR for h in (1, 1.5, 2, 3, 4, 5, 6, 8, 10, 12, 18, 24, 36, 48, 72, 96, 120, 168))
"""Round wall-clock limits users pick from (5 minutes to 7 days): the modal values of the logs Tsafrir
et al. studied (minutes, whole hours, 12/18/24/36/48 hours), extended to the days GPU training jobs run."""


@dataclass(frozen=True)
class EstimateModel:
    """How users pick a time limit (see the module docstring for the sources).

    Attributes:
        max_limit_s: the largest limit the cluster allows (7 days, a common Slurm partition maximum;
            Philly and Alibaba jobs run up to weeks). A job longer than it gets its run time rounded up
            to whole days (an extension granted by the operators).
        p_max: share of the jobs that ask for the maximum whatever they need (the always-popular
            maximum of Tsafrir et al.).
        p_at_limit: share of the jobs whose run time reached their limit (killed at it in the recorded
            system): their limit is their run time.
        popular_s: the round values the other limits are rounded up to.
    """

    max_limit_s: float = 168 * _HOUR
    p_max: float = 0.15
    p_at_limit: float = 0.10
    popular_s: tuple[float, ...] = POPULAR_LIMITS_S

    def __post_init__(self) -> None:
        if not (np.isfinite(self.max_limit_s) and self.max_limit_s > 0):
            raise TraceError(f"estimate model: max_limit_s must be finite and > 0, got {self.max_limit_s}")
        for name in ("p_max", "p_at_limit"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise TraceError(f"estimate model: {name} must be in [0, 1], got {p}")
        if self.p_max + self.p_at_limit > 1.0:
            raise TraceError("estimate model: p_max + p_at_limit must be <= 1")
        values = np.asarray(self.popular_s, dtype=float)
        if values.size == 0 or not (np.isfinite(values).all() and (values > 0).all()):
            raise TraceError("estimate model: popular_s must be positive, finite values")


@seeded(error=TraceError)
def model_estimates(work_s: np.ndarray, model: EstimateModel = EstimateModel(),
                    seed: int | np.random.Generator | None = 0) -> np.ndarray:
    """One drawn limit per job of run time ``work_s`` (reference seconds): each is ``>= work_s``.

    A job asks for the maximum with probability ``p_max``; else its run time is its limit with
    probability ``p_at_limit``; else its limit is ``work / accuracy`` with the accuracy uniform on
    (0, 1], rounded up to the next popular value and capped at the maximum. A job longer than the
    maximum has its run time rounded up to whole days. Draws are vectorised in job order: the same
    seed gives the same limits.
    """
    work = np.asarray(work_s, dtype=float)
    if work.ndim != 1 or not (np.isfinite(work).all() and (work > 0).all()):
        raise TraceError("estimates: work_s must be a 1-D array of finite values > 0")
    rng = np.random.default_rng(seed)
    n = len(work)
    u_kind = rng.random(n)
    accuracy = 1.0 - rng.random(n)  # (0, 1]
    popular = np.sort(np.unique(np.asarray(model.popular_s, dtype=float)))
    popular = np.append(popular[popular < model.max_limit_s], model.max_limit_s)
    k = np.searchsorted(popular, work / accuracy, side="left")  # the first popular value >= the target
    est = popular[np.minimum(k, len(popular) - 1)]  # capped at the maximum
    est = np.where(u_kind < model.p_max, model.max_limit_s, est)
    at_limit = (u_kind >= model.p_max) & (u_kind < model.p_max + model.p_at_limit)
    est = np.where(at_limit, work, est)
    day = 24 * _HOUR
    over = work > model.max_limit_s
    est = np.where(over & ~at_limit, np.ceil(work / day) * day, est)
    return np.maximum(est, work)


@seeded(error=TraceError)
def user_estimates(jobs: Sequence[Job], model: EstimateModel = EstimateModel(),
                   seed: int | np.random.Generator | None = 0, work_s: np.ndarray | None = None) -> np.ndarray:
    """Each job's time limit in reference seconds: its own ``time_limit_s`` where the trace gives one,
    else :func:`model_estimates` (drawn for every job, so a job's draw does not depend on which
    others have a limit of their own).

    Args:
        jobs: the trace's jobs, in trace order.
        model: the noise model.
        seed: seeds the draws.
        work_s: the jobs' work (default: each ``Job.work_s``).
    """
    work = np.fromiter((j.work_s for j in jobs), float, len(jobs)) if work_s is None else np.asarray(work_s, float)
    if len(work) != len(jobs):
        raise TraceError(f"estimates: work_s has {len(work)} entries for {len(jobs)} jobs")
    drawn = model_estimates(work, model, seed) if len(work) else work.copy()
    own = np.fromiter((np.nan if j.time_limit_s is None else j.time_limit_s for j in jobs), float, len(jobs))
    return np.where(np.isnan(own), drawn, own)
