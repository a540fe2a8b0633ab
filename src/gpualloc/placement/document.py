"""The plan document (``gpualloc-plan``): one reader and one writer for both plan kinds.

A plan file is a JSON object with a header and the plan's body, told apart by ``version``::

    {"format": "gpualloc-plan", "version": 1, "graph": ..., "cluster": ..., "devices": [labels],
     "method": ..., "batch_size": 32, "microbatches": 4, "schedule": "1f1b",
     "assignment": {node id: device index}, ...the scored outcome (step_time_s, ...)}

    {"format": "gpualloc-plan", "version": 2, ...header, ...the hybrid plan
     (:mod:`gpualloc.placement.hybrid.plan`), ...the scored outcome}

Version 1 is an :class:`~gpualloc.placement.plan.OperatorPlan` (``version`` may be absent in files
written before version 2 existed), version 2 a :class:`~gpualloc.placement.hybrid.plan.HybridPlan`.
:func:`read_plan` reads and checks a file once; :meth:`PlanFile.plan_for` binds it to a problem (node
ids to indices, device labels checked). Version 1 files written before the batch was recorded give it as
``round(throughput x step time)`` of the scored outcome.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    model_validator,
)

from gpualloc.errors import PlacementError, read_json, write_text
from gpualloc.cost.memory import OPTIMIZER_STATES, PRECISIONS
from gpualloc.limits import MAX_BATCH, MAX_MICROBATCHES
from gpualloc.placement.hybrid.plan import HybridPlan, HybridStage, Replica, Sync, replica_microbatches, validate
from gpualloc.placement.plan import OperatorPlan, Plan

if TYPE_CHECKING:
    from gpualloc.placement.problem import PlacementProblem

__all__ = ["PLAN_FORMAT", "PlanFile", "parse_hybrid", "read_plan", "write_plan"]

PLAN_FORMAT = "gpualloc-plan"


def _one_of(choices: Mapping[str, Any]) -> AfterValidator:
    """A field check: the value (when given) is a key of ``choices``."""
    def check(value: str | None) -> str | None:
        if value is not None and value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value
    return AfterValidator(check)


class _Header(BaseModel):
    """What every plan file says about where its plan belongs."""

    model_config = ConfigDict(extra="allow")

    format: Literal["gpualloc-plan"] = PLAN_FORMAT
    graph: str | None = None
    cluster: str | None = None
    devices: list[str] | None = None
    method: str | None = None
    optimizer: Annotated[str | None, _one_of(OPTIMIZER_STATES)] = None
    calibration: str | None = None


class _AssignmentBody(_Header):
    version: Literal[1] = 1
    assignment: dict[str, Any]
    microbatches: Annotated[StrictInt, Field(ge=1, le=MAX_MICROBATCHES)] = 1
    schedule: Literal["1f1b", "gpipe"] | None = None
    batch_size: Annotated[StrictInt, Field(ge=1, le=MAX_BATCH)] | None = None
    precision: Annotated[str, _one_of(PRECISIONS)] = "fp32"


class _Sync(BaseModel):
    model_config = ConfigDict(extra="forbid")

    algorithm: str = "ring"
    overlap: StrictBool = True
    bucket_mb: StrictFloat | StrictInt = 25.0


class _Replica(BaseModel):
    devices: list[StrictInt]
    tp: StrictInt | None = None
    batch_share: StrictInt
    microbatch_size: StrictInt | None = None
    microbatches: StrictInt | None = None

    @model_validator(mode="after")
    def _tp_matches(self) -> _Replica:
        if self.tp is not None and self.tp != len(self.devices):
            raise ValueError(f"tp {self.tp} does not match the {len(self.devices)} devices listed")
        return self


class _Stage(BaseModel):
    layers: tuple[StrictInt, StrictInt]
    replicas: list[_Replica]


class _HybridBody(_Header):
    version: Literal[2]
    global_batch: StrictInt
    microbatches: StrictInt
    stages: list[_Stage]
    schedule: str = "1f1b"
    sync: _Sync = _Sync()
    sharding: str = "none"
    precision: str = "fp32"
    recompute: StrictBool = False
    layer_count: StrictInt | None = None


def parse_hybrid(doc: Mapping[str, Any], *, where: str = "plan") -> HybridPlan:
    """A version 2 plan's body as a validated :class:`HybridPlan`; errors name the field. A replica's
    ``microbatch_size`` and ``microbatches``, derived fields written for the reader, must be what the plan
    implies (a hand edit that disagrees is an error, not a silent override)."""
    try:
        body = _HybridBody.model_validate({"version": 2, **doc})
    except ValidationError as err:
        raise _pydantic_error(where, err) from err
    stages = [HybridStage(st.layers[0], st.layers[1], tuple(Replica(tuple(r.devices), r.batch_share)
                                                            for r in st.replicas)) for st in body.stages]
    plan = HybridPlan(tuple(stages), body.global_batch, body.microbatches, body.schedule,
                      Sync(body.sync.algorithm, body.sync.overlap, float(body.sync.bucket_mb)), body.sharding,
                      body.precision, body.recompute)
    validate(plan, layer_count=body.layer_count, where=where)
    for si, (stage, st) in enumerate(zip(plan.stages, body.stages, strict=True)):
        for ri, (rep, given) in enumerate(zip(stage.replicas, st.replicas, strict=True)):
            for key, value in zip(("microbatch_size", "microbatches"), replica_microbatches(plan, rep), strict=True):
                if getattr(given, key) not in (None, value):
                    raise PlacementError(f"{where}: stages[{si}].replicas[{ri}].{key}: {getattr(given, key)!r} does "
                                         f"not match the plan ({value}: batch_share {rep.batch_share} over "
                                         f"{plan.microbatches} microbatches)")
    return plan


def _pydantic_error(where: str, err: ValidationError) -> PlacementError:
    """The first error as one line naming the field (``stages[0].replicas[1].devices``)."""
    first = err.errors()[0]
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"]).lstrip(".") or "plan"
    msg = first["msg"].removeprefix("Value error, ")
    return PlacementError(f"{where}: {field}: {msg[:1].lower() + msg[1:]}, got {first.get('input')!r}")


@dataclass(frozen=True)
class PlanFile:
    """A plan file, read and checked once.

    Attributes:
        path: the file.
        version: 1 (operator assignment) or 2 (hybrid).
        graph, cluster, method: what the plan was made for and by (None when the file does not say).
        devices: the cluster's device labels the plan was made for (None when not recorded).
        global_batch: samples per step (None for an old version 1 file that recorded neither the batch nor
            a scored step).
        microbatches: pipeline microbatches per step.
        schedule: the pipeline schedule (None when an old version 1 file names none).
        precision: the training precision the plan was costed in.
        optimizer: the optimizer the plan was costed with (None in files written before it was recorded).
        calibration: the calibration file the plan was scored with (None: the shipped one).
        doc: the whole JSON object (the scored outcome and notes written beside the plan).
    """

    path: Path
    version: int
    graph: str | None
    cluster: str | None
    method: str | None
    devices: tuple[str, ...] | None
    global_batch: int | None
    microbatches: int
    schedule: str | None
    precision: str
    optimizer: str | None
    calibration: str | None
    doc: Mapping[str, Any]
    _hybrid: HybridPlan | None = None

    @property
    def kind(self) -> str:
        """The plan's kind: ``assignment`` (version 1) or ``hybrid`` (version 2)."""
        return "hybrid" if self._hybrid is not None else "assignment"

    @property
    def node_ids(self) -> frozenset[str]:
        """The graph node ids a version 1 plan places (empty for a hybrid plan)."""
        return frozenset(self.doc["assignment"]) if self.version == 1 else frozenset()

    def plan_for(self, problem: PlacementProblem, *, schedule: str | None = None,
                 microbatches: int | None = None, global_batch: int | None = None) -> Plan:
        """The plan on ``problem``'s graph and cluster; ``schedule``, ``microbatches`` and ``global_batch``
        override an operator assignment's (a hybrid plan fixes its own: another value is an error). Errors
        name the file and field."""
        _check_devices(str(self.path), self.devices, problem)
        if self._hybrid is not None:
            hp = self._hybrid
            for name, given, fixed in (("schedule", schedule, hp.schedule), ("microbatches", microbatches,
                                       hp.microbatches), ("global_batch", global_batch, hp.global_batch)):
                if given is not None and given != fixed:
                    raise PlacementError(f"{self.path}: {name}: the hybrid plan fixes it at {fixed}, not {given}")
            validate(hp, n_devices=problem.k, where=str(self.path))
            return hp
        return OperatorPlan(_assignment(str(self.path), self.doc["assignment"], problem),
                            microbatches or self.microbatches, schedule or self.schedule or "1f1b",
                            global_batch or self.global_batch or int(problem.graph.batch_size or 1), self.precision)


def read_plan(path: str | Path) -> PlanFile:
    """Read a plan file of either version; every error names the file and the field."""
    where = str(path)
    doc = read_json(path, PlacementError)
    if not isinstance(doc, dict):
        raise PlacementError(f"{where}: expected a JSON object (a gpualloc-plan)")
    version = doc.get("version", 1)
    if isinstance(version, bool) or version not in (1, 2):
        raise PlacementError(f"{where}: version: expected 1 (op-level) or 2 (hybrid), got {version!r}")
    if version == 1 and not isinstance(doc.get("assignment"), dict):
        raise PlacementError(f"{where}: assignment: expected an object mapping node id -> device index")
    try:
        head = (_AssignmentBody if version == 1 else _HybridBody).model_validate(doc)
    except ValidationError as err:
        raise _pydantic_error(where, err) from err
    devices = tuple(head.devices) if head.devices is not None else None
    if version == 2:
        hp = parse_hybrid(doc, where=where)
        return PlanFile(Path(path), 2, head.graph, head.cluster, head.method, devices, hp.global_batch,
                        hp.microbatches, hp.schedule, hp.precision, head.optimizer, head.calibration, doc, hp)
    return PlanFile(Path(path), 1, head.graph, head.cluster, head.method, devices,
                    head.batch_size or _scored_batch(doc), head.microbatches, head.schedule, head.precision,
                    head.optimizer, head.calibration, doc)


def write_plan(path: str | Path, problem: PlacementProblem, plan: Plan, cluster: str,
               extra: Mapping[str, Any] | None = None) -> None:
    """Write ``plan`` for ``problem`` as a plan file; ``extra`` (the scored outcome, notes) is stored beside it."""
    doc = {"format": PLAN_FORMAT, "version": plan.version, "graph": problem.graph.name, "cluster": cluster,
           "devices": [d.label for d in problem.cluster.devices], "optimizer": problem.rules.optimizer,
           **dict(extra or {}), **plan.body(problem.graph)}
    write_text(path, json.dumps(doc, indent=1) + "\n")


def _scored_batch(doc: Mapping[str, Any]) -> int | None:
    """An old version 1 file's batch: the scored throughput times the step time."""
    tput, step = doc.get("throughput_samples_per_s"), doc.get("step_time_s")
    if isinstance(tput, int | float) and isinstance(step, int | float) and tput > 0 and step > 0:
        return int(round(tput * step)) or None
    return None


def _check_devices(where: str, labels: tuple[str, ...] | None, problem: PlacementProblem) -> None:
    """A plan that lists its devices must have been made for this cluster's devices, in this order."""
    if labels is None:
        return
    ours = [d.label for d in problem.cluster.devices]
    if len(labels) != len(ours):
        raise PlacementError(f"{where}: devices: the plan was made for {len(labels)} devices, "
                             f"cluster {problem.cluster.name!r} has {len(ours)}")
    for i, (theirs, mine) in enumerate(zip(labels, ours, strict=True)):
        if theirs != mine:
            raise PlacementError(f"{where}: devices[{i}]: the plan was made for {theirs!r}, "
                                 f"cluster {problem.cluster.name!r} has {mine!r} there")


def _assignment(where: str, mapping: Mapping[str, int], problem: PlacementProblem) -> np.ndarray:
    """Node id -> device index as a device per node of ``problem.graph``; errors name the node."""
    out = np.empty(problem.n, dtype=np.int64)
    for i, node in enumerate(problem.graph.nodes):
        if node.id not in mapping:
            raise PlacementError(f"{where}: assignment: node {node.id!r} of graph {problem.graph.name!r} is not placed")
        dev = mapping[node.id]
        if isinstance(dev, bool) or not isinstance(dev, int) or not 0 <= dev < problem.k:
            raise PlacementError(f"{where}: assignment.{node.id}: device must be an integer in 0..{problem.k - 1}, "
                                 f"got {dev!r}")
        out[i] = dev
    extra = set(mapping) - set(problem.graph.index)
    if extra:
        raise PlacementError(f"{where}: assignment: unknown node {sorted(extra)[0]!r}")
    return out
