"""Memory on real devices: the caching allocator's peaks on a GPU, glibc's ``mallinfo2`` on the CPU.

:class:`MemoryProbe` measures the peak memory of a region (a training step) above a baseline, the same way on
either device; :func:`synchronize` waits for a device before a host clock is read.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["MemoryProbe", "malloc_in_use_bytes", "optimizer_state_bytes", "synchronize", "tensor_bytes"]


def synchronize(device: torch.device) -> None:
    """Wait for ``device`` to finish its queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc >= 2.33; ``man 3 mallinfo2``): every field a ``size_t``."""

    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _load_mallinfo2() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc < 2.33
        return None
    fn.restype = _MallInfo2
    fn.argtypes = []
    return fn


_MALLINFO2 = _load_mallinfo2()


def malloc_in_use_bytes() -> int | None:
    """Bytes this process holds from ``malloc`` now: ``uordblks`` (in use in every arena) + ``hblkhd`` (in
    ``mmap``-ed chunks); None where the C library has no ``mallinfo2``. About 1 us a call."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


def tensor_bytes(tensors: Iterable[Any]) -> int:
    """Sum of ``nbytes`` of the tensors among ``tensors`` (others and None are skipped)."""
    return int(sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor)))


def optimizer_state_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of the tensors in ``optimizer``'s state (a ZeRO optimizer's local shard)."""
    if optimizer is None:
        return 0
    local = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard's optimizer here
    return tensor_bytes(v for state in local.state.values() for v in state.values())


class _SampleAfterEveryOp(TorchDispatchMode):
    """Calls ``sample(op name)`` after every aten op: the op's inputs and outputs are both alive then."""

    def __init__(self, sample: Any) -> None:
        super().__init__()
        self.sample = sample

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        out = func(*args, **(kwargs or {}))
        self.sample(func)
        return out


class MemoryProbe:
    """Peak memory of a region (a training step) on one device, above a baseline.

    ``baseline()`` once before the model is built; then ``with probe:`` around the region; then
    :attr:`peak_bytes` and :attr:`reserve_bytes`.

    * **CPU**: PyTorch's CPU allocator is ``malloc`` (``c10::alloc_cpu``, ``posix_memalign``), with no
      cache of its own, so what torch holds is what ``malloc`` has handed out: glibc's ``mallinfo2()``
      ``uordblks + hblkhd``, summed over every arena (the intra-op threads' too) and the ``mmap``-ed
      chunks. It has no high-water mark, so the probe samples it after every aten op in the region (a
      ``TorchDispatchMode``: forward, the autograd engine's backward ops, collectives, the optimizer's
      ops), when the op's outputs and inputs are both alive, and at the region's ends. What it misses is
      a buffer that lives and dies inside one op (a kernel's own workspace). ``torch.profiler``'s memory
      events would count only tensors allocated while it records, not the weights and optimizer state
      from before; ``mallinfo2`` sees everything, including gloo's buffers, which is the point of
      measuring. The sampling costs a Python call per op: run it on a step that is not timed.
      The baseline (everything ``malloc`` held before the model was built) is the reserve.
    * **CUDA**: ``torch.cuda.max_memory_allocated`` since ``reset_peak_memory_stats`` at the region's
      start, above the baseline's ``memory_allocated``; the reserve is ``max_memory_reserved`` minus
      ``max_memory_allocated`` (the caching allocator's slack).

    ``available`` is False where neither applies (a C library without ``mallinfo2``): peaks are None.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.available = self.cuda or _MALLINFO2 is not None
        self.method = "cuda" if self.cuda else "mallinfo2"
        self._base = 0
        self._peak = 0
        self._reserve = 0
        self._peak_op: Any = ""
        self._mode: _SampleAfterEveryOp | None = None

    def _now(self) -> int:
        if self.cuda:
            return int(torch.cuda.memory_allocated(self.device))
        return malloc_in_use_bytes() or 0

    def baseline(self) -> int:
        """Take the baseline now (before the model is built); its bytes. On the CPU the sampling mode runs
        one op first: its first use imports and caches about 25 MB of Python, the runtime's and not the
        step's."""
        if not self.available:
            return 0
        if not self.cuda:
            with _SampleAfterEveryOp(self.sample):
                torch.zeros(1).add_(1)
        self._base = self._now()
        return self._base

    def sample(self, op: Any = "") -> None:
        """Note the memory held now, after ``op`` (on the CPU; a GPU keeps its own peak)."""
        if not self.cuda:
            used = malloc_in_use_bytes() or 0
            if used > self._peak:
                self._peak, self._peak_op = used, op

    def __enter__(self) -> MemoryProbe:
        if not self.available:
            return self
        if self.cuda:
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._peak = 0
            self.sample()
            self._mode = _SampleAfterEveryOp(self.sample)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.available:
            return
        if self.cuda:
            synchronize(self.device)
            self._peak = int(torch.cuda.max_memory_allocated(self.device))
            self._reserve = int(torch.cuda.max_memory_reserved(self.device)) - self._peak
        elif self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
            self.sample()
            self._reserve = self._base

    @property
    def peak_bytes(self) -> int | None:
        """Peak of the last region above the baseline; None where the probe is not available."""
        return max(self._peak - self._base, 0) if self.available else None

    @property
    def peak_op(self) -> str:
        """The aten op after which the last region's CPU peak was sampled ("" at the region's ends or on a GPU)."""
        return str(self._peak_op)

    @property
    def reserve_bytes(self) -> int | None:
        """The runtime's own memory (see the class docstring); None where not available."""
        return self._reserve if self.available else None
