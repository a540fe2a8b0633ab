"""The one plan abstraction: a :class:`Plan` of one training step, in two kinds.

* :class:`OperatorPlan` (kind ``assignment``, plan files of version 1): one device per operator of the
  graph, its pipeline microbatches, schedule and batch.
* :class:`~gpualloc.placement.hybrid.plan.HybridPlan` (kind ``hybrid``, version 2): data x pipeline x
  tensor parallel stages over the model's layers, with per-replica batch shares.

Every plan says what it is (``kind``, ``version``), what a run of it needs (``global_batch``,
``microbatches``, ``schedule``, the ``devices`` it uses), describes itself in one line and writes its
document body (:meth:`Plan.body`); :mod:`gpualloc.placement.outcome` simulates and bounds either kind
against one problem, :mod:`gpualloc.placement.document` reads and writes plan files.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from gpualloc.errors import PlacementError

if TYPE_CHECKING:
    from gpualloc.graph.ir import OpGraph

__all__ = ["SCHEDULES", "OperatorPlan", "Plan"]

SCHEDULES = ("1f1b", "gpipe")
"""Pipeline schedules a plan runs under (PipeDream-Flush, GPipe)."""


class Plan(ABC):
    """A plan of one training step of a model on a cluster's devices."""

    kind: ClassVar[str]
    """``assignment`` (one device per operator) or ``hybrid`` (data x pipeline x tensor parallel)."""
    version: ClassVar[int]
    """The plan file version of the kind (1 or 2)."""
    global_batch: int
    """Samples per training step."""
    microbatches: int
    """Pipeline microbatches per step."""
    schedule: str
    """``1f1b`` or ``gpipe``."""
    precision: str
    """The training precision the plan was costed in (``fp32``, ``tf32``, ``bf16``, ``fp16``)."""

    @property
    @abstractmethod
    def devices(self) -> tuple[int, ...]:
        """Cluster device indices the plan uses."""

    @abstractmethod
    def describe(self) -> str:
        """The plan in one line (``4 devices M=4 1f1b``, ``PP=2 [...] M=8 1f1b ring fp32``)."""

    @abstractmethod
    def body(self, graph: OpGraph) -> dict[str, Any]:
        """The plan's fields of a plan document (:mod:`gpualloc.placement.document`)."""


@dataclass(frozen=True, eq=False)
class OperatorPlan(Plan):
    """One device per operator: ``assignment[i]`` is the device of ``graph.nodes[i]``.

    Attributes:
        assignment: device index per node, int64, read-only.
        microbatches: pipeline microbatches per step.
        schedule: ``1f1b`` or ``gpipe``.
        global_batch: samples per step (the graph's batch).
        precision: the training precision it was costed in.
    """

    kind: ClassVar[str] = "assignment"
    version: ClassVar[int] = 1
    assignment: np.ndarray
    microbatches: int = 1
    schedule: str = "1f1b"
    global_batch: int = 1
    precision: str = "fp32"

    def __post_init__(self) -> None:
        a = np.array(self.assignment, dtype=np.int64)
        a.setflags(write=False)
        object.__setattr__(self, "assignment", a)
        if self.schedule not in SCHEDULES:
            raise PlacementError(f"schedule: expected one of {', '.join(SCHEDULES)}, got {self.schedule!r}")

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, OperatorPlan) and np.array_equal(self.assignment, other.assignment)
                and (self.microbatches, self.schedule, self.global_batch, self.precision)
                == (other.microbatches, other.schedule, other.global_batch, other.precision))

    def __hash__(self) -> int:
        return hash((self.assignment.tobytes(), self.microbatches, self.schedule, self.global_batch, self.precision))

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(int(d) for d in np.unique(self.assignment))

    def describe(self) -> str:
        return f"{len(self.devices)} device(s) M={self.microbatches} {self.schedule}"

    def body(self, graph: OpGraph) -> dict[str, Any]:
        return {"batch_size": self.global_batch, "microbatches": self.microbatches, "schedule": self.schedule,
                "precision": self.precision,
                "assignment": {node.id: int(d) for node, d in zip(graph.nodes, self.assignment, strict=True)}}
