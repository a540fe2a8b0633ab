"""The gpualloc-graph JSON document: pydantic models at the input edge, and its JSON Schema.

``validate_graph_document`` checks untrusted JSON field by field;
:func:`gpualloc.graph.ir.parse_graph_document` then builds the :class:`~gpualloc.graph.ir.OpGraph` (which
checks the structure: ids, dangling edges, cycles). This module does not import the IR, so the IR reads
its documents through it without an import cycle. ``json_schema()`` is what docs/graph-format.md publishes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpualloc.errors import GraphError
from gpualloc.limits import MAX_BATCH

FORMAT = "gpualloc-graph"
VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TimingDoc(_Strict):
    """Measured time of one op on one device type, milliseconds for the graph's batch."""

    fwd: float = Field(ge=0)
    bwd: float | None = Field(default=None, ge=0)


class NodeDoc(_Strict):
    """One operator."""

    id: str = Field(min_length=1)
    name: str | None = None
    kind: str = "op"
    flops: float = Field(default=0.0, ge=0, description="forward FLOPs for the batch; multiply-add = 2")
    bytes_read: float = Field(default=0.0, ge=0)
    bytes_written: float = Field(default=0.0, ge=0)
    param_bytes: float = Field(default=0.0, ge=0)
    output_bytes: float = Field(default=0.0, ge=0)
    time_ms: dict[str, TimingDoc] = Field(default_factory=dict, description="by device type name")
    layer: str | None = None
    output_shape: list[int] | None = None


class EdgeDoc(_Strict):
    """Data from src to dst (forward activation; the same bytes of gradient flow back)."""

    src: str
    dst: str
    bytes: float = Field(default=0.0, ge=0)


class TiedDoc(_Strict):
    """A weight several nodes read (a tied embedding); ``nodes[0]`` owns it (its param_bytes count it)."""

    name: str = Field(min_length=1)
    bytes: float = Field(ge=0, description="the weight's bytes (fp32, as param_bytes)")
    nodes: list[str] = Field(min_length=2, description="the nodes that read it, the owner first")


class GraphDoc(_Strict):
    """A gpualloc-graph document."""

    format: Literal["gpualloc-graph"]
    version: Literal[1]
    name: str = "graph"
    batch_size: int | None = Field(default=None, ge=1, le=MAX_BATCH)
    meta: dict[str, Any] = Field(default_factory=dict)
    nodes: list[NodeDoc] = Field(min_length=1)
    edges: list[EdgeDoc] = Field(default_factory=list)
    tied: list[TiedDoc] = Field(default_factory=list, description="weights several nodes read")


def _locate(data: Any, loc: tuple[Any, ...]) -> str:
    """Render a pydantic error location, naming the node or edge by its id where possible."""
    parts: list[str] = []
    node: Any = data
    for key in loc:
        if isinstance(key, int):
            label = f"[{key}]"
            if isinstance(node, list) and 0 <= key < len(node) and isinstance(node[key], dict):
                item = node[key]
                if "id" in item:
                    label = f"[{key}] (id {item['id']!r})"
                elif "src" in item or "dst" in item:
                    label = f"[{key}] ({item.get('src')!r} -> {item.get('dst')!r})"
            parts.append(label)
        else:
            parts.append(("." if parts else "") + str(key))
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            node = None
    return "".join(parts) or "document"


def validate_graph_document(data: Any, where: str = "graph") -> GraphDoc:
    """Validate a decoded JSON document (format, version, fields), or raise a one-line GraphError.

    :func:`gpualloc.graph.ir.parse_graph_document` builds the :class:`~gpualloc.graph.ir.OpGraph` from it.
    """
    if isinstance(data, dict) and data.get("format") != FORMAT:
        raise GraphError(f"{where}: format: expected {FORMAT!r}, got {data.get('format')!r}")
    if isinstance(data, dict) and data.get("version") != VERSION:
        raise GraphError(f"{where}: version: this gpualloc reads version {VERSION}, got {data.get('version')!r}")
    try:
        return GraphDoc.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        raise GraphError(f"{where}: {_locate(data, first['loc'])}: {first['msg']}") from err


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the gpualloc-graph format (version 1)."""
    schema = GraphDoc.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://gpualloc.dev/schema/gpualloc-graph-v1.json"
    return schema
