"""Where independent runs execute: in this process, in local worker processes, or as Ray tasks.

One protocol, :class:`Executor`, with one method: ``map(fn, items)`` returns ``[fn(x) for x in
items]`` in the order of ``items``, whatever order the work finishes in. ``fn`` must be a top-level
(picklable) function and the items small picklable values, so that the same call runs unchanged on
a laptop (:class:`SerialExecutor`, :class:`ProcessExecutor`) or a Ray cluster (:class:`RayExecutor`).
Each item is computed independently from its own arguments (seeds included), so results do not
depend on the executor.

Ray is imported only by :class:`RayExecutor`; nothing else needs it installed.

A utility below every domain layer (it imports nothing from gpualloc): the experiments and the
learning code (:func:`gpualloc.rl.dqn.distributed.train_distributed`) both fan runs out through it.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Protocol, TypeVar

__all__ = ["Executor", "ProcessExecutor", "RayExecutor", "SerialExecutor", "make_executor"]

T = TypeVar("T")
R = TypeVar("R")

OnResult = Callable[[int, Any], None]
"""``on_result(index, result)``: called in the caller's process as each item finishes (any order)."""


class Executor(Protocol):
    """Runs independent calls of one function; results come back in input order."""

    def map(self, fn: Callable[[T], R], items: Iterable[T], *, on_result: OnResult | None = None) -> list[R]:
        """``[fn(x) for x in items]``; ``on_result`` sees each result as it arrives."""
        ...

    def close(self) -> None:
        """Release workers (idempotent)."""
        ...


class _Closing:
    def close(self) -> None:
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SerialExecutor(_Closing):
    """Everything in the calling process, one item after another (the default)."""

    def map(self, fn: Callable[[T], R], items: Iterable[T], *, on_result: OnResult | None = None) -> list[R]:
        out = []
        for i, item in enumerate(items):
            out.append(fn(item))
            if on_result is not None:
                on_result(i, out[-1])
        return out


class ProcessExecutor(_Closing):
    """A local pool of ``workers`` processes started with ``spawn``.

    ``spawn`` rather than ``fork``: the parent may hold torch's thread pools and OpenMP state, which
    a forked child inherits in a broken state; a spawned child imports its own. The pool starts on
    the first :meth:`map` and is reused until :meth:`close`.
    """

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"ProcessExecutor: workers must be >= 1 (got {workers})")
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def map(self, fn: Callable[[T], R], items: Iterable[T], *, on_result: OnResult | None = None) -> list[R]:
        items = list(items)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        futures = {self._pool.submit(fn, item): i for i, item in enumerate(items)}
        out: list[Any] = [None] * len(items)
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                i = futures[fut]
                out[i] = fut.result()
                if on_result is not None:
                    on_result(i, out[i])
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


class RayExecutor(_Closing):
    """Each item is one Ray task (one CPU each).

    Args:
        address: an existing cluster (``"auto"``, ``"ray://head:10001"``, ...); None starts a local
            Ray, or joins the one already initialised in this process.
        num_cpus: CPUs of a locally started Ray (None: all of them).
        temp_dir: Ray's session folder for a locally started Ray. Keep it short: Ray puts unix
            sockets under it and socket paths are limited to about 107 bytes.

    Ray is shut down on :meth:`close` only if this executor started it. On a cluster the workers
    import :mod:`gpualloc` themselves (install it on every node or use a ``runtime_env``), and path
    arguments (agent checkpoints, traces) must name files that every node can read.
    """

    def __init__(self, address: str | None = None, num_cpus: int | None = None, temp_dir: str | None = None) -> None:
        from gpualloc._extras import require

        ray = require("ray", "ray", by="the Ray executor (--ray, --ray-address)")
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, _temp_dir=temp_dir,
                     ignore_reinit_error=True, log_to_driver=False)
        self._remote: dict[Callable, Any] = {}

    def map(self, fn: Callable[[T], R], items: Iterable[T], *, on_result: OnResult | None = None) -> list[R]:
        ray = self._ray
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = ray.remote(fn)
        refs = [remote.remote(item) for item in items]
        index = {ref: i for i, ref in enumerate(refs)}
        out: list[Any] = [None] * len(refs)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                i = index[ref]
                out[i] = ray.get(ref)
                if on_result is not None:
                    on_result(i, out[i])
        return out

    def close(self) -> None:
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
        self._started = False


def make_executor(ray: bool = False, ray_address: str | None = None, workers: int | None = None,
                  temp_dir: str | None = None) -> SerialExecutor | ProcessExecutor | RayExecutor:
    """The executor the CLI options ``--ray``, ``--ray-address`` and ``--workers`` ask for.

    A Ray address implies Ray. With Ray, ``workers`` caps the CPUs of a locally started Ray. Without
    it, more than one worker means local processes, otherwise everything runs in this process.
    """
    if ray or ray_address is not None:
        return RayExecutor(ray_address, num_cpus=workers if ray_address is None else None, temp_dir=temp_dir)
    if workers is not None and workers > 1:
        return ProcessExecutor(workers)
    return SerialExecutor()
