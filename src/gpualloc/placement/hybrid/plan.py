"""HybridPlan: data × pipeline × tensor parallelism on possibly mixed GPUs (``gpualloc-plan`` v2).

A plan splits the model's *layer sequence* (see :mod:`gpualloc.graph.layers`) into stages of
contiguous layers. Each stage has one or more data-parallel replicas; a replica is a group of ``tp``
devices (cluster device indices) that run the stage's layers tensor-parallel. Every replica processes
``batch_share`` samples of the global batch per step; within a stage the shares add up to the global
batch, and they may differ (a faster GPU takes more). The global batch goes through the pipeline in
``microbatches`` microbatches of ``microbatch_size`` samples (the last may be smaller when the batch does
not divide); in each microbatch a replica takes its share of it (``batch_share / microbatches`` samples,
rounded by :func:`replica_microbatch`). What one replica processes is written on the replica: its own
``microbatch_size`` (the most samples it takes in one microbatch) and ``microbatches`` (how many of the
global microbatches give it any sample). The plan also fixes the training ``precision`` and whether
activations are recomputed in the backward (``recompute``); ``sharding`` is a ZeRO stage.

The op-level plans of version 1 (one device per operator) are the other kind of
:class:`~gpualloc.placement.plan.Plan`; :mod:`gpualloc.placement.document` reads and writes both.

JSON (keys that scripts rely on are exact)::

    {"format": "gpualloc-plan", "version": 2, "graph": ..., "cluster": ..., "devices": [labels],
     "global_batch": 256, "layer_count": 54,
     "stages": [{"layers": [0, 17], "replicas": [{"devices": [0, 1], "tp": 2, "batch_share": 160,
                                                  "microbatch_size": 20, "microbatches": 8}, ...]}],
     "microbatch_size": 32, "microbatches": 8, "schedule": "1f1b",
     "sync": {"algorithm": "ring", "overlap": true, "bucket_mb": 25.0}, "sharding": "none",
     "precision": "fp32", "recompute": false}

The top-level ``microbatch_size`` stays the global microbatch (the batch over the microbatch count), as
scripts read it; what a device computes is the replica's own ``microbatch_size``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from gpualloc.cost.memory import PRECISIONS, SHARDINGS
from gpualloc.errors import PlacementError
from gpualloc.limits import MAX_BATCH, MAX_DEVICES, MAX_MICROBATCHES
from gpualloc.placement.plan import SCHEDULES, Plan

if TYPE_CHECKING:
    from gpualloc.graph.ir import OpGraph

SYNC_ALGORITHMS = ("ring", "hierarchical")


@dataclass(frozen=True)
class Replica:
    """One data-parallel replica of a stage: ``tp`` devices running the stage tensor-parallel."""

    devices: tuple[int, ...]
    batch_share: int

    @property
    def tp(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class HybridStage:
    """Layers ``first..last`` (inclusive, indices into the layer sequence) and their replicas."""

    first: int
    last: int
    replicas: tuple[Replica, ...]

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(d for r in self.replicas for d in r.devices)


@dataclass(frozen=True)
class Sync:
    """Gradient synchronisation among a stage's replicas."""

    algorithm: str = "ring"
    overlap: bool = True
    bucket_mb: float = 25.0


@dataclass(frozen=True)
class HybridPlan(Plan):
    """A DP × PP × TP plan (:class:`~gpualloc.placement.plan.Plan` of kind ``hybrid``); construct through
    :func:`make_plan` or :func:`gpualloc.placement.document.parse_hybrid` (both validate)."""

    kind: ClassVar[str] = "hybrid"
    version: ClassVar[int] = 2
    stages: tuple[HybridStage, ...]
    global_batch: int
    microbatches: int
    schedule: str = "1f1b"
    sync: Sync = field(default_factory=Sync)
    sharding: str = "none"
    precision: str = "fp32"
    recompute: bool = False

    @property
    def microbatch_size(self) -> int:
        """Samples per (global) microbatch: the batch over the microbatches, rounded up."""
        return -(-self.global_batch // self.microbatches)

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(d for s in self.stages for d in s.devices)

    @property
    def layer_count(self) -> int:
        return self.stages[-1].last + 1

    @property
    def pipeline_depth(self) -> int:
        return len(self.stages)

    def describe(self) -> str:
        """One line: ``PP=2 [DP=3 TP=1 | DP=1 TP=2] M=8 1f1b ring``."""
        parts = " | ".join(
            f"L{s.first}-{s.last} DP={len(s.replicas)} TP={','.join(sorted({str(r.tp) for r in s.replicas}))}"
            for s in self.stages)
        extra = "".join(f" {x}" for x in (self.sharding if self.sharding != "none" else "",
                                           "recompute" if self.recompute else "") if x)
        return (f"PP={len(self.stages)} [{parts}] M={self.microbatches} {self.schedule} {self.sync.algorithm} "
                f"{self.precision}{extra}")

    def body(self, graph: OpGraph | None = None) -> dict[str, Any]:
        """The plan's JSON object (:func:`plan_to_dict`); the layers are the graph's, so ``graph`` is unused."""
        return plan_to_dict(self)


def replica_microbatch(plan: HybridPlan, replica: Replica, k: int) -> int:
    """Samples ``replica`` takes in microbatch ``k`` (0-based): its share spread over the microbatches as
    evenly as integers allow (the first ``share % M`` microbatches take one more)."""
    base, extra = divmod(replica.batch_share, plan.microbatches)
    return base + (1 if k < extra else 0)


def replica_microbatches(plan: HybridPlan, replica: Replica) -> tuple[int, int]:
    """``(microbatch_size, microbatches)`` of one replica: the most samples it takes in a microbatch, and how
    many microbatches give it any."""
    return replica_microbatch(plan, replica, 0), min(plan.microbatches, replica.batch_share)


def make_plan(stages, global_batch: int, microbatches: int, *, schedule: str = "1f1b", sync: Sync | None = None,
              sharding: str = "none", precision: str = "fp32", recompute: bool = False,
              n_devices: int | None = None, where: str = "plan") -> HybridPlan:
    """Build and validate a plan (``stages``: :class:`HybridStage` objects)."""
    plan = HybridPlan(tuple(stages), int(global_batch), int(microbatches), schedule, sync or Sync(), sharding,
                      precision, bool(recompute))
    validate(plan, n_devices=n_devices, where=where)
    return plan


def validate(plan: HybridPlan, *, n_devices: int | None = None, layer_count: int | None = None,
             where: str = "plan") -> None:
    """Check the plan's structure; every error names the field.

    Stages cover ``0..layer_count-1`` contiguously; every replica has >= 1 device; no device is in two
    replicas (or stages); each stage's shares are positive and add up to the global batch; the microbatch
    count is in ``1..global_batch``.
    """
    def bad(field_: str, msg: str) -> PlacementError:
        return PlacementError(f"{where}: {field_}: {msg}")

    _validate_header(plan, bad)
    _validate_stages(plan, bad, n_devices)
    if layer_count is not None and plan.layer_count != layer_count:
        raise bad("stages", f"the stages cover {plan.layer_count} layers, the model has {layer_count}")


def _validate_header(plan: HybridPlan, bad) -> None:
    if not 1 <= plan.global_batch <= MAX_BATCH:
        raise bad("global_batch", f"must be in 1..{MAX_BATCH:,}, got {plan.global_batch}")
    if not 1 <= plan.microbatches <= min(MAX_MICROBATCHES, plan.global_batch):
        raise bad("microbatches", f"must be in 1..{min(MAX_MICROBATCHES, plan.global_batch)}, got {plan.microbatches}")
    if plan.schedule not in SCHEDULES:
        raise bad("schedule", f"must be one of {', '.join(SCHEDULES)}, got {plan.schedule!r}")
    if plan.sync.algorithm not in SYNC_ALGORITHMS:
        raise bad("sync.algorithm", f"must be one of {', '.join(SYNC_ALGORITHMS)}, got {plan.sync.algorithm!r}")
    if not 0 < plan.sync.bucket_mb <= 1e6:
        raise bad("sync.bucket_mb", f"must be in (0, 1e6], got {plan.sync.bucket_mb}")
    if plan.sharding not in SHARDINGS:
        raise bad("sharding", f"must be one of {', '.join(SHARDINGS)}, got {plan.sharding!r}")
    if plan.precision not in PRECISIONS:
        raise bad("precision", f"must be one of {', '.join(PRECISIONS)}, got {plan.precision!r}")


def _validate_stages(plan: HybridPlan, bad, n_devices: int | None) -> None:
    if not plan.stages:
        raise bad("stages", "the plan has no stages")
    limit = n_devices if n_devices is not None else MAX_DEVICES
    seen: dict[int, str] = {}
    expect_first = 0
    for si, stage in enumerate(plan.stages):
        at = f"stages[{si}]"
        if stage.first != expect_first or stage.last < stage.first:
            raise bad(f"{at}.layers", f"expected [{expect_first}, >= {expect_first}] (stages are contiguous), "
                                      f"got [{stage.first}, {stage.last}]")
        expect_first = stage.last + 1
        if not stage.replicas:
            raise bad(f"{at}.replicas", "a stage needs at least one replica")
        for ri, rep in enumerate(stage.replicas):
            rat = f"{at}.replicas[{ri}]"
            if not rep.devices:
                raise bad(f"{rat}.devices", "a replica needs at least one device")
            for d in rep.devices:
                if not 0 <= d < limit:
                    raise bad(f"{rat}.devices", f"device index must be in 0..{limit - 1}, got {d}")
                if d in seen:
                    raise bad(f"{rat}.devices", f"device {d} is already used by {seen[d]}")
                seen[d] = rat
            if rep.batch_share < 1:
                raise bad(f"{rat}.batch_share", f"must be >= 1, got {rep.batch_share}")
        total = sum(r.batch_share for r in stage.replicas)
        if total != plan.global_batch:
            raise bad(f"{at}.replicas", f"batch shares add up to {total}, not the global batch {plan.global_batch}")


# --------------------------------------------------------------------------- JSON
def plan_to_dict(plan: HybridPlan) -> dict[str, Any]:
    """The plan's JSON object (without the file header: see :mod:`gpualloc.placement.document`)."""
    return {
        "global_batch": plan.global_batch,
        "layer_count": plan.layer_count,
        "stages": [{"layers": [s.first, s.last],
                    "replicas": [{"devices": list(r.devices), "tp": r.tp, "batch_share": r.batch_share,
                                  **dict(zip(("microbatch_size", "microbatches"), replica_microbatches(plan, r),
                                             strict=True))}
                                 for r in s.replicas]} for s in plan.stages],
        "microbatch_size": plan.microbatch_size,
        "microbatches": plan.microbatches,
        "schedule": plan.schedule,
        "sync": {"algorithm": plan.sync.algorithm, "overlap": plan.sync.overlap, "bucket_mb": plan.sync.bucket_mb},
        "sharding": plan.sharding,
        "precision": plan.precision,
        "recompute": plan.recompute,
    }
