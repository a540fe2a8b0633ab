"""One device's worker process: runs its stages of a split model, microbatch by microbatch.

A worker owns one cluster device (a ``cuda:i`` GPU or a share of the CPU's threads) and the stages
placed on it. It is a separate process, so each CPU worker has its own torch thread pool, and
activations really move: a value another worker needs is sent through that worker's inbox (CPU
tensors go through shared memory; a GPU worker copies to the host first and the receiver copies to
its device).

Each step the worker list-schedules its tasks like :mod:`gpualloc.placement.simulate` does:

* ``"1f1b"``: a ready backward first (oldest microbatch, last stage first); else a ready forward of an
  admitted microbatch, where microbatches are admitted in order and at most ``inflight_limit`` at once
  (the simulator's, :func:`gpualloc.placement.simulate.inflight_limits`);
* ``"gpipe"``: forwards (oldest microbatch, first stage first), and backwards only once every forward
  of the worker is done.

The loss is the mean of each floating-point model output (its gradient, ``1 / numel``, needs no
labels); after the last backward the worker's optimizer (:data:`OPTIMIZERS`) updates its parameters.

A step run with ``memory=True`` (:func:`run_step`) is also measured by the worker's
:class:`~gpualloc.execute.measure.MemoryProbe` and reports its :class:`~gpualloc.execute.measure.MemoryReport`
under ``"memory"``; the probe samples after every op, so the runners keep it off their timed steps.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
import traceback
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

with warnings.catch_warnings():  # its functional optimizers still use torch.jit.script, deprecated in torch 2.13
    warnings.simplefilter("ignore", DeprecationWarning)
    # imported with the module, not after a worker's memory baseline (its first import is ~3 MB of Python)
    from torch.distributed.optim import ZeroRedundancyOptimizer

from gpualloc.cost.microbench import set_tf32
from gpualloc.errors import ExecutionError
from gpualloc.execute.measure import MemoryProbe, MemoryReport, TaskClock, synchronize, tensor_bytes
from gpualloc.execute.split import Stage

__all__ = ["OPTIMIZERS", "ProgramTable", "WorkerLoop", "WorkerPool", "WorkerSpec", "make_optimizer", "to_host",
           "worker_main"]

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}
"""The optimizers the runners train with, by name (torch's defaults but the learning rate)."""


def make_optimizer(name: str, params: list[torch.nn.Parameter], lr: float,
                   shard_group: Any = None) -> torch.optim.Optimizer:
    """Optimizer ``name`` (:data:`OPTIMIZERS`) over ``params``; with ``shard_group`` (a process group) its
    state is sharded among that group's ranks (ZeRO stage 1, Rajbhandari et al., SC 2020), through
    ``torch.distributed.optim.ZeroRedundancyOptimizer``: each rank steps its part of ``params`` and
    broadcasts it to the others. Gradients must already be reduced (the runners all-reduce them).

    Raises:
        ExecutionError: an unknown optimizer name.
    """
    if name not in OPTIMIZERS:
        raise ExecutionError(f"optimizer: expected one of {', '.join(OPTIMIZERS)}, got {name!r}")
    if shard_group is None:
        return OPTIMIZERS[name](params, lr=lr)
    return ZeroRedundancyOptimizer(params, optimizer_class=OPTIMIZERS[name], process_group=shard_group, lr=lr)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of the tensors in ``optimizer``'s state (a ZeRO optimizer's local shard)."""
    if optimizer is None:
        return 0
    local = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard's optimizer here
    return tensor_bytes(v for state in local.state.values() for v in state.values())

_POLL_S = 5.0


@dataclass(frozen=True)
class ProgramTable:
    """A split model as one worker sees it: its own stages, and where every value comes from and goes.

    Attributes:
        stages: this worker's stages, by stage index.
        stage_worker: worker rank of every stage of the program.
        producer: value name -> producing stage index.
        consumers: value name -> stage indices reading it from another stage.
        differentiable: values whose gradients flow back.
        outputs: the model's output values.
    """

    stages: Mapping[int, Stage]
    stage_worker: tuple[int, ...]
    producer: Mapping[str, int]
    consumers: Mapping[str, tuple[int, ...]]
    differentiable: frozenset[str]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process starts from.

    Attributes:
        rank: worker index.
        torch_device: ``"cpu"`` or ``"cuda:i"``.
        threads: torch intra-op threads of this worker.
        programs: program name (``"train"``, ``"check"``) -> its table.
        inputs: model input name -> microbatches (only the inputs this worker's stages read).
        microbatches: microbatches per step.
        schedule: ``"1f1b"`` or ``"gpipe"``.
        inflight_limit: most microbatches in flight at once under 1F1B.
        lr: learning rate.
        optimizer: :data:`OPTIMIZERS` name.
    """

    rank: int
    torch_device: str
    threads: int
    programs: Mapping[str, ProgramTable]
    inputs: Mapping[str, tuple[torch.Tensor, ...]]
    microbatches: int
    schedule: str
    inflight_limit: int
    lr: float = 1e-4
    optimizer: str = "sgd"


@dataclass
class _StepState:
    values: dict[tuple[str, int], Any] = field(default_factory=dict)
    grads: dict[tuple[str, int], torch.Tensor | None] = field(default_factory=dict)
    grad_count: dict[tuple[str, int], int] = field(default_factory=dict)
    saved: dict[tuple[int, int], tuple[dict[str, torch.Tensor], tuple[Any, ...]]] = field(default_factory=dict)


def serve_worker(worker: type[WorkerLoop], spec: Any, inbox: Any, outbox: Any, peers: list[Any]) -> None:
    """Process entry point of any worker: serve ``worker(spec, ...)`` until ``stop``; any failure goes
    back to the parent as one ``("error", rank, line)`` message naming where it happened."""
    try:
        worker(spec, inbox, outbox, peers).serve()
    except BaseException as err:  # noqa: BLE001 - every failure goes back to the parent as one line
        last = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
        where = f" (at {os.path.basename(last.filename)}:{last.lineno})" if last else ""
        text = str(err).strip().splitlines()[0] if str(err).strip() else ""
        outbox.put(("error", spec.rank, f"{type(err).__name__}: {text[:300]}{where}"))


class WorkerLoop(ABC):
    """What every worker process does around its steps: set up, report ``("ready", rank, pid)``,
    then answer commands from ``inbox`` until ``stop``. ``("data", ...)`` messages from peers that
    arrive between steps are kept in ``early`` for the next step; ``(command, program, step, train)``
    runs :meth:`step` and reports ``("done", rank, step, report)`` (with a fifth element ``True``, the
    step is measured and the report carries ``"memory"``); :meth:`answer` may take other commands.
    Subclasses give ``setup`` and ``step``, and may give ``connect`` (joining a process group, before the
    memory baseline). ``spec`` has ``rank``, ``torch_device`` and ``threads`` (torch's intra-op threads in
    this process)."""

    optimizer: torch.optim.Optimizer | None = None  # set by setup, with clock and params
    clock: TaskClock
    params: list[torch.nn.Parameter] | dict[str, torch.nn.Parameter]

    def __init__(self, spec: Any, inbox: Any, outbox: Any, peers: list[Any]) -> None:
        self.spec = spec
        self.inbox = inbox
        self.outbox = outbox
        self.peers = peers
        self.device = torch.device(spec.torch_device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            set_tf32(False)  # every worker trains in FP32, as the plans are scored
        self.early: list[tuple[Any, ...]] = []
        self.step_id = -1
        self.probe = MemoryProbe(self.device)
        self._grads_bytes = 0

    def connect(self) -> None:  # noqa: B027 - optional hook, nothing to join by default
        """Join whatever the workers share (a process group); runs before the memory baseline (none here)."""

    @abstractmethod
    def setup(self) -> None:
        """Take the modules and inputs to this process's device; set ``optimizer`` and ``clock``."""

    @abstractmethod
    def step(self, program: str, step: int, train: bool) -> dict[str, Any]:
        """Run this worker's part of one step of ``program``; its report for the parent."""

    def answer(self, msg: tuple[Any, ...]) -> bool:
        """Answer a command other than a step; whether it was one (none here)."""
        return False

    # ------------------------------------------------------------------ the step's tasks, shared
    def accept(self, kind: str, name: str, m: int, where: Any, value: Any) -> None:
        """Keep a value that arrived during the step: an activation (``kind == "act"``) or a gradient of
        value ``name`` of microbatch ``m``; ``where`` is what the sender said about its rows. A worker whose
        steps exchange no data takes none."""
        raise ExecutionError(f"worker {self.spec.rank}: unexpected {kind!r} data during a step")

    def send(self, rank: int, kind: str, name: str, m: int, where: Any, value: Any) -> None:
        """Send a value of this step to worker ``rank`` (a CPU copy: see :func:`to_host`)."""
        self.peers[rank].put(("data", kind, self.step_id, name, m, where, to_host(value)))

    def receive(self, msg: tuple[Any, ...], step: int) -> None:
        """Check that ``msg`` is data of ``step`` and :meth:`accept` it, in this worker's own memory (the
        queue's shared segment is not ``malloc``-ed, and a GPU needs it on the device anyway)."""
        if msg[0] != "data":
            raise ExecutionError(f"worker {self.spec.rank}: unexpected {msg[0]!r} message during a step")
        _, kind, msg_step, name, m, where, value = msg
        if msg_step != step:
            raise ExecutionError(f"worker {self.spec.rank}: data of step {msg_step} during step {step}")
        if isinstance(value, torch.Tensor):
            value = value.to(self.device, copy=True)
        self.accept(kind, name, m, where, value)

    def run_tasks(self, step: int, left: Callable[[], bool], pick: Callable[[], Any],
                  run: Callable[[Any], None]) -> float:
        """The step's loop: take the data that came early, then while ``left()``, take what has arrived and
        ``run`` the task ``pick`` chooses, or wait for the next message when none is ready. Returns the
        seconds spent waiting."""
        self.step_id = step
        pending, self.early = self.early, []
        for msg in pending:
            self.receive(msg, step)
        wait_s = 0.0
        while left():
            while True:  # drain what has arrived
                try:
                    msg = self.inbox.get_nowait()
                except queue.Empty:
                    break
                self.receive(msg, step)
            task = pick()
            if task is None:
                t0 = time.perf_counter()
                self.receive(self._get(), step)
                wait_s += time.perf_counter() - t0
            else:
                run(task)
        return wait_s

    def pick(self, train: bool, forwards_left: bool, backward: Callable[[], Any],
             forward: Callable[[], Any]) -> Any:
        """The schedule's next task: under ``"1f1b"`` a ready backward first, else a ready forward; under
        ``"gpipe"`` backwards only once every forward of the worker is done. ``backward()`` and
        ``forward()`` return a ready task or None."""
        if train and (self.spec.schedule != "gpipe" or not forwards_left):
            task = backward()
            if task is not None:
                return task
        return forward()

    def timed_forward(self, key: Any, train: bool, run: Callable[[], Any]) -> Any:
        """``run()`` (the stage modules' forward), timed under ``key``, recording the graph when training."""
        self.clock.start(key)
        with torch.set_grad_enabled(train):
            out = run()
        self.clock.stop(key)
        return out

    def timed_backward(self, key: Any, tensors: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        """Back-propagate ``grads`` into ``tensors``, timed under ``key``."""
        self.clock.start(key)
        if tensors:
            torch.autograd.backward(tensors, grads)
        self.clock.stop(key)

    def finish_step(self, train: bool) -> tuple[float, float, dict[Any, float]]:
        """The optimizer step (when training, and there are weights here), then wait for the device:
        ``(end time, optimizer seconds, the clock's other totals)``. ``setup`` sets ``optimizer`` and
        ``clock``."""
        if train and self.optimizer is not None:
            self._grads_bytes = tensor_bytes(p.grad for p in self._param_list())
            self.clock.start("optimizer")
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.clock.stop("optimizer")
        synchronize(self.device)
        end = time.perf_counter()
        totals = self.clock.totals()
        return end, totals.pop("optimizer", 0.0), totals

    def _param_list(self) -> list[torch.nn.Parameter]:
        params = getattr(self, "params", [])
        return list(params.values()) if isinstance(params, dict) else list(params)

    def memory_report(self) -> MemoryReport | None:
        """The last measured step's memory: weights, gradients and optimizer state counted, the peak
        and reserve measured; None where the probe is not available."""
        if self.probe.peak_bytes is None or self.probe.reserve_bytes is None:
            return None
        return MemoryReport(weights_bytes=tensor_bytes(self._param_list()), grads_bytes=self._grads_bytes,
                            optimizer_bytes=optimizer_state_bytes(self.optimizer), peak_bytes=self.probe.peak_bytes,
                            reserve_bytes=self.probe.reserve_bytes, method=self.probe.method,
                            peak_op=self.probe.peak_op)

    def serve(self) -> None:
        torch.set_num_threads(self.spec.threads)
        torch.set_flush_denormal(True)
        self.connect()
        self.probe.baseline()
        self.setup()
        self.outbox.put(("ready", self.spec.rank, os.getpid()))
        while True:
            msg = self._get()
            if msg[0] == "stop":
                return
            if msg[0] == "data":
                self.early.append(msg)
            elif not self.answer(msg):
                _, program, step, train, *measured = msg
                if measured and measured[0]:
                    with self.probe:
                        report = self.step(program, step, train)
                    report["memory"] = self.memory_report()
                else:
                    report = self.step(program, step, train)
                self.outbox.put(("done", self.spec.rank, step, report))

    def _get(self) -> tuple[Any, ...]:
        """The next message; exits quietly when the parent process is gone."""
        parent = multiprocessing.parent_process()
        while True:
            try:
                return self.inbox.get(timeout=_POLL_S)
            except queue.Empty:
                if parent is not None and not parent.is_alive():
                    raise SystemExit(0) from None


def worker_main(spec: WorkerSpec, inbox: Any, outbox: Any, peers: list[Any]) -> None:
    """Process entry point of a pipeline worker: set up, report ``ready``, serve steps until ``stop``."""
    serve_worker(_Worker, spec, inbox, outbox, peers)


class _Worker(WorkerLoop):
    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        params: dict[int, torch.nn.Parameter] = {}
        for table in self.spec.programs.values():
            for stage in table.stages.values():
                stage.module.to(self.device)
                for p in stage.module.parameters():
                    # own memory (not the shared segment the parameters arrived in) and own gradients
                    p.data = p.data.clone()
                    params[id(p)] = p
        self.params = list(params.values())
        self.optimizer = make_optimizer(self.spec.optimizer, self.params, self.spec.lr) if self.params else None
        self.inputs = {name: tuple(t.to(self.device) for t in mbs) for name, mbs in self.spec.inputs.items()}
        self.clock = TaskClock(self.device)

    # ------------------------------------------------------------------ one step
    def step(self, program: str, step: int, train: bool) -> dict[str, Any]:
        table = self.table = self.spec.programs[program]
        M = self.spec.microbatches
        state = self.state = _StepState()
        start = time.perf_counter()
        for m in range(M):
            for name, mbs in self.inputs.items():
                state.values[(name, m)] = mbs[m]
        own = sorted(table.stages)
        fwd_todo = {(s, m) for s in own for m in range(M)}
        bwd_todo = set(fwd_todo) if train else set()
        fwd_done: set[tuple[int, int]] = set()
        counts = {"admitted": 0, "inflight": 0}
        finished = [0] * M  # backwards done per microbatch

        def run(task: tuple[str, int, int]) -> None:
            kind, s, m = task
            if kind == "F":
                if not any((x, m) in fwd_done for x in own):
                    counts["admitted"] += 1
                    counts["inflight"] += 1
                self._forward(s, m, train)
                fwd_todo.discard((s, m))
                fwd_done.add((s, m))
            else:
                self._backward(s, m)
                bwd_todo.discard((s, m))
                finished[m] += 1
                if finished[m] == len(own):
                    counts["inflight"] -= 1

        def backward() -> tuple[str, int, int] | None:
            ready = [(m, -s) for s, m in bwd_todo if (s, m) in fwd_done and self._grads_ready(s, m)]
            return ("B", -min(ready)[1], min(ready)[0]) if ready else None

        def forward() -> tuple[str, int, int] | None:
            ready = [(m, s) for s, m in fwd_todo if all((name, m) in state.values for name in table.stages[s].inputs)]
            if not ready:
                return None
            m, s = min(ready)
            if self.spec.schedule == "gpipe" or not train or m < counts["admitted"]:
                return "F", s, m  # a forward-only pass holds nothing for a backward
            started = any((x, m) in fwd_done for x in own)
            if started or (m == counts["admitted"] and counts["inflight"] < self.spec.inflight_limit):
                return "F", s, m
            return None

        wait_s = self.run_tasks(step, lambda: bool(fwd_todo or bwd_todo),
                                lambda: self.pick(train, bool(fwd_todo), backward, forward), run)
        end, opt_s, totals = self.finish_step(train)
        return {
            "start": start, "end": end, "wait_s": wait_s, "optimizer_s": opt_s,
            "fwd_s": {s: sum(v for k, v in totals.items() if k[0] == "F" and k[1] == s) for s in own},
            "bwd_s": {s: sum(v for k, v in totals.items() if k[0] == "B" and k[1] == s) for s in own},
        }

    def _grads_ready(self, s: int, m: int) -> bool:
        table, state = self.table, self.state
        for name in table.stages[s].outputs:
            if name not in table.differentiable:
                continue
            expected = len(table.consumers.get(name, ())) + (name in table.outputs)
            if state.grad_count.get((name, m), 0) < expected:
                return False
        return True

    # ------------------------------------------------------------------ tasks
    def _forward(self, s: int, m: int, train: bool) -> None:
        table, state = self.table, self.state
        stage = table.stages[s]
        leaves: dict[str, torch.Tensor] = {}
        args = []
        for name in stage.inputs:
            value = state.values[(name, m)]
            if train and name in table.differentiable and isinstance(value, torch.Tensor):
                value = value.detach().requires_grad_()
                leaves[name] = value
            args.append(value)
        out = self.timed_forward(("F", s, m), train, lambda: stage.module(*args))
        if train:
            state.saved[(s, m)] = (leaves, tuple(out))
        for name, value in zip(stage.outputs, out, strict=False):
            self._route_value(name, m, value, train)

    def _backward(self, s: int, m: int) -> None:
        table, state = self.table, self.state
        stage = table.stages[s]
        leaves, out = state.saved.pop((s, m))
        tensors, grads = [], []
        for name, value in zip(stage.outputs, out, strict=False):
            g = state.grads.pop((name, m), None)
            if g is not None and isinstance(value, torch.Tensor) and value.requires_grad:
                tensors.append(value)
                grads.append(g)
        self.timed_backward(("B", s, m), tensors, grads)
        for name, leaf in leaves.items():
            producer_worker = table.stage_worker[table.producer[name]]
            if producer_worker == self.spec.rank:
                self._add_grad(name, m, leaf.grad)
            else:
                self.send(producer_worker, "grad", name, m, None, leaf.grad)

    def _route_value(self, name: str, m: int, value: Any, train: bool) -> None:
        table, state = self.table, self.state
        sent: set[int] = set()
        for c in table.consumers.get(name, ()):
            w = table.stage_worker[c]
            if w == self.spec.rank:
                state.values[(name, m)] = value
            elif w not in sent:
                sent.add(w)
                self.send(w, "act", name, m, None, value)
        if name in table.outputs:
            if train:
                if name in table.differentiable and isinstance(value, torch.Tensor):
                    self._add_grad(name, m, torch.full_like(value, 1.0 / max(value.numel(), 1)))
            else:
                self.outbox.put(("out", self.spec.rank, name, m, to_host(value)))

    def accept(self, kind: str, name: str, m: int, where: Any, value: Any) -> None:
        if kind == "act":
            self.state.values[(name, m)] = value
        else:
            self._add_grad(name, m, value)

    def _add_grad(self, name: str, m: int, grad: torch.Tensor | None) -> None:
        state, key = self.state, (name, m)
        state.grad_count[key] = state.grad_count.get(key, 0) + 1
        if grad is None:
            state.grads.setdefault(key, None)
            return
        prev = state.grads.get(key)
        state.grads[key] = grad if prev is None else prev + grad


def to_host(value: Any) -> Any:
    """A detached CPU copy of ``value`` to send: the queue moves a tensor it sends into shared memory, which
    would take the sender's own tensor (an activation kept for the backward, the whole tensor the rows are
    cut from) out of its ``malloc``-ed, measured memory."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    return value


def run_step(inboxes: list[Any], receive: Callable[[], tuple[Any, ...]], program: str, step: int, train: bool,
             other: Callable[[tuple[Any, ...]], None] | None = None, *, memory: bool = False) -> list[dict[str, Any]]:
    """Parent side of one step: send ``("step", program, step, train)`` to every worker (``(..., True)``
    with ``memory``: measure its memory), then collect each worker's report, in rank order, from
    ``receive`` (:func:`next_message`); any other message (a worker's output) goes to ``other``."""
    for box in inboxes:
        box.put(("step", program, step, train, True) if memory else ("step", program, step, train))
    reports: list[dict[str, Any] | None] = [None] * len(inboxes)
    while any(r is None for r in reports):
        msg = receive()
        if msg[0] == "done" and msg[2] == step:
            reports[msg[1]] = msg[3]
        elif other is not None:
            other(msg)
    return reports  # type: ignore[return-value]


class WorkerPool:
    """The worker processes of one plan, one per spec (``target(spec, inbox, outbox, inboxes)``): spawned
    on enter, each setting up and reporting ``ready``; stopped on exit (killed if need be). A worker's
    failure, death or silence for ``timeout_s`` stops the pool and is one ExecutionError naming the worker
    (``describe(rank)``). Subclasses say what their steps return."""

    def __init__(self, target: Any, specs: Sequence[Any], timeout_s: float, name: Callable[[Any], str],
                 describe: Callable[[int], str]) -> None:
        self.specs = list(specs)
        self.timeout_s = timeout_s
        self._target, self._name, self._describe = target, name, describe
        self._procs: list[Any] = []
        self._inboxes: list[Any] = []
        self._outbox: Any = None
        self._step = 0

    def start(self) -> Any:
        """Spawn the workers and wait until each has set up."""
        self._outbox, self._inboxes, self._procs = spawn_workers(self._target, self.specs, self._name)
        ready = 0
        try:
            while ready < len(self.specs):
                ready += self.next()[0] == "ready"
        except BaseException:
            self.close()  # the others would wait for the failed one (a gloo rendezvous)
            raise
        return self

    def close(self) -> None:
        """Ask the workers to stop; kill any that has not within a few seconds."""
        stop_workers(self._inboxes, self._procs)
        self._procs = []

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next(self) -> tuple[Any, ...]:
        """The next message from any worker."""
        return next_message(self._outbox, self._procs, self.timeout_s, self._describe, self.close)

    def command(self, program: str, *, train: bool, output: Callable[[tuple[Any, ...]], None] | None = None,
                memory: bool = False) -> list[dict[str, Any]]:
        """One step of ``program`` on every worker (:func:`run_step`); their reports in rank order, any other
        message (a forward pass's outputs) to ``output``."""
        if not self._procs:
            raise ExecutionError("the workers are not started")
        self._step += 1
        return run_step(self._inboxes, self.next, program, self._step, train, output, memory=memory)


def spawn_workers(target: Any, specs: list[Any], name: Any) -> tuple[Any, list[Any], list[Any]]:
    """Start one ``target(spec, inbox, outbox, inboxes)`` process per spec (indexed by ``spec.rank``), with
    the ``spawn`` start method; returns the shared outbox, the inboxes and the processes. ``name(spec)``
    names each process. If one fails to start, those already started are stopped."""
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    outbox = ctx.Queue()
    inboxes = [ctx.Queue() for _ in specs]
    procs: list[Any] = []
    try:
        for spec in specs:
            proc = ctx.Process(target=target, args=(spec, inboxes[spec.rank], outbox, inboxes), daemon=True,
                               name=name(spec))
            proc.start()
            procs.append(proc)
    except BaseException:
        stop_workers(inboxes, procs)
        raise
    return outbox, inboxes, procs


def next_message(outbox: Any, procs: list[Any], timeout_s: float, describe: Callable[[int], str],
                 on_error: Callable[[], None] | None = None) -> tuple[Any, ...]:
    """The next message of a worker pool. A worker's death, its ``("error", index, text)`` report or
    no message for ``timeout_s`` becomes one ExecutionError (after ``on_error()``, e.g. stopping the
    pool); ``describe(index)`` names the worker that reported the error."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            msg = outbox.get(timeout=1.0)
        except queue.Empty:
            dead = [p for p in procs if not p.is_alive()]
            if dead:
                problem = f"worker {dead[0].name} died (exit code {dead[0].exitcode})"
            elif time.monotonic() > deadline:
                problem = f"no answer from the workers in {timeout_s:.0f} s"
            else:
                continue
        else:
            if msg[0] != "error":
                return msg
            problem = f"worker for {describe(msg[1])} failed: {msg[2]}"
        if on_error is not None:
            on_error()
        raise ExecutionError(problem) from None


def stop_workers(inboxes: list[Any], procs: list[Any], grace_s: float = 5.0) -> None:
    """Ask every worker to stop; kill any that has not within ``grace_s`` seconds."""
    for box in inboxes:
        try:
            box.put(("stop",))
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(timeout=max(0.1, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=1.0)


def threads_per_worker(torch_devices: list[str], total: int) -> list[int]:
    """Split ``total`` CPU threads: one per GPU worker (it mostly launches kernels), the rest evenly
    over the CPU workers (at least one each)."""
    n_cpu = sum(1 for d in torch_devices if d == "cpu")
    n_gpu = len(torch_devices) - n_cpu
    per_cpu = max(1, (max(total - n_gpu, 1)) // max(n_cpu, 1)) if n_cpu else 1
    return [per_cpu if d == "cpu" else 1 for d in torch_devices]

