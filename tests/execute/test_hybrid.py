"""Running hybrid (v2) plans on CPU workers: DDP replicas with unequal shares and pipeline stages, checked
against the unsplit model's output and its training step."""

from __future__ import annotations

import json
import sys

import pytest

from gpualloc.cli.main import main
from gpualloc.errors import ExecutionError, PlacementError
from gpualloc.execute.hybrid import FSDP_REFUSED, TP_REFUSED, _inflight_limits, _Program, execute_hybrid, plan_pieces
from gpualloc.graph.capture import capture
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.hybrid.layers import layer_count
from gpualloc.placement.hybrid.plan import Replica, HybridStage, make_plan

MODEL, BATCH = "gpt-tiny", 4  # LayerNorm, no dropout: a sample's training forward is independent of the others


@pytest.fixture(scope="module")
def graph():
    return capture(MODEL, batch=BATCH)


def _two_by_two(layers: int, *, microbatches: int = 2):
    """2 stages x 2 replicas: shares 3:1 in the first stage, 2:2 in the second (microbatch edges differ)."""
    half = layers // 2
    return make_plan([HybridStage(0, half - 1, (Replica((0,), 3), Replica((1,), 1))),
                      HybridStage(half, layers - 1, (Replica((2,), 2), Replica((3,), 2)))], BATCH, microbatches,
                     n_devices=4)


def _ddp(layers: int, shares=(3, 1), sharding="none"):
    replicas = tuple(Replica((i,), s) for i, s in enumerate(shares))
    return make_plan([HybridStage(0, layers - 1, replicas)], sum(shares), 1,
                     n_devices=4, sharding=sharding)


@pytest.mark.slow
def test_pieces_tile_each_stage_and_the_1f1b_window_covers_shifted_microbatches(graph):
    plan = _two_by_two(layer_count(graph))
    pieces = plan_pieces(plan)
    as_rows = [(q.stage, q.rank, q.k, q.offset, q.n) for q in pieces]
    assert as_rows == [(0, 0, 0, 0, 2), (0, 1, 0, 2, 1), (0, 0, 1, 3, 1),  # replica 1 takes nothing in mb 1
                       (1, 2, 0, 0, 1), (1, 3, 0, 1, 1), (1, 2, 1, 2, 1), (1, 3, 1, 3, 1)]
    prog = _Program(by_size={}, crossing={"x": (0, (1,))}, producer_stage={}, layout={"x": (0, 1)}, inputs=(),
                    outputs=(), differentiable=frozenset())
    # the second stage's microbatches read only the first stage's same microbatch: 1F1B's S - s suffices
    assert _inflight_limits(pieces, prog, 2, 2) == {0: 2, 1: 2, 2: 1, 3: 1}
    # one replica then shares 1:3: the second stage's replica 1 reads rows [1, 3) in its microbatch 0, i.e.
    # the first stage's microbatches 0 and 1, so the first stage's backward 0 needs its forward 1 first;
    # with a base limit of 1 (n_stages=1) the window still lets it run
    shifted = make_plan([HybridStage(0, 0, (Replica((0,), 4),)),
                         HybridStage(1, 1, (Replica((1,), 1), Replica((2,), 3)))], 4, 2)
    assert [(q.rank, q.offset, q.n) for q in plan_pieces(shifted)] == [(0, 0, 2), (0, 2, 2), (1, 0, 1), (2, 1, 2),
                                                                      (2, 3, 1)]
    assert _inflight_limits(plan_pieces(shifted), prog, 1, 2)[0] == 2


@pytest.mark.slow
def test_a_two_by_two_plan_with_unequal_shares_matches_the_unsplit_output_and_step(graph):
    run = execute_hybrid(MODEL, graph, _two_by_two(layer_count(graph)), load_cluster("4xcpu"), steps=1, warmup=0,
                         threads=2, lr=0.05, timeout_s=120)
    r = run.result
    assert r.output_match and r.max_abs_diff <= r.output_tolerance
    # the unequal-share all-reduce (and the tied lm_head/wte weight across the two stages) give the unsplit step
    assert run.weight_match is True and run.max_weight_diff <= run.weight_tolerance
    assert run.max_update > 100 * run.weight_tolerance  # the step moved the weights far beyond the tolerance
    assert [(d.index, d.torch_device) for d in r.devices] == [(0, "cpu"), (1, "cpu"), (2, "cpu"), (3, "cpu")]
    assert r.stages == 2 and r.microbatches == 2 and r.batch_size == BATCH
    assert r.measured_step_s > 0 and r.predicted_step_s > 0
    assert r.error == pytest.approx(r.predicted_step_s / r.measured_step_s - 1)
    assert len(run.sync_s) == 4 and all(s >= 0 for s in run.sync_s)
    assert run.describe.startswith("PP=2")


@pytest.fixture
def cli(monkeypatch, capsys):
    def invoke(*args):
        monkeypatch.setattr(sys, "argv", ["gpualloc", *map(str, args)])
        with pytest.raises(SystemExit) as exc:
            main()
        out, err = capsys.readouterr()
        return (exc.value.code or 0), out, err

    return invoke


def _save(path, plan, cluster="4xcpu"):
    labels = [d.label for d in load_cluster(cluster).devices]
    path.write_text(json.dumps({"format": "gpualloc-plan", "version": 2, "graph": MODEL, "cluster": cluster,
                                "devices": labels, **plan.body()}))
    return path


@pytest.mark.slow
def test_cli_runs_a_ddp_plan_with_shares_3_to_1(graph, tmp_path, cli):
    plan = _save(tmp_path / "ddp.json", _ddp(layer_count(graph)))
    code, out, err = cli("run", MODEL, "--plan", plan, "--steps", "1", "--warmup", "0", "--threads", "2",
                         "--no-calibrate", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["plan_version"] == 2 and doc["describe"].startswith("PP=1 [L0-")
    assert {"measured_step_s", "predicted_step_s", "error", "output_match", "calibration"} <= set(doc)
    assert doc["output_match"] is True and doc["batch_size"] == BATCH and doc["steps"] == 1
    assert doc["weight_match"] is True and doc["max_update"] > 100 * doc["weight_tolerance"]
    assert [d["index"] for d in doc["devices"]] == [0, 1]
    assert doc["optimizer"] == "sgd" and doc["sharding"] == "none"
    for dev in doc["devices"]:  # each worker's memory: counted parts and the measured peak, beside the prediction
        mem = dev["memory"]
        assert {"weights_bytes", "grads_bytes", "optimizer_bytes", "peak_bytes", "reserve_bytes"} <= set(mem)
        assert mem["weights_bytes"] == mem["grads_bytes"] > 0 and mem["optimizer_bytes"] == 0
        assert mem["peak_bytes"] >= mem["weights_bytes"] + mem["grads_bytes"]
        assert dev["predicted_peak_bytes"] > 0


@pytest.mark.parametrize(("edit", "names"), [
    (lambda d: d["stages"][0]["replicas"][1].update(devices=[7]), ("stages[0].replicas[1].devices", "0..3")),
    (lambda d: d["stages"][0]["replicas"][1].update(batch_share=2), ("stages[0].replicas", "add up to 5")),
    (lambda d: d["stages"][0]["replicas"][1].update(devices=[1, 2], tp=2), ("tp", "tensor parallel")),
])
def test_bad_hybrid_plans_are_one_line_errors(graph, tmp_path, cli, edit, names):
    path = _save(tmp_path / "plan.json", _ddp(layer_count(graph)))
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    code, out, err = cli("run", MODEL, "--plan", path, "--steps", "1", "--no-calibrate")
    assert code == 2 and out == ""
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert all(n in err for n in names), err


def test_the_library_refuses_tensor_parallel_replicas_and_a_plan_for_another_model(graph):
    layers = layer_count(graph)
    tp = make_plan([HybridStage(0, layers - 1, (Replica((0, 1), 4),))], BATCH, 1)
    with pytest.raises(ExecutionError, match=TP_REFUSED.split(";")[0]):
        execute_hybrid(MODEL, graph, tp, load_cluster("4xcpu"))
    short = make_plan([HybridStage(0, layers - 2, (Replica((0,), 4),))], BATCH, 1)
    with pytest.raises(PlacementError, match="cover"):
        execute_hybrid(MODEL, graph, short, load_cluster("4xcpu"))


@pytest.mark.slow
def test_adam_ddp_with_shares_3_to_1_takes_the_unsplit_adam_step(graph):
    run = execute_hybrid(MODEL, graph, _ddp(layer_count(graph)), load_cluster("2xcpu"), steps=1, warmup=0,
                         threads=2, lr=0.05, timeout_s=120, optimizer="adam")
    assert run.result.optimizer == "adam"
    assert run.weight_match is True and run.max_update == pytest.approx(0.05, rel=1e-3)  # Adam's first step: lr
    for d in run.result.devices:
        m = d.memory
        assert m.optimizer_bytes >= 2 * m.weights_bytes  # exp_avg and exp_avg_sq, whole on every replica
        assert m.peak_bytes >= m.weights_bytes + m.grads_bytes + m.optimizer_bytes


@pytest.mark.slow
def test_zero1_shards_adam_state_between_the_replicas_and_takes_the_unsplit_step(graph):
    run = execute_hybrid(MODEL, graph, _ddp(layer_count(graph), (2, 2), sharding="zero1"), load_cluster("2xcpu"),
                         steps=1, warmup=0, threads=2, lr=0.05, timeout_s=120, optimizer="adam")
    assert run.sharding == "zero1" and run.weight_match is True
    states = [d.memory.optimizer_bytes for d in run.result.devices]
    weights = run.result.devices[0].memory.weights_bytes
    # each replica keeps about half of Adam's 2 x weights; together they hold it once
    assert all(0.3 * 2 * weights < s < 0.7 * 2 * weights for s in states)
    assert sum(states) == pytest.approx(2 * weights, rel=0.01)


def test_fsdp_plans_are_refused_in_one_line(graph):
    with pytest.raises(ExecutionError, match=FSDP_REFUSED):
        execute_hybrid(MODEL, graph, _ddp(layer_count(graph), sharding="fsdp"), load_cluster("2xcpu"))
