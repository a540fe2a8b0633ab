"""Documented upper bounds on every size a user can ask for, in one place.

Each bound is far above any real use and far below what would exhaust memory or hang the program.
The parsers and the library check them (:func:`check_size`), so the CLI, the service and the Python
API all refuse the same inputs; the CLI also shows them in ``--help`` (Typer ``max=``).
"""

from __future__ import annotations

from gpualloc.errors import GpuallocError

MAX_MICROBATCHES = 4096
"""Pipeline microbatches per training step."""

MAX_BATCH = 1 << 20
"""Batch size of a captured or costed model (samples per step)."""

MAX_DEVICES = 16_384
"""Devices of one cluster, and of one shorthand term or cluster-file node entry."""

MAX_NODE_COUNT = 4096
"""``count`` of one node entry of a cluster file (identical nodes)."""

MAX_JOBS = 1_000_000
"""Jobs generated or read from one trace."""

MAX_STEPS = 100_000_000
"""Training steps, iterations, samples, seeds or repeats of any loop the user sizes."""

MAX_SEED = 2**32 - 1
"""Largest seed (numpy and torch both accept 0..2**32-1)."""

MAX_TOP = 100_000
"""Rows of a listing (``graph show --top``)."""


def check_size(value: int, field: str, maximum: int, error: type[GpuallocError], *, minimum: int = 1) -> int:
    """``value`` if it is an integer in ``minimum..maximum``, else ``error`` naming ``field`` and the bound."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise error(f"{field}: expected an integer in {minimum:,}..{maximum:,}, got {value!r}")
    return value


def check_seed(seed: object, error: type[GpuallocError], field: str = "seed") -> object:
    """``seed`` unchanged if it is ``None``, a numpy ``Generator`` or an integer in ``0..MAX_SEED``."""
    if seed is None or not isinstance(seed, (int, float, str)) or isinstance(seed, bool):
        return seed  # None, a Generator or a SeedSequence: numpy normalises them
    return check_size(seed, field, MAX_SEED, error, minimum=0)
