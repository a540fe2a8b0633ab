"""Plans as configs that torchtitan, Megatron-LM and DeepSpeed launch (``gpualloc export``).

:func:`export_plan` maps a plan of either kind to the nearest plan the framework can express
(:mod:`gpualloc.export.nearest`), writes that plan in the framework's own format
(:mod:`gpualloc.export.frameworks`), and simulates both plans with the same problem and the same score
(:func:`gpualloc.placement.outcome.simulate_plan`), so the user sees what the framework gives up. Layers map to
the framework's units (:mod:`gpualloc.export.units`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpualloc.errors import PlacementError
from gpualloc.export.frameworks import FRAMEWORKS
from gpualloc.export.nearest import Nearest, nearest_plan
from gpualloc.export.units import Units, units_of
from gpualloc.placement.outcome import simulate_plan
from gpualloc.placement.plan import Plan
from gpualloc.placement.problem import PlacementProblem

__all__ = ["FRAMEWORKS", "Exported", "export_plan", "units_of"]


@dataclass(frozen=True)
class Exported:
    """A plan exported to one framework.

    Attributes:
        framework: ``torchtitan``, ``megatron`` or ``deepspeed``.
        text: the file.
        plan: the plan as given; ``nearest``: the expressible plan the file describes.
        units: the graph's units (the framework's layer numbering).
        dropped: what the framework could not express, one line each (empty: the file is the plan).
        step_time_s, exported_step_time_s: both plans simulated on the same problem.
        feasible, exported_feasible: whether each fits the devices' memory.
        rank_devices: the cluster device label of every framework rank.
    """

    framework: str
    text: str
    plan: Plan
    nearest: Nearest
    units: Units
    dropped: tuple[str, ...]
    step_time_s: float
    exported_step_time_s: float
    feasible: bool
    exported_feasible: bool
    rank_devices: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document (``dropped``, ``step_time_s`` and ``exported_step_time_s`` are exact keys)."""
        n = self.nearest
        return {"framework": self.framework, "dropped": list(self.dropped), "step_time_s": self.step_time_s,
                "exported_step_time_s": self.exported_step_time_s,
                "slowdown": self.exported_step_time_s / self.step_time_s if self.step_time_s > 0 else None,
                "feasible": self.feasible, "exported_feasible": self.exported_feasible,
                "plan": self.plan.describe(), "exported_plan": n.plan.describe(),
                "degrees": {"pp": n.pp, "dp": n.dp, "tp": n.tp, "micro_batch": n.micro_batch,
                            "microbatches": n.plan.microbatches, "global_batch": n.plan.global_batch},
                "stage_units": [[",".join(self.units.fqns[u]) for u in rng] for rng in n.stage_units],
                "rank_devices": list(self.rank_devices)}


def export_plan(problem: PlacementProblem, plan: Plan, to: str, *, steps: int = 1000,
                header: tuple[str, ...] = ()) -> Exported:
    """Export ``plan`` (made for ``problem``) to framework ``to``.

    Args:
        problem: the plan's graph and cluster, at the plan's precision and microbatch count.
        plan: either kind.
        to: a key of :data:`FRAMEWORKS`.
        steps: training steps written where the framework takes them.
        header: comment lines for the file's head (formats without comments leave them out).

    Raises:
        PlacementError: an unknown framework, or a plan the problem does not fit.
    """
    if to not in FRAMEWORKS:
        raise PlacementError(f"--to: unknown framework {to!r}; known: {', '.join(FRAMEWORKS)}")
    target = FRAMEWORKS[to]
    units = units_of(problem.graph)
    mine = simulate_plan(problem, plan)
    near = nearest_plan(problem, plan, units, target.framework)
    theirs = simulate_plan(near.problem, near.plan)
    labels = [d.label for d in problem.cluster.devices]
    ranks = tuple(labels[d] for d in near.rank_devices())
    lines = (*header, f"exported plan: {near.plan.describe()}",
             *(f"dropped: {d}" for d in near.dropped),
             "rank -> device: " + ", ".join(f"{r}={lab}" for r, lab in enumerate(ranks)))
    text = target.write(near, units, {"steps": steps, "header": lines})
    return Exported(to, text, plan, near, units, near.dropped, float(mine.step_time_s), float(theirs.step_time_s),
                    bool(mine.feasible), bool(theirs.feasible), ranks)
