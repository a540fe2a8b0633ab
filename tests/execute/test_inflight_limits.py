"""Timing helpers: medians and per-task clocks."""

from __future__ import annotations

import time

import pytest
import torch

from gpualloc.execute.measure import TaskClock, summarize
from gpualloc.execute.worker import threads_per_worker
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode
from gpualloc.placement.simulate import inflight_limits


def test_summary_reports_the_median_not_the_outlier():
    s = summarize([1.0, 1.1, 0.9, 10.0, 1.05])
    assert s.median_s == pytest.approx(1.05)
    assert (s.min_s, s.max_s, s.n) == (0.9, 10.0, 5)
    with pytest.raises(ValueError):
        summarize([])


def test_task_clock_accumulates_per_key_and_resets():
    clock = TaskClock(torch.device("cpu"))
    for _ in range(2):
        clock.start("a")
        time.sleep(0.002)
        clock.stop("a")
    totals = clock.totals()
    assert totals["a"] >= 0.004
    assert clock.totals() == {}


def test_threads_are_split_between_cpu_workers_and_gpu_workers_get_one():
    assert threads_per_worker(["cpu", "cpu"], 2) == [1, 1]
    assert threads_per_worker(["cpu", "cpu"], 7) == [3, 3]
    assert threads_per_worker(["cuda:0", "cpu"], 16) == [1, 15]
    assert threads_per_worker(["cpu", "cpu", "cpu"], 2) == [1, 1, 1]


def _chain_limits(devices: list[int], microbatches: int) -> list[int]:
    """The 1F1B limits ``gpualloc run``'s workers get for a chain of ops placed on ``devices``."""
    n = len(devices)
    graph = OpGraph("chain", [OpNode(f"n{i}", f"n{i}", "op") for i in range(n)],
                    [OpEdge(f"n{i}", f"n{i + 1}", 1.0) for i in range(n - 1)])
    return inflight_limits(graph, devices, max(devices) + 1, microbatches).tolist()


def test_1f1b_limits_are_the_stage_depth_the_simulator_uses():
    assert _chain_limits([0, 1, 2], 8) == [3, 2, 1]
    # device 0 holds the first and the last op: three device changes lie ahead of its first op
    assert _chain_limits([0, 1, 0], 8) == [3, 2]
    assert _chain_limits([0, 1], 1) == [1, 1]
