"""Gavel: heterogeneity-aware allocation by linear programming, enforced in rounds.

Every policy in Gavel speaks one representation: the jobs x device-types throughput matrix ``T`` and
an allocation ``X`` of the same shape, ``X[j, t]`` being the fraction of wall time job ``j`` should
spend on type ``t``. Here ``T`` is the view's ``speed`` matrix (throughput relative to the reference
device), and ``X`` solves a linear program subject to

* ``sum_t X[j, t] <= 1`` (a job runs on one type at a time),
* ``sum_j num_gpus[j] * X[j, t] <= n_t`` (gangs of ``num_gpus`` GPUs fit the ``n_t`` GPUs of type ``t``
  on average — Gavel's *scale factor*),
* ``X >= 0``, and ``X[j, t] = 0`` where the job may not run on ``t`` (speed 0, a gang larger than the
  type, or a single-node gang larger than any node's share of the type).

Objectives (``objective=``):

* ``"max-min-fairness"`` — Gavel's heterogeneity-aware LAS (§4): maximise the smallest *normalised*
  throughput ``sum_t T[j, t] X[j, t] / sum_t T[j, t] Xeq[j, t]``, where ``Xeq`` (:func:`equal_share`)
  gives every active job the same share of the cluster's GPU-time, spread over the types it may use
  in proportion to their sizes; a gang of ``g`` GPUs is owed ``1/g`` of the time a 1-GPU job is, as
  with Gavel's scale factors. A plain max-min LP may return any optimal vertex, so a second LP
  maximises the sum of normalised throughputs with every job kept at the optimal minimum (one step
  of Gavel's water-filling). With one device type the policy uses the exact water-filling in
  closed form instead.
* ``"max-throughput"`` — Gavel's ``max_sum_throughput`` policy with each job's throughput normalised
  by its best type (``T[j, t] / max_t T[j, t]``), so the sum counts jobs' worth of full-speed
  progress and each job goes where it has a comparative advantage (small gangs first when GPUs are
  short).
* ``"shortest-first"`` — ours (:class:`GavelShortestFirst`, ``gavel-srtf``): the same sum weighted
  by the inverse of each job's remaining time, solved over 0/1 allocations (a MILP: each job on one
  type or none), which the rounds then run without time-sharing.

Mechanism (Gavel §5): time is cut into rounds of ``round_s``. At each round, the priority of job
``j`` on type ``t`` is ``X[j, t] / f[j, t]``, where ``f[j, t]`` is the fraction of wall time ``j``
has received on ``t`` since it entered the allocation (``X * 1e9`` while it has received none, as in
Gavel). (Job, type) pairs are granted in decreasing priority (ties: the job already running there,
then earlier arrival) while the type has room for the gang. A job granted the type it runs on keeps
its GPUs; the others start on GPUs chosen by :meth:`~gpualloc.scheduling.base.FreeGpus.find`,
taking the GPUs of running jobs left without a grant (lowest priority first) only where they are
needed — a running job nobody needs keeps running, where Gavel would stop it. A job moved to
another type is stopped and started in the same decision. Leftover GPUs go to the other queued
jobs in arrival order, fastest type first. Between rounds (arrival and completion events) the
policy only fills free GPUs and never preempts.

Differences from Gavel's scheduler: it resets the received-time counters whenever it recomputes the
allocation; here they accumulate from the job's entry into the allocation, so a job that was short
of its share catches up. No space sharing (job packing) and no throughput estimation: the speed
matrix is taken as known.

Scale: the LP covers every running job plus the ``max_jobs_lp`` earliest-arrived queued jobs;
later jobs wait to enter the allocation or run on leftover GPUs. The allocation is recomputed at a
round only when the set of queued and running jobs changed since the last one; when every job in it
fits on its fastest type at once, the allocation is that placement and no LP is solved.

References:
    .. [1] Narayanan, D.; Santhanam, K.; Kazhamiaka, F.; Phanishayee, A.; Zaharia, M. (2020).
       "Heterogeneity-Aware Cluster Scheduling Policies for Deep Learning Workloads." *14th USENIX
       Symposium on Operating Systems Design and Implementation (OSDI '20)*, 481–498.
    .. [2] stanford-futuredata/gavel, ``scheduler/policies/max_min_fairness.py``,
       ``max_sum_throughput.py`` and the round-based priorities in ``scheduler/scheduler.py``.
    .. [3] Huangfu, Q.; Hall, J. A. J. (2018). "Parallelizing the dual revised simplex method."
       *Mathematical Programming Computation* 10(1): 119–142 (HiGHS).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from gpualloc.errors import SchedulingError
from gpualloc.native import quiet_stdout
from gpualloc.scheduling.base import (
    DONE,
    GPU_FREE,
    PENDING,
    QUEUED,
    RUNNING,
    ClusterView,
    Decision,
    FreeGpus,
    JobTable,
    Starts,
)

__all__ = ["DEFAULT_MAX_JOBS_LP", "DEFAULT_ROUND_S", "MIN_REMAINING_S", "OBJECTIVES", "Gavel", "GavelShortestFirst",
           "equal_share", "feasible_pairs", "normalised_throughput", "shortest_first_weights", "solve_allocation"]

OBJECTIVES: tuple[str, ...] = ("max-min-fairness", "max-throughput", "shortest-first")

DEFAULT_ROUND_S = 360.0
"""Gavel's round length in its simulations (6 minutes)."""

DEFAULT_MAX_JOBS_LP = 512
"""Queued jobs in the LP besides the running ones (HiGHS: tens of milliseconds at 512 x 3 types)."""

_NEVER_RECEIVED = 1e9  # Gavel's priority multiplier for a job that has not run yet on a type
_GRANTABLE = np.zeros((2, max(PENDING, QUEUED, RUNNING, DONE) + 1), dtype=bool)  # [preempt][status]
_GRANTABLE[:, QUEUED] = True
_GRANTABLE[1, RUNNING] = True
MIN_REMAINING_S = 60.0
"""Remaining times below a minute weigh as a minute in the ``"shortest-first"`` objective."""
_TIE_SLACK = 1e-6      # relative slack on the optimal minimum in the tie-breaking LP
MAX_MIP_NODES = 2000
"""Branch-and-bound nodes a 0/1 allocation may take (deterministic, unlike a time limit); past it the
MILP counts as failed and the LP's allocation is used. These MILPs' relaxations are nearly integral:
a few nodes suffice in practice."""
DEFAULT_IDLE_WEIGHT = 1.0
"""``gavel-srtf``'s ``idle_weight``: the design's ``lambda`` on idle GPUs, in units of the mean weight
per GPU asked. Chosen on the validation traces (``benchmarks/sched_idle_weight.py``), not on the
table's."""


# ----------------------------------------------------------------------------------- the LP
def feasible_pairs(throughput: np.ndarray, num_gpus: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Mask of (job, type) pairs a job may use: positive throughput and a gang that fits the type."""
    throughput = np.asarray(throughput, dtype=float)
    num_gpus = np.asarray(num_gpus)
    capacity = np.asarray(capacity)
    return (throughput > 0) & (num_gpus[:, None] <= capacity[None, :])


def equal_share(throughput: np.ndarray, num_gpus: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """``Xeq``: every job with a feasible type gets the same share of GPU-time, spread over its types.

    ``Xeq[j, t] = (e / num_gpus[j]) * n_t / N_j`` with ``N_j`` the GPUs of the types job ``j`` may
    use and ``e = min(1, 1 / sum_j 1 / N_j)`` the largest common share that fits (both LP
    constraints hold). Normalising by it makes throughputs of different jobs comparable.
    """
    feas = feasible_pairs(throughput, num_gpus, capacity)
    cap = np.asarray(capacity, dtype=float)
    n_j = feas @ cap
    has = n_j > 0
    if not has.any():
        return np.zeros(feas.shape)
    e = min(1.0, 1.0 / float(np.sum(1.0 / n_j[has])))
    out = np.zeros(feas.shape)
    out[has] = feas[has] * cap[None, :] * (e / (np.asarray(num_gpus, dtype=float)[has] * n_j[has]))[:, None]
    return out


def normalised_throughput(throughput: np.ndarray, num_gpus: np.ndarray, capacity: np.ndarray,
                          x: np.ndarray) -> np.ndarray:
    """Each job's throughput under ``x`` over its throughput under :func:`equal_share` (0 if none)."""
    throughput = np.asarray(throughput, dtype=float)
    base = (throughput * equal_share(throughput, num_gpus, capacity)).sum(axis=1)
    got = (throughput * np.asarray(x, dtype=float)).sum(axis=1)
    return np.divide(got, base, out=np.zeros_like(got), where=base > 0)


def solve_allocation(throughput: np.ndarray, num_gpus: np.ndarray, capacity: np.ndarray, *,
                     objective: str = "max-min-fairness", remaining: np.ndarray | None = None,
                     integral: bool = False, idle_weight: float = 0.0) -> np.ndarray:
    """Gavel's allocation ``X`` (jobs x types) for one objective.

    With several device types this is a linear program solved with HiGHS (two for max-min
    fairness: the optimum, then the tie-break). With one type every objective has a closed form
    (:func:`_one_type`) that gives the same optimum without the solver's per-call overhead.
    ``integral=True`` asks for the best allocation that runs each job all the time on one type or
    not at all (``X`` in {0, 1}: a MILP, HiGHS's branch and bound, on any number of types).

    Args:
        throughput: jobs x types; 0 where a job may not run on a type.
        num_gpus: gang size of each job.
        capacity: GPUs of each type.
        objective: one of :data:`OBJECTIVES`.
        remaining: each job's remaining time on its fastest type (``"shortest-first"`` only: required).
        integral: a 0/1 allocation (``"max-throughput"`` and ``"shortest-first"`` only); the LP's if
            the MILP fails.
        idle_weight: ``"shortest-first"`` only: every GPU the allocation keeps busy also earns
            ``idle_weight`` times the mean weight per GPU asked (``sum_j w_j / sum_j num_gpus[j]``),
            the design's ``lambda`` on idle GPU time. 0 is Smith's rule alone; larger values run a
            gang that would otherwise leave GPUs idle even where it costs a shorter job some speed.

    Returns:
        ``X`` with ``X >= 0``, ``sum_t X[j, t] <= 1``, ``sum_j num_gpus[j] X[j, t] <= capacity[t]``
        and zeros on infeasible pairs. If HiGHS fails, the feasible :func:`equal_share`.
    """
    if objective not in OBJECTIVES:
        raise SchedulingError(f"gavel: unknown objective {objective!r} (known: {', '.join(OBJECTIVES)})")
    throughput = np.asarray(throughput, dtype=float)
    num_gpus = np.asarray(num_gpus, dtype=float)
    capacity = np.asarray(capacity, dtype=float)
    weight = None
    if objective == "shortest-first":
        if remaining is None or np.shape(remaining) != (throughput.shape[0],):
            raise SchedulingError("gavel: objective 'shortest-first' needs one remaining time per job")
        weight = shortest_first_weights(remaining)
    if integral and objective == "max-min-fairness":
        raise SchedulingError("gavel: an integral allocation is for 'max-throughput' and 'shortest-first' only")
    if _idle_weight(idle_weight) and objective != "shortest-first":
        raise SchedulingError("gavel: idle_weight is for the 'shortest-first' objective only")
    if throughput.shape[1] == 1 and not integral and not idle_weight:
        return _one_type(throughput, num_gpus, capacity, objective, weight)
    return _solve_lp(throughput, num_gpus, capacity, objective, weight, integral, idle_weight)


def _idle_weight(value: float) -> float:
    """``value`` as a float; raises SchedulingError unless it is finite and >= 0."""
    if not (math.isfinite(value) and value >= 0):
        raise SchedulingError(f"gavel: idle_weight must be a finite number >= 0, got {value}")
    return float(value)


def shortest_first_weights(remaining: np.ndarray) -> np.ndarray:
    """Per-job weights of the ``"shortest-first"`` objective: the shortest remaining time over each
    job's (floored at :data:`MIN_REMAINING_S`), so the shortest job weighs 1 and the LP, which pays
    ``num_gpus`` GPUs for a weight, serves jobs by Smith's rule (shortest GPU-time first)."""
    rem = np.maximum(np.asarray(remaining, dtype=float), MIN_REMAINING_S)
    return rem.min() / rem if rem.size else rem


def _one_type(throughput: np.ndarray, num_gpus: np.ndarray, capacity: np.ndarray,
              objective: str, weight: np.ndarray | None = None) -> np.ndarray:
    """Every objective on one device type, in closed form.

    Max-min fairness is water-filling: ``x_j = min(1, z * Xeq_j)`` with the largest ``z`` that fits
    (the capacity binds, so the tie-breaking stage has nothing left to choose). Max-throughput
    maximises the number of jobs' worth of progress, ``sum_j x_j``: a fractional knapsack that fills
    the smallest gangs first (ties in row order); shortest-first maximises ``sum_j weight_j x_j``, the
    same knapsack by decreasing ``weight / num_gpus``.
    """
    m = throughput.shape[0]
    x = np.zeros((m, 1))
    feas = feasible_pairs(throughput, num_gpus, capacity)[:, 0]
    if not feas.any():
        return x
    g = num_gpus[feas]
    cap = float(capacity[0])
    if g.sum() <= cap:
        x[feas, 0] = 1.0
        return x
    if objective != "max-min-fairness":
        order = np.argsort(g if weight is None else -weight[feas] / g, kind="stable")
        before = np.concatenate([[0.0], np.cumsum(g[order])[:-1]])
        share = np.zeros(g.size)
        share[order] = np.clip((cap - before) / g[order], 0.0, 1.0)
        x[feas, 0] = share
        return x
    a = equal_share(throughput, num_gpus, capacity)[feas, 0]
    bp = 1.0 / a                      # z at which each job saturates at x = 1
    order = np.argsort(bp, kind="stable")
    g_sorted, ga_sorted = g[order], (g * a)[order]
    sat_g = np.concatenate([[0.0], np.cumsum(g_sorted)])            # GPUs of the first k saturated
    rest_ga = np.concatenate([np.cumsum(ga_sorted[::-1])[::-1], [0.0]])  # sum g*a of the others
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (cap - sat_g) / rest_ga                                  # z if exactly k saturate
    lo = np.concatenate([[0.0], bp[order]])
    hi = np.concatenate([bp[order], [np.inf]])
    ok = (rest_ga > 0) & (z >= lo * (1 - 1e-12)) & (z <= hi * (1 + 1e-12))
    zstar = float(z[np.flatnonzero(ok)[0]])
    x[feas, 0] = np.minimum(1.0, zstar * a)
    return _clip(x, num_gpus, capacity)


def _solve_lp(throughput: np.ndarray, num_gpus: np.ndarray, capacity: np.ndarray,
              objective: str, weight: np.ndarray | None = None, integral: bool = False,
              idle_weight: float = 0.0) -> np.ndarray:
    """The LP formulation for any number of types (HiGHS).

    Variables are the feasible (job, type) pairs in row-major order (then ``z`` in stage 1 of
    max-min fairness). Every pair's column holds three entries: 1 in its job's row, its gang size in
    its type's row, and (max-min fairness) ``-w`` in its job's fairness row; the CSC arrays are built
    directly from that pattern (:func:`_lp_columns`), the same matrix ``linprog`` would be given.
    ``integral`` (not for max-min fairness) makes every column binary: a MILP. ``idle_weight`` adds
    ``idle_weight * num_gpus[j] * sum(weight) / sum(num_gpus)`` to every pair's gain.
    """
    m, n_types = throughput.shape
    feas = feasible_pairs(throughput, num_gpus, capacity)
    rows, cols = np.nonzero(feas)
    x = np.zeros((m, n_types))
    if rows.size == 0:
        return x
    p = rows.size
    b_base = np.concatenate([np.ones(m), capacity])

    if objective != "max-min-fairness":  # max-throughput, or shortest-first (weighted by job)
        best = np.where(feas, throughput, 0.0).max(axis=1)
        gain = throughput[rows, cols] / best[rows]
        if weight is not None:
            gain = gain * weight[rows]
        if idle_weight:
            gain = gain + idle_weight * num_gpus[rows] * weight.sum() / num_gpus.sum()
        indptr, indices, data = _lp_columns(rows, cols, num_gpus[rows], None, m, n_types)
        sol = _highs_min(-gain, indptr, indices, data, b_base, np.ones(p), integral=integral)
        if sol is None and integral:  # the MILP failed (node limit, solver error): its relaxation
            integral = False
            sol = _highs_min(-gain, indptr, indices, data, b_base, np.ones(p))
        if sol is None:
            return equal_share(throughput, num_gpus, capacity)
        x[rows, cols] = np.round(sol[:p]) if integral else sol[:p]
        return _clip(x, num_gpus, capacity)

    base = (throughput * equal_share(throughput, num_gpus, capacity)).sum(axis=1)
    w = throughput[rows, cols] / base[rows]  # normalised throughput per unit of X
    k = int(feas.any(axis=1).sum())
    # stage 1: maximise z subject to z <= sum_t w x for every job
    indptr, indices, data = _lp_columns(rows, cols, num_gpus[rows], w, m, n_types, with_z=k)
    c1 = np.zeros(p + 1)
    c1[-1] = -1.0
    ub1 = np.ones(p + 1)
    ub1[-1] = np.inf
    sol = _highs_min(c1, indptr, indices, data, np.concatenate([b_base, np.zeros(k)]), ub1)
    if sol is None:
        return equal_share(throughput, num_gpus, capacity)
    z = float(sol[-1])
    x[rows, cols] = sol[:p]
    # stage 2: most total normalised throughput among the max-min optimal allocations
    floor = z * (1.0 - _TIE_SLACK)
    sol2 = _highs_min(-w, indptr[:p + 1], indices[:3 * p], data[:3 * p], np.concatenate([b_base, np.full(k, -floor)]),
                      np.ones(p))
    if sol2 is not None:
        x[:] = 0.0
        x[rows, cols] = sol2
    return _clip(x, num_gpus, capacity)


def _lp_columns(rows: np.ndarray, cols: np.ndarray, gang: np.ndarray, w: np.ndarray | None, m: int, n_types: int,
                with_z: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSC arrays ``(indptr, indices, data)`` of the constraint matrix over the pairs ``(rows, cols)``.

    Row blocks: one per job (``sum_t x <= 1``), one per type (``sum_j g x <= n_t``) and, when ``w``
    is given, one per job with a feasible pair (``z - sum_t w x <= 0``; ``rows`` is sorted, so a
    pair's fairness row is its job's rank among them). ``with_z`` adds the ``z`` column (a 1 in
    each of those ``with_z`` fairness rows).
    """
    p = rows.size
    per = 2 if w is None else 3
    indices = np.empty(per * p + with_z, dtype=np.int32)
    data = np.empty(per * p + with_z)
    indices[0:per * p:per] = rows
    indices[1:per * p:per] = m + cols
    data[0:per * p:per] = 1.0
    data[1:per * p:per] = gang
    if w is not None:
        first = np.ones(p, dtype=bool)
        first[1:] = rows[1:] != rows[:-1]
        indices[2:per * p:per] = m + n_types + np.cumsum(first) - 1
        data[2:per * p:per] = -w
    indptr = np.arange(0, per * (p + 1), per, dtype=np.int32)
    if with_z:
        base = m + n_types
        indices[per * p:] = np.arange(base, base + with_z)
        data[per * p:] = 1.0
        indptr = np.append(indptr, per * p + with_z).astype(np.int32)
    return indptr, indices, data


_HIGHS: list = []  # [module, options] once the direct path is set up; [None] without it
_SOLVER = threading.local()  # .highs: this thread's HiGHS object


def _highs_options():
    """scipy's HiGHS binding and the options ``linprog(method="highs")`` passes it, made once.

    ``linprog`` spends most of a small LP's time checking inputs and options and converting the
    matrix; calling the binding it wraps with the same model and options gives the same solution
    (``tests/scheduling/test_speedup_identical.py`` compares both bit for bit) at a fraction of the cost. The
    binding is private to scipy: without it, :func:`_highs_min` goes through ``linprog``. Each thread keeps
    one HiGHS object and hands it every model as arrays: ``passModel`` drops the previous model, basis
    and solution, so a solve does not depend on the ones before it (tested), and the per-LP cost is the
    simplex itself.
    """
    if not _HIGHS:
        try:
            from scipy.optimize._highspy import _core as h

            opts = h.HighsOptions()
            opts.presolve = "on"
            opts.highs_debug_level = h.HighsDebugLevel.kHighsDebugLevelNone
            opts.log_to_console = False
            opts.output_flag = False
            opts.simplex_strategy = h.simplex_constants.SimplexStrategy.kSimplexStrategyDual
            opts.mip_max_nodes = MAX_MIP_NODES  # MILPs only: LPs are solved as linprog solves them
            _HIGHS.extend([h, opts])
        except (ImportError, AttributeError, TypeError):  # another scipy: the public API
            _HIGHS.extend([None, None])
    return _HIGHS


def _highs_min(c: np.ndarray, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, rhs: np.ndarray,
               ub: np.ndarray, integral: bool = False) -> np.ndarray | None:
    """``argmin c @ x`` subject to ``A x <= rhs`` and ``0 <= x <= ub`` (``A`` as CSC arrays), solved as
    ``linprog(method="highs")`` solves it; ``None`` where ``linprog`` would not report success.
    ``integral``: every ``x`` an integer, solved as ``milp`` solves it (with :func:`quiet_stdout`:
    HiGHS's MIP solver prints a line when it repairs an incumbent, whatever its output options)."""
    h, opts = _highs_options()
    if h is None:
        a = sparse.csc_array((data, indices, indptr), shape=(rhs.size, c.size))
        bounds = np.column_stack([np.zeros(c.size), ub])
        if integral:
            with quiet_stdout():
                res = milp(c, constraints=LinearConstraint(a, -np.inf, rhs), integrality=np.ones(c.size),
                           bounds=Bounds(bounds[:, 0], bounds[:, 1]), options={"node_limit": MAX_MIP_NODES})
            return res.x if res.status == 0 else None
        res = linprog(c, A_ub=a, b_ub=rhs, bounds=bounds, method="highs")
        return res.x if res.status == 0 else None
    highs = getattr(_SOLVER, "highs", None)
    if highs is None:  # one solver object per thread, reused: passModel clears the previous model and solve
        highs = _SOLVER.highs = h._Highs()
        if highs.passOptions(opts) == h.HighsStatus.kError:
            _SOLVER.highs = None
            return None
    inf = h.kHighsInf
    # the model as arrays (colwise, minimise, no offset, columns continuous or, for a MILP, integer)
    colwise, minimize = int(h.MatrixFormat.kColwise), int(h.ObjSense.kMinimize)
    if highs.passModel(c.size, rhs.size, indices.size, colwise, minimize, 0.0, c, np.zeros(c.size),
                       np.where(np.isinf(ub), inf, ub), np.full(rhs.size, -inf), rhs, indptr, indices, data,
                       np.full(c.size, int(integral), dtype=np.int32)) == h.HighsStatus.kError:
        return None
    with quiet_stdout() if integral else contextlib.nullcontext():
        status = highs.run()
    if status == h.HighsStatus.kError or highs.getModelStatus() != h.HighsModelStatus.kOptimal:
        return None
    sol = highs.getSolution()
    x = np.array(sol.col_value)
    # linprog's own acceptance test (scipy.optimize._linprog_util._check_result, tol 1e-9)
    tol = math.sqrt(1e-9) * 10
    slack = rhs - np.array(sol.row_value)
    if np.isnan(x).any() or np.isnan(slack).any() or not ((x >= -tol) & (x <= ub + tol)).all() \
            or (slack < -tol).any():
        return None
    return x


def _clip(x: np.ndarray, num_gpus: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Remove solver round-off so the constraints hold exactly (up to float rounding)."""
    x = np.clip(x, 0.0, 1.0)
    x[x < 1e-9] = 0.0
    row = x.sum(axis=1)
    over = row > 1.0
    x[over] /= row[over, None]
    used = num_gpus @ x
    scale = np.ones_like(used)
    np.divide(capacity, used, out=scale, where=used > capacity)
    return x * np.minimum(scale, 1.0)[None, :]


# ------------------------------------------------------------------------------- the policy
class Gavel:
    """Gavel's heterogeneity-aware policies with its round-based mechanism.

    Args:
        objective: ``"max-min-fairness"`` (Gavel's heterogeneity-aware LAS, the default),
            ``"max-throughput"`` or ``"shortest-first"`` (use :class:`GavelShortestFirst`, which
            tells the simulator it reads remaining work).
        round_s: round length (Gavel: 360 s); ``None`` makes every decision a round.
        max_jobs_lp: most queued jobs in the LP (earliest arrivals), besides every running job.
        preemptive: may stop and move jobs at round boundaries (the view must allow it too).

    Attributes:
        allocation_jobs, allocation: the job indices and ``X`` rows of the last solved allocation.
        lp_solves: how many allocations were computed (LP or shortcut).

    State is kept per job table (a new simulation resets it): wall time received per job per type,
    when each job entered the allocation, and the cached allocation.
    """

    name = "gavel"
    reads_running_progress = False  # allocations from speeds and time received, not work left
    integral = False  # the LP's fractional allocation, time-shared by the rounds
    idle_weight = 0.0  # no weight on idle GPUs: Gavel's objectives as published

    def __init__(self, *, objective: str = "max-min-fairness", round_s: float | None = DEFAULT_ROUND_S,
                 max_jobs_lp: int = DEFAULT_MAX_JOBS_LP, preemptive: bool = True) -> None:
        if objective not in OBJECTIVES:
            raise SchedulingError(f"gavel: unknown objective {objective!r} (known: {', '.join(OBJECTIVES)})")
        if objective == "shortest-first" and not type(self).__dict__.get("reads_running_progress", True):
            # as the simulator reads it: Gavel says it never reads running jobs' remaining work; this objective does
            raise SchedulingError("gavel: objective 'shortest-first' is the 'gavel-srtf' policy (GavelShortestFirst)")
        if round_s is not None and not (math.isfinite(round_s) and round_s > 0):
            raise SchedulingError(f"gavel: round_s must be > 0 or None, got {round_s}")
        if int(max_jobs_lp) < 1:
            raise SchedulingError(f"gavel: max_jobs_lp must be >= 1, got {max_jobs_lp}")
        self.objective = objective
        self.round_s = None if round_s is None else float(round_s)
        self.max_jobs_lp = int(max_jobs_lp)
        self.preemptive = bool(preemptive)
        self._reset(None, 0, 0)

    def __repr__(self) -> str:
        return (f"Gavel(objective={self.objective!r}, round_s={self.round_s}, "
                f"max_jobs_lp={self.max_jobs_lp}, preemptive={self.preemptive})")

    # ------------------------------------------------------------------------------- state
    def _reset(self, table: JobTable | None, n: int, n_types: int) -> None:
        self._table = table
        self._received_s = np.zeros((n, n_types))
        self._entered_s = np.full(n, np.nan)
        self._row = np.full(n, -1, dtype=np.int64)
        self.allocation_jobs = np.zeros(0, dtype=np.int64)
        self.allocation = np.zeros((0, n_types))
        self._active_key: list[int] | None = None
        self._settled: np.ndarray | None = None  # each allocation row's one type, when every row has one
        self._last_now: float | None = None
        self._last_round: float | None = None
        self.lp_solves = 0

    def _sync(self, view: ClusterView) -> None:
        n_types = len(view.type_names)
        if self._table is not view.jobs or self._received_s.shape != (len(view.jobs), n_types):
            self._reset(view.jobs, len(view.jobs), n_types)

    # ------------------------------------------------------------------------------ decide
    def decide(self, view: ClusterView) -> Decision:
        self._sync(view)
        jobs = view.jobs
        now = float(view.now_s)
        r = np.asarray(view.running, dtype=np.int64)
        q = np.asarray(view.queue, dtype=np.int64)
        if self._last_now is not None and r.size:
            rt = jobs.run_type[r]
            ok = rt >= 0
            self._received_s[r[ok], rt[ok]] += now - self._last_now
        self._last_now = now

        n_types = len(view.type_names)
        is_round = self._is_round(now)
        if q.size == 0 and (n_types == 1 or not is_round):
            return Decision()
        if not is_round:
            if view.free_by_type().sum() == 0:
                return Decision()
            return self._assign(view, r, q, preempt=False)
        self._last_round = now
        key = sorted(view.running)  # the job set, as a sorted list of ints: cheaper than numpy at this size
        key.extend(view.queue)
        key.sort()
        if self._active_key is None or key != self._active_key:
            self._solve(view, r, q)
            self._active_key = key
        elif q.size == 0 and self._settled is not None and np.array_equal(jobs.run_type[self.allocation_jobs],
                                                                          self._settled):
            # Every job of the allocation runs on the one type it is allocated and none waits: each is
            # granted its own type (they all fit, as they run together), so nobody moves and nothing
            # is left to fill: the same empty decision _assign would return, without building it.
            return Decision()
        return self._assign(view, r, q, preempt=self.preemptive and view.preemption)

    def _is_round(self, now: float) -> bool:
        """First decision, or the first one in a new period of the ``round_s`` grid (the simulator
        ticks at multiples of ``round_s``; arrivals and completions in between are not rounds)."""
        if self.round_s is None or self._last_round is None:
            return True
        return math.floor(now / self.round_s + 1e-9) > math.floor(self._last_round / self.round_s + 1e-9)

    # ------------------------------------------------------------------------------- solve
    def _solve(self, view: ClusterView, r: np.ndarray, q: np.ndarray) -> None:
        jobs = view.jobs
        shortest = self.objective == "shortest-first"
        if q.size > self.max_jobs_lp:  # the earliest arrivals (shortest-first: the shortest jobs)
            q = q[np.lexsort((q, _best_time_s(jobs, q) if shortest else jobs.arrival_s[q]))][:self.max_jobs_lp]
        lp_jobs = np.concatenate([r, q])
        healthy = view.gpu_job >= GPU_FREE
        n_types = len(view.type_names)
        capacity = np.bincount(view.gpu_type[healthy], minlength=n_types)
        thr = jobs.speed[lp_jobs].astype(float)
        g = jobs.num_gpus[lp_jobs]
        single = jobs.single_node[lp_jobs]
        if single.any():
            node_max = _per_node_max(view, healthy, n_types)
            thr[single[:, None] & (g[:, None] > node_max[None, :])] = 0.0
        feas = feasible_pairs(thr, g, capacity)
        thr = np.where(feas, thr, 0.0)
        best = np.argmax(thr, axis=1)
        has = feas.any(axis=1)
        demand = np.bincount(best[has], weights=g[has], minlength=n_types)
        if np.all(demand <= capacity):  # everyone fits on its fastest type: nothing to trade
            x = np.zeros(thr.shape)
            x[np.flatnonzero(has), best[has]] = 1.0
        else:
            x = solve_allocation(thr, g, capacity, objective=self.objective,
                                 remaining=_best_time_s(jobs, lp_jobs) if shortest else None, integral=self.integral,
                                 idle_weight=self.idle_weight)
        self.lp_solves += 1
        self._row[self.allocation_jobs] = -1
        self._row[lp_jobs] = np.arange(lp_jobs.size)
        self.allocation_jobs = lp_jobs
        self.allocation = x
        positive = x > 0
        self._settled = np.argmax(positive, axis=1) if (positive.sum(axis=1) == 1).all() else None
        new = np.isnan(self._entered_s[lp_jobs])
        self._entered_s[lp_jobs[new]] = view.now_s
        self._cache_allocation(jobs)

    def _cache_allocation(self, jobs: JobTable) -> None:
        """What the rounds read of the allocation and stays fixed until the next solve: when each row's job
        entered it, ``X * 1e9`` (the priority before any time is received), the rows' gang sizes and
        each row's rank by (arrival, job index), the grant order's tie-break. Nothing reads them before the
        first solve: a new table's first decision is a round, and the first round with work solves."""
        lp, x = self.allocation_jobs, self.allocation
        self._lp_entered = self._entered_s[lp]
        self._lp_never = x * _NEVER_RECEIVED
        self._lp_zero = x <= 0
        self._lp_gangs = jobs.num_gpus[lp]
        rank = np.empty(lp.size, dtype=np.int64)
        rank[np.lexsort((lp, jobs.arrival_s[lp]))] = np.arange(lp.size)
        self._lp_rank = rank

    # ------------------------------------------------------------------------------ assign
    def _priorities(self, view: ClusterView) -> np.ndarray:
        """``X / received fraction`` for the allocation rows (``X * 1e9`` where nothing received)."""
        x = self.allocation
        age = (view.now_s - self._lp_entered)[:, None]  # where age <= 0 the fraction stays 0
        frac = np.divide(self._received_s[self.allocation_jobs], age, out=np.zeros(x.shape), where=age > 0)
        prio = np.divide(x, frac, out=self._lp_never.copy(), where=frac > 0)
        prio[self._lp_zero] = 0.0
        return prio

    def _assign(self, view: ClusterView, r: np.ndarray, q: np.ndarray, *, preempt: bool) -> Decision:
        working = view.free_gpus()
        prio = self._priorities(view)
        granted = self._grant(view, prio, working, preempt=preempt)
        held = _Held(view)
        victims = self._victims(view, r, granted, prio, preempt=preempt)
        starts, stopped = _realise(view, held, granted, victims, working)
        starts += _fill_leftover(view, q, {j for j, _ in starts}, working, self._leftover_key)
        return Decision(starts=starts, preempt=stopped)

    @staticmethod
    def _leftover_key(jobs: JobTable, idx: np.ndarray) -> np.ndarray:
        """Order of the queued jobs that get leftover GPUs: earliest arrival first."""
        return jobs.arrival_s[idx]

    def _grant(self, view: ClusterView, prio: np.ndarray, working: FreeGpus, *, preempt: bool) -> dict[int, int]:
        """Grant (job, type) pairs in decreasing priority while the type has room, counting GPUs.

        Ties: the job already running on the type, then earlier arrival, lower job index, lower type
        index (one integer per pair from the rows' cached arrival ranks). Returns job -> granted type
        index.
        """
        jobs = view.jobs
        lp = self.allocation_jobs
        alive = _GRANTABLE[int(bool(preempt))][jobs.status[lp]]  # queued, or running when preempting
        rows, cols = np.nonzero((prio > 0) & alive[:, None])
        if not rows.size:
            return {}
        pair_jobs = lp[rows]
        moves = jobs.run_type[pair_jobs] != cols  # False (sorts first) where the job keeps its type
        tie = (moves * lp.size + self._lp_rank[rows]) * prio.shape[1] + cols
        order = np.lexsort((tie, -prio[rows, cols]))
        room = (np.bincount(view.gpu_type[view.gpu_job >= GPU_FREE], minlength=len(view.type_names)) if preempt
                else working.by_type).tolist()
        gangs = self._lp_gangs[rows]
        smallest = int(gangs.min())
        granted: dict[int, int] = {}
        for j, t, g in zip(pair_jobs[order].tolist(), cols[order].tolist(), gangs[order].tolist(), strict=True):
            if j in granted or room[t] < g:
                continue
            granted[j] = t
            room[t] -= g
            if room[t] < smallest and max(room) < smallest:
                break
        return granted

    def _victims(self, view: ClusterView, r: np.ndarray, granted: dict[int, int], prio: np.ndarray, *,
                 preempt: bool) -> list[list[int]]:
        """Per type, the running jobs on it without a grant there, lowest priority first (none unless ``preempt``)."""
        jobs = view.jobs
        victims: list[list[int]] = [[] for _ in range(len(view.type_names))]
        if not preempt or not r.size:
            return victims
        rows = prio.tolist()
        losers = [(max(rows[k]) if k >= 0 and rows[k] else 0.0, -a, -j, t)  # a row's top priority first
                  for j, t, k, a in zip(r.tolist(), jobs.run_type[r].tolist(), self._row[r].tolist(),
                                        jobs.arrival_s[r].tolist(), strict=True)
                  if granted.get(j, -1) != t]
        losers.sort()  # -j is unique: the type never decides
        for _, _, j, t in losers:
            victims[t].append(-j)
        return victims


class GavelShortestFirst(Gavel):
    """Gavel's framework with SRTF's objective (``gavel-srtf``): heterogeneity-aware shortest-first.

    The allocation maximises ``sum_j w_j sum_t X[j, t] T[j, t] / max_t T[j, t]`` with ``w_j`` the
    inverse of job ``j``'s remaining time on its fastest type (:func:`shortest_first_weights`) over
    0/1 allocations (``integral``: a MILP): each job runs all the time on one type or waits, gangs
    fit their types, and jobs with the least GPU-time left come first (Smith's rule), each on the
    type where it is comparatively fastest. It is re-solved when the job set changes, as Gavel's.
    The rounds run it as it is: (job, type) pairs are granted by the job's remaining time now,
    shortest first — no time-sharing between rounds, which would only pay restart penalties for a
    shortest-first objective (on Philly, Gavel's ``X / received`` priorities with the LP preempted
    35,732 times in 150 jobs). The LP's fractional optimum, rounded to each job's largest share,
    left a large gang waiting behind small jobs that had somewhere slower to go (its share was
    fractional, so the rounding dropped it) with most GPUs idle; the 0/1 optimum moves the small
    jobs and runs the gang. Shorter jobs preempt longer ones at rounds; between rounds it only fills
    free GPUs; leftover GPUs go to the other queued jobs, least time left first. The simulator keeps
    running jobs' remaining work up to date for it (``reads_running_progress``).

    ``idle_weight`` (the design's ``lambda`` on idle GPU time; :data:`DEFAULT_IDLE_WEIGHT`) makes every
    GPU the allocation keeps busy worth that many times the mean weight per GPU asked. Smith's rule
    alone kept an 8-GPU gang waiting, with 15 of 16 GPUs idle, rather than move a 1-GPU job that
    had 9 h left to a type where it runs at 0.46 of its speed; the weight runs both.

    Not one of Gavel's published policies: SRTF's objective in Gavel's framework, a heuristic of
    ours, reported beside the others and one of the experts the learned scheduler may choose.
    """

    name = "gavel-srtf"
    reads_running_progress = True
    integral = True  # a 0/1 allocation: each job on one type, or waiting

    def __init__(self, *, round_s: float | None = DEFAULT_ROUND_S, max_jobs_lp: int = DEFAULT_MAX_JOBS_LP,
                 preemptive: bool = True, idle_weight: float = DEFAULT_IDLE_WEIGHT) -> None:
        super().__init__(objective="shortest-first", round_s=round_s, max_jobs_lp=max_jobs_lp, preemptive=preemptive)
        self.idle_weight = _idle_weight(idle_weight)

    def __repr__(self) -> str:
        return (f"GavelShortestFirst(round_s={self.round_s}, max_jobs_lp={self.max_jobs_lp}, "
                f"preemptive={self.preemptive}, idle_weight={self.idle_weight})")

    @staticmethod
    def _leftover_key(jobs: JobTable, idx: np.ndarray) -> np.ndarray:
        """Leftover GPUs go to the queued jobs with the least time left first."""
        return _best_time_s(jobs, idx)

    def _priorities(self, view: ClusterView) -> np.ndarray:
        """The current :func:`shortest_first_weights` of each allocation row on its largest-share type."""
        x = self.allocation
        prio = np.zeros(x.shape)
        if not x.size:
            return prio
        rows = np.arange(x.shape[0])
        top = np.argmax(x, axis=1)
        w = shortest_first_weights(_best_time_s(view.jobs, self.allocation_jobs))
        prio[rows, top] = np.where(x[rows, top] > 0, w, 0.0)
        return prio


class _Held(dict):
    """Job -> its GPUs in the view (:meth:`ClusterView.gpus_of`), each looked up once per decision."""

    def __init__(self, view: ClusterView) -> None:
        super().__init__()
        self.view = view

    def __missing__(self, job: int) -> tuple[int, ...]:
        gpus = self[job] = self.view.gpus_of(job)
        return gpus


def _realise(view: ClusterView, held: _Held, granted: dict[int, int], victims: list[list[int]],
             working: FreeGpus) -> tuple[Starts, list[int]]:
    """Turn grants into starts and preemptions; returns ``(starts, stopped)``.

    A job granted the type it runs on keeps its GPUs; the others start where ``find`` puts them,
    taking GPUs of running jobs left without a grant (lowest priority first) only where they are
    needed. Ungranted jobs nobody needs keep running.
    """
    starts: Starts = []
    stopped: list[int] = []
    if not granted:
        return starts, stopped
    run_types = view.jobs.run_type[list(granted)].tolist()
    for (j, t), old in zip(granted.items(), run_types, strict=True):
        if old == t:
            continue
        # GPUs of type t, freeing the type's victims (lowest priority first) only where needed; the
        # victims it did not need stay at the front of the list, in order
        gpus, freed, spared = working.find_freeing(j, t, ((v, held[v]) for v in victims[t]))
        victims[t][:len(freed) + len(spared)] = spared
        stopped.extend(freed)
        if gpus is None:
            continue
        working.take(gpus)
        if old >= 0 and j not in stopped:  # a move between types: stop it, start it there
            if j in victims[old]:
                victims[old].remove(j)
            working.give(held[j])
            stopped.append(j)
        starts.append((j, gpus))
    return starts, stopped


def _fill_leftover(view: ClusterView, q: np.ndarray, started: set[int], working: FreeGpus,
                   key: Callable[[JobTable, np.ndarray], np.ndarray]) -> Starts:
    """Work conservation: leftover GPUs to queued jobs not ``started``, by ``key`` (then job index),
    each on its fastest type with room."""
    if working.total <= 0 or not q.size:
        return []
    jobs = view.jobs
    starts: Starts = []
    rest = np.array([j for j in q.tolist() if j not in started], dtype=q.dtype) if started else q
    fits = ((jobs.speed[rest] > 0) & (jobs.num_gpus[rest][:, None] <= working.by_type[None, :])).any(axis=1)
    rest = rest[fits]
    rest = rest[np.lexsort((rest, key(jobs, rest)))]
    for j in rest.tolist():
        if working.total == 0:
            break
        gpus = working.start(j)
        if gpus is not None:
            starts.append((j, gpus))
    return starts


def _best_time_s(jobs: JobTable, idx: np.ndarray) -> np.ndarray:
    """Remaining time of jobs ``idx`` on their fastest type."""
    return jobs.remaining_s[idx] / jobs.speed[idx].max(axis=1)


def _per_node_max(view: ClusterView, healthy: np.ndarray, n_types: int) -> np.ndarray:
    """Most healthy GPUs of each type on any one node."""
    n_nodes = int(view.gpu_node.max()) + 1 if view.gpu_node.size else 0
    counts = np.zeros((max(n_nodes, 1), n_types), dtype=np.int64)
    np.add.at(counts, (view.gpu_node[healthy], view.gpu_type[healthy]), 1)
    return counts.max(axis=0)
