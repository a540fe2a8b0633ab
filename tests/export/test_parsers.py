"""Round trips through the frameworks' own parsers: every zoo model x plan kind exports to every framework, the
framework parses the file, and the degrees and batches it reads are the exported plan's.

- torchtitan 0.3.0: its ``ConfigManager`` (tyro, its own rules) parses the file's overrides into its own
  ``ParallelismConfig`` / ``TrainingConfig``; ``ParallelDims`` checks the degrees against the world size; the
  model parts name modules of the model.
- megatron-core 0.16.1: the argument list becomes ``TransformerConfig`` (with ``ModelParallelConfig``'s fields
  and the layout parser) the way Megatron-LM's ``core_transformer_config_from_args`` copies same-named
  arguments; ``ConstantNumMicroBatchesCalculator`` checks the batch arithmetic.
- DeepSpeed 0.19.8: ``DeepSpeedConfig`` parses the JSON and checks ``train_batch_size = micro x accumulation x
  DP``; ``PipeModelDataParallelTopology`` gives every rank's coordinates, which must be the export's rank order.
"""

from __future__ import annotations

import json
import shlex

import pytest

from gpualloc.export import export_plan
from gpualloc.export.frameworks import torchtitan_overrides
from gpualloc.export.units import BLOCK
from gpualloc.graph.zoo import get_model

from .conftest import MODELS

CASES = [(m, k) for m in MODELS for k in ("hybrid", "assignment", "unequal", "tp", "accumulate")]


def _blocks_per_stage(made) -> list[int]:
    return [sum(made.units.kinds[u] == BLOCK for u in rng) for rng in made.nearest.stage_units]


def _check_plan_is_grid(made, plan) -> None:
    n = made.nearest
    assert len(made.rank_devices) == n.pp * n.dp * n.tp
    assert all(len(s.replicas) == n.dp and all(r.tp == n.tp for r in s.replicas) for s in n.plan.stages)
    assert n.plan.global_batch % (n.dp * n.plan.microbatches) == 0
    assert made.step_time_s > 0 and made.exported_step_time_s > 0
    assert [s.last for s in n.plan.stages][-1] == made.units.layer_count - 1
    if plan.kind == "hybrid" and len({r.batch_share for s in plan.stages for r in s.replicas}) > 1:
        assert any("unequal batch shares" in d for d in made.dropped)


# --------------------------------------------------------------------------- torchtitan
@pytest.mark.parametrize(("model", "kind"), CASES)
def test_torchtitan_parses_the_export(problems, plans, model, kind):
    pytest.importorskip("torchtitan")
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    problem, plan = problems[model], plans[model][kind]
    made = export_plan(problem, plan, "torchtitan")
    _check_plan_is_grid(made, plan)
    n = made.nearest
    cfg = ConfigManager().parse_args(["--module", "tests.export.titan_registry", "--config", "gpualloc_export",
                                      *torchtitan_overrides(made.text)])
    par, train = cfg.parallelism, cfg.training
    dims = ParallelDims.from_config(par, len(made.rank_devices))  # asserts dp x tp x pp == world size
    assert (dims.pp, dims.tp, dims.dp_replicate * dims.dp_shard) == (n.pp, n.tp, n.dp)
    assert train.global_batch_size == n.plan.global_batch
    accumulation, rest = divmod(train.global_batch_size, train.local_batch_size * n.dp)  # as its Trainer does
    assert rest == 0
    if n.pp > 1:
        get_schedule_class(par.pipeline_parallel_schedule)
        assert train.local_batch_size % par.pipeline_parallel_microbatch_size == 0
        assert (accumulation, train.local_batch_size // par.pipeline_parallel_microbatch_size) == \
            (1, n.plan.microbatches)
        modules = dict(get_model(model).factory().named_modules())
        parts = par.module_fqns_per_model_part
        assert len(parts) == n.pp and all(f in modules for part in parts for f in part)
        flat = [f for part in parts for f in part]
        assert len(flat) == len(set(flat)) == sum(len(f) for f in made.units.fqns)
    else:
        assert accumulation == n.plan.microbatches


# --------------------------------------------------------------------------- Megatron-LM
def _megatron_namespace(text: str) -> dict:
    """The argument list as Megatron-LM's argparse leaves it: ``--a-b v`` -> ``a_b``, a bare flag -> True."""
    line = next(x for x in text.splitlines() if x and not x.startswith("#"))
    argv, out, i = shlex.split(line), {}, 0
    while i < len(argv):
        key = argv[i].removeprefix("--").replace("-", "_")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value = argv[i + 1]
            out[key] = int(value) if value.isdigit() else value
            i += 2
        else:
            out[key], i = True, i + 1
    return out


@pytest.mark.parametrize(("model", "kind"), CASES)
def test_megatron_core_parses_the_export(problems, plans, model, kind):
    pytest.importorskip("megatron.core")
    import dataclasses

    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer import TransformerConfig

    problem, plan = problems[model], plans[model][kind]
    made = export_plan(problem, plan, "megatron")
    _check_plan_is_grid(made, plan)
    n = made.nearest
    args = _megatron_namespace(made.text)
    tp, pp = args["tensor_model_parallel_size"], args["pipeline_model_parallel_size"]
    known = {f.name for f in dataclasses.fields(TransformerConfig)}
    given = {k: v for k, v in args.items() if k in known}
    # the model's own widths are not the exported plan's business: heads and hidden size divisible by TP
    cfg = TransformerConfig(**given, hidden_size=64 * tp, num_attention_heads=4 * tp, pipeline_dtype=torch.float32)
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size) == (n.tp, n.pp)
    world = len(made.rank_devices)
    assert world % (tp * pp) == 0 and world // (tp * pp) == n.dp  # DP implied by the world size
    calc = ConstantNumMicroBatchesCalculator(args["global_batch_size"], args["micro_batch_size"], n.dp, False, 0)
    assert (calc.get(), calc.get_current_global_batch_size()) == (n.plan.microbatches, n.plan.global_batch)
    assert args.get("use_distributed_optimizer", False) == (n.plan.sharding == "zero1")
    assert (args.get("bf16", False), args.get("fp16", False)) == \
        (n.plan.precision == "bf16", n.plan.precision == "fp16")
    DistributedDataParallelConfig(use_distributed_optimizer=args.get("use_distributed_optimizer", False))
    layout = cfg.pipeline_model_parallel_layout
    if layout is not None:
        per_stage = [layout.get_num_layers_to_build(pp_rank=r, vp_stage=0) for r in range(pp)]
    else:
        assert cfg.num_layers % pp == 0
        per_stage = [cfg.num_layers // pp] * pp
    assert per_stage == _blocks_per_stage(made)


def test_an_uneven_pipeline_is_a_megatron_layout(problems):
    """gpt-tiny on three stages (embedding | h.0 | h.1 and head): 0/1/1 blocks, which only a layout says."""
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.transformer import TransformerConfig

    from gpualloc.export.units import units_of
    from gpualloc.placement.hybrid.plan import HybridStage, Replica, make_plan

    problem = problems["gpt-tiny"]
    u = units_of(problem.graph)
    plan = make_plan([HybridStage(0, u.last_layer(0), (Replica((0,), 16),)),
                      HybridStage(u.first_layer[1], u.last_layer(1), (Replica((1,), 16),)),
                      HybridStage(u.first_layer[2], u.layer_count - 1, (Replica((2,), 16),))], 16, 4,
                     n_devices=problem.k)
    made = export_plan(problem, plan, "megatron")
    assert made.dropped == ()
    args = _megatron_namespace(made.text)
    assert args["pipeline_model_parallel_layout"] == "E|t|tL"
    cfg = TransformerConfig(num_layers=args["num_layers"], hidden_size=64, num_attention_heads=4,
                            pipeline_model_parallel_size=3, pipeline_dtype=torch.float32,
                            pipeline_model_parallel_layout=args["pipeline_model_parallel_layout"])
    assert [cfg.pipeline_model_parallel_layout.get_num_layers_to_build(pp_rank=r, vp_stage=0)
            for r in range(3)] == [0, 1, 1]


# --------------------------------------------------------------------------- DeepSpeed
def _deepspeed_config(doc: dict, dp: int):
    """``DeepSpeedConfig(doc)`` as a rank of a ``dp``-way data-parallel job builds it. Its constructor asks
    ``deepspeed.comm`` for the data-parallel size, which on a CPU build means compiling a shared-memory op (minutes);
    the same steps run here with that size given."""
    from deepspeed.runtime import config as ds

    ds._reject_removed_config_keys(doc)
    cfg = ds.DeepSpeedConfig.__new__(ds.DeepSpeedConfig)
    cfg._param_dict, cfg.global_rank, cfg.world_size = doc, 0, dp
    cfg._initialize_params(dict(doc))
    cfg._configure_train_batch_size()  # asserts train_batch_size == micro x accumulation x dp
    cfg._do_sanity_check()
    return cfg


@pytest.mark.parametrize(("model", "kind"), CASES)
def test_deepspeed_parses_the_export(problems, plans, model, kind):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    from deepspeed.runtime.utils import partition_uniform

    problem, plan = problems[model], plans[model][kind]
    made = export_plan(problem, plan, "deepspeed")
    _check_plan_is_grid(made, plan)
    n = made.nearest
    cfg = _deepspeed_config(json.loads(made.text), n.dp)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == \
        (n.plan.global_batch, n.micro_batch, n.plan.microbatches)
    assert cfg.zero_optimization_stage == {"none": 0, "zero1": 1, "zero2": 2, "fsdp": 3}[n.plan.sharding]
    assert (cfg.bfloat16_config.enabled, cfg.float16_config.enabled) == \
        (n.plan.precision == "bf16", n.plan.precision == "fp16")
    assert cfg.tensor_parallel_config.autotp_size == (n.tp if n.tp > 1 else 0)
    if n.pp > 1:
        parts = partition_uniform(len(made.units), n.pp)
        assert cfg.pipeline["stages"] == n.pp and cfg.pipeline["parts"] == parts
        assert [range(parts[s], parts[s + 1]) for s in range(n.pp)] == list(n.stage_units)
    topo = PipeModelDataParallelTopology(num_pp=n.pp, num_mp=n.tp, num_dp=n.dp)
    for rank, label in enumerate(made.rank_devices):
        c = topo.get_coord(rank)
        device = n.plan.stages[c.pipe].replicas[c.data].devices[c.model]
        assert problem.cluster.devices[device].label == label
