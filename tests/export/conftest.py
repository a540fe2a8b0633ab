"""Problems and plans shared by the export tests: each tiny zoo model on one mixed cluster, traced once."""

from __future__ import annotations


import pytest

from gpualloc.cli.common import load_graph
from gpualloc.cli.place import problem_of
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.hybrid.plan import HybridStage, Replica, make_plan
from gpualloc.placement.run import place

MODELS = ("gpt-tiny", "bert-tiny", "resnet-tiny")
CLUSTER = "2xA100+2xV100"
BATCH = 16
MICROBATCHES = 4


def problem_for(model: str, cluster: str = CLUSTER, precision: str = "fp32"):
    return problem_of(load_graph(model, BATCH), load_cluster(cluster), MICROBATCHES, None, precision)


def unequal_plan(problem, units, *, precision: str = "fp32"):
    """A plan no framework expresses: stage 0 ends inside the first block, has two replicas with unequal
    shares (A100s, 10 and 6 samples); stage 1 is one TP=2 replica (the V100s)."""
    inside = units.first_layer[1] + 2  # three layers into the first block
    return make_plan([HybridStage(0, inside, (Replica((0,), 10), Replica((1,), 6))),
                      HybridStage(inside + 1, units.layer_count - 1, (Replica((2, 3), 16),))],
                     BATCH, MICROBATCHES, precision=precision, n_devices=problem.k)


def tp_plan(problem, units):
    """A grid every framework expresses as is, but with TP=2 and ZeRO-1: blocks split after the first, each
    stage one replica of two devices."""
    end = units.last_layer(1)
    return make_plan([HybridStage(0, end, (Replica((0, 1), BATCH),)),
                      HybridStage(end + 1, units.layer_count - 1, (Replica((2, 3), BATCH),))],
                     BATCH, MICROBATCHES, sharding="zero1", n_devices=problem.k)


def accumulate_plan(problem, units):
    """Data parallel only, over all four devices, with two microbatches: gradient accumulation."""
    return make_plan([HybridStage(0, units.layer_count - 1, tuple(Replica((d,), BATCH // 4) for d in range(4)))],
                     BATCH, 2, n_devices=problem.k)


@pytest.fixture(scope="session")
def problems():
    return {m: problem_for(m) for m in MODELS}


@pytest.fixture(scope="session")
def plans(problems):
    """model -> {kind: plan}: the hybrid planner's, an op-level (round-robin: non-contiguous), the unequal one."""
    from gpualloc.export.units import units_of

    out = {}
    for m, p in problems.items():
        out[m] = {"hybrid": place(p, "hybrid", seed=0).plan, "assignment": place(p, "round-robin", seed=0).plan,
                  "unequal": unequal_plan(p, units_of(p.graph)), "tp": tp_plan(p, units_of(p.graph)),
                  "accumulate": accumulate_plan(p, units_of(p.graph))}
    return out
