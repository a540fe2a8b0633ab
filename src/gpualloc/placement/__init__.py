"""Placement inside one training job: partition an operator graph over a cluster's devices."""

from gpualloc.placement.problem import PlacementProblem

__all__ = ["PlacementProblem"]
