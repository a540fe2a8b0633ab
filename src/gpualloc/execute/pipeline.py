"""Run split models on real devices: one worker process per device, microbatches pipelined.

:class:`Pipeline` starts the workers (``spawn``: each gets a fresh torch with its own thread pool),
hands each its stages and its share of the inputs, and then runs steps on command: a forward-only
pass that returns the model's outputs (to check them against the unsplit model), or a training step
that returns its timings. Workers are stopped on exit, and killed if they do not stop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gpualloc.errors import ExecutionError
from gpualloc.execute.measure import MemoryReport
from gpualloc.execute.split import SplitModel
from gpualloc.execute.worker import ProgramTable, WorkerPool, WorkerSpec, worker_main

__all__ = ["Pipeline", "StepTiming", "WorkerTiming"]


@dataclass(frozen=True)
class WorkerTiming:
    """One worker's share of one step (seconds).

    Attributes:
        device: cluster device index.
        busy_s: forward + backward compute of its stages.
        fwd_s / bwd_s: per stage index.
        optimizer_s: its optimizer update.
        wait_s: time blocked waiting for another worker.
        memory: its memory in the step, when the step was measured (``train_step(memory=True)``).
    """

    device: int
    busy_s: float
    fwd_s: Mapping[int, float]
    bwd_s: Mapping[int, float]
    optimizer_s: float
    wait_s: float
    memory: MemoryReport | None = None


@dataclass(frozen=True)
class StepTiming:
    """One measured training step: from the first worker's start to the last worker's end."""

    step_s: float
    workers: tuple[WorkerTiming, ...]


class Pipeline(WorkerPool):
    """Worker processes running the stages of one or more split models of the same plan.

    Args:
        programs: name -> split model (e.g. ``"train"``: the training trace, ``"check"``: the eval one).
        torch_devices: torch device of each cluster device index that runs a stage.
        threads: torch threads of each such device's worker.
        inputs: the model's flat inputs for the whole batch (split into ``microbatches`` along dim 0).
        microbatches: microbatches per step (must divide the batch).
        inflight_limits: 1F1B in-flight microbatch limit of each device that runs a stage (the
            simulator's, :func:`gpualloc.placement.simulate.inflight_limits`).
        schedule: ``"1f1b"`` or ``"gpipe"``.
        lr: learning rate of the workers.
        timeout_s: longest wait for a worker's answer before giving up.
        optimizer: the workers' optimizer (:data:`gpualloc.execute.worker.OPTIMIZERS`).
    """

    def __init__(self, programs: Mapping[str, SplitModel], torch_devices: Mapping[int, str],
                 threads: Mapping[int, int], inputs: Sequence[torch.Tensor], *, microbatches: int,
                 inflight_limits: Mapping[int, int], schedule: str = "1f1b", lr: float = 1e-4,
                 timeout_s: float = 600.0, optimizer: str = "sgd") -> None:
        if schedule not in ("1f1b", "gpipe"):
            raise ExecutionError(f"unknown schedule {schedule!r}; expected 1f1b or gpipe")
        batch = int(inputs[0].shape[0]) if inputs and inputs[0].dim() else 0
        if microbatches < 1 or batch % microbatches:
            raise ExecutionError(f"{microbatches} microbatches do not divide the batch of {batch}")
        self.programs = dict(programs)
        self.microbatches = microbatches
        first = next(iter(self.programs.values()))
        self.devices = tuple(dict.fromkeys(d for p in self.programs.values() for d in p.devices))
        missing = [d for d in self.devices if d not in torch_devices]
        if missing:
            raise ExecutionError(f"no torch device given for cluster device {missing[0]}")
        rank = {d: r for r, d in enumerate(self.devices)}
        chunks = {name: tuple(t.contiguous().clone() for t in x.chunk(microbatches)) for name, x in
                  zip(first.inputs, inputs, strict=False)}
        specs = []
        for d in self.devices:
            tables = {}
            needed: set[str] = set()
            for pname, prog in self.programs.items():
                own = {s.index: s for s in prog.stages if s.device == d}
                needed |= {n for s in own.values() for n in s.inputs if n in prog.inputs}
                tables[pname] = ProgramTable(
                    stages=own, stage_worker=tuple(rank[s.device] for s in prog.stages), producer=prog.producer,
                    consumers=prog.consumers, differentiable=prog.differentiable, outputs=prog.outputs)
            specs.append(WorkerSpec(
                rank=rank[d], torch_device=torch_devices[d], threads=int(threads.get(d, 1)), programs=tables,
                inputs={n: chunks[n] for n in sorted(needed)}, microbatches=microbatches, schedule=schedule,
                inflight_limit=int(inflight_limits[d]), lr=lr, optimizer=optimizer))
        super().__init__(worker_main, specs, timeout_s, lambda spec: f"gpualloc-worker-{spec.rank}",
                         lambda i: f"device {self.devices[i]} ({self.specs[i].torch_device})")

    # ------------------------------------------------------------------ steps
    def forward(self, program: str) -> tuple[torch.Tensor, ...]:
        """A forward-only pass of ``program`` over all microbatches; the model's flat outputs, the
        microbatches concatenated along dim 0."""
        prog = self.programs[program]
        got: dict[tuple[str, int], torch.Tensor] = {}

        def output(msg: tuple[Any, ...]) -> None:
            if msg[0] == "out":
                _, _, name, m, value = msg
                got[(name, m)] = value.clone()

        self.command(program, train=False, output=output)
        out = []
        for name in prog.outputs:
            parts = [got[(name, m)] for m in range(self.microbatches)]
            out.append(torch.cat(parts) if parts[0].dim() else torch.stack(parts))
        return tuple(out)

    def train_step(self, program: str, *, memory: bool = False) -> StepTiming:
        """One training step (forward, backward, optimizer) of ``program``; its measured times, and with
        ``memory`` each worker's memory (the probe slows the step: do not time it)."""
        reports = self.command(program, train=True, memory=memory)
        workers = []
        for d, rep in zip(self.devices, reports, strict=False):
            fwd = {int(k): float(v) for k, v in rep["fwd_s"].items()}
            bwd = {int(k): float(v) for k, v in rep["bwd_s"].items()}
            workers.append(WorkerTiming(d, sum(fwd.values()) + sum(bwd.values()), fwd, bwd,
                                        float(rep["optimizer_s"]), float(rep["wait_s"]), rep.get("memory")))
        step = max(r["end"] for r in reports) - min(r["start"] for r in reports)
        return StepTiming(float(step), tuple(workers))
