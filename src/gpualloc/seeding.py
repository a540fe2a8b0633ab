"""One check for every public ``seed`` argument: the :func:`seeded` decorator (after networkx's
``py_random_state``).

A seed is ``None`` (fresh entropy), an integer in ``0..MAX_SEED`` (a numpy integer becomes a Python
``int``) or a numpy ``Generator`` (used as it is, so a caller can thread one stream through several
calls). Anything else (a negative or huge integer, a float, a bool, a string) is refused in one line
naming the function and the argument, which the CLI prints with exit status 2::

    @seeded()                      # checked, passed on as given (ints normalised)
    def plan(problem, *, seed=0): ...

    @seeded(to="generator")        # the function receives a numpy Generator
    def sample(n, seed=None): ...

    @seeded(to="int")              # the function receives an int (for a C library or scikit-learn)
    def partition(graph, seed=0): ...
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from gpualloc.errors import GpuallocError
from gpualloc.limits import MAX_SEED

F = TypeVar("F", bound=Callable[..., Any])


class SeedError(GpuallocError):
    """A ``seed`` argument that is not ``None``, an integer in ``0..MAX_SEED`` or a numpy ``Generator``."""


def check_seed(seed: Any, where: str = "seed", error: type[GpuallocError] = SeedError) -> Any:
    """``seed`` normalised: ``None`` and a numpy ``Generator`` (or ``SeedSequence``) as they are, an integer in
    ``0..MAX_SEED`` as a Python ``int``; anything else raises ``error`` naming ``where``, in one line."""
    if seed is None:
        return None
    if isinstance(seed, int) and not isinstance(seed, bool):
        if 0 <= seed <= MAX_SEED:
            return seed
    elif not isinstance(seed, (bool, float, str, bytes)):
        import numpy as np

        if isinstance(seed, np.integer) and 0 <= int(seed) <= MAX_SEED:
            return int(seed)
        if isinstance(seed, (np.random.Generator, np.random.SeedSequence)):
            return seed
    raise error(f"{where}: expected an integer in 0..{MAX_SEED:,}, None or a numpy Generator, got {seed!r}")


def seeded(name: str = "seed", *, to: Literal["as-is", "generator", "int"] = "as-is",
           error: type[GpuallocError] = SeedError) -> Callable[[F], F]:
    """Decorate a function whose argument ``name`` is a seed: it is checked (and normalised) by
    :func:`check_seed` before the function runs.

    Args:
        name: the argument's name.
        to: ``"as-is"`` passes the checked seed on; ``"generator"`` passes ``numpy.random.default_rng(seed)``
            (a Generator passes through unchanged); ``"int"`` passes an integer in ``0..MAX_SEED`` (an
            integer as it is; one drawn from a Generator, or from fresh entropy for ``None``).
        error: the error raised for a bad seed (the function's own domain error, e.g. ``TraceError``).
    """

    def decorate(func: F) -> F:
        params = list(inspect.signature(func).parameters.values())
        names = [p.name for p in params]
        if name not in names:
            raise TypeError(f"@seeded: {func.__qualname__} has no argument {name!r}")
        param = params[names.index(name)]
        index = names.index(name) if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD) else None
        where = f"{func.__qualname__.replace('.__init__', '')}: {name}"
        default = param.default if param.default is not param.empty else None
        check_seed(default, where, TypeError)  # a bad default is a programming error

        def convert(seed: Any) -> Any:
            seed = check_seed(seed, where, error)
            if to == "as-is" or (to == "int" and isinstance(seed, int)):
                return seed
            import numpy as np

            rng = np.random.default_rng(seed)
            return rng if to == "generator" else int(rng.integers(MAX_SEED + 1))

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if name in kwargs:
                kwargs[name] = convert(kwargs[name])
            elif index is not None and index < len(args):
                args = (*args[:index], convert(args[index]), *args[index + 1:])
            elif to != "as-is":
                kwargs[name] = convert(default)
            return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
