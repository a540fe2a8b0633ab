"""The engine: a plan run under ``torchrun`` with PyTorch's own distributed stack.

* :mod:`.topology`: the plan as ranks (a ``("pp", "dp", "tp")`` mesh), what the engine refuses, the loss scale
  of unequal shares;
* :mod:`.stages`: the model cut into a chain of pipeline stages;
* :mod:`.loss`: the per-sample training loss of each model family;
* :mod:`.parallelize`: tensor parallelism and the replica group's wrapping (DDP, ZeRO-1, FSDP2);
* :mod:`.rank`: the per-rank program (``python -m gpualloc.execute.engine``);
* :mod:`.record`: the run's record in the calibration format.

See docs/engine.md.
"""

from gpualloc.execute.engine.topology import RankSpec, Topology, loss_scale, topology

__all__ = ["RankSpec", "Topology", "loss_scale", "topology"]
