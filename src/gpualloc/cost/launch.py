"""How much of each op's launch overhead a step actually waits for.

The cost model charges every op a fixed overhead ``launch_s`` (:class:`gpualloc.cost.model.Efficiency`)
on top of its work. Whether a step pays it depends on who launches and how:

* ``"serial"``: every op pays its launch, one after the other. True on a CPU, where the framework's
  dispatch and the kernel run on the same thread (measured: ``benchmarks/launch_cost.py``), and on a GPU
  run synchronously (``CUDA_LAUNCH_BLOCKING=1``, or a profiler that synchronises after every layer, as
  PipeDream's did).
* ``"async"``: a GPU launch is asynchronous. The host enqueues the next kernel while the previous one
  runs, and the device runs them in order (PyTorch, "CUDA semantics: asynchronous execution"). The
  launch of op ``i`` overlaps op ``i - 1``'s execution, so the device waits only for the part of the
  launch that the previous op does not cover: ``max(0, launch_i - work_{i-1})``. The first op has
  nothing before it and pays its whole launch. This is the default for GPUs.
* ``"graphs"``: CUDA graphs. A captured region (a stage's forward, say) is submitted by one
  ``cudaGraphLaunch``, so one launch is paid per region and none for the ops inside it (NVIDIA, "CUDA
  Graph Best Practice for PyTorch").

The ``"async"`` rule looks back one op only. It assumes that the host issues op ``i`` no earlier than
op ``i - 1`` starts. When a long kernel lets the host run several launches ahead, the launches after it
are hidden too, and the rule overcharges them. For a host that issues one launch every ``launch_s`` and
a device that runs kernels in order, the exact idle time is
``max_k ((k + 1) launch - sum_{j<k} work_j)``. The rule's total is never below that, and it equals it
when every op is longer than the launch or every op is shorter. So it is the conservative side of
asynchronous execution. It also assumes that nothing in the step forces a synchronisation, such as
``.item()``, a host-side branch on a tensor, or a blocking copy.

References:
    PyTorch documentation, "CUDA semantics", section "Asynchronous execution".
    NVIDIA, "CUDA Graph Best Practice for PyTorch" (docs.nvidia.com/dl-cuda-graph).
    H. He, "Making Deep Learning Go Brrrr From First Principles" (horace.io/brrr_intro.html), on
    overhead-bound execution.
"""

from __future__ import annotations

import numpy as np

from gpualloc.errors import CostModelError
from gpualloc.hardware.catalog import DeviceType

__all__ = ["LAUNCH_MODES", "default_launch_mode", "exposed_launch_s"]

LAUNCH_MODES = ("serial", "async", "graphs")
"""The launch rules :func:`exposed_launch_s` knows, in the order of the module docstring."""


def default_launch_mode(device: DeviceType) -> str:
    """``"serial"`` for a CPU device type (dispatch runs on the op's own thread), ``"async"`` otherwise."""
    return "serial" if device.vendor == "cpu" or device.name == "cpu" else "async"


def exposed_launch_s(op_times_s, launch_s, mode: str = "async", *, axis: int = 0, reverse: bool = False,
                     regions=None) -> np.ndarray:
    """The part of each op's launch overhead that the device waits for, under ``mode``.

    Ops run in their order along ``axis``: graph order for a forward pass, and the reverse for a backward
    pass (``reverse=True``), which runs the ops last to first. Other axes are independent sequences, such
    as one column per device of a ``(n_ops, n_devices)`` array.

    Args:
        op_times_s: each op's execution time without its launch overhead (seconds, >= 0).
        launch_s: the launch overhead, a scalar or an array broadcastable to ``op_times_s`` (one per device
            column, or one per op).
        mode: ``"serial"``, ``"async"`` or ``"graphs"`` (see the module docstring).
        axis: the axis along which the ops run one after another.
        reverse: the ops run from the end of ``axis`` to its start (a backward pass); the result keeps the
            input's order.
        regions: ``"graphs"`` only: a region label per op along ``axis``. An op whose label differs from the
            previous op's starts a new graph launch. Default: all ops are one captured region.

    Returns:
        Exposed launch seconds, shaped like ``op_times_s`` broadcast with ``launch_s``. The step time is
        ``op_times_s + exposed`` summed along ``axis``.

    Raises:
        CostModelError: an unknown mode, negative or non-finite times, or ``regions`` of the wrong length.

    Examples:
        Three ops of 1, 50 and 2 us with a 10 us launch: serially 30 us of launches; asynchronously the
        first launch, then 9 us (the 1 us op hides 1 us of the next launch), then 0 (the 50 us op hides
        it all); as one CUDA graph, one launch.

        >>> exposed_launch_s([1e-6, 50e-6, 2e-6], 10e-6, "serial") * 1e6
        array([10., 10., 10.])
        >>> exposed_launch_s([1e-6, 50e-6, 2e-6], 10e-6, "async") * 1e6
        array([10.,  9.,  0.])
        >>> exposed_launch_s([1e-6, 50e-6, 2e-6], 10e-6, "graphs") * 1e6
        array([10.,  0.,  0.])
    """
    if mode not in LAUNCH_MODES:
        raise CostModelError(f"launch mode: unknown {mode!r}; expected one of {', '.join(LAUNCH_MODES)}")
    work = np.asarray(op_times_s, dtype=np.float64)
    launch = np.asarray(launch_s, dtype=np.float64)
    for name, arr in (("op_times_s", work), ("launch_s", launch)):
        if arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0):
            raise CostModelError(f"{name}: expected finite times >= 0")
    shape = np.broadcast_shapes(work.shape, launch.shape)
    if not shape:  # one op: nothing before it, whatever the mode
        return launch + 0.0 * work
    work = np.moveaxis(np.broadcast_to(work, shape), axis, 0)
    launch = np.moveaxis(np.broadcast_to(launch, shape), axis, 0)
    if reverse:
        work, launch = work[::-1], launch[::-1]
    if mode == "serial":
        out = launch.copy()
    elif mode == "async":
        out = launch.copy()
        out[1:] = np.maximum(launch[1:] - work[:-1], 0.0)
    else:
        n = shape[axis]
        starts = np.zeros(n, dtype=bool)
        starts[:1] = True
        if regions is not None:
            labels = np.asarray(regions)
            if labels.shape != (n,):
                raise CostModelError(f"regions: expected one label per op ({n}), got shape {labels.shape}")
            labels = labels[::-1] if reverse else labels
            starts[1:] = labels[1:] != labels[:-1]
        out = np.where(starts.reshape((n,) + (1,) * (len(shape) - 1)), launch, 0.0)
    return np.moveaxis(out[::-1] if reverse else out, 0, axis)
