"""Drift on hybrid problems: devices that run slower (or faster) than their type says.

A :class:`~gpualloc.placement.hybrid.problem.HybridProblem` costs devices by *type*. A throttled GPU or
one sharing its SMs with another job is no longer like the others of its type, so
:func:`with_speed_scale` gives every (type, speed factor) pair of the cluster a type of its own (named
``V100-16GB@0.5``) whose compute and optimizer-step times are the base type's divided by the factor.
Links, memory and sizes do not change. The planner, the baselines, the closed form, the bound and the
simulator then use the scaled problem like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np

from gpualloc.errors import PlacementError
from gpualloc.placement.hybrid.problem import HybridProblem

__all__ = ["ScaledHybridProblem", "with_speed_scale"]


class ScaledHybridProblem(HybridProblem):
    """``base`` with device ``d`` running at ``scale[d]`` times its type's speed (see :func:`with_speed_scale`)."""

    def __init__(self, base: HybridProblem, scale: np.ndarray) -> None:
        super().__init__(base.graph, base.cluster, base.global_batch, base.cost, base.optimizer_states)
        self.base = base
        self.scale = scale
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

    def layer_times_s(self, type_index: int, mb: int, tp: int = 1) -> tuple[np.ndarray, np.ndarray]:
        key = (int(type_index), int(mb), int(tp))
        hit = self._time_cache.get(key)
        if hit is None:
            s = self._factor[type_index]
            hit = tuple(a / s for a in self.base.layer_times_s(int(self._base_type[type_index]), mb, tp))
            for a in hit:
                a.setflags(write=False)
            self._time_cache[key] = hit
        return hit

    def opt_step_s(self, type_index: int, param_bytes: float) -> float:
        return self.base.opt_step_s(int(self._base_type[type_index]), param_bytes) / float(self._factor[type_index])

    def min_sample_work_s(self) -> np.ndarray:
        return self.base.min_sample_work_s()[self._base_type] / self._factor[:, None]

    def min_layer_fixed_s(self) -> np.ndarray:
        return self.base.min_layer_fixed_s()[self._base_type] / self._factor[:, None]


def with_speed_scale(problem: HybridProblem, scale_per_device: Sequence[float] | np.ndarray) -> HybridProblem:
    """``problem`` with device ``d``'s compute ``scale_per_device[d]`` times as fast (0.5: every layer and
    the optimizer step take twice as long on it). Scaling a scaled problem composes; all ones return
    ``problem`` itself.

    Raises:
        PlacementError: not one finite positive factor per device.
    """
    scale = np.asarray(scale_per_device, dtype=np.float64)
    if scale.shape != (problem.k,) or not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise PlacementError(f"speed scale: expected {problem.k} finite positive factors (one per device), "
                             f"got {np.asarray(scale_per_device).tolist()!r}")
    if isinstance(problem, ScaledHybridProblem):
        problem, scale = problem.base, problem.scale * scale
    if np.all(scale == 1.0):
        return problem
    scale.setflags(write=False)
    return ScaledHybridProblem(problem, scale)
