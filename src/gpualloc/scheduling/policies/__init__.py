"""Scheduling policies behind one protocol (:class:`gpualloc.scheduling.base.Policy`).

:data:`POLICIES` is a :class:`~gpualloc.registry.Registry` of lazy ``"module:factory"`` entries;
factories take keyword options only. The learned ``dqn`` policy lives in the learning layer
(:mod:`gpualloc.rl.sched_policy`) and is listed here by name only, so this layer never imports it.
"""

from __future__ import annotations

from typing import Any

from gpualloc.errors import SchedulingError
from gpualloc.registry import Registry
from gpualloc.scheduling.base import Policy

POLICIES: Registry[Any] = Registry("policy", SchedulingError)
"""Policy factories by name; an entry's ``options`` are the keyword options callers may forward."""

for _name, _target in (("fcfs", "simple:FCFS"), ("static-affinity", "simple:StaticAffinity"), ("sjf", "simple:SJF"),
                       ("srtf", "simple:SRTF"), ("easy-backfill", "simple:EasyBackfill"),
                       ("tiresias", "las:Tiresias"), ("gavel", "hetero:Gavel"),
                       ("gavel-srtf", "hetero:GavelShortestFirst")):
    POLICIES.register(_name, f"gpualloc.scheduling.policies.{_target}", tags=("heuristic",))
POLICIES.register("dqn", "gpualloc.rl.sched_policy:learned_policy", tags=("learned",), options=("agent",))


def make_policy(name: str, **options: Any) -> Policy:
    """Instantiate the policy registered as ``name`` with keyword ``options``.

    Raises:
        SchedulingError: an unknown name (the message lists the known ones).
    """
    return POLICIES.create(name, **options)
