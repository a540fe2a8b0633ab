"""Arguments of the benchmark scripts, checked before any run: bad input is one line on stderr and
exit status 2 (the CLI's rule), never a traceback after minutes of simulation, and never a results
file written without the data it is meant to hold (a ``--data`` folder without the real traces).

Use :class:`Parser` instead of ``argparse.ArgumentParser``, the ``type=`` functions below for the
options, and :func:`guarded` around ``main`` for what only the library can check.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from gpualloc.errors import GpuallocError
from gpualloc.limits import MAX_SEED

T = TypeVar("T")


class Parser(argparse.ArgumentParser):
    """``argparse`` with errors in one line (``prog: message``) and exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


def guarded(main: Callable[[], T]) -> T:
    """Run ``main`` and return what it returns (an exit status, for some); a library error (bad input it
    found) is one line and exit status 2."""
    try:
        return main()
    except GpuallocError as err:
        print(f"{Path(sys.argv[0]).name}: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def between(low: int, high: int | None = None) -> Callable[[str], int]:
    """``type=``: an integer in ``low..high`` (no upper bound without ``high``)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{value} is above {high}")
        return value
    return parse


def at_least(low: int) -> Callable[[str], int]:
    """``type=``: an integer >= ``low``."""
    return between(low)


def seed(text: str) -> int:
    """``type=``: a seed, an integer in 0..2**32-1 (what numpy and torch take: ``gpualloc.limits.MAX_SEED``)."""
    return between(0, MAX_SEED)(text)


def _number(text: str, low: float, *, strict: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < low or (strict and value == low):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number {'>' if strict else '>='} {low:g}")
    return value


def positive(text: str) -> float:
    """``type=``: a finite number > 0."""
    return _number(text, 0.0, strict=True)


def non_negative(text: str) -> float:
    """``type=``: a finite number >= 0."""
    return _number(text, 0.0, strict=False)


def numbers(low: float = 0.0, *, strict: bool = False, empty: bool = False) -> Callable[[str], list[float]]:
    """``type=``: a comma-separated list of finite numbers >= ``low`` (> with ``strict``), non-empty
    unless ``empty``."""
    def parse(text: str) -> list[float]:
        values = [_number(x.strip(), low, strict=strict) for x in text.split(",") if x.strip()]
        if not values and not empty:
            raise argparse.ArgumentTypeError("expected one or more comma-separated numbers")
        return values
    return parse


def counts(text: str) -> list[int]:
    """``type=``: a non-empty comma-separated list of integers >= 0."""
    values = [at_least(0)(x.strip()) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected one or more comma-separated integers")
    return values


def library_check(check: Callable[[str], object], text: str) -> None:
    """``check(text)``, the library's own rule; its ``GpuallocError`` becomes argparse's one-line error."""
    try:
        check(text)
    except GpuallocError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def cluster(text: str) -> str:
    """``type=``: a cluster preset, shorthand or file that loads (kept as given)."""
    from gpualloc.hardware.cluster import load_cluster

    library_check(load_cluster, text)
    return text


def policies(text: str) -> tuple[str, ...]:
    """``type=``: a non-empty comma-separated list of registered scheduling policies."""
    from gpualloc.scheduling.policies import POLICIES

    names = tuple(p.strip() for p in text.split(",") if p.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected one or more comma-separated policies")
    for name in names:
        if name not in POLICIES:
            raise argparse.ArgumentTypeError(str(POLICIES.unknown(name)))
    return names


def real_data(text: str) -> Path:
    """``type=``: a data folder holding the real traces of the results table (``../shared/data``)."""
    from gpualloc.experiments.scheduling_table import require_real_traces

    library_check(require_real_traces, text)
    return Path(text)


def folder(*needs: str) -> Callable[[str], Path]:
    """``type=``: an existing folder holding a match of each glob pattern of ``needs`` (what the script
    reads from it), so a wrong ``--data`` fails before any run instead of after it or half-read."""
    def parse(text: str) -> Path:
        path = Path(text)
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: not a folder")
        for pattern in needs:
            if next(path.glob(pattern), None) is None:
                raise argparse.ArgumentTypeError(f"{text}: no {pattern} in it")
        return path
    return parse


def existing_file(text: str) -> Path:
    """``type=``: a file that exists (its content is the library's to check)."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return Path(text)


def output(text: str) -> Path:
    """``type=``: a file to write at the end of a run: not a folder, and in a folder that exists or can be
    made (the scripts create a missing one, as they do ``benchmarks/results``), so a run is not lost to
    an unwritable ``--out``."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a folder")
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: cannot write in {parent}")
    return path


def torch_cpu_args(description: str | None, out: Path) -> argparse.Namespace:
    """The arguments of a one-process CPU measurement: ``--threads`` (torch's, default 1: on a shared 2-core
    machine two threads wait on each other; applied here) and ``--out`` (default ``out``)."""
    parser = Parser(description=description)
    parser.add_argument("--threads", type=at_least(1), default=1, help="torch CPU threads")
    parser.add_argument("--out", type=output, default=out, help="results JSON")
    args = parser.parse_args()
    import torch  # once the arguments are checked: a bad one fails before torch loads

    torch.set_num_threads(args.threads)
    return args
