"""Lower bounds on the step time of any placement of a problem (communication ignored).

Every term is valid for every assignment and both pipeline schedules of
:func:`gpualloc.placement.simulate.simulate_step`, with ``M = problem.microbatches``: each op takes its
one-microbatch time (``problem.mb_fwd_s`` / ``mb_bwd_s``, launch overhead included) per microbatch, so
the step works ``s[i, j] = problem.step_compute_s`` on node ``i`` placed on ``j``. With
``smin[i] = min_j s[i, j]`` and ``mmin[i] = min_j (mb_fwd_s + mb_bwd_s)[i, j]``:

* ``critical_path_s``: the longest path of ``mmin``: one microbatch's forward along the path, then
  its backward back along it.
* ``balanced_work_s``: perfect balancing. For any weights ``y`` on the simplex, the busiest device
  works at least ``sum_j y_j load_j >= sum_i min_j y_j s[i, j]`` (weak LP duality). We take
  ``y_j ~ 1 / W_j`` with ``W_j = sum_i s[i, j]``; when devices differ by one speed factor this is
  exactly ``1 / sum_j (1 / W_j)``, and it stays valid when relative speeds differ per op.
* ``largest_op_s``: ``max_i smin[i]``: all ``M`` forwards and backwards of an op run on one device.
* ``pipeline_fill_s`` (:func:`pipeline_lower_bound` only): for every node ``v``, the device of
  ``v`` cannot start before microbatch 0 has gone forward through ``v``'s longest ancestor chain,
  then runs ``smin[v]`` of ``v``'s work, and after ``v``'s last backward that microbatch's gradient
  still has to go back through ``v``'s longest ancestor chain: ``F_head(v) + B_head(v) + smin[v]``
  (heads of one-microbatch times). It subsumes the largest op and, with ``M = 1``, the critical path.

:func:`lower_bound` is the one bound every plan of a problem is compared with, of either kind: the
least of the op-level bound above and the hybrid one (:mod:`gpualloc.placement.hybrid.bound`), each
valid for its plan kind, so valid for both; computed once per problem.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from gpualloc.errors import PlacementError
from gpualloc.placement.hybrid.bound import hybrid_bound
from gpualloc.placement.problem import PlacementProblem


@dataclass(frozen=True)
class Bound:
    """A lower bound on the step time and the terms it is the max of.

    Attributes:
        value_s: the bound, the largest term.
        binding: name of the largest term (``"critical_path"``, ``"balanced_work"``,
            ``"largest_op"`` or ``"pipeline_fill"``).
        critical_path_s: longest path of fastest-device fwd+bwd time of one microbatch.
        balanced_work_s: perfectly balanced total work.
        largest_op_s: the largest single op on its fastest device.
        pipeline_fill_s: head-chains-plus-op term (0.0 in :func:`step_lower_bound`).
        hybrid_s: the hybrid plans' bound (:func:`lower_bound` only; ``inf`` where the model has no
            hybrid plan).
    """

    value_s: float
    binding: str
    critical_path_s: float
    balanced_work_s: float
    largest_op_s: float
    pipeline_fill_s: float = 0.0
    hybrid_s: float = float("inf")


def _terms(problem: PlacementProblem) -> tuple[float, float, float]:
    c = problem.step_compute_s
    if problem.n == 0:
        return 0.0, 0.0, 0.0
    cmin = c.min(axis=1)
    crit, _ = problem.graph.critical_path((problem.mb_fwd_s + problem.mb_bwd_s).min(axis=1))
    work = c.sum(axis=0)
    if np.all(work > 0):
        y = 1.0 / work
        y /= y.sum()
        balanced = float(np.sum(np.min(c * y[None, :], axis=1)))
    else:  # a device doing everything for free: no balancing bound
        balanced = 0.0
    return float(crit), balanced, float(cmin.max())


def _pick(crit: float, balanced: float, largest: float, fill: float = 0.0) -> Bound:
    terms = {"critical_path": crit, "balanced_work": balanced, "largest_op": largest, "pipeline_fill": fill}
    binding = max(terms, key=terms.__getitem__)
    return Bound(terms[binding], binding, crit, balanced, largest, fill)


def step_lower_bound(problem: PlacementProblem) -> Bound:
    """Max of the critical path (of one microbatch), the balanced-work and the largest-op bounds."""
    return _pick(*_terms(problem))


def pipeline_lower_bound(problem: PlacementProblem) -> Bound:
    """:func:`step_lower_bound` plus the pipeline-fill term; tighter when ``M > 1``."""
    crit, balanced, largest = _terms(problem)
    fill = 0.0
    if problem.n:
        fmin = problem.mb_fwd_s.min(axis=1)
        bmin = problem.mb_bwd_s.min(axis=1)
        cmin = problem.step_compute_s.min(axis=1)
        preds = problem.graph.predecessors
        fhead = np.zeros(problem.n)  # longest ancestor chain ending just before the node
        bhead = np.zeros(problem.n)
        for i in problem.graph.topo_order.tolist():
            for u in preds[i]:
                fhead[i] = max(fhead[i], fhead[u] + fmin[u])
                bhead[i] = max(bhead[i], bhead[u] + bmin[u])
        fill = float(np.max(fhead + bhead + cmin))
    return _pick(crit, balanced, largest, fill)


def lower_bound(problem: PlacementProblem) -> Bound:
    """The one bound of ``problem``: no plan of either kind simulates a shorter step.

    The op-level bound (pipelined when ``M > 1``) holds for operator assignments at the problem's ``M``,
    the hybrid bound for every hybrid plan; the least of the two holds for both. ``binding`` is
    ``"hybrid"`` where the hybrid bound is the lower. Computed once per problem.
    """
    if "lower_bound" not in problem.memo:
        op = pipeline_lower_bound(problem) if problem.microbatches > 1 else step_lower_bound(problem)
        try:
            hy = hybrid_bound(problem.hybrid).value_s
        except PlacementError:  # no hybrid plan of this model (no layer to place, a profile in another precision)
            hy = float("inf")
        problem.memo["lower_bound"] = replace(op, hybrid_s=hy, **({} if op.value_s <= hy else
                                                                   {"value_s": hy, "binding": "hybrid"}))
    return problem.memo["lower_bound"]
