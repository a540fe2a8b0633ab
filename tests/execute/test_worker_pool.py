"""`next_message`: the one way the op-level and hybrid worker pools turn a worker's error, death or
silence into an ExecutionError."""

from __future__ import annotations

import queue
from dataclasses import dataclass

import pytest

from gpualloc.errors import ExecutionError
from gpualloc.execute.worker import next_message


@dataclass
class _Proc:
    name: str
    alive: bool = True
    exitcode: int | None = None

    def is_alive(self) -> bool:
        return self.alive


def test_messages_pass_and_errors_name_the_worker_after_cleaning_up():
    box: queue.Queue = queue.Queue()
    stopped = []
    box.put(("done", 0, 1))
    box.put(("error", 1, "boom"))
    procs = [_Proc("w0"), _Proc("w1")]
    assert next_message(box, procs, 5.0, str) == ("done", 0, 1)
    with pytest.raises(ExecutionError, match="worker for stage-1 failed: boom"):
        next_message(box, procs, 5.0, lambda i: f"stage-{i}", lambda: stopped.append(True))
    assert stopped == [True]


def test_a_dead_worker_and_a_silent_pool_become_one_error():
    box: queue.Queue = queue.Queue()
    with pytest.raises(ExecutionError, match=r"worker w1 died \(exit code -9\)"):
        next_message(box, [_Proc("w0"), _Proc("w1", alive=False, exitcode=-9)], 5.0, str)
    with pytest.raises(ExecutionError, match="no answer from the workers in 0 s"):
        next_message(box, [_Proc("w0")], 0.0, str)
