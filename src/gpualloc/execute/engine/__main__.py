"""``python -m gpualloc.execute.engine ...``: the per-rank program ``torchrun`` runs (:func:`rank.main`).

MKL's own memory manager is off in every rank (``MKL_DISABLE_FAST_MM=1``, read when torch loads MKL, so before
``rank`` imports torch; a value the user set is kept). With it on, MKL keeps a buffer pool of its own past each
matmul, sized per shape: on an AMX Xeon, gpt-tiny's first step left 13 MB behind (three GEMM shapes, 4.6-5.9 MB
each), which ``mallinfo2`` (a CPU rank's memory probe, :class:`~gpualloc.execute.measure.MemoryProbe`) counts as
the step's while no memory model predicts it. With it off, what a CPU rank has allocated is its tensors and the
runtime's, as ``torch.cuda.max_memory_allocated`` is on a GPU (whose matmuls never reach MKL)."""

import os
import sys

os.environ.setdefault("MKL_DISABLE_FAST_MM", "1")

from gpualloc.execute.engine.rank import main  # noqa: E402  (torch loads MKL: after the line above)

if __name__ == "__main__":
    sys.exit(main())
