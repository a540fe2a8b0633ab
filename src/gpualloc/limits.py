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

MAX_INPUT_ELEMENTS = 1 << 28
"""Elements of the example inputs made from ``graph capture --input-shape`` (batch included): 1 GiB of fp32."""

MAX_NODE_FLOPS = 1e21
"""Forward FLOPs of one graph node: ~500x a whole forward pass of a 1-trillion-parameter model over a million
tokens (2e18); a node beyond it is a unit error, and would take longer than a year on any device."""

MAX_NODE_BYTES = float(1 << 60)
"""Bytes a graph node or edge reads, writes, holds or sends (1 EiB)."""

MAX_SEED = 2**32 - 1
"""Largest seed (numpy and torch both accept 0..2**32-1)."""

MAX_TOP = 100_000
"""Rows of a listing (``graph show --top``)."""


YEAR_S = 365.25 * 86_400

MAX_TRACE_S = 10 * YEAR_S
"""A trace's time span: a job's arrival (seconds after the trace starts), ten years."""

MAX_WORK_S = 10 * YEAR_S
"""A job's work: ten years alone on its GPUs (the longest real trace job, in Philly, ran 54 days; a 16,384-GPU
job of this length is 5e12 GPU-seconds, so sums over a million jobs stay far from overflow)."""

MAX_OP_TIME_MS = MAX_WORK_S * 1e3
"""A measured op time in a graph (``time_ms``): ten years (as a job's work), in milliseconds."""

MAX_CPU_CORES = 1 << 20
"""CPU cores one job asks for."""

MAX_MEM_BYTES = 1 << 50
"""Host memory one job asks for (1 PiB)."""

MAX_PRIORITY = 10**9
"""Largest priority magnitude (priorities lie in -MAX_PRIORITY..MAX_PRIORITY)."""

TRACE_LIMITS: dict[str, tuple[float, float, str]] = {
    "arrival_s": (0.0, MAX_TRACE_S, "10 years"),
    "work_s": (0.0, MAX_WORK_S, "10 years"),
    "num_gpus": (1, MAX_DEVICES, "the devices of the largest cluster"),
    "cpu_cores": (0.0, MAX_CPU_CORES, "2^20 cores"),
    "mem_bytes": (0, MAX_MEM_BYTES, "1 PiB"),
    "priority": (-MAX_PRIORITY, MAX_PRIORITY, "10^9"),
    "batch_size": (0, MAX_BATCH, "2^20"),
}
"""Every numeric field of a trace's job: ``field -> (minimum, maximum, the maximum in words)``. Each reader
checks the jobs it builds against these with :func:`check_trace_fields` (a field added to jobs gets its
bound here)."""


def check_trace_fields(columns, where, error: type[GpuallocError]) -> None:
    """Refuse a job field outside :data:`TRACE_LIMITS` (or not finite), naming the row and the field.

    Args:
        columns: field name -> the values of every job (a sequence or array; fields without a bound
            are ignored).
        where: row index -> where that row is (``"philly.csv:12"``).
        error: the error raised, one line: ``philly.csv:12: arrival_s: 1e+308 is above the limit of
            315,576,000 (10 years)``.
    """
    import numpy as np

    for name, (low, high, words) in TRACE_LIMITS.items():
        values = columns.get(name)
        if values is None or len(values) == 0:
            continue
        arr = np.asarray(values, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            bad = ~((arr >= low) & (arr <= high))
        if bad.any():
            i = int(np.argmax(bad))
            value = arr[i]
            if value > high:
                why = f"above the limit of {high:,.0f} ({words})"
            elif value < low:
                why = f"below the minimum of {low:,.0f}"
            else:
                why = "not a finite number"
            raise error(f"{where(i)}: {name}: {values[i]!r} is {why}")


def check_size(value: int, field: str, maximum: int, error: type[GpuallocError], *, minimum: int = 1) -> int:
    """``value`` if it is an integer in ``minimum..maximum``, else ``error`` naming ``field`` and the bound."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise error(f"{field}: expected an integer in {minimum:,}..{maximum:,}, got {value!r}")
    return value
