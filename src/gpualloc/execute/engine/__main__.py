"""``python -m gpualloc.execute.engine ...``: the per-rank program ``torchrun`` runs (:func:`rank.main`)."""

import sys

from gpualloc.execute.engine.rank import main

if __name__ == "__main__":
    sys.exit(main())
