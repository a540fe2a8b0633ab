"""Calling native libraries that write to the process's standard output.

Some C/C++ libraries print diagnostics with ``printf`` whatever their own output options say
(METIS on tiny sub-graphs; HiGHS's MIP solver when it repairs an incumbent). Written to file
descriptor 1, those lines would land in the middle of a command's table or JSON. :func:`quiet_stdout`
sends them to ``/dev/null`` for the duration of one call.

A utility below every domain layer (it imports nothing from gpualloc).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

__all__ = ["quiet_stdout"]


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Send the native code's writes to file descriptor 1 to /dev/null for the duration (Python's
    buffered output is flushed first, so none of it is lost)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
