"""Captured zoo graphs kept in a :class:`~gpualloc.cache.DiskCache`, so a command that names a zoo model
traces it once, not on every call (tracing ResNet-50 takes ~15 s; reading its graph back, ~0.1 s).

A cached graph is keyed by the model's name, the batch, the granularity, the torch version, the
gpualloc version and a hash of the capture code (:data:`CAPTURE_SOURCES`): editing the zoo or the
tracer invalidates every entry. Only zoo models are cached; a ``package.module:factory`` model is
user code this key cannot see, so it is traced every time. This module does not import torch: a
cache hit costs no torch import.
"""

from __future__ import annotations

from importlib import metadata

from gpualloc.cache import DiskCache, code_key
from gpualloc.errors import GraphError
from gpualloc.graph.ir import OpGraph

KIND = "graphs"
"""The cache's sub-folder for captured graphs."""

CAPTURE_SOURCES = ("graph/capture.py", "graph/zoo.py", "graph/activations.py", "graph/recipe.py", "graph/ir.py",
                   "graph/schema.py")
"""The code a captured graph depends on (package-relative)."""


def capture_key(model: str, batch: int, granularity: str = "op") -> dict:
    """The cache key of ``capture(model, batch=batch, granularity=granularity)``."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    return {"model": model, "batch": int(batch), "granularity": granularity, "torch": torch_version,
            **code_key(CAPTURE_SOURCES)}


def is_zoo_name(model: str) -> bool:
    """A zoo name (``resnet50``), as opposed to ``package.module:factory`` or a file."""
    return ":" not in model and "/" not in model and not model.endswith((".json", ".txt"))


def capture_cached(model: str, *, batch: int = 1, granularity: str = "op", cache: DiskCache | None = None) -> OpGraph:
    """:func:`gpualloc.graph.capture.capture` of ``model``, read from ``cache`` when a zoo model's graph is
    stored there for the same key, else traced (and stored). ``cache=None`` always traces.

    A stored graph that no longer parses (a corrupt entry, or one the current schema refuses) is
    traced again and rewritten, never an error.
    """
    cacheable = cache is not None and is_zoo_name(model)
    if cacheable:
        key = capture_key(model, batch, granularity)
        doc = cache.get(KIND, key)
        if doc is not None:
            try:
                return OpGraph.from_dict(doc, str(cache.path(KIND, key)))
            except GraphError:
                pass  # unusable entry: trace again below, and overwrite it
    from gpualloc.graph.capture import capture

    graph = capture(model, batch=batch, granularity=granularity)
    if cacheable:
        cache.put(KIND, key, graph.to_dict())
    return graph
