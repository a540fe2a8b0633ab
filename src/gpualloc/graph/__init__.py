"""What a model is: the operator-graph IR, capture from PyTorch, the model zoo, importers."""

from gpualloc.graph.ir import OpEdge, OpGraph, OpNode, OpTiming

__all__ = ["OpEdge", "OpGraph", "OpNode", "OpTiming"]
