"""The memory probe: a region's peak above the baseline, measured (glibc ``mallinfo2`` on the CPU, the caching
allocator's peaks on a GPU), and the optimizer state counted from its tensors."""

from __future__ import annotations

import pytest
import torch

from gpualloc.errors import EngineError
from gpualloc.execute.engine.parallelize import wrap_replica
from gpualloc.graph.recipe import OPTIMIZERS
from gpualloc.execute.measure import MemoryProbe, malloc_in_use_bytes, optimizer_state_bytes

N = 48 << 20  # bytes: far above glibc's mmap threshold and any allocator noise

cpu_probe = pytest.mark.skipif(malloc_in_use_bytes() is None, reason="the C library has no mallinfo2")


def _peak(probe: MemoryProbe, region) -> int:
    with probe:
        region()
    return probe.peak_bytes


@cpu_probe
def test_a_tensor_allocated_in_the_region_raises_the_peak_by_its_bytes():
    probe = MemoryProbe(torch.device("cpu"))
    probe.baseline()
    held = []
    empty = _peak(probe, lambda: None)
    kept = _peak(probe, lambda: held.append(torch.ones(N // 4)))
    assert kept - empty == pytest.approx(N, rel=0.03)
    # a transient freed before the region ends is still the region's peak (sampled after every op)
    transient = _peak(probe, lambda: torch.ones(N // 4).sum())
    assert transient - kept == pytest.approx(N, rel=0.03)  # on top of the tensor still held
    # the peak is above the baseline (what the process held before, reported as the reserve)
    assert empty < 1 << 20 and probe.reserve_bytes > 10 * (1 << 20)


@cpu_probe
def test_the_peak_inside_an_autograd_backward_is_seen():
    probe = MemoryProbe(torch.device("cpu"))
    probe.baseline()
    x = torch.ones(N // 4, requires_grad=True)
    before = _peak(probe, lambda: None)

    def step():  # the backward allocates x.grad (N) while exp's saved output (N) is still alive
        torch.exp(x).sum().backward()

    assert _peak(probe, step) - before >= 1.97 * N


def test_optimizer_state_is_counted_from_its_tensors_and_sgd_keeps_none():
    p = torch.nn.Parameter(torch.ones(1000))
    p.grad = torch.ones(1000)
    adam = OPTIMIZERS["adam"]([p], lr=0.1)
    adam.step()
    assert optimizer_state_bytes(adam) >= 2 * 4000  # exp_avg and exp_avg_sq (and a step counter)
    sgd = OPTIMIZERS["sgd"]([p], lr=0.1)
    sgd.step()
    assert optimizer_state_bytes(sgd) == 0
    with pytest.raises(EngineError, match="optimizer: expected one of sgd, adam"):
        wrap_replica(torch.nn.Linear(2, 2), None, "none", "lamb", 0.1)


@pytest.mark.gpu
def test_on_cuda_the_probe_reads_the_caching_allocator_peak():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    dev = torch.device("cuda:0")
    probe = MemoryProbe(dev)
    probe.baseline()
    assert probe.method == "cuda"
    held = _peak(probe, lambda: torch.ones(N // 4, device=dev).sum())
    assert held == pytest.approx(N, rel=0.03)
    assert probe.reserve_bytes >= 0
