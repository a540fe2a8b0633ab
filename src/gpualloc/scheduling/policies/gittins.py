"""The Gittins index of a job's attained service under an empirical distribution of job sizes.

For a job of unknown size ``S`` (here: total GPU-service, GPU-seconds) that has received ``a``, the
Gittins index is

    G(a) = sup_{Δ > 0}  P(S - a <= Δ | S > a) / E[min(S - a, Δ) | S > a],

the best ratio, over how much more service ``Δ`` one is willing to invest, of the chance of finishing
within it to the service it costs. Serving the job of highest index minimises mean response time in
the M/G/1 queue among policies that do not know sizes (Gittins; Aalto, Ayesta & Righter 2009); with a
decreasing hazard rate it reduces to LAS, with an increasing one to FCFS. Tiresias (2D-Gittins) uses it
for DL jobs with the distribution of previous jobs' GPU-time.

With the distribution given by atoms ``s_1 < ... < s_m`` of weights ``w_i`` (an empirical distribution),
the supremum is reached at ``Δ = s_k - a`` for an atom ``s_k > a`` (between atoms the probability is
flat and the expected cost grows), so

    G(a) = max_{k : s_k > a}  W(a, s_k] / ( sum_{a < s_i <= s_k} w_i (s_i - a) + (s_k - a) W(s_k, inf) ),

``W(x, y]`` the weight of the atoms in ``(x, y]``; 0 when no atom exceeds ``a``. With a fixed quantum
``Δ`` (the authors' simulator: ``gittins_delta``) the ratio is taken at that ``Δ`` alone.

:class:`GittinsTable` puts the samples on a geometric grid (:func:`compress`) and holds the index
at the start of each interval between atoms (``a = 0`` and
``a = s_j``, each atom just passed): :meth:`GittinsTable.lookup` gives a job the value of the last atom
its service has passed, so its index changes only when an atom passes, as in the authors' table
lookup (``get_gittins_index``). Inside an interval the exact index grows towards the next atom
(without bound under the supremum); the interval's starting value is its least.

References:
    .. [1] Gittins, J. C. (1989). *Multi-armed Bandit Allocation Indices*. Wiley.
    .. [2] Aalto, S.; Ayesta, U.; Righter, R. (2009). "On the Gittins index in the M/G/1 queue."
       *Queueing Systems* 63, 437–458.
    .. [3] Gu, J. et al. (2019). "Tiresias: A GPU Cluster Manager for Distributed Deep Learning."
       *NSDI '19*, §3 (Eq. 1, the Gittins index over 2D attained service).
    .. [4] SymbioticLab/Tiresias, ``simulator/run_sim.py``: ``cal_r_gittins_index``,
       ``parse_job_dist``, ``get_gittins_index``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gpualloc.errors import SchedulingError

__all__ = ["DEFAULT_BINS_PER_DECADE", "GittinsTable", "compress", "gittins_index"]

DEFAULT_BINS_PER_DECADE = 10.0
"""Grid of the distribution's atoms: this many geometric steps per factor of 10 (steps of ~26%)."""


def _atoms(sizes: Sequence[float] | np.ndarray, weights: Sequence[float] | np.ndarray | None
           ) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(sizes, dtype=float).reshape(-1)
    w = np.ones(s.size) if weights is None else np.asarray(weights, dtype=float).reshape(-1)
    if w.size != s.size:
        raise SchedulingError(f"gittins: {s.size} sizes but {w.size} weights")
    if s.size and (not np.isfinite(s).all() or (s < 0).any()):
        raise SchedulingError("gittins: sizes must be finite and >= 0")
    if w.size and (not np.isfinite(w).all() or (w <= 0).any()):
        raise SchedulingError("gittins: weights must be finite and > 0")
    values, inverse = np.unique(s, return_inverse=True)
    return values, np.bincount(inverse, weights=w, minlength=values.size)


def compress(sizes: Sequence[float] | np.ndarray, bins_per_decade: float | None = DEFAULT_BINS_PER_DECADE
             ) -> tuple[np.ndarray, np.ndarray]:
    """``(atoms, weights)`` of the empirical distribution of ``sizes`` on a geometric grid.

    Each size moves up to the next point of the grid ``10 ** (k / bins_per_decade)`` (shifted right, as
    the shifted empirical Gittins index of Gast, Gaujal & Obrecht moves samples to the next point of a
    discretised support): a job is never taken for shorter than it was. Without the grid, the index of
    a job that has just passed one sample and is close to the next is as large as that gap is small, and
    jobs would overtake each other at every sample; on the grid, a job's index changes when its service
    grows by a factor ``10 ** (1 / bins_per_decade)``, like the thresholds of a multi-level feedback queue.
    ``None`` keeps the samples as they are. Sizes of 0 stay 0.
    """
    if bins_per_decade is None:
        return _atoms(sizes, None)
    if not (math.isfinite(bins_per_decade) and bins_per_decade > 0):
        raise SchedulingError(f"gittins: bins_per_decade must be > 0, got {bins_per_decade}")
    s = np.asarray(sizes, dtype=float).reshape(-1)
    _atoms(s, None)  # validates
    pos = s > 0
    grid = s.copy()
    # the small tolerance keeps a size already on the grid where it is
    grid[pos] = 10.0 ** (np.ceil(np.log10(s[pos]) * bins_per_decade - 1e-9) / bins_per_decade)
    return _atoms(grid, None)


def _index_at(atoms: np.ndarray, weights: np.ndarray, a: np.ndarray, delta: float | None) -> np.ndarray:
    """``G(a)`` for each value of ``a`` (one row of atoms per value: O(len(a) x atoms))."""
    a = np.asarray(a, dtype=float)
    out = np.zeros(a.shape)
    if not atoms.size or not a.size:
        return out
    alive = atoms[None, :] > a[:, None]  # values x atoms: the atoms still possible
    w = np.where(alive, weights[None, :], 0.0)
    surv = w.sum(axis=1)  # weight of S > a
    if delta is None:
        done = np.cumsum(w, axis=1)  # W(a, s_k]
        spent = np.cumsum(w * (atoms[None, :] - a[:, None]), axis=1)  # sum w_i (s_i - a) over (a, s_k]
        cost = spent + (atoms[None, :] - a[:, None]) * (surv[:, None] - done)
        ratio = np.divide(done, cost, out=np.zeros(done.shape), where=alive & (cost > 0))
        ratio[alive & (cost <= 0)] = math.inf  # an atom at a itself cannot be alive; kept for safety
        out = ratio.max(axis=1)
    else:
        inside = alive & (atoms[None, :] <= a[:, None] + delta)
        done = np.where(inside, w, 0.0).sum(axis=1)
        cost = (np.where(inside, w * (atoms[None, :] - a[:, None]), 0.0).sum(axis=1)
                + delta * (surv - done))
        out = np.divide(done, cost, out=np.zeros(a.shape), where=cost > 0)
    out[surv <= 0] = 0.0
    return out


def gittins_index(sizes: Sequence[float] | np.ndarray, attained: float | Sequence[float] | np.ndarray, *,
                  weights: Sequence[float] | np.ndarray | None = None, delta: float | None = None) -> np.ndarray:
    """The exact Gittins index ``G(a)`` of the distribution of ``sizes`` at each attained service ``a``.

    Args:
        sizes: the atoms (samples) of the size distribution.
        attained: service received so far, one value or many.
        weights: each size's weight (default 1 each: the empirical distribution).
        delta: a fixed quantum ``Δ`` instead of the supremum over ``Δ``.

    Returns:
        One index per attained value (0 where no size exceeds it).
    """
    if delta is not None and not (math.isfinite(delta) and delta > 0):
        raise SchedulingError(f"gittins: delta must be > 0, got {delta}")
    atoms, w = _atoms(sizes, weights)
    a = np.atleast_1d(np.asarray(attained, dtype=float))
    return _index_at(atoms, w, a, delta)


class GittinsTable:
    """The index at the start of each interval between atoms, for :meth:`lookup` by attained service.

    Args:
        sizes: samples of the size distribution (moved onto a geometric grid, :func:`compress`).
        delta: fixed quantum, or ``None`` for the supremum over ``Δ``.
        bins_per_decade: the grid (``None``: the samples themselves are the atoms).

    Attributes:
        atoms, weights: the distribution's atoms, ascending, and their weights.
        values: ``values[0] = G(0)``, ``values[j] = G(atoms[j - 1])`` (the ``j``-th atom just passed).
    """

    def __init__(self, sizes: Sequence[float] | np.ndarray, *, delta: float | None = None,
                 bins_per_decade: float | None = DEFAULT_BINS_PER_DECADE) -> None:
        if delta is not None and not (math.isfinite(delta) and delta > 0):
            raise SchedulingError(f"gittins: delta must be > 0, got {delta}")
        self.atoms, self.weights = compress(sizes, bins_per_decade)
        self.delta = delta
        starts = np.concatenate([[0.0], self.atoms])
        self.values = _index_at(self.atoms, self.weights, starts, delta)

    def __len__(self) -> int:
        return int(self.atoms.size)

    def lookup(self, attained: np.ndarray) -> np.ndarray:
        """The index of jobs with ``attained`` service: the value at the last atom they passed."""
        return self.values[np.searchsorted(self.atoms, attained, side="right")]
