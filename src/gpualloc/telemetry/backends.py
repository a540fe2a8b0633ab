"""The telemetry backends by name: ``nvml`` (real GPUs), ``sim`` (the simulators), ``replay`` (a file).

As with the scheduling policies, the registry maps a name to ``"module:factory"`` so that naming a
backend imports only that backend (``pynvml`` is never imported for ``sim``). Factories take keyword
options only and return a :class:`~gpualloc.telemetry.base.DeviceTelemetry`.
"""

from __future__ import annotations

import importlib
from typing import Any

from gpualloc.telemetry.base import DeviceTelemetry, TelemetryError

__all__ = ["BACKENDS", "open_backend"]

BACKENDS: dict[str, str] = {
    "nvml": "gpualloc.telemetry.nvml:NvmlTelemetry",
    "sim": "gpualloc.telemetry.sim:sim_backend",
    "replay": "gpualloc.telemetry.replay:ReplayTelemetry",
}
"""Backend factories by name. ``nvml``: ``pcie``, ``nvml``, ``clock``; ``sim``: ``cluster``,
``trace``, ``jobs``, ``load``, ``policy``, ``seed``, ``step_s``, ``noise``; ``replay``: ``path``,
``loop``."""


def open_backend(name: str, **options: Any) -> DeviceTelemetry:
    """Open the backend registered as ``name`` with keyword ``options``.

    Raises:
        TelemetryError: an unknown name, or the backend cannot start (no NVML, a bad file, ...).
    """
    try:
        target = BACKENDS[name]
    except KeyError:
        raise TelemetryError(f"unknown telemetry backend {name!r} (known: {', '.join(sorted(BACKENDS))})") from None
    module, factory = target.split(":")
    return getattr(importlib.import_module(module), factory)(**options)
