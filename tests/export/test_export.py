"""``gpualloc export``: the framework's units, the nearest expressible plan, what it dropped, both step times,
and bad input as one line. The frameworks' own parsers are in test_parsers.py."""

from __future__ import annotations

import json

import pytest

from gpualloc.cli.export import FRAMEWORK_NAMES
from gpualloc.export import FRAMEWORKS, export_plan, units_of
from gpualloc.export.nearest import uniform_parts
from gpualloc.export.units import block_key
from gpualloc.placement.document import write_plan
from gpualloc.placement.hybrid.plan import HybridStage, Replica, make_plan
from gpualloc.placement.outcome import simulate_plan

from .conftest import BATCH, CLUSTER, MICROBATCHES, problem_for


def test_the_cli_names_every_framework():
    assert FRAMEWORK_NAMES == tuple(FRAMEWORKS)


def test_blocks_are_the_numbered_modules():
    assert [block_key(m) for m in ("h.3.attn.c_proj", "encoder.layer.1.output", "layer2.0.conv1", "wte", None)] == \
        ["h.3", "encoder.layer.1", "layer2.0", None, None]


def test_gpt_units_are_embedding_blocks_head(problems):
    u = units_of(problems["gpt-tiny"].graph)
    assert u.kinds == ("embedding", "block", "block", "head")
    assert u.fqns == (("wte", "wpe"), ("h.0",), ("h.1",), ("ln_f", "lm_head"))
    assert u.first_layer[0] == 0 and u.last_layer(3) == u.layer_count - 1
    assert [u.is_edge(u.last_layer(i)) for i in range(4)] == [True] * 4
    assert not u.is_edge(u.first_layer[1])  # inside h.0


@pytest.mark.parametrize(("items", "parts", "expected"), [(4, 2, [0, 2, 4]), (5, 2, [0, 3, 5]), (7, 3, [0, 3, 5, 7]),
                                                          (2, 4, [0, 1, 2, 2, 2])])
def test_uniform_parts_is_deepspeeds_split(items, parts, expected):
    assert uniform_parts(items, parts) == expected
    ds = pytest.importorskip("deepspeed.runtime.utils")
    assert ds.partition_uniform(items, parts) == expected


def test_a_grid_plan_exports_as_is(problems, plans):
    """The TP=2 grid loses nothing in Megatron and DeepSpeed (both have ZeRO-1); torchtitan has no ZeRO-1, and its
    FSDP would not sum the tied embedding that the grid's two stages hold, so the export trains unsharded."""
    problem, plan = problems["gpt-tiny"], plans["gpt-tiny"]["tp"]
    for to in ("megatron", "deepspeed"):
        made = export_plan(problem, plan, to)
        assert made.dropped == ()
        assert made.nearest.plan == plan
        assert made.exported_step_time_s == made.step_time_s
    made = export_plan(problem, plan, "torchtitan")
    assert made.dropped[0] == "sharding zero1: torchtitan has fsdp here"
    assert made.dropped[1].startswith("sharding fsdp with a weight tied across stages: sharding none")
    assert len(made.dropped) == 2 and made.nearest.plan.sharding == "none"


def test_an_op_level_plan_becomes_a_pipeline_of_its_devices(problems, plans):
    problem, plan = problems["gpt-tiny"], plans["gpt-tiny"]["assignment"]  # round-robin: non-contiguous
    made = export_plan(problem, plan, "megatron")
    assert any("non-contiguous" in d for d in made.dropped)
    assert sorted(made.nearest.plan.devices) == sorted(plan.devices)
    assert made.nearest.pp == len(plan.devices) and made.nearest.plan.microbatches == plan.microbatches
    assert made.step_time_s == pytest.approx(simulate_plan(problem, plan).step_time_s)


def test_precision_the_framework_lacks_is_simulated_at_the_nearest():
    problem = problem_for("gpt-tiny", "4xA100", precision="fp16")
    u = units_of(problem.graph)
    plan = make_plan([HybridStage(0, u.layer_count - 1, tuple(Replica((d,), 4) for d in range(4)))], BATCH, 1,
                     precision="fp16", n_devices=problem.k)
    made = export_plan(problem, plan, "torchtitan")
    assert made.dropped == ("precision fp16: torchtitan trains in bf16 here",)
    assert made.nearest.problem.rules.precision == "bf16"
    assert 'mixed_precision_param = "bfloat16"' in made.text
    assert made.exported_step_time_s == simulate_plan(made.nearest.problem, made.nearest.plan).step_time_s
    assert "--fp16" in export_plan(problem, plan, "megatron").text


def _plan_file(tmp_path, problem, plan, name="plan.json", **header):
    path = tmp_path / name
    write_plan(path, problem, plan, CLUSTER)
    if header:
        doc = json.loads(path.read_text())
        doc.update(header)
        path.write_text(json.dumps(doc))
    return path


def test_unequal_shares_say_what_was_dropped_and_both_step_times(cli, tmp_path, problems, plans):
    """The interface scripts rely on: --json prints dropped, step_time_s (the plan, scored as `place evaluate`
    scores it) and exported_step_time_s (the nearest plan, same problem, same score)."""
    problem, plan = problems["gpt-tiny"], plans["gpt-tiny"]["unequal"]
    path = _plan_file(tmp_path, problem, plan)
    out = tmp_path / "out" / "gpt.json"
    code, stdout, err = cli("export", path, "--to", "deepspeed", "-o", out, "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert any(d.startswith("unequal batch shares (stage 0: 10/6)") for d in doc["dropped"])
    assert any(d.startswith("tensor parallel degrees 1/2") for d in doc["dropped"])
    assert any(d.startswith("uneven stages") for d in doc["dropped"])
    code, evaluated, err = cli("place", "evaluate", "gpt-tiny", "-c", CLUSTER, "--plan", path, "--batch", BATCH,
                               "--json")
    assert code == 0, err
    assert doc["step_time_s"] == pytest.approx(json.loads(evaluated)["step_time_s"], rel=1e-12)
    made = export_plan(problem, plan, "deepspeed")
    assert doc["exported_step_time_s"] == pytest.approx(simulate_plan(problem, made.nearest.plan).step_time_s)
    assert doc["step_time_s"] != doc["exported_step_time_s"]
    assert doc["degrees"] == {"pp": 2, "dp": 2, "tp": 1, "micro_batch": BATCH // (2 * MICROBATCHES),
                              "microbatches": MICROBATCHES, "global_batch": BATCH}
    assert {s.batch_share for s in made.nearest.plan.stages[0].replicas} == {BATCH // 2}
    assert json.loads(out.read_text())["train_batch_size"] == BATCH


def test_the_summary_and_the_file(cli, tmp_path, problems, plans):
    path = _plan_file(tmp_path, problems["gpt-tiny"], plans["gpt-tiny"]["unequal"])
    code, stdout, err = cli("export", path, "--to", "megatron", "-o", tmp_path / "m.args")
    assert code == 0, err
    assert "dropped: unequal batch shares" in stdout and "step time: plan" in stdout
    text = (tmp_path / "m.args").read_text()
    assert text.splitlines()[-1].startswith("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2")
    code, stdout, err = cli("export", path, "--to", "torchtitan")  # no -o: the file on stdout
    assert code == 0 and stdout.lstrip().startswith("# gpualloc export of") and "[parallelism]" in stdout


@pytest.mark.parametrize(("args", "expected"), [
    (["--to", "colossalai"], r"--to: unknown framework 'colossalai'; known: torchtitan, megatron, deepspeed"),
    (["--to", "megatron", "--graph", "no-such-model"], r"unknown zoo model 'no-such-model'"),
    (["--to", "megatron", "--cluster", "4xA100"], r"devices\[2\]: the plan was made for .n1.V100-16GB.0."),
])
def test_bad_input_is_one_line(cli, tmp_path, problems, plans, args, expected):
    import re

    path = _plan_file(tmp_path, problems["gpt-tiny"], plans["gpt-tiny"]["tp"])
    code, _, err = cli("export", path, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and re.search(expected, err), err


def test_a_missing_plan_or_one_for_an_unknown_graph_is_one_line(cli, tmp_path, problems, plans):
    code, _, err = cli("export", tmp_path / "nope.json", "--to", "deepspeed")
    assert code == 2 and err.startswith("error: ") and "nope.json" in err and len(err.strip().splitlines()) == 1
    unknown = _plan_file(tmp_path, problems["gpt-tiny"], plans["gpt-tiny"]["tp"], graph="no-such-model")
    code, _, err = cli("export", unknown, "--to", "deepspeed")
    assert code == 2 and "no-such-model" in err and len(err.strip().splitlines()) == 1
    bare = _plan_file(tmp_path, problems["gpt-tiny"], plans["gpt-tiny"]["tp"], name="bare.json", graph=None)
    code, _, err = cli("export", bare, "--to", "deepspeed")
    assert code == 2 and "graph: the plan file names no graph; pass --graph" in err


def test_a_precision_the_devices_lack_falls_back_to_fp32(problems):
    """fp16 on V100s: torchtitan has no fp16 and V100s no bf16, so the nearest trains in fp32."""
    problem = problem_for("gpt-tiny", precision="fp16")
    u = units_of(problem.graph)
    plan = make_plan([HybridStage(0, u.layer_count - 1, tuple(Replica((d,), 4) for d in range(4)))], BATCH, 1,
                     precision="fp16", n_devices=problem.k)
    made = export_plan(problem, plan, "torchtitan")
    assert made.dropped == ("precision fp16: torchtitan trains in fp32 here",)
    assert made.nearest.problem.rules.precision == "fp32" and made.exported_step_time_s > 0


@pytest.mark.slow
@pytest.mark.parametrize(("model", "blocks"), [("resnet50", 16), ("bert-base", 12), ("gpt2-small", 12)])
def test_the_full_size_zoo_models_export(model, blocks):
    """Every zoo model: its blocks are the framework's layers, and a PP=2 x DP=2 x TP=2 grid split at the middle
    block exports to every framework as is (DeepSpeed's uniform split of embedding + blocks + head included)."""
    from gpualloc.cli.common import load_graph
    from gpualloc.cli.place import problem_of
    from gpualloc.hardware.cluster import load_cluster

    problem = problem_of(load_graph(model, 8), load_cluster("4xA100+4xV100"), 2)
    u = units_of(problem.graph)
    assert (u.kinds[0], u.blocks, u.kinds[-1], len(u)) == ("embedding", blocks, "head", blocks + 2)
    end = u.last_layer(len(u) // 2 - 1)
    plan = make_plan([HybridStage(0, end, (Replica((0, 1), 4), Replica((2, 3), 4))),
                      HybridStage(end + 1, u.layer_count - 1, (Replica((4, 5), 4), Replica((6, 7), 4)))], 8, 2,
                     n_devices=problem.k)
    for to in FRAMEWORKS:
        made = export_plan(problem, plan, to)
        assert made.dropped == () and made.nearest.plan == plan, (to, made.dropped)
        assert (made.nearest.pp, made.nearest.dp, made.nearest.tp) == (2, 2, 2)
    assert f"--num-layers {blocks}" in export_plan(problem, plan, "megatron").text


def test_a_contiguous_op_level_plan_is_its_own_pipeline(problems):
    """Layers 0..13 (embedding and h.0) on device 2, the rest on device 0: two stages, nothing dropped."""
    from gpualloc.graph.layers import layer_of_node
    from gpualloc.placement.plan import OperatorPlan

    problem = problems["gpt-tiny"]
    u = units_of(problem.graph)
    layer = layer_of_node(problem.graph)
    plan = OperatorPlan(((layer > u.last_layer(1)) * 0 + (layer <= u.last_layer(1)) * 2), MICROBATCHES,
                        global_batch=BATCH)
    made = export_plan(problem, plan, "megatron")
    assert made.dropped == ()
    assert [(s.first, s.last, s.devices) for s in made.nearest.plan.stages] == \
        [(0, u.last_layer(1), (2,)), (u.first_layer[2], u.layer_count - 1, (0,))]
    assert made.rank_devices == (problem.cluster.devices[2].label, problem.cluster.devices[0].label)
