"""Optional parts of gpualloc, and the one message for a part that is not installed.

The bare ``pip install gpualloc`` plans and simulates. The rest comes with an extra
(``pyproject.toml``'s ``[project.optional-dependencies]``; ``tests/test_extras.py`` keeps :data:`EXTRAS`
in step with it):

- ``service``: ``gpualloc serve`` and its client commands (FastAPI, uvicorn, SQLAlchemy, httpx);
- ``ray``: the service's Ray backend and ``reproduce --ray``;
- ``slurm``: the service's Slurm backend, which is the ``service`` extra (Slurm itself, ``slurm-wlm`` and
  ``munge``, comes from the system's packages; ``--cluster slurm:`` needs no extra);
- ``nvml``: reading NVIDIA GPUs through NVML (``gpualloc monitor``'s default backend);
- ``execute``: running plans on real devices, which needs nothing beyond the core (torch with gloo).

Every import of one of these goes through :func:`require` (or, at a module's top, a ``try`` that raises
:func:`missing_extra`), so a missing extra is one line naming it, never a ``ModuleNotFoundError``
traceback.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType, ModuleType

from gpualloc.errors import ExtraMissingError, GpuallocError

__all__ = ["EXTRAS", "missing_extra", "require"]

EXTRAS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "service": ("fastapi", "uvicorn", "sqlalchemy", "httpx"),
    "ray": ("ray",),
    "slurm": ("fastapi", "uvicorn", "sqlalchemy", "httpx"),
    "nvml": ("pynvml",),
    "execute": (),
})
"""The modules each extra provides, by import name (``nvidia-ml-py`` is imported as ``pynvml``)."""


def missing_extra(extra: str, by: str, error: type[GpuallocError] = ExtraMissingError) -> GpuallocError:
    """The error for ``by`` (what the user asked for, e.g. ``"gpualloc serve"``) without ``extra``."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
    return error(f"{by} needs the {extra!r} extra: pip install 'gpualloc[{extra}]'")


def require(extra: str, module: str, *, by: str, error: type[GpuallocError] = ExtraMissingError) -> ModuleType:
    """Import ``module``, which ``extra`` installs, or raise ``error`` in one line naming the extra.

    Args:
        extra: the extra that installs ``module`` (a key of :data:`EXTRAS`).
        module: what to import, e.g. ``"ray"`` or ``"ray.util.placement_group"``.
        by: what needs it, as the user asked for it: ``"gpualloc serve --backend ray"``.
        error: the :class:`~gpualloc.errors.GpuallocError` to raise, where the caller's callers catch a
            narrower one (a telemetry backend raises ``TelemetryError``).

    Returns:
        the imported module.
    """
    if module.partition(".")[0] not in EXTRAS.get(extra, ()):
        raise ValueError(f"{module!r} is not in the {extra!r} extra ({', '.join(EXTRAS.get(extra, ())) or 'none'})")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        raise missing_extra(extra, by, error) from err
    except ImportError as err:  # installed but broken (a missing shared library, a wrong version)
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise error(f"{missing_extra(extra, by, error)} ({module} is installed but does not import: {why})") from err
