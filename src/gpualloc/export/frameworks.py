"""The three frameworks: what each can express (:class:`~gpualloc.export.nearest.Framework`) and its file.

* **torchtitan 0.3.0**: a TOML of its ``[parallelism]`` (``ParallelismConfig``) and ``[training]``
  (``TrainingConfig``) sections, keys spelled as its dataclass fields. torchtitan 0.3.0 reads its config from a
  Python ``config_registry`` function plus ``--section.key value`` overrides (no TOML reader): the file's
  header comment holds those overrides (:func:`torchtitan_overrides` turns the TOML into them).
* **Megatron-LM** (megatron-core 0.16.1): the argument list of ``pretrain_gpt.py``, one line; DP is implied
  (world size / (TP x PP)); an uneven split is ``--pipeline-model-parallel-layout``.
* **DeepSpeed 0.19.8**: its JSON config (batch arithmetic, ZeRO stage, precision, pipeline section).

Every writer takes the nearest plan (:class:`~gpualloc.export.nearest.Nearest`), which is a grid.
"""

from __future__ import annotations

import json
import shlex
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpualloc.export.nearest import Framework, Nearest, uniform_parts
from gpualloc.export.units import BLOCK, EMBEDDING, HEAD, Units

__all__ = ["FRAMEWORKS", "Target", "megatron_args", "torchtitan_overrides"]

_ALL = {"1f1b": "1f1b", "gpipe": "gpipe"}
_ONLY_1F1B = {"1f1b": "1f1b", "gpipe": "1f1b"}
_PRECISIONS = {"fp32": "fp32", "tf32": "fp32", "bf16": "bf16", "fp16": "fp16"}


@dataclass(frozen=True)
class Target:
    """A framework and how its file is written.

    Attributes:
        framework: what its config can express.
        write: ``(nearest, units, context) -> file text``; ``context`` holds ``steps`` and ``header`` (comment
            lines: plan, graph, cluster, rank order).
    """

    framework: Framework
    write: Callable[[Nearest, Units, dict[str, Any]], str]


# --------------------------------------------------------------------------- torchtitan
def _model_parts(nearest: Nearest, units: Units) -> list[list[str]]:
    return [[f for u in rng for f in units.fqns[u]] for rng in nearest.stage_units]


def torchtitan_sections(nearest: Nearest, units: Units, steps: int) -> dict[str, dict[str, Any]]:
    """The ``[parallelism]`` and ``[training]`` tables (torchtitan's field names)."""
    plan, dp = nearest.plan, nearest.dp
    local = plan.global_batch // dp
    shard = plan.sharding == "fsdp"
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": 1 if shard else dp,
        "data_parallel_shard_degree": dp if shard else 1,
        "tensor_parallel_degree": nearest.tp,
        "pipeline_parallel_degree": nearest.pp,
    }
    train: dict[str, Any] = {"global_batch_size": plan.global_batch, "steps": steps,
                             "mixed_precision_param": "bfloat16" if plan.precision == "bf16" else "float32",
                             "dtype": "float32"}
    if nearest.pp > 1:  # the microbatches are the pipeline's; the local batch is the rank's whole share
        par.update(pipeline_parallel_schedule={"1f1b": "1F1B", "gpipe": "GPipe"}[plan.schedule],
                   pipeline_parallel_microbatch_size=nearest.micro_batch,
                   module_fqns_per_model_part=_model_parts(nearest, units))
        train["local_batch_size"] = local
    else:  # no pipeline: the microbatches are gradient accumulation steps
        train["local_batch_size"] = nearest.micro_batch
    return {"parallelism": par, "training": train}


def _toml_value(value: Any) -> str:
    return json.dumps(value)  # ints, strings and lists of lists of strings: JSON and TOML spell them alike


def torchtitan_overrides(toml_text: str) -> list[str]:
    """torchtitan 0.3.0's command-line overrides of a TOML written by :func:`write_torchtitan`
    (``--parallelism.tensor_parallel_degree 2 ...``)."""
    out = []
    for section, table in tomllib.loads(toml_text).items():
        for key, value in table.items():
            out.append(f"--{section}.{key}")
            if isinstance(value, list):  # list[list[str]]: one comma-separated value per inner list
                out += [",".join(v) if isinstance(v, list) else str(v) for v in value]
            else:
                out.append(value if isinstance(value, str) else json.dumps(value))
    return out


def write_torchtitan(nearest: Nearest, units: Units, ctx: dict[str, Any]) -> str:
    sections = torchtitan_sections(nearest, units, ctx["steps"])
    body = "".join(f"\n[{name}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in table.items())
                   for name, table in sections.items())
    args = " ".join(shlex.quote(a) for a in torchtitan_overrides(body))
    return "".join(f"# {line}\n" for line in [*ctx["header"], "torchtitan 0.3.0 reads these as command-line "
                                               f"overrides: {args}"]) + body


# --------------------------------------------------------------------------- Megatron-LM
def megatron_layout(nearest: Nearest, units: Units) -> str:
    """``--pipeline-model-parallel-layout``: ``E`` embedding, ``t`` per block, ``L`` output and loss, ``|``
    between stages (megatron-core's ``PipelineParallelLayerLayout``)."""
    char = {EMBEDDING: "E", BLOCK: "t", HEAD: "L"}
    stages = ["".join(char[units.kinds[u]] for u in rng) for rng in nearest.stage_units]
    if not stages[0].startswith("E"):
        stages[0] = "E" + stages[0]
    if not stages[-1].endswith("L"):
        stages[-1] += "L"
    return "|".join(stages)


def _even(nearest: Nearest, units: Units) -> bool:
    """Whether Megatron's default split (blocks / PP on every stage, embedding first, head last) is the plan's."""
    per = [sum(units.kinds[u] == BLOCK for u in rng) for rng in nearest.stage_units]
    return len(set(per)) == 1


def megatron_args(nearest: Nearest, units: Units, steps: int) -> list[str]:
    """The argument list (DP implied by the world size)."""
    plan = nearest.plan
    args = ["--tensor-model-parallel-size", str(nearest.tp), "--pipeline-model-parallel-size", str(nearest.pp),
            "--num-layers", str(units.blocks), "--micro-batch-size", str(nearest.micro_batch),
            "--global-batch-size", str(plan.global_batch), "--train-iters", str(steps)]
    if nearest.pp > 1 and not _even(nearest, units):
        args += ["--pipeline-model-parallel-layout", megatron_layout(nearest, units)]
    args += {"bf16": ["--bf16"], "fp16": ["--fp16"]}.get(plan.precision, [])
    args += {"zero1": ["--use-distributed-optimizer"], "fsdp": ["--use-torch-fsdp2"]}.get(plan.sharding, [])
    if plan.recompute:
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    return args


def write_megatron(nearest: Nearest, units: Units, ctx: dict[str, Any]) -> str:
    world = nearest.pp * nearest.dp * nearest.tp
    lines = [*ctx["header"], f"world size {world}: DP = {world} / (TP {nearest.tp} x PP {nearest.pp}) = {nearest.dp}"]
    return "".join(f"# {line}\n" for line in lines) + shlex.join(megatron_args(nearest, units, ctx["steps"])) + "\n"


# --------------------------------------------------------------------------- DeepSpeed
_ZERO = {"none": 0, "zero1": 1, "zero2": 2, "fsdp": 3}


def deepspeed_config(nearest: Nearest, units: Units) -> dict[str, Any]:
    """DeepSpeed's config: ``train_batch_size = micro x grad-accum x DP``."""
    plan = nearest.plan
    doc: dict[str, Any] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": nearest.micro_batch,
        "gradient_accumulation_steps": plan.microbatches,
        "zero_optimization": {"stage": _ZERO[plan.sharding]},
        "bf16": {"enabled": plan.precision == "bf16"},
        "fp16": {"enabled": plan.precision == "fp16"},
    }
    if nearest.tp > 1:
        doc["tensor_parallel"] = {"autotp_size": nearest.tp}
    if nearest.pp > 1:
        doc["pipeline"] = {"stages": nearest.pp, "partition_method": "uniform",
                           "parts": uniform_parts(len(units), nearest.pp),
                           "activation_checkpoint_interval": 1 if plan.recompute else 0}
    return doc


def write_deepspeed(nearest: Nearest, units: Units, ctx: dict[str, Any]) -> str:
    return json.dumps(deepspeed_config(nearest, units), indent=1) + "\n"


FRAMEWORKS: dict[str, Target] = {
    "torchtitan": Target(
        Framework("torchtitan", free_splits=True, schedules=_ALL,
                  shardings={"none": "none", "zero1": "fsdp", "zero2": "fsdp", "fsdp": "fsdp"},
                  precisions={**_PRECISIONS, "fp16": "bf16"}),
        write_torchtitan),
    "megatron": Target(
        Framework("megatron", free_splits=True, schedules=_ONLY_1F1B,
                  shardings={"none": "none", "zero1": "zero1", "zero2": "zero1", "fsdp": "fsdp"},
                  precisions=_PRECISIONS),
        write_megatron),
    "deepspeed": Target(
        Framework("deepspeed", free_splits=False, schedules=_ONLY_1F1B,
                  shardings={"none": "none", "zero1": "zero1", "zero2": "zero2", "fsdp": "fsdp"},
                  pp_shardings={"none": "none", "zero1": "zero1", "zero2": "zero1", "fsdp": "zero1"},
                  precisions=_PRECISIONS),
        write_deepspeed),
}
"""Framework name -> what it expresses and how its file is written (``gpualloc export --to``)."""
