"""Run a hybrid plan (``gpualloc-plan`` v2) on real devices: DDP replicas and pipeline stages.

:func:`execute_hybrid` is what ``gpualloc run`` does with a version-2 plan:

1. build the model with seeded weights; cut it by stage with :func:`gpualloc.execute.split.split_model`
   (every op's device is its stage, :func:`gpualloc.placement.hybrid.layers.stage_of_node`), once per
   microbatch size a replica takes (exports bake shapes in), for the training and the eval trace;
2. start one worker process per (stage, replica), joined in one ``gloo`` process group;
3. a *piece* is the samples one replica of one stage takes in one microbatch
   (:func:`gpualloc.placement.hybrid.plan.replica_microbatch`); a stage's pieces tile the global batch
   in microbatch-then-replica order. Activations go from each piece of stage ``s`` to the pieces of a
   later stage whose sample ranges overlap it (the rows of the overlap; shares may differ between
   stages), gradients back the same way, through the workers' shared-memory inboxes;
4. after its backwards every worker all-reduces (``gloo``, summed) the gradients of the parameters it
   shares with other workers: the replicas of its stage, and for a weight used by several stages (a
   tied embedding) the replicas of those stages too. Each piece seeds its output gradient as the
   global-batch mean (``n / (B x numel)``), so the sum is exactly the unsplit model's gradient whatever
   the shares; then the optimizer (SGD or Adam, ``ExecuteOptions.optimizer``) updates. Under
   ``sharding == "zero1"`` the optimizer state is sharded among a stage's replicas (ZeRO-1,
   ``ZeroRedundancyOptimizer`` over a process group of those replicas: each steps its part of the weights
   and broadcasts it);
5. check the output against the unsplit model, and after the first training step the weights against
   one step of the same optimizer on the unsplit model and the same batch; time the steps and predict
   them with the hybrid simulator;
6. run one more, untimed, step in which every worker measures its peak memory
   (:class:`~gpualloc.execute.measure.MemoryProbe`) and counts its weights, gradients and optimizer state.

Tensor parallelism is not executed: a replica with more than one device is refused (see
:data:`TP_REFUSED`), and so is FSDP (:data:`FSDP_REFUSED`). Gradient synchronisation runs after the
backward (no bucketing or overlap).
"""

from __future__ import annotations

import copy
import datetime
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import fx, nn

from gpualloc.cost.memory import MemoryRules
from gpualloc.cost.microbench import apply_profiles
from gpualloc.cost.model import Calibration, CostModel
from gpualloc.errors import ExecutionError
from gpualloc.execute.measure import TaskClock, summarize
from gpualloc.execute.run import (
    OUTPUT_ATOL,
    OUTPUT_RTOL,
    DeviceRun,
    ExecuteOptions,
    ExecutionResult,
    _calibration_warnings,
    _leaves,
    _max_abs,
    checked_options,
    torch_devices_for,
    worker_threads,
)
from gpualloc.execute.split import SplitModel, Stage, split_model
from gpualloc.execute.worker import (
    OPTIMIZERS,
    WorkerLoop,
    WorkerPool,
    make_optimizer,
    serve_worker,
    to_host,
)
from gpualloc.graph.ir import OpGraph
from gpualloc.graph.runnable import build_model, export_runnable
from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.placement.hybrid.layers import layer_count, stage_of_node
from gpualloc.placement.hybrid.plan import HybridPlan, replica_microbatch, validate
from gpualloc.placement.hybrid.problem import HybridProblem
from gpualloc.placement.hybrid.simulate import HybridResult, simulate_hybrid

__all__ = ["FSDP_REFUSED", "TP_REFUSED", "HybridExecution", "Piece", "check_plan", "execute_hybrid",
           "hybrid_problem", "plan_pieces"]

TP_REFUSED = "tensor parallel execution is not supported on CPU; plan with tp 1 (one device per replica)"
FSDP_REFUSED = "FSDP is not executed by gpualloc run; plan with sharding none or zero1"

WEIGHT_RTOL = 1e-3
"""Weights after one step match when ``max |split - unsplit| <= WEIGHT_ULPS x ulp(max |w|) + WEIGHT_RTOL x
max |update|``: the gradients are sums taken in another order, and the optimizer rounds to the weight's ulp."""
WEIGHT_ULPS = 4
ADAM_GRAD_RTOL = 1e-5
"""How much of its tensor's largest gradient a gradient summed in another order may differ by (fp32 sums
of a few thousand terms; see :func:`_reference_step`)."""

Progress = Callable[[str, int, int], None]
Layout = tuple[int, int] | None
"""Where a value's samples are: ``(dim, rows per sample)``, or None when it has no batch dimension."""


# ----------------------------------------------------------------------------------------- pieces
@dataclass(frozen=True)
class Piece:
    """Global samples ``offset .. offset + n - 1`` taken by replica ``replica`` of stage ``stage`` (worker
    ``rank``) in microbatch ``k``."""

    stage: int
    replica: int
    rank: int
    k: int
    offset: int
    n: int

    @property
    def end(self) -> int:
        return self.offset + self.n


def plan_pieces(plan: HybridPlan) -> tuple[Piece, ...]:
    """Every non-empty piece of the plan; ranks number the (stage, replica) pairs in stage order."""
    out, rank0 = [], 0
    for s, stage in enumerate(plan.stages):
        offset = 0
        for k in range(plan.microbatches):
            for r, rep in enumerate(stage.replicas):
                n = replica_microbatch(plan, rep, k)
                if n:
                    out.append(Piece(s, r, rank0 + r, k, offset, n))
                    offset += n
        rank0 += len(stage.replicas)
    return tuple(out)


def _overlap(a: Piece, b: Piece) -> tuple[int, int]:
    return max(a.offset, b.offset), min(a.end, b.end)


# ----------------------------------------------------------------------------------------- programs
@dataclass(frozen=True)
class _Program:
    """One trace (training or eval) cut by stage at every piece size.

    Attributes:
        by_size: piece size -> the split model.
        crossing: value -> (producing stage, consuming stages) for values read by another stage.
        producer_stage: model output -> stage producing it.
        layout: batch layout of the crossing values and the outputs.
        inputs / outputs: the model's flat inputs and outputs.
        differentiable: floating-point values.
    """

    by_size: Mapping[int, SplitModel]
    crossing: Mapping[str, tuple[int, tuple[int, ...]]]
    producer_stage: Mapping[str, int]
    layout: Mapping[str, Layout]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    differentiable: frozenset[str]


def _crossing(sm: SplitModel) -> tuple[dict[str, tuple[int, tuple[int, ...]]], dict[str, int]]:
    cons: dict[str, set[int]] = {}
    for st in sm.stages:
        for name in st.inputs:
            if name in sm.producer and sm.stages[sm.producer[name]].device != st.device:
                cons.setdefault(name, set()).add(st.device)
    crossing = {v: (sm.stages[sm.producer[v]].device, tuple(sorted(c))) for v, c in cons.items()}
    return crossing, {v: sm.stages[sm.producer[v]].device for v in sm.outputs}


def _layouts(a: fx.GraphModule, size_a: int, b: fx.GraphModule, size_b: int, names) -> dict[str, Layout]:
    """Batch layout of ``names`` from their shapes in two exports at different batch sizes."""
    vals_b = {n.name: n.meta.get("val") for n in b.graph.nodes}
    vals_a = {n.name: n.meta.get("val") for n in a.graph.nodes}
    out: dict[str, Layout] = {}
    for name in names:
        va, vb = vals_a.get(name), vals_b.get(name)
        if not isinstance(va, torch.Tensor) or not isinstance(vb, torch.Tensor):
            out[name] = None
            continue
        diff = [d for d in range(va.dim()) if va.dim() == vb.dim() and va.shape[d] != vb.shape[d]]
        if va.dim() != vb.dim() or len(diff) > 1:
            raise ExecutionError(f"value {name!r} has no single batch dimension: cannot route its samples")
        if not diff:
            out[name] = None
            continue
        d = diff[0]
        rows, rem = divmod(int(va.shape[d]), size_a)
        if rem or rows * size_b != int(vb.shape[d]):
            raise ExecutionError(f"value {name!r}: dimension {d} does not scale with the batch")
        out[name] = (d, rows)
    return out


def _programs(model: str, module: nn.Module, args: Sequence[torch.Tensor], graph: OpGraph, assignment: np.ndarray,
              sizes: Sequence[int]) -> dict[str, _Program]:
    """The training and eval traces of ``module`` cut by ``assignment`` at every size in ``sizes``."""
    batch = int(args[0].shape[0])
    probe = [] if len(sizes) > 1 else [sizes[0] + 1 if sizes[0] < batch else 0]
    out = {}
    for pname, training in (("train", True), ("check", False)):
        gms = {n: export_runnable(module, tuple(x[:n] for x in args), training=training, name=model).module
               for n in [*sizes, *probe] if n}
        by_size = {n: split_model(gms[n], graph, assignment) for n in sizes}
        first = by_size[sizes[0]]
        crossing, producer_stage = _crossing(first)
        for n, sm in by_size.items():
            if _crossing(sm) != (crossing, producer_stage):
                raise ExecutionError(f"the {pname} trace of {model} cuts differently at microbatch {n} than at "
                                     f"{sizes[0]}: cannot route values between stages")
        names = [*crossing, *first.outputs]
        if len(gms) > 1:
            (na, ga), (nb, gb) = list(gms.items())[:2]
            layout = _layouts(ga, na, gb, nb, names)
        else:  # one piece per stage covering the whole batch: every value goes whole
            layout = dict.fromkeys(names)
        out[pname] = _Program(by_size, crossing, producer_stage, layout, first.inputs, first.outputs,
                              first.differentiable)
    return out


# ----------------------------------------------------------------------------------------- routes
@dataclass(frozen=True)
class _Routes:
    """One worker's view of a program: which rows of which value go where.

    Attributes:
        recv: (value, my microbatch) -> parts ``(src rank, src microbatch, lo, hi)`` it is assembled from.
        send: (value, my microbatch) -> parts ``(dst rank, dst microbatch, lo, hi)`` it is cut into.
        layout: value -> batch layout.
        outputs: model outputs this worker's stage produces.
        differentiable: floating-point values.
    """

    recv: Mapping[tuple[str, int], tuple[tuple[int, int, int, int], ...]]
    send: Mapping[tuple[str, int], tuple[tuple[int, int, int, int], ...]]
    layout: Mapping[str, Layout]
    outputs: tuple[str, ...]
    differentiable: frozenset[str]


def _routes(prog: _Program, pieces: Sequence[Piece]) -> dict[int, _Routes]:
    recv: dict[int, dict] = {}
    send: dict[int, dict] = {}
    for v, (p, consumers) in prog.crossing.items():
        batched = prog.layout.get(v) is not None
        for c in consumers:
            for dst in (q for q in pieces if q.stage == c):
                for src in (q for q in pieces if q.stage == p):
                    lo, hi = _overlap(src, dst)
                    if (batched and lo >= hi) or (not batched and not src.offset <= dst.offset < src.end):
                        continue
                    if not batched:
                        lo, hi = dst.offset, dst.end
                    recv.setdefault(dst.rank, {}).setdefault((v, dst.k), []).append((src.rank, src.k, lo, hi))
                    send.setdefault(src.rank, {}).setdefault((v, src.k), []).append((dst.rank, dst.k, lo, hi))
    ranks = {q.rank: q.stage for q in pieces}
    return {r: _Routes({k: tuple(v) for k, v in recv.get(r, {}).items()},
                       {k: tuple(v) for k, v in send.get(r, {}).items()}, prog.layout,
                       tuple(o for o in prog.outputs if prog.producer_stage[o] == s), prog.differentiable)
            for r, s in ranks.items()}


def _inflight_limits(pieces: Sequence[Piece], prog: _Program, n_stages: int, microbatches: int) -> dict[int, int]:
    """1F1B limit per worker: ``S - stage`` (the stage depth on a chain, as
    :func:`gpualloc.placement.simulate.inflight_limits`), raised to what its oldest backward needs: when
    shares differ between stages a later stage's microbatch may read rows of this worker's next one, whose
    forward must run before that backward can."""
    edges = {(p, c) for p, cs in prog.crossing.values() for c in cs}
    idx = {q: i for i, q in enumerate(pieces)}
    producers = {q: [x for x in pieces if (x.stage, q.stage) in edges and _overlap(x, q)[0] < _overlap(x, q)[1]]
                 for q in pieces}
    consumers = {q: [x for x in pieces if (q.stage, x.stage) in edges and _overlap(q, x)[0] < _overlap(q, x)[1]]
                 for q in pieces}

    @cache
    def need_fwd(q: Piece) -> frozenset[int]:
        return frozenset({idx[q]}).union(*(need_fwd(x) for x in producers[q]))

    @cache
    def need_bwd(q: Piece) -> frozenset[int]:
        return need_fwd(q).union(*(need_bwd(x) for x in consumers[q]))

    out: dict[int, int] = {}
    for rank in dict.fromkeys(q.rank for q in pieces):
        mine = [q for q in pieces if q.rank == rank]
        ordinal = {idx[q]: i for i, q in enumerate(mine)}
        window = max(max(ordinal[j] for j in need_bwd(q) if j in ordinal) - i + 1 for i, q in enumerate(mine))
        out[rank] = max(window, min(n_stages - mine[0].stage, microbatches))
    return out


def _param_groups(prog: _Program, ranks_of_stage: Mapping[int, Sequence[int]]) -> tuple[tuple[tuple[int, ...],
                                                                                             tuple[str, ...]], ...]:
    """The gradient all-reduces: for every set of workers holding the same parameters, those names."""
    holders: dict[str, set[int]] = {}
    for sm in prog.by_size.values():
        for st in sm.stages:
            for name, _ in st.module.named_parameters():
                holders.setdefault(name, set()).update(ranks_of_stage[st.device])
    groups: dict[tuple[int, ...], list[str]] = {}
    for name, ranks in sorted(holders.items()):
        if len(ranks) > 1:
            groups.setdefault(tuple(sorted(ranks)), []).append(name)
    return tuple((ranks, tuple(names)) for ranks, names in sorted(groups.items()))


# ----------------------------------------------------------------------------------------- worker
@dataclass(frozen=True)
class _Spec:
    """Everything a worker process starts from."""

    rank: int
    world: int
    stage: int
    torch_device: str
    threads: int
    pieces: tuple[Piece, ...]
    modules: Mapping[str, Mapping[int, tuple[Stage, ...]]]
    routes: Mapping[str, _Routes]
    inputs: Mapping[str, Mapping[int, torch.Tensor]]
    groups: tuple[tuple[tuple[int, ...], tuple[str, ...]], ...]
    store: str
    batch: int
    schedule: str
    inflight_limit: int
    lr: float
    timeout_s: float
    optimizer: str = "sgd"
    shard_groups: tuple[tuple[int, ...], ...] = ()
    """ZeRO-1: the ranks of each stage's replicas (every rank creates every group, in this order)."""


@dataclass
class _State:
    parts: dict[tuple[str, int], list[tuple[int, int, int, Any]]] = field(default_factory=dict)
    grads: dict[tuple[str, int], list[tuple[int, int, Any]]] = field(default_factory=dict)
    saved: dict[int, tuple[dict[str, tuple[torch.Tensor, tuple]], dict[str, Any]]] = field(default_factory=dict)


def _worker_main(spec: _Spec, inbox: Any, outbox: Any, peers: list[Any]) -> None:
    """Process entry point: set up, report ``ready``, then serve commands until ``stop``."""
    try:
        serve_worker(_Worker, spec, inbox, outbox, peers)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _set_param(module: nn.Module, name: str, param: nn.Parameter) -> None:
    *path, last = name.split(".")
    owner = module.get_submodule(".".join(path)) if path else module
    setattr(owner, last, param)


def _rows(value: Any, layout: Layout, start: int, count: int) -> Any:
    """Rows of samples ``start .. start + count - 1`` (relative to the value's first sample)."""
    if layout is None or not isinstance(value, torch.Tensor):
        return value
    d, per = layout
    return value.narrow(d, start * per, count * per)


class _Worker(WorkerLoop):
    def connect(self) -> None:
        dist.init_process_group("gloo", init_method=f"file://{self.spec.store}", rank=self.spec.rank,
                                world_size=self.spec.world, timeout=datetime.timedelta(seconds=self.spec.timeout_s))
        self.groups = []
        for ranks, names in self.spec.groups:
            group = dist.new_group(list(ranks))  # every rank creates every group, in the same order
            if self.spec.rank in ranks:
                self.groups.append((group, names))
        self.shard_group = None
        for ranks in self.spec.shard_groups:
            group = dist.new_group(list(ranks))
            if self.spec.rank in ranks:
                self.shard_group = group

    def setup(self) -> None:
        self.params: dict[str, nn.Parameter] = {}
        for by_size in self.spec.modules.values():
            for stages in by_size.values():
                for st in stages:
                    st.module.to(self.device)
                    for name, p in list(st.module.named_parameters()):
                        if name not in self.params:
                            p.data = p.data.clone()  # own memory, not the shared segment it arrived in
                            self.params[name] = p
                        elif self.params[name] is not p:  # one parameter per name across traces and sizes
                            _set_param(st.module, name, self.params[name])
        # sorted: a ZeRO optimizer partitions by position, the same on every replica
        params = [self.params[n] for n in sorted(self.params)]
        self.optimizer = make_optimizer(self.spec.optimizer, params, self.spec.lr, self.shard_group) if params else None
        self.inputs = {name: {k: t.to(self.device, copy=True) for k, t in mbs.items()}
                       for name, mbs in self.spec.inputs.items()}
        self.clock = TaskClock(self.device)

    def answer(self, msg: tuple[Any, ...]) -> bool:
        """``("params",)``: send this worker's weights back (the check against the reference step)."""
        if msg[0] != "params":
            return False
        self.outbox.put(("params", self.spec.rank, {n: p.detach().to("cpu").clone() for n, p in self.params.items()}))
        return True

    # ------------------------------------------------------------------ one step
    def step(self, program: str, step: int, train: bool) -> dict[str, Any]:
        routes = self.routes = self.spec.routes[program]
        state = self.state = _State()
        start = time.perf_counter()
        n = len(self.spec.pieces)
        done = {"F": 0, "B": set()}  # forwards run (in piece order), backwards run

        def run(task: tuple[str, int]) -> None:
            if task[0] == "F":
                self._forward(program, task[1], train)
                done["F"] += 1
            else:
                self._backward(task[1])
                done["B"].add(task[1])

        def backward() -> tuple[str, int] | None:
            return next((("B", i) for i in sorted(state.saved) if i not in done["B"] and self._grads_ready(i)),
                        None)

        def forward() -> tuple[str, int] | None:
            if done["F"] == n:
                return None
            k = self.spec.pieces[done["F"]].k
            ready = all(len(state.parts.get(key, ())) == len(parts) for key, parts in routes.recv.items()
                        if key[1] == k)
            inflight = done["F"] - len(done["B"])
            if ready and (not train or self.spec.schedule == "gpipe" or inflight < self.spec.inflight_limit):
                return "F", done["F"]
            return None

        wait_s = self.run_tasks(step, lambda: done["F"] < n or (train and len(done["B"]) < n),
                                lambda: self.pick(train, done["F"] < n, backward, forward), run)
        sync_s = 0.0
        if train:
            t0 = time.perf_counter()
            self._all_reduce()
            sync_s = time.perf_counter() - t0
        end, opt_s, totals = self.finish_step(train)
        return {"start": start, "end": end, "wait_s": wait_s, "sync_s": sync_s, "optimizer_s": opt_s,
                "busy_s": sum(totals.values())}

    def _grads_ready(self, i: int) -> bool:
        k = self.spec.pieces[i].k
        for name in self.state.saved[i][0]:
            expected = len(self.routes.send.get((name, k), ())) + (name in self.routes.outputs)
            if len(self.state.grads.get((name, k), ())) < expected:
                return False
        return True

    def _forward(self, program: str, i: int, train: bool) -> None:
        routes, state = self.routes, self.state
        piece = self.spec.pieces[i]
        values: dict[str, Any] = {name: mbs[piece.k] for name, mbs in self.inputs.items()}
        leaves: dict[str, tuple[torch.Tensor, tuple]] = {}
        for name, k in routes.recv:
            if k != piece.k:
                continue
            got = sorted(state.parts.pop((name, k)), key=lambda part: part[:4])
            layout = routes.layout.get(name)
            value = got[0][5] if layout is None else torch.cat([part[5] for part in got], dim=layout[0])
            if train and got[0][4] and isinstance(value, torch.Tensor):
                value = value.detach().requires_grad_()
                leaves[name] = (value, tuple(got))
            values[name] = value
        stages = self.spec.modules[program][piece.n]

        def run() -> None:
            for st in stages:
                values.update(zip(st.outputs, st.module(*(values[v] for v in st.inputs)), strict=False))

        self.timed_forward(("F", i), train, run)
        out = {name: values[name] for name in {*(v for v, k in routes.send if k == piece.k), *routes.outputs}}
        if train:
            state.saved[i] = ({n: v for n, v in out.items() if self._needs_grad(v)}, leaves)
        for (name, k), parts in routes.send.items():
            if k == piece.k:
                for dst, dst_k, lo, hi in parts:
                    value = out[name]
                    rows = _rows(value, routes.layout.get(name), lo - piece.offset, hi - lo)
                    self.send(dst, "act", name, dst_k,
                              (lo, hi, self.spec.rank, piece.k, train and self._needs_grad(value)), rows)
        for name in routes.outputs:
            value = out[name]
            if train and self._needs_grad(value):  # the global-batch mean's gradient
                grad = torch.full_like(value, piece.n / (self.spec.batch * max(value.numel(), 1)))
                state.grads.setdefault((name, piece.k), []).append((piece.offset, piece.end, grad))
            elif not train:
                self.outbox.put(("out", self.spec.rank, name, piece.offset, piece.n, to_host(value)))

    @staticmethod
    def _needs_grad(value: Any) -> bool:
        return isinstance(value, torch.Tensor) and value.requires_grad

    def _backward(self, i: int) -> None:
        routes, state = self.routes, self.state
        piece = self.spec.pieces[i]
        outs, leaves = state.saved.pop(i)
        tensors, grads = [], []
        for name, value in outs.items():
            grad = torch.zeros_like(value)
            for lo, hi, g in state.grads.pop((name, piece.k), ()):
                if g is not None:
                    _rows(grad, routes.layout.get(name), lo - piece.offset, hi - lo).add_(g)
            tensors.append(value)
            grads.append(grad)
        self.timed_backward(("B", i), tensors, grads)
        for name, (leaf, parts) in leaves.items():
            start = parts[0][0]
            for lo, hi, src, src_k, _, _ in parts:
                g = None if leaf.grad is None else _rows(leaf.grad, routes.layout.get(name), lo - start, hi - lo)
                self.send(src, "grad", name, src_k, (lo, hi), g.contiguous() if g is not None else None)

    def accept(self, kind: str, name: str, k: int, where: Any, value: Any) -> None:
        if kind == "act":  # where = (lo, hi, src rank, src microbatch, needs a gradient back)
            self.state.parts.setdefault((name, k), []).append((*where, value))
        else:  # where = (lo, hi)
            self.state.grads.setdefault((name, k), []).append((*where, value))

    def _all_reduce(self) -> None:
        for group, names in self.groups:
            params = [self.params[n] for n in names]
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to("cpu")
                              for p in params])
            dist.all_reduce(flat, group=group)
            offset = 0
            for p in params:
                p.grad = flat[offset: offset + p.numel()].view_as(p).to(self.device)
                offset += p.numel()


# ----------------------------------------------------------------------------------------- parent
class _Workers(WorkerPool):
    """The worker processes of one plan: one per (stage, replica)."""

    def __init__(self, specs: Sequence[_Spec], timeout_s: float) -> None:
        super().__init__(_worker_main, specs, timeout_s, lambda spec: f"gpualloc-hybrid-{spec.stage}.{spec.rank}",
                         lambda i: f"stage {self.specs[i].stage} (rank {self.specs[i].rank})")

    def forward(self, prog: _Program) -> tuple[torch.Tensor, ...]:
        """A forward-only pass of the eval trace; the model's flat outputs for the whole batch."""
        sink: dict[str, list] = {}

        def output(msg: tuple[Any, ...]) -> None:
            if msg[0] == "out":
                _, _, name, offset, n, value = msg
                sink.setdefault(name, []).append((offset, n, value.clone()))

        self.command("check", train=False, output=output)
        out = []
        for name in prog.outputs:
            parts = sorted(sink[name], key=lambda p: p[0])
            layout = prog.layout[name]
            out.append(parts[0][2] if layout is None else torch.cat([p[2] for p in parts], dim=layout[0]))
        return tuple(out)

    def params(self) -> dict[int, dict[str, torch.Tensor]]:
        """Every worker's parameters (name -> tensor)."""
        for box in self._inboxes:
            box.put(("params",))
        got: dict[int, dict[str, torch.Tensor]] = {}
        while len(got) < len(self.specs):
            msg = self.next()
            if msg[0] == "params":
                got[msg[1]] = {n: t.clone() for n, t in msg[2].items()}
        return got


@dataclass(frozen=True)
class HybridExecution:
    """A hybrid plan run on real devices.

    Attributes:
        result: what ``gpualloc run`` reports for any plan (measured vs predicted step, output check, one
            :class:`~gpualloc.execute.run.DeviceRun` per worker, i.e. per (stage, replica)).
        describe: the plan in one line (:meth:`HybridPlan.describe`).
        weight_match: after the first training step every worker's weights equal those of one step of the
            same optimizer on the unsplit model and the same batch (within :data:`WEIGHT_RTOL` of the update);
            None when not checked (a model whose training forward depends on how the batch is split:
            BatchNorm, dropout).
        max_weight_diff: largest ``|split - unsplit|`` over all weights of all workers.
        weight_tolerance: the tolerance of the weight closest to failing.
        max_update: largest ``|unsplit step - initial|`` (how much the step moved the weights).
        sync_s: per worker, median time of its gradient all-reduces.
        sharding: the plan's sharding (``none`` or ``zero1``).
    """

    result: ExecutionResult
    describe: str
    weight_match: bool | None
    max_weight_diff: float
    weight_tolerance: float
    max_update: float
    sync_s: tuple[float, ...]
    sharding: str = "none"

    def to_dict(self) -> dict[str, Any]:
        return {**self.result.to_dict(), "plan_version": 2, "describe": self.describe,
                "weight_match": self.weight_match, "max_weight_diff": self.max_weight_diff,
                "weight_tolerance": self.weight_tolerance, "max_update": self.max_update,
                "sync_s": list(self.sync_s), "sharding": self.sharding}


def _batch_coupled(module: nn.Module) -> bool:
    """Whether the training forward of a sample depends on the others (BatchNorm) or on the RNG (dropout)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) or (isinstance(m, nn.Dropout) and m.p > 0)
               for m in module.modules())


def _reference_step(module: nn.Module, args: Sequence[torch.Tensor], optimizer: str,
                    lr: float) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Weights after one unsplit step of ``optimizer`` on the mean of every floating-point output (the
    workers' loss), and each weight's slack for Adam (zero for SGD).

    Adam's first step moves a weight by ``lr x g / (|g| + eps)`` (bias-corrected moments), whose slope
    ``lr x eps / (|g| + eps)^2`` turns a gradient that is rounding noise (``|g|`` near ``eps``) into any
    update in ``[-lr, lr]``. Summed in another order, a gradient is uncertain by about
    :data:`ADAM_GRAD_RTOL` of its tensor's largest; the slack is that times the slope (at most ``2 lr``),
    so only elements whose gradient is lost in rounding get it.
    """
    ref = copy.deepcopy(module).train()
    leaves = [t for t in _leaves(ref(*args)) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    sum(t.mean() for t in leaves).backward()
    opt = OPTIMIZERS[optimizer](ref.parameters(), lr=lr)
    opt.step()
    slack = {}
    for n, p in ref.named_parameters(remove_duplicate=False):
        g = p.grad.double().abs() if p.grad is not None else torch.zeros_like(p, dtype=torch.float64)
        if isinstance(opt, torch.optim.Adam) and g.numel():
            eps = float(opt.param_groups[0]["eps"])
            slack[n] = (lr * eps * ADAM_GRAD_RTOL * float(g.max()) / (g + eps) ** 2).clamp(max=2 * lr)
        else:
            slack[n] = torch.zeros_like(g)
    return {n: p.detach() for n, p in ref.named_parameters(remove_duplicate=False)}, slack


def _compare_weights(got: Mapping[int, Mapping[str, torch.Tensor]], ref: Mapping[str, torch.Tensor],
                     before: Mapping[str, torch.Tensor],
                     slack: Mapping[str, torch.Tensor]) -> tuple[bool, float, float, float]:
    """(match, max diff, tolerance of the weight closest to failing, max update) of every worker's weights:
    each element within ``WEIGHT_ULPS x ulp(max |w|) + WEIGHT_RTOL x max |update|`` of its tensor plus its
    ``slack``."""
    eps = torch.finfo(torch.float32).eps
    match, worst, worst_tol, worst_ratio, update = True, 0.0, 0.0, -1.0, 0.0
    for params in got.values():
        for name, w in params.items():
            if name not in ref:
                raise ExecutionError(f"a worker holds weight {name!r}, which the model does not have")
            if not w.numel():
                continue
            r = ref[name].double()
            diff = (w.double() - r).abs()
            moved = float((r - before[name].double()).abs().max())
            tol = WEIGHT_ULPS * eps * float(r.abs().max()) + WEIGHT_RTOL * moved + slack[name]
            ratio = diff / tol.clamp(min=1e-300)
            i = int(ratio.argmax())
            match &= bool((diff <= tol).all())
            worst, update = max(worst, float(diff.max())), max(update, moved)
            if float(ratio.flatten()[i]) > worst_ratio:
                worst_ratio, worst_tol = float(ratio.flatten()[i]), float(tol.flatten()[i])
    return match, worst, worst_tol, update


def check_plan(plan: HybridPlan, graph: OpGraph, cluster: ClusterSpec) -> None:
    """Refuse what cannot run before anything starts: a plan that does not fit the graph's layers or the
    cluster (:class:`PlacementError`), tensor-parallel replicas or FSDP (:class:`ExecutionError`,
    :data:`TP_REFUSED`, :data:`FSDP_REFUSED`)."""
    validate(plan, n_devices=len(cluster), layer_count=layer_count(graph), where="plan")
    if plan.sharding not in ("none", "zero1"):
        raise ExecutionError(f"plan: sharding: {plan.sharding!r}: {FSDP_REFUSED}")
    for si, stage in enumerate(plan.stages):
        for ri, rep in enumerate(stage.replicas):
            if rep.tp > 1:
                raise ExecutionError(f"plan: stages[{si}].replicas[{ri}].tp: {TP_REFUSED}")


def _specs(plan: HybridPlan, programs: Mapping[str, _Program], args: Sequence[torch.Tensor],
           placed: Mapping[int, str], threads: Mapping[int, int], store: str, o: ExecuteOptions) -> list[_Spec]:
    pieces = plan_pieces(plan)
    ranks = [(s, rep) for s, stage in enumerate(plan.stages) for rep in stage.replicas]
    ranks_of_stage: dict[int, list[int]] = {}
    for rank, (s, _) in enumerate(ranks):
        ranks_of_stage.setdefault(s, []).append(rank)
    routes = {name: _routes(prog, pieces) for name, prog in programs.items()}
    limits = _inflight_limits(pieces, programs["train"], len(plan.stages), plan.microbatches)
    groups = _param_groups(programs["train"], ranks_of_stage)
    shards = tuple(tuple(r) for r in ranks_of_stage.values() if len(r) > 1) if plan.sharding == "zero1" else ()
    input_names = programs["train"].inputs
    specs = []
    for rank, (s, rep) in enumerate(ranks):
        mine = tuple(q for q in pieces if q.rank == rank)
        sizes = sorted({q.n for q in mine})
        modules = {name: {n: tuple(st for st in prog.by_size[n].stages if st.device == s) for n in sizes}
                   for name, prog in programs.items()}
        read = {v for by_size in modules.values() for sts in by_size.values() for st in sts for v in st.inputs}
        inputs = {name: {q.k: x[q.offset: q.end].contiguous().clone() for q in mine}
                  for name, x in zip(input_names, args, strict=False) if name in read}
        dev = rep.devices[0]
        specs.append(_Spec(rank=rank, world=len(ranks), stage=s, torch_device=placed[dev], threads=threads[dev],
                           pieces=mine, modules=modules, routes={n: r[rank] for n, r in routes.items()},
                           inputs=inputs, groups=groups, store=store, batch=plan.global_batch,
                           schedule=plan.schedule, inflight_limit=limits[rank], lr=o.lr, timeout_s=o.timeout_s,
                           optimizer=o.optimizer, shard_groups=shards))
    return specs


def execute_hybrid(model: str, graph: OpGraph, plan: HybridPlan, cluster: ClusterSpec,
                   options: ExecuteOptions | None = None, *, progress: Progress | None = None,
                   **overrides: Any) -> HybridExecution:
    """Run hybrid ``plan`` for ``model`` on real devices, check it, time it and predict it.

    Args:
        model: zoo name or ``package.module:factory`` (the model ``graph`` was captured from).
        graph: the captured graph the plan's layers index (any batch: the step's batch is the plan's).
        plan: the plan; its microbatches, schedule and sharding are run (the first two of ``options`` are
            ignored).
        cluster: the cluster the plan is for.
        options: how to run it (:class:`~gpualloc.execute.run.ExecuteOptions`).
        progress: called ``(phase, done, total)`` as the run advances.
        **overrides: fields of ``options`` to replace.

    Raises:
        ExecutionError: tensor parallelism, a missing device, a model that will not split, a failing worker.
        PlacementError: the plan does not fit the graph or the cluster.
    """
    o = checked_options(options, overrides, "execute_hybrid")
    check_plan(plan, graph, cluster)
    note = progress or (lambda _p, _d, _t: None)
    cal = o.calibration if o.calibration is not None else Calibration.load()
    batch = plan.global_batch

    note("building and splitting the model", 0, 1)
    module, args = build_model(model, batch, seed=o.seed)
    before = {n: p.detach().clone() for n, p in module.named_parameters(remove_duplicate=False)}
    ref_step = None if _batch_coupled(module) else _reference_step(module, args, o.optimizer, o.lr)
    with torch.no_grad():
        ref_out = tuple(t for t in _leaves(module.eval()(*args)) if isinstance(t, torch.Tensor))
    assignment = stage_of_node(graph, [s.last for s in plan.stages])
    programs = _programs(model, module, args, graph, assignment, sorted({q.n for q in plan_pieces(plan)}))
    placed = torch_devices_for(cluster, o.torch_devices)
    used = [rep.devices[0] for s in plan.stages for rep in s.replicas]
    threads = worker_threads({d: placed[d] for d in used}, o.threads)

    store_dir = tempfile.mkdtemp(prefix="gpualloc-gloo-")
    step_times: list[float] = []
    samples: list[list[tuple[float, ...]]] = [[] for _ in used]
    got = None
    memory: list[Any] = [None] * len(used)
    try:
        specs = _specs(plan, programs, args, placed, threads, os.path.join(store_dir, "store"), o)
        with _Workers(specs, o.timeout_s) as workers:
            note("checking the output", 0, 1)
            diff, scale = _max_abs(workers.forward(programs["check"]), ref_out)
            for i in range(o.warmup + o.steps):
                note("training", i, o.warmup + o.steps)
                reports = workers.command("train", train=True)
                if i == 0 and ref_step is not None:
                    got = workers.params()
                if i >= o.warmup:
                    step_times.append(max(r["end"] for r in reports) - min(r["start"] for r in reports))
                    for rank, r in enumerate(reports):
                        samples[rank].append((r["busy_s"], r["wait_s"], r["optimizer_s"], r["sync_s"]))
            if o.measure_memory:
                note("training: one more step, measuring memory", o.warmup + o.steps, o.warmup + o.steps + 1)
                memory = [r.get("memory") for r in workers.command("train", train=True, memory=True)]
            note("training", o.warmup + o.steps, o.warmup + o.steps)
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)

    match, wdiff, wtol, update = (_compare_weights(got, ref_step[0], before, ref_step[1]) if got is not None
                                  else (None, 0.0, 0.0, 0.0))
    sim, how = _predict(graph, plan, cluster, cal, o.use_profiles, o.optimizer)
    predicted = float(sim.step_time_s)
    measured = summarize(step_times).median_s
    med = [[summarize([x[j] for x in rows]).median_s for j in range(4)] for rows in samples]
    devices = tuple(DeviceRun(index=d, label=cluster.devices[d].label, torch_device=placed[d], threads=threads[d],
                              stages=1, predicted_busy_s=float(sim.busy_s[d]), measured_busy_s=m[0],
                              measured_wait_s=m[1], measured_optimizer_s=m[2],
                              predicted_peak_bytes=float(sim.peak_mem_bytes[d]), memory=mem)
                    for d, m, mem in zip(used, med, memory, strict=True))
    tolerance = OUTPUT_ATOL + OUTPUT_RTOL * scale
    result = ExecutionResult(
        model=model, graph=graph.name, batch_size=batch, microbatches=plan.microbatches, schedule=plan.schedule,
        cluster=cluster.name, measured_step_s=measured, step_times_s=tuple(step_times), predicted_step_s=predicted,
        error=predicted / measured - 1.0 if measured > 0 else float("inf"), output_match=bool(diff <= tolerance),
        max_abs_diff=diff, output_tolerance=tolerance, prediction=how, calibration=o.calibration_name,
        stages=len(plan.stages), devices=devices, warmup=o.warmup,
        warnings=tuple(_calibration_warnings(cal, cluster, used, placed, threads)), optimizer=o.optimizer)
    return HybridExecution(result, plan.describe(), match, wdiff, wtol, update, tuple(m[3] for m in med),
                           plan.sharding)


def hybrid_problem(graph: OpGraph, cluster: ClusterSpec, global_batch: int, calibration: Calibration | None,
                   optimizer: str) -> HybridProblem:
    """The hybrid simulator's problem for a run: fp32, the run's optimizer, the calibration's costs."""
    return HybridProblem(graph, cluster, global_batch, cost=CostModel(calibration),
                         rules=MemoryRules(precision="fp32", optimizer=optimizer))


def _predict(graph: OpGraph, plan: HybridPlan, cluster: ClusterSpec, calibration: Calibration,
             use_profiles: bool, optimizer: str) -> tuple[HybridResult, str]:
    """The hybrid simulator's step for ``plan``, and how op times were estimated (as
    :func:`gpualloc.execute.run.predict`)."""
    types = list(dict.fromkeys(cluster.devices[d].type.name for d in plan.devices))
    profiled = apply_profiles(graph, calibration, types) if use_profiles else None
    sim = simulate_hybrid(hybrid_problem(profiled or graph, cluster, plan.global_batch, calibration, optimizer), plan)
    return sim, "profiled ops" if profiled is not None else "roofline"
