"""Launchable plans (issue 38): the engine's structural rule in one place, and the planner kept to it on request.

* :func:`gpualloc.placement.hybrid.runnable.reasons` lists every rule a plan breaks; the engine's ``topology()``
  refuses exactly the plans it lists reasons for, with the first one;
* ``plan_hybrid(launchable=True)`` returns (and only generates) plans with none, on mixed clusters of one node
  and two, for the tiny zoo models; off, the planner still emits plans the engine refuses (a Sailor profile);
* ``gpualloc place --launchable``, and the one note line without it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpualloc.cli.main import app
from gpualloc.cost.memory import MemoryRules
from gpualloc.errors import EngineError, PlacementError
from gpualloc.execute.engine.topology import topology
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode
from gpualloc.hardware.catalog import default_catalog
from gpualloc.hardware.cluster import build_cluster, load_cluster
from gpualloc.placement.hybrid.baselines import largest_remainder
from gpualloc.placement.hybrid.plan import HybridPlan, HybridStage, Replica, Sync
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.hybrid.runnable import reasons, runnable
from gpualloc.placement.hybrid.search import _candidates, plan_hybrid
from gpualloc.placement.plan import OperatorPlan

runner = CliRunner()


def hybrid(stages, batch=8, microbatches=2, schedule="1f1b", sharding="none", precision="fp32"):
    return HybridPlan(tuple(HybridStage(a, b, tuple(Replica(tuple(d), s) for d, s in reps)) for a, b, reps in stages),
                      batch, microbatches, schedule, Sync(), sharding, precision, False)


def chain_graph(n: int = 4) -> OpGraph:
    nodes = [OpNode(f"n{i}", f"n{i}", "linear", layer=f"l{i}") for i in range(n)]
    return OpGraph("chain", nodes, [OpEdge(f"n{i}", f"n{i + 1}", 1.0) for i in range(n - 1)], batch_size=8)


# --------------------------------------------------------------------------- the rule
def test_reasons_lists_every_broken_rule_and_none_for_a_grid():
    grid = hybrid([(0, 1, [([0], 6), ([1], 2)]), (2, 3, [([2], 6), ([3], 2)])])
    assert reasons(grid) == [] and runnable(grid)
    bad = hybrid([(0, 1, [([0], 5), ([1], 3)]), (2, 3, [([2], 4), ([3], 4)])], microbatches=1, sharding="zero2",
                 precision="fp16")
    why = reasons(bad)
    assert [w.split(": ")[1] for w in why] == ["precision", "stages[1].replicas[0].batch_share",
                                               "stages[1].replicas[1].batch_share", "microbatches"]
    assert all(w.startswith("plan: ") and "\n" not in w for w in why)
    assert not runnable(bad)


def test_operator_plans_run_whatever_their_chain_and_need_their_graph():
    g = chain_graph(4)
    assert reasons(OperatorPlan(np.array([2, 2, 0, 0]), microbatches=2, global_batch=8), g) == []
    assert reasons(OperatorPlan(np.array([0, 1, 0, 1]), 2, global_batch=8), g) == []  # returns to its devices
    assert reasons(OperatorPlan(np.array([0, 1, 0, 1]), 1, schedule="1f1b", global_batch=8), g) == []
    assert "does not split into 3" in reasons(OperatorPlan(np.array([0, 0, 1, 1]), 3, global_batch=8), g)[0]
    assert "needs the graph" in reasons(OperatorPlan(np.array([0, 1]), global_batch=8))[0]


@st.composite
def plans(draw):
    """Small hybrid plans, grids and not: 1-3 stages, 1-3 replicas each, TP 1-2, any shares and microbatches."""
    batch = draw(st.integers(4, 24))
    n_stages = draw(st.integers(1, 3))
    stages, device = [], 0
    for s in range(n_stages):
        n_reps = draw(st.integers(1, 3))
        shares = largest_remainder(batch, draw(st.lists(st.integers(1, 5), min_size=n_reps, max_size=n_reps)))
        reps = []
        for share in shares:
            tp = draw(st.integers(1, 2))
            reps.append((list(range(device, device + tp)), share))
            device += tp
        stages.append((s, s, reps))
    return hybrid(stages, batch=batch, microbatches=draw(st.integers(1, batch)),
                  schedule=draw(st.sampled_from(["1f1b", "gpipe"])),
                  sharding=draw(st.sampled_from(["none", "zero1", "zero2", "fsdp"])))


@given(plans())
@settings(max_examples=150, deadline=None)
def test_the_engine_refuses_exactly_what_the_rule_lists_with_its_first_reason(plan):
    why = reasons(plan)
    if why:
        with pytest.raises(EngineError) as err:
            topology(plan)
        assert str(err.value) == why[0]
    else:
        top = topology(plan)
        assert (top.pp, top.dp) == (len(plan.stages), len(plan.stages[0].replicas))


# --------------------------------------------------------------------------- the planner
def _one_node_mixed():
    cat = default_catalog()
    types = [cat.device(t) for t in ("A100-40GB", "A100-40GB", "V100-16GB", "V100-16GB", "T4", "T4")]
    return build_cluster("1 node: 2xA100+2xV100+2xT4", [("n0", types, cat.link("pcie4"))], cat.link("eth-100g"), cat)


CLUSTERS = {"one node": _one_node_mixed, "two nodes": lambda: load_cluster("4xV100-16GB+2xT4@eth-10g")}


@pytest.fixture(scope="module")
def zoo_graphs():
    from gpualloc.cli.common import load_graph

    return {m: load_graph(m, 16) for m in ("gpt-tiny", "resnet-tiny", "bert-tiny")}


@pytest.mark.parametrize("cluster", list(CLUSTERS))
@pytest.mark.parametrize("model", ["gpt-tiny", "resnet-tiny", "bert-tiny"])
def test_launchable_plans_pass_the_rule_and_the_engine_topology(zoo_graphs, model, cluster):
    problem = HybridProblem(zoo_graphs[model], CLUSTERS[cluster](), 48)
    generated = list(_candidates(problem, float("inf"), launchable=True))
    assert generated and all(runnable(p) for p, _ in generated), [reasons(p) for p, _ in generated if reasons(p)]
    piped = [p for p, _ in generated if p.pipeline_depth > 1]
    assert piped, "the launchable search built no pipeline"
    # equal groups at a depth that is no power of two (6 devices, 3 stages) come only with launchable
    assert any(p.pipeline_depth == 3 for p in piped)
    assert all(r.tp == 1 for p in piped for r in p.stages[0].replicas)  # TP stages of a pipeline: whole blocks
    assert any(p.stages[0].replicas[0].tp == 2 for p, _ in generated) or cluster == "two nodes"
    plan, result = plan_hybrid(problem, launchable=True)
    assert reasons(plan) == [] and result.feasible
    top = topology(plan)
    assert top.world_size == len(plan.devices)


def test_a_default_plan_the_engine_refuses_gets_a_launchable_twin(shared_data):
    from gpualloc.graph.sailor import import_sailor

    g = import_sailor(shared_data / "sailor-profiles", model="OPT-350", gpus=["A100-40", "V100-16"], batch_size=256)
    problem = HybridProblem(g, load_cluster("4xA100+2xV100"), 256)
    free, free_r = plan_hybrid(problem)
    assert "replicas where stages[0] has" in reasons(free)[0]  # one stage per type: 2 A100 replicas, 4 V100
    kept, kept_r = plan_hybrid(problem, launchable=True)
    assert reasons(kept) == [] and kept_r.feasible
    assert topology(kept).world_size == len(kept.devices)
    assert kept_r.step_time_s >= free_r.step_time_s * 0.5  # a real plan, not a degenerate one


def test_launchable_refuses_a_precision_the_engine_does_not_train_in(zoo_graphs):
    problem = HybridProblem(zoo_graphs["gpt-tiny"], load_cluster("2xA100"), 16, rules=MemoryRules(precision="fp16"))
    assert plan_hybrid(problem)[0].precision == "fp16"  # off: the planner plans it as ever
    with pytest.raises(PlacementError, match=r"^--launchable: the engine trains in fp32, tf32, bf16 only, not fp16"):
        plan_hybrid(problem, launchable=True)
    bf16 = HybridProblem(zoo_graphs["gpt-tiny"], load_cluster("2xA100"), 16, rules=MemoryRules(precision="bf16"))
    assert plan_hybrid(bf16, launchable=True)[0].precision == "bf16"  # the engine trains in bf16


# --------------------------------------------------------------------------- the CLI
def test_place_launchable_json_plan_runs_and_the_note_names_the_flag(tmp_path):
    out = runner.invoke(app, ["place", "run", "gpt-tiny", "-c", "4xA100+2xV100", "--method", "hybrid",
                              "--launchable", "--json", "-o", str(tmp_path / "p.json")])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["method"] == "hybrid"
    from gpualloc.placement.document import parse_hybrid

    saved = parse_hybrid(json.loads((tmp_path / "p.json").read_text()))
    assert reasons(saved) == [] and topology(saved).world_size == len(saved.devices)
    # metis-style puts 4 A100 in one stage and 2 V100 in the other: the engine refuses it; one note on stderr
    noted = runner.invoke(app, ["place", "run", "gpt-tiny", "-c", "4xA100+2xV100", "--method", "metis-style"])
    assert noted.exit_code == 0, noted.output
    notes = [line for line in noted.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "stages[1].replicas: 2 replicas where stages[0] has 4" in notes[0]
    assert "--method hybrid --launchable" in notes[0] and "note:" not in noted.stdout
    quiet = runner.invoke(app, ["place", "run", "gpt-tiny", "-c", "4xA100+2xV100", "--method", "metis-style",
                                "--json"])
    assert quiet.exit_code == 0 and "note:" not in quiet.output and json.loads(quiet.stdout)
    refused = runner.invoke(app, ["place", "run", "gpt-tiny", "-c", "2xA100", "--method", "kl", "--launchable"])
    assert isinstance(refused.exception, PlacementError)  # main() makes it one line and exit status 2
    assert str(refused.exception).startswith("--launchable: only the hybrid planner and best")
