"""Drift on hybrid problems: devices slower (or faster) than their type says, degraded links, a new batch.

A :class:`~gpualloc.placement.hybrid.problem.HybridProblem` costs devices by *type*. A throttled GPU or
one sharing its SMs with another job is no longer like the others of its type, so
:func:`with_conditions` gives every (type, speed factor) pair of the cluster a type of its own (named
``V100-16GB@0.5``) whose compute and optimizer-step times are the base type's divided by the factor. It
applies a whole :class:`~gpualloc.placement.conditions.Conditions`: the device speeds as above, a
bandwidth factor per directed device pair (the pairwise links, and the intra-node and
network links of a hierarchical all-reduce, through :meth:`HybridProblem.sync_links`), and the batch
scale (a problem at the new global batch; :func:`rescale_batch` carries a plan's shares to it in
proportion). Memory and model sizes do not change. The planner, the baselines, the closed form, the
bound and the simulator then use the drifted problem like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np

from gpualloc.errors import PlacementError
from gpualloc.limits import MAX_BATCH, check_size
from gpualloc.placement.conditions import Conditions
from gpualloc.placement.hybrid.baselines import largest_remainder
from gpualloc.placement.hybrid.plan import HybridPlan, Replica, HybridStage, make_plan
from gpualloc.placement.hybrid.problem import HybridProblem

__all__ = ["ScaledHybridProblem", "rescale_batch", "with_conditions", "with_speed_scale"]


class ScaledHybridProblem(HybridProblem):
    """``base`` with device ``d`` running at ``scale[d]`` times its type's speed (see :func:`with_conditions`)
    and, with ``link``, the bandwidth from device ``a`` to ``b`` ``link[a, b]`` times the cluster's."""

    def __init__(self, base: HybridProblem, scale: np.ndarray, link: np.ndarray | None = None) -> None:
        super().__init__(base.graph, base.cluster, base.global_batch, base.cost, base.rules)
        self.base = base
        self.scale = scale
        self.link = link
        # one virtual type per (base type, factor) in use, the base types' order kept, nominal first
        pairs = sorted({(int(t), float(s)) for t, s in zip(base.type_of, scale, strict=True)},
                       key=lambda p: (p[0], -p[1]))
        index = {p: i for i, p in enumerate(pairs)}
        self._base_type = np.array([t for t, _ in pairs], dtype=np.int64)
        self._factor = np.array([s for _, s in pairs])
        self.type_of = np.array([index[(int(t), float(s))] for t, s in zip(base.type_of, scale, strict=True)])
        self.type_names = tuple(base.type_names[t] if s == 1.0 else f"{base.type_names[t]}@{s:g}" for t, s in pairs)

    @cached_property
    def tp_degrees(self) -> tuple[int, ...]:
        return self.base.tp_degrees

    def _layer_times(self, type_index: int, mb: int, tp: int) -> tuple[np.ndarray, np.ndarray]:
        s = self._factor[type_index]
        return tuple(a / s for a in self.base.layer_times_s(int(self._base_type[type_index]), mb, tp))

    def opt_step_s(self, type_index: int, param_bytes: float, tensors: float) -> float:
        return (self.base.opt_step_s(int(self._base_type[type_index]), param_bytes, tensors)
                / float(self._factor[type_index]))

    def opt_floor_s(self, type_index: int) -> np.ndarray:
        return self.base.opt_floor_s(int(self._base_type[type_index])) / float(self._factor[type_index])

    def min_sample_work_s(self) -> np.ndarray:
        return self.base.min_sample_work_s()[self._base_type] / self._factor[:, None]

    def min_layer_fixed_s(self) -> np.ndarray:
        return self.base.min_layer_fixed_s()[self._base_type] / self._factor[:, None]

    @cached_property
    def bandwidth(self) -> np.ndarray:
        if self.link is None:
            return self.base.bandwidth
        out = self.base.bandwidth * self.link
        out.setflags(write=False)
        return out

    def sync_links(self, devices) -> tuple[float, float, float, float]:
        """The base's links, each scaled by the least factor among ``devices``' pairs it carries (same-node
        pairs for the intra-node link, cross-node pairs for the network)."""
        intra_bw, intra_lat, net_bw, net_lat = self.base.sync_links(devices)
        if self.link is None:
            return intra_bw, intra_lat, net_bw, net_lat
        d = np.asarray(devices)
        sub = self.link[np.ix_(d, d)]
        same = self.node_of[d][:, None] == self.node_of[d][None, :]
        off = ~np.eye(d.size, dtype=bool)
        intra, cross = sub[same & off], sub[~same]
        return (intra_bw * (float(intra.min()) if intra.size else 1.0), intra_lat,
                net_bw * (float(cross.min()) if cross.size else 1.0), net_lat)

    def replica_kind(self, devices: tuple[int, ...]) -> tuple:
        kind = super().replica_kind(devices)
        if self.link is None:
            return kind
        d = np.asarray(devices)
        return (*kind, tuple(self.link[np.ix_(d, d)].ravel().tolist()))


def with_speed_scale(problem: HybridProblem, scale_per_device: Sequence[float] | np.ndarray) -> HybridProblem:
    """``problem`` with device ``d``'s compute ``scale_per_device[d]`` times as fast (0.5: every layer and
    the optimizer step take twice as long on it): :func:`with_conditions` with device speeds only.
    Scaling a scaled problem composes; all ones return ``problem`` itself.

    Raises:
        PlacementError: not one finite positive factor per device.
    """
    scale = np.asarray(scale_per_device, dtype=np.float64)
    if scale.shape != (problem.k,) or not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise PlacementError(f"speed scale: expected {problem.k} finite positive factors (one per device), "
                             f"got {np.asarray(scale_per_device).tolist()!r}")
    return _drifted(*_compose(problem, scale, None))


def _compose(problem: HybridProblem, scale: np.ndarray, link: np.ndarray | None
             ) -> tuple[HybridProblem, np.ndarray, np.ndarray | None]:
    """The undrifted problem under ``problem`` and the factors on it: ``scale`` and ``link`` (factors on
    ``problem``) times those ``problem`` already has."""
    if not isinstance(problem, ScaledHybridProblem):
        return problem, scale, link
    if problem.link is not None:
        link = problem.link if link is None else problem.link * link
    return problem.base, problem.scale * scale, link


def _drifted(base: HybridProblem, scale: np.ndarray, link: np.ndarray | None) -> HybridProblem:
    """``base`` itself when every factor is 1, else a :class:`ScaledHybridProblem` over it."""
    if link is not None:
        link = np.array(link, dtype=np.float64)
        np.fill_diagonal(link, 1.0)  # a device talks to itself at infinite bandwidth whatever the factor
        if np.all(link == 1.0):
            link = None
        else:
            link.setflags(write=False)
    if np.all(scale == 1.0) and link is None:
        return base
    scale.setflags(write=False)
    return ScaledHybridProblem(base, scale, link)


def with_conditions(problem: HybridProblem, conditions: Conditions) -> HybridProblem:
    """``problem`` under ``conditions`` (factors on ``problem``; they compose with a drifted one's): device
    ``d``'s compute ``device_speed[d]`` times as fast (0.5: every layer and the optimizer step take twice as
    long on it), link bandwidth factors per directed device pair, and the global batch times
    ``batch_scale`` (rounded, at least 1). All ones return ``problem`` itself.

    Raises:
        PlacementError: the conditions are for another number of devices, or the new batch is too large.
    """
    k = len(conditions.device_speed)
    if k != problem.k:
        raise PlacementError(f"conditions: {k} devices, the problem has {problem.k}")
    base, scale, link = _compose(problem, np.array(conditions.device_speed, dtype=np.float64),
                                 np.array(conditions.link_bandwidth, dtype=np.float64))
    if conditions.batch_scale != 1.0:
        batch = max(1, round(base.global_batch * conditions.batch_scale))
        if batch != base.global_batch:
            base = HybridProblem(base.graph, base.cluster, batch, base.cost, base.rules)
    return _drifted(base, scale, link)


def rescale_batch(plan: HybridPlan, global_batch: int, *, n_devices: int | None = None) -> HybridPlan:
    """``plan`` at another global batch, every stage's shares in the same proportions (largest
    remainder, at least one sample each; when the batch is smaller than a stage's replicas, its first
    ``global_batch`` replicas keep one each) and at most as many microbatches as the smallest share.
    What a job does by itself when its batch changes: no weight moves.

    Raises:
        PlacementError: ``global_batch`` out of range.
    """
    if global_batch == plan.global_batch:
        return plan
    check_size(global_batch, "global batch", MAX_BATCH, PlacementError)
    stages = []
    for s in plan.stages:
        reps = s.replicas[:global_batch]
        shares = largest_remainder(global_batch, [r.batch_share for r in reps])
        replicas = tuple(Replica(r.devices, n) for r, n in zip(reps, shares, strict=True))
        stages.append(HybridStage(s.first, s.last, replicas))
    smallest = min(r.batch_share for s in stages for r in s.replicas)
    return make_plan(stages, global_batch, min(plan.microbatches, smallest), schedule=plan.schedule, sync=plan.sync,
                     sharding=plan.sharding, precision=plan.precision, recompute=plan.recompute,
                     n_devices=n_devices, where="rescaled plan")
