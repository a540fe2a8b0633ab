"""The telemetry backends by name: ``nvml`` (real GPUs), ``sim`` (the simulators), ``replay`` (a file).

:data:`BACKENDS` is a :class:`~gpualloc.registry.Registry` of lazy ``"module:factory"`` entries, so
naming a backend imports only that backend (``pynvml`` is never imported for ``sim``). Factories take
keyword options only and return a :class:`~gpualloc.telemetry.base.DeviceTelemetry`. The ``sim``
backend replays a cluster simulation, so its factory lives with the scheduler
(:mod:`gpualloc.scheduling.timeline`) and is only named here.
"""

from __future__ import annotations

from typing import Any

from gpualloc.registry import Registry
from gpualloc.telemetry.base import DeviceTelemetry, TelemetryError

__all__ = ["BACKENDS", "open_backend"]

BACKENDS: Registry[Any] = Registry("telemetry backend", TelemetryError)
"""Backend factories by name. ``nvml``: ``pcie``, ``energy``, ``nvml``, ``clock``; ``sim``: ``cluster``,
``trace``, ``jobs``, ``load``, ``policy``, ``seed``, ``step_s``, ``noise``; ``replay``: ``path``,
``loop``."""
BACKENDS.register("nvml", "gpualloc.telemetry.nvml:NvmlTelemetry")
BACKENDS.register("sim", "gpualloc.scheduling.timeline:sim_backend")
BACKENDS.register("replay", "gpualloc.telemetry.replay:ReplayTelemetry")


def open_backend(name: str, **options: Any) -> DeviceTelemetry:
    """Open the backend registered as ``name`` with keyword ``options``.

    Raises:
        TelemetryError: an unknown name, or the backend cannot start (no NVML, a bad file, ...).
    """
    return BACKENDS.create(name, **options)
