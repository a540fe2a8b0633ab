"""Scheduling policies behind one protocol (:class:`gpualloc.scheduling.base.Policy`).

The registry maps a name to ``"module:factory"``; factories take keyword options only.
"""

from __future__ import annotations

import importlib
from typing import Any

from gpualloc.errors import SchedulingError
from gpualloc.scheduling.base import Policy

POLICIES: dict[str, str] = {
    "fcfs": "gpualloc.scheduling.policies.simple:FCFS",
    "static-affinity": "gpualloc.scheduling.policies.simple:StaticAffinity",
    "sjf": "gpualloc.scheduling.policies.simple:SJF",
    "srtf": "gpualloc.scheduling.policies.simple:SRTF",
    "easy-backfill": "gpualloc.scheduling.policies.simple:EasyBackfill",
    "tiresias": "gpualloc.scheduling.policies.las:Tiresias",
    "gavel": "gpualloc.scheduling.policies.hetero:Gavel",
    "dqn": "gpualloc.scheduling.policies.learned:DQNPolicy",
}


def make_policy(name: str, **options: Any) -> Policy:
    """Instantiate the policy registered as ``name`` with keyword ``options``."""
    try:
        target = POLICIES[name]
    except KeyError:
        raise SchedulingError(f"unknown policy {name!r} (known: {', '.join(sorted(POLICIES))})") from None
    module, factory = target.split(":")
    return getattr(importlib.import_module(module), factory)(**options)
