"""The framework's layer numbering of a graph: gpualloc's layers grouped into the units a framework splits.

A hybrid plan splits the graph's *layers* (:mod:`gpualloc.graph.layers`: runs of operators of one
module, 26 for ``gpt-tiny``). Training frameworks split coarser *units*:

* a **block** is a repeated module, named by its module path up to the first numbered component
  (``h.3`` in GPT-2, ``encoder.layer.3`` in BERT, ``layer2.0`` in a ResNet): Megatron-LM's transformer layer
  ``t`` number ``i``, torchtitan's ``layers.i``, one DeepSpeed ``LayerSpec``;
* the layers before the first block form one **embedding** unit (Megatron's ``E``, the modules torchtitan puts
  in the first model part), the layers after the last block one **head** unit (Megatron's ``L``: output layer
  and loss).

A layer that belongs to no module (``None``) joins the unit before it (the first unit when it leads). A graph
without numbered modules has one block per top-level module. A stage boundary is expressible in a framework
only at a unit edge; :func:`gpualloc.export.nearest.nearest_plan` moves the others to the nearest edge.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpualloc.graph.ir import OpGraph
from gpualloc.graph.layers import layer_of_node

__all__ = ["Units", "block_key", "units_of"]

EMBEDDING, BLOCK, HEAD = "embedding", "block", "head"


def block_key(module: str | None) -> str | None:
    """``h.3.attn.c_proj`` -> ``h.3``; ``wte`` -> None (no numbered component)."""
    if not module:
        return None
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i + 1]) if i > 0 else None
    return None


@dataclass(frozen=True)
class Units:
    """A graph's units in order.

    Attributes:
        kinds: ``embedding``, ``block`` or ``head`` per unit.
        fqns: the module paths (fully qualified names) each unit holds, in order: ``("wte", "wpe")`` for a GPT
            embedding, ``("h.0",)`` for a block.
        first_layer: the first graph layer of each unit (ascending, the first 0).
        layer_count: the graph's layer count.
    """

    kinds: tuple[str, ...]
    fqns: tuple[tuple[str, ...], ...]
    first_layer: tuple[int, ...]
    layer_count: int

    def __len__(self) -> int:
        return len(self.kinds)

    @property
    def blocks(self) -> int:
        """Blocks (the framework's transformer layers)."""
        return self.kinds.count(BLOCK)

    def last_layer(self, unit: int) -> int:
        return (self.first_layer[unit + 1] if unit + 1 < len(self) else self.layer_count) - 1

    def unit_of_layer(self, layer: int) -> int:
        return int(np.searchsorted(self.first_layer, layer, side="right")) - 1

    def is_edge(self, last_layer: int) -> bool:
        """Whether a stage may end at ``last_layer`` (the last layer of a unit)."""
        return last_layer == self.layer_count - 1 or (last_layer + 1) in self.first_layer

    def stage_units(self, last_layers: tuple[int, ...]) -> tuple[range, ...]:
        """The unit ranges of stages ending at unit edges ``last_layers``."""
        out, start = [], 0
        for last in last_layers:
            end = self.unit_of_layer(last) + 1
            out.append(range(start, end))
            start = end
        return tuple(out)


def units_of(graph: OpGraph) -> Units:
    """The units of ``graph`` (see the module docstring)."""
    layer_of = layer_of_node(graph)
    count = int(layer_of.max()) + 1
    module: list[str | None] = [None] * count
    for i in graph.topo_order:
        lay = int(layer_of[i])
        if module[lay] is None:
            module[lay] = graph.nodes[i].layer
    blocks = [block_key(m) for m in module]
    numbered = any(b is not None for b in blocks)
    if not numbered:  # no repeated modules: one block per top-level module (per layer where it has none)
        blocks = [m.split(".")[0] if m else f"layer{i}" for i, m in enumerate(module)]
    first_block = next((i for i, b in enumerate(blocks) if b is not None), count)
    last_block = max((i for i, b in enumerate(blocks) if b is not None), default=-1)

    kinds: list[str] = []
    fqns: list[list[str]] = []
    first: list[int] = []
    current: str | None = None
    for lay in range(count):
        if lay < first_block or lay > last_block:
            kind = EMBEDDING if lay < first_block else HEAD
            if not kinds or kinds[-1] != kind:
                kinds.append(kind), fqns.append([]), first.append(lay)
            top = module[lay].split(".")[0] if module[lay] else None
            if top and top not in fqns[-1]:
                fqns[-1].append(top)
            continue
        key = blocks[lay]
        if key is not None and key != current:
            if key in (f for names in fqns for f in names):  # a block revisited after another: keep it whole
                continue
            kinds.append(BLOCK), fqns.append([key]), first.append(lay)
            current = key
    return Units(tuple(kinds), tuple(tuple(f) for f in fqns), tuple(first), count)
