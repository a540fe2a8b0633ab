"""The worker loop both executors' processes run, and `next_message`: the one way the op-level and
hybrid worker pools turn a worker's error, death or silence into an ExecutionError."""

from __future__ import annotations

import queue
from dataclasses import dataclass

import pytest
import torch

from gpualloc.errors import ExecutionError
from gpualloc.execute.worker import WorkerLoop, next_message, run_step, serve_worker


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


@dataclass
class _Spec:
    rank: int = 3
    torch_device: str = "cpu"
    threads: int = 1


@pytest.fixture(autouse=True)
def _keep_torch_settings(monkeypatch):
    """The loop sets torch's threads and denormal flushing for its process: not for this one."""
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(torch, "set_flush_denormal", lambda on: True)


class _Echo(WorkerLoop):
    """Steps report the early data they found; ``("ping",)`` is answered apart."""

    def setup(self) -> None:
        self.ready = True

    def step(self, program: str, step: int, train: bool) -> dict:
        found, self.early = self.early, []
        return {"program": program, "train": train, "early": len(found)}

    def answer(self, msg: tuple) -> bool:
        if msg[0] != "ping":
            return False
        self.outbox.put(("pong", self.spec.rank))
        return True


class _Broken(_Echo):
    def step(self, program: str, step: int, train: bool) -> dict:
        raise ValueError("bad shapes\nsecond line")


def _serve(worker: type[WorkerLoop], *msgs: tuple) -> list[tuple]:
    inbox: queue.Queue = queue.Queue()
    outbox: queue.Queue = queue.Queue()
    for m in msgs:
        inbox.put(m)
    serve_worker(worker, _Spec(), inbox, outbox, [])
    return [outbox.get_nowait() for _ in range(outbox.qsize())]


def test_the_worker_loop_keeps_early_data_answers_commands_and_stops():
    out = _serve(_Echo, ("data", "act", 0), ("ping",), ("step", "train", 0, True), ("stop",), ("step", "x", 1, False))
    assert out[0][:2] == ("ready", 3)
    assert out[1:] == [("pong", 3), ("done", 3, 0, {"program": "train", "train": True, "early": 1})]


def test_a_failing_step_is_one_error_line_naming_where():
    out = _serve(_Broken, ("step", "train", 0, True))
    kind, rank, line = out[-1]
    assert (kind, rank) == ("error", 3)
    assert line.startswith("ValueError: bad shapes (at test_worker_pool.py:") and "\n" not in line


def test_run_step_collects_reports_in_rank_order_and_passes_outputs_on():
    inboxes = [queue.Queue(), queue.Queue()]
    replies = iter([("done", 1, 6, {"r": 1}), ("out", 0, "y", 0.5), ("done", 0, 7, {"r": 0}), ("done", 1, 7, {"r": 1})])
    seen = []
    reports = run_step(inboxes, lambda: next(replies), "train", 7, True, seen.append)
    assert reports == [{"r": 0}, {"r": 1}]  # the stale report of step 6 is not taken for step 7
    assert [b.get_nowait() for b in inboxes] == [("step", "train", 7, True)] * 2
    assert seen == [("done", 1, 6, {"r": 1}), ("out", 0, "y", 0.5)]
