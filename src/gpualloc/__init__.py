"""gpualloc: allocate GPU resources for deep learning.

Placement inside one training job (partition an operator graph over heterogeneous devices) and
scheduling across jobs (a heterogeneous cluster simulator and policies), on one hardware catalog and
one cost model.
"""

__version__ = "0.1.0"
