"""The physical formulas, each written once and vectorised over numpy arrays.

Every simulator (placement step, re-planning run, simulated telemetry) and the cost model call these,
so a change here (or a calibration feeding them) reaches all of them:

* :func:`power_w`: board power, linear between idle and TDP in the busy fraction;
* :func:`energy_j`: that power over a wall-clock interval;
* :func:`weight_state_bytes`: what a migration moves (the memory a plan pins is :mod:`gpualloc.cost.memory`'s);
* :func:`transfer_time_s`: the alpha-beta link model, ``latency + bytes / bandwidth``;
* :func:`microbatch_time_s`: an op's time on one microbatch, the launch overhead paid every time.
"""

from __future__ import annotations

import numpy as np

ArrayLike = float | np.ndarray


def power_w(idle_w: ArrayLike, tdp_w: ArrayLike, busy: ArrayLike) -> np.ndarray:
    """Board power at busy fraction ``busy`` (clipped to [0, 1]): ``idle + (TDP - idle) x busy``."""
    u = np.clip(np.asarray(busy, dtype=np.float64), 0.0, 1.0)
    return idle_w + (np.asarray(tdp_w, dtype=np.float64) - idle_w) * u


def energy_j(idle_w: ArrayLike, tdp_w: ArrayLike, busy_s: ArrayLike, wall_s: ArrayLike) -> np.ndarray:
    """Energy over ``wall_s`` seconds of which ``busy_s`` were busy: :func:`power_w` times the wall time.

    Zero where ``wall_s <= 0`` (nothing ran).
    """
    wall = np.asarray(wall_s, dtype=np.float64)
    safe = np.where(wall > 0, wall, 1.0)
    return np.where(wall > 0, power_w(idle_w, tdp_w, np.asarray(busy_s, dtype=np.float64) / safe) * wall, 0.0)


def weight_state_bytes(param_bytes: ArrayLike, optimizer_states: int, *, gradients: bool = True) -> np.ndarray:
    """Bytes of the weights, their ``optimizer_states`` state tensors (:data:`gpualloc.cost.memory.OPTIMIZER_STATES`)
    and (``gradients``) their gradients.

    A migration moves weights and optimizer states only: the gradients were consumed by the optimizer
    step before the move.
    """
    return np.asarray(param_bytes, dtype=np.float64) * (1 + int(gradients) + optimizer_states)


OPTIMIZER_PASSES: dict[int, float] = {0: 3.0, 1: 8.0, 2: 19.0}
"""Bytes one optimizer step moves per fp32 weight byte, by the optimizer's state tensors per weight
(:data:`gpualloc.cost.memory.OPTIMIZER_STATES`), as torch's eager optimizers run (``torch.optim``, foreach or
per tensor alike; not ``fused=True``), each kernel reading its inputs and writing its output once:

* SGD (0 states): ``p += -lr g``, 3;
* SGD with momentum (1): ``b *= m``, ``b += g``, ``p += -lr b``: 2 + 3 + 3 = 8;
* Adam (2): ``m.lerp_(g)`` 3, ``v *= b2`` 2, ``v.addcmul_(g, g)`` 4, ``d = v.sqrt()`` 2, ``d /= c`` 2, ``d += eps`` 2,
  ``p.addcdiv_(m, d)`` 4: 19 (``_multi_tensor_adam`` / ``_single_tensor_adam`` of torch 2.13, not capturable)."""

MASTER_WEIGHT_PASSES = 3.0
"""What an fp32 master copy adds per fp32 weight byte in a lower precision (the engine's ``MasterWeights``): the
gradient cast up (half read, one written) and the weights copied back down (one read, half written)."""


def optimizer_traffic_bytes(param_bytes: ArrayLike, optimizer_states: int, precision: str = "fp32") -> np.ndarray:
    """Memory traffic of one optimizer step over ``param_bytes`` of fp32 weights (:data:`OPTIMIZER_PASSES`,
    plus :data:`MASTER_WEIGHT_PASSES` when the weights train in a lower ``precision`` than fp32)."""
    passes = OPTIMIZER_PASSES[int(optimizer_states)] + (0.0 if precision in ("fp32", "tf32") else MASTER_WEIGHT_PASSES)
    return np.asarray(param_bytes, dtype=np.float64) * passes


def optimizer_step_s(traffic_bytes: float, tensors: float, per_tensor_s: float, bandwidth_bytes_per_s: float,
                     fixed_s: float = 0.0, overlap: bool = False) -> float:
    """One optimizer step: the host's work on each of ``tensors`` parameter tensors (the optimizer's Python loop and
    its dispatch) and the device's ``traffic_bytes`` (:func:`optimizer_traffic_bytes`) at ``bandwidth_bytes_per_s``,
    one after the other, or (``overlap``: a GPU runs the kernels while the host issues the next) the slower of the
    two, plus ``fixed_s``."""
    host = float(tensors) * per_tensor_s
    device = float(traffic_bytes) / bandwidth_bytes_per_s
    return fixed_s + (max(host, device) if overlap else host + device)


def transfer_time_s(nbytes: ArrayLike, latency_s: ArrayLike, bandwidth_bytes_per_s: ArrayLike) -> np.ndarray:
    """Alpha-beta model of one transfer: ``latency + bytes / bandwidth`` (arrays broadcast).

    Callers decide when no transfer happens at all (same device, nothing to send).
    """
    return latency_s + np.asarray(nbytes, dtype=np.float64) / bandwidth_bytes_per_s


def microbatch_time_s(batch_time_s: ArrayLike, launch_s: ArrayLike, microbatches: float, launch: str = "serial", *,
                      order: np.ndarray | None = None, reverse: bool = False) -> np.ndarray:
    """Time of an op on one of ``microbatches`` equal microbatches, from its whole-batch time.

    The work scales linearly with the batch (as :func:`gpualloc.placement.conditions.scaled_graph`
    has it), the launch overhead does not: ``launch + (batch_time - launch) / M``, so ``M`` microbatches
    cost ``(M - 1) x launch`` more than the whole batch. The overhead counted is at most the op's whole
    time (a measured op faster than the calibrated launch cost is all overhead). ``M = 1`` returns
    ``batch_time_s`` unchanged.

    ``launch`` is the rule of :func:`gpualloc.cost.launch.exposed_launch_s`: ``serial`` (every op pays its
    launch, above), or ``async`` (a GPU launch hides behind the previous op's work, in the ops' run order
    ``order`` along the first axis, reversed for a backward pass).
    """
    t = np.asarray(batch_time_s, dtype=np.float64)
    if launch == "serial" and microbatches == 1:
        return t
    fixed = np.minimum(launch_s, t)
    work = (t - fixed) / microbatches
    if launch == "serial":
        return fixed + work
    from gpualloc.cost.launch import exposed_launch_s

    idx = np.arange(t.shape[0]) if order is None else np.asarray(order)
    out = np.empty_like(work)
    out[idx] = work[idx] + exposed_launch_s(work[idx], np.broadcast_to(fixed, t.shape)[idx], launch, reverse=reverse)
    return out


def ring_allreduce_s(nbytes: ArrayLike, participants: ArrayLike, latency_s: ArrayLike,
                     bandwidth_bytes_per_s: ArrayLike) -> np.ndarray:
    """Ring all-reduce of ``nbytes`` among ``participants``: ``2 (n - 1)`` steps of ``nbytes / n`` each
    (reduce-scatter, then all-gather), every step paying the link latency (Patarasuk and Yuan, 2009).

    Zero for one participant (nothing to reduce) or nothing to send.
    """
    n = np.asarray(participants, dtype=np.float64)
    b = np.asarray(nbytes, dtype=np.float64)
    safe = np.maximum(n, 1.0)
    t = 2.0 * (safe - 1.0) * (latency_s + b / (safe * bandwidth_bytes_per_s))
    return np.where((n > 1) & (b > 0), t, 0.0)


def prefetched_exposed_s(comm_s: np.ndarray, compute_s: np.ndarray) -> float:
    """Communication left exposed when unit ``i + 1``'s collective is prefetched during unit ``i``'s compute
    (FSDP's forward and backward prefetch, Zhao et al., PyTorch FSDP, VLDB 2023): the first unit's in full,
    then whatever each next one needs beyond the compute it hides behind."""
    comm = np.asarray(comm_s, dtype=np.float64)
    if comm.size == 0:
        return 0.0
    hidden_behind = np.asarray(compute_s, dtype=np.float64)[:-1]
    return float(comm[0] + np.maximum(comm[1:] - hidden_behind, 0.0).sum())


def hierarchical_allreduce_s(nbytes: ArrayLike, per_node: ArrayLike, nodes: ArrayLike,
                             intra_latency_s: ArrayLike, intra_bandwidth_bytes_per_s: ArrayLike,
                             inter_latency_s: ArrayLike, inter_bandwidth_bytes_per_s: ArrayLike) -> np.ndarray:
    """Hierarchical all-reduce: reduce inside each node, ring among the nodes' leaders, broadcast inside.

    The intra-node reduce plus broadcast moves what an intra-node ring all-reduce moves, so each level
    is a :func:`ring_allreduce_s`; ``per_node`` is the most devices of the group on one node.
    """
    return (ring_allreduce_s(nbytes, per_node, intra_latency_s, intra_bandwidth_bytes_per_s)
            + ring_allreduce_s(nbytes, nodes, inter_latency_s, inter_bandwidth_bytes_per_s))


def tp_layer_comm_s(activation_bytes: ArrayLike, tp: ArrayLike, latency_s: ArrayLike,
                    bandwidth_bytes_per_s: ArrayLike, allreduces: ArrayLike = 1) -> np.ndarray:
    """Tensor-parallel communication of a layer in one direction: ``allreduces`` ring all-reduces of its
    activation among the ``tp`` devices (Megatron-LM: 2 per transformer layer forward, 2 backward).
    """
    return np.asarray(allreduces, dtype=np.float64) * ring_allreduce_s(activation_bytes, tp, latency_s,
                                                                       bandwidth_bytes_per_s)


def overlapped_sync_s(sync_s: ArrayLike, backward_s: ArrayLike, buckets: ArrayLike) -> np.ndarray:
    """Part of a bucketed gradient all-reduce still running after the backward that feeds it ends.

    Bucket ``i`` of ``n`` is ready after ``(i + 1) / n`` of the backward and the buckets reduce one after
    another, each ``sync / n``: the last one ends at ``max(backward / n + sync, backward + sync / n)``, so
    ``max(sync - backward (n - 1) / n, sync / n)`` is exposed (PyTorch DDP's bucketing, Li et al., VLDB 2020).
    """
    n = np.maximum(np.asarray(buckets, dtype=np.float64), 1.0)
    s = np.asarray(sync_s, dtype=np.float64)
    return np.maximum(s - np.asarray(backward_s, dtype=np.float64) * (n - 1.0) / n, s / n)
