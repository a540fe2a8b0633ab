"""Per-op overhead on this CPU as a function of op size (issue 34, item 7: the launch term).

Times PyTorch ops (matmul, add, gelu, layer_norm, softmax) from one element to tens of MB, forward
(inputs that require grad: the autograd graph is recorded, as in training) and backward
(``torch.autograd.grad`` of the op's output), and fits ``time = overhead + work / rate`` per op and
direction. Two fits: on the large half of the sizes (the intercept a roofline fitted on big ops would
extrapolate to small ones) and on every size with relative residuals. The tiny op's own time is the
per-op overhead measured directly; ``excess_s`` at each size (measured time minus work / the large-op
rate) shows whether the overhead depends on the op's size.

On the CPU dispatch and compute run on the same thread, one after the other: every op pays its
dispatch serially (:mod:`gpualloc.cost.launch`, mode ``"serial"``). The GPU side is not measured here.

    python benchmarks/launch_cost.py [--threads 1] [--budget 0.4]

Writes benchmarks/results/launch_cost.json and prints a table. About 1-2 minutes on 2 shared cores.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from rich.table import Table

import _args
from gpualloc.cli.common import console
from gpualloc.cost.microbench import bench_op_overhead, host_cpu_model, torch_threads

OUT = Path(__file__).resolve().parent / "results" / "launch_cost.json"
CPU = torch.device("cpu")
ELEMENTS = (1, 64, 1024, 16384, 65536, 262144, 1048576, 4194304)
"""Element counts of the elementwise and row-wise ops (4 B to 16 MB an operand)."""
MATMUL_N = (1, 4, 16, 32, 64, 128, 256, 384, 512)
"""Square matmul sizes."""
ROW = 256
"""Row width of layer_norm and softmax (fewer elements: one row of that many)."""
TARGET_SAMPLE_S = 5e-3
"""Each timed sample repeats the op until it lasts about this long (a tiny op takes microseconds)."""
SAMPLES = 15
"""Timed samples per op, size and direction; the fastest is kept (see :func:`fastest_s`)."""


def fastest_s(fn: Callable[[], None], budget_s: float) -> float:
    """Seconds of the fastest of :data:`SAMPLES` calls of ``fn`` (at least 3, fewer once ``budget_s`` is
    spent), after one warm-up call. The minimum, not :func:`gpualloc.cost.microbench.time_call`'s median:
    on a CPU shared with other jobs, what a sample gains over the fastest is other jobs' time."""
    fn()
    best = math.inf
    start = time.perf_counter()
    for i in range(SAMPLES):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if i >= 2 and time.perf_counter() - start > budget_s:
            break
    return best


def _tensor(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).requires_grad_(True)


def _rows(numel: int) -> tuple[int, int]:
    width = min(numel, ROW)
    return max(numel // width, 1), width


def make_op(name: str, size: int) -> tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...], float]:
    """The op ``name`` at ``size``: (callable, inputs that require grad, forward work).

    Work is FLOPs for matmul (``2 n^3``) and bytes read + written for the others (FP32).
    """
    if name == "matmul":
        a, b = _tensor((size, size), 1), _tensor((size, size), 2)
        return torch.mm, (a, b), 2.0 * size**3
    if name == "add":
        return torch.add, (_tensor((size,), 1), _tensor((size,), 2)), 12.0 * size
    if name == "gelu":
        return torch.nn.functional.gelu, (_tensor((size,), 1),), 8.0 * size
    rows, width = _rows(size)
    x = _tensor((rows, width), 1)
    if name == "layer_norm":
        w, b = _tensor((width,), 2), _tensor((width,), 3)
        return (lambda x, w, b: torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)), (x, w, b), 8.0 * rows * width
    if name == "softmax":
        return (lambda x: torch.softmax(x, dim=-1)), (x,), 8.0 * rows * width
    raise ValueError(name)


OPS = {"matmul": MATMUL_N, "add": ELEMENTS, "gelu": ELEMENTS, "layer_norm": ELEMENTS, "softmax": ELEMENTS}
WORK_UNIT = {"matmul": "flop"}


def time_op(fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...], budget_s: float) -> tuple[float, float]:
    """Seconds of one forward call, and of forward + backward (``torch.autograd.grad``)."""
    grad = torch.ones_like(fn(*inputs))

    def fwd_once() -> None:
        fn(*inputs)

    def step_once() -> None:
        torch.autograd.grad(fn(*inputs), inputs, grad)

    out = []
    for once in (fwd_once, step_once):
        t0 = time.perf_counter()
        once()
        reps = max(1, min(20000, int(TARGET_SAMPLE_S / max(time.perf_counter() - t0, 1e-7))))

        def many(once: Callable[[], None] = once, reps: int = reps) -> None:
            for _ in range(reps):
                once()

        out.append(fastest_s(many, budget_s) / reps)
    return out[0], out[1]


def fit(work: np.ndarray, secs: np.ndarray, *, relative: bool) -> dict:
    """Least squares ``secs = overhead + work / rate``; ``relative`` weighs each point by 1 / secs.

    Returns the overhead, its standard error, and the rate (work per second).
    """
    scale = float(work.max()) or 1.0  # work up to 1e8: scaled, or the normal equations lose the intercept
    design = np.column_stack([np.ones_like(work), work / scale])
    w = 1.0 / secs if relative else np.ones_like(secs)
    a = design * w[:, None]
    coef, *_ = np.linalg.lstsq(a, secs * w, rcond=None)
    resid = (secs - design @ coef) * w
    dof = max(len(secs) - 2, 1)
    cov = (resid @ resid / dof) * np.linalg.inv(a.T @ a)
    slope = float(coef[1]) / scale
    return {"overhead_s": float(coef[0]), "overhead_stderr_s": float(math.sqrt(max(cov[0, 0], 0.0))),
            "rate_per_s": 1.0 / slope if slope > 0 else None, "points": int(len(secs))}


def measure(name: str, sizes: tuple[int, ...], budget_s: float) -> list[dict]:
    """Points and fits of one op, forward and backward."""
    fwd, bwd, work = [], [], []
    for size in sizes:
        fn, inputs, w = make_op(name, size)
        f, fb = time_op(fn, inputs, budget_s)
        fwd.append(f)
        bwd.append(max(fb - f, 1e-9))
        work.append(w)
    work_a = np.array(work)
    rows = []
    for direction, secs in (("fwd", np.array(fwd)), ("bwd", np.array(bwd))):
        large = slice(len(sizes) // 2, None)
        big = fit(work_a[large], secs[large], relative=False)
        every = fit(work_a, secs, relative=True)
        rate = big["rate_per_s"]
        points = [{"size": int(s), "work": float(w), "seconds": float(t),
                   "excess_s": float(t - w / rate) if rate else None}
                  for s, w, t in zip(sizes, work_a, secs, strict=True)]
        tiny = float(secs[0])
        rows.append({"op": name, "direction": direction, "work_unit": WORK_UNIT.get(name, "byte"),
                     "tiny_s": tiny, "fit_large": big, "fit_all_relative": every, "points": points,
                     "intercept_minus_tiny_s": big["overhead_s"] - tiny,
                     "size_independent": bool(abs(big["overhead_s"] - tiny) <= 2 * big["overhead_stderr_s"])})
    return rows


CHAIN = (1, 8, 32, 128)
"""Chain lengths of tiny ops: the slope is the cost of one more op inside a graph, the intercept the
cost of a call (for the backward, ``torch.autograd.grad`` starting the engine). gelu is left out: chained,
it shrinks its values towards zero and slows down for that reason."""


def chain(name: str, numel: int, budget_s: float) -> dict:
    """Forward and backward time of ``k`` chained tiny ops for each ``k`` of :data:`CHAIN`; per-op slope."""
    fwd, bwd = [], []
    for k in CHAIN:
        fn, inputs, _ = make_op(name, numel)
        first, rest = inputs[0], inputs[1:]

        def run(x: torch.Tensor, fn=fn, rest=rest, k=k) -> torch.Tensor:
            y = x
            for _ in range(k):
                y = fn(y, *rest)
            return y

        f, fb = time_op(run, (first,), budget_s)
        fwd.append(f)
        bwd.append(max(fb - f, 1e-9))
    ks = np.array(CHAIN, dtype=np.float64)
    out = {"op": name, "numel": numel, "lengths": list(CHAIN), "fwd_s": fwd, "bwd_s": bwd}
    for direction, secs in (("fwd", np.array(fwd)), ("bwd", np.array(bwd))):
        slope, intercept = np.polyfit(ks, secs, 1)
        out[f"{direction}_per_op_s"] = float(slope)
        out[f"{direction}_per_call_s"] = float(intercept)
    return out


def table(rows: list[dict]) -> Table:
    t = Table(title="per-op time on this CPU: tiny op vs the intercept of time = overhead + work/rate (us)")
    for col in ("op", "dir", "tiny op", "intercept (large ops)", "+- 1 se", "intercept (all, rel.)",
                "excess at mid size", "rate (large)"):
        t.add_column(col, justify="left" if col in ("op", "dir") else "right")
    for r in rows:
        big, every = r["fit_large"], r["fit_all_relative"]
        mid = r["points"][len(r["points"]) // 2]
        unit = "GFLOP/s" if r["work_unit"] == "flop" else "GB/s"
        rate = f"{big['rate_per_s'] / 1e9:.1f} {unit}" if big["rate_per_s"] else "-"
        excess = f"{mid['excess_s'] * 1e6:.1f}" if mid["excess_s"] is not None else "-"
        t.add_row(r["op"], r["direction"], f"{r['tiny_s'] * 1e6:.2f}", f"{big['overhead_s'] * 1e6:.1f}",
                  f"{big['overhead_stderr_s'] * 1e6:.1f}", f"{every['overhead_s'] * 1e6:.2f}", excess, rate)
    return t


def chain_table(chains: list[dict]) -> Table:
    t = Table(title="chains of k tiny ops (64 elements): the cost of one more op in a graph (us)")
    for col in ("op", "fwd per op", "bwd per op", "bwd per call (engine start)"):
        t.add_column(col, justify="left" if col == "op" else "right")
    for c in chains:
        t.add_row(c["op"], f"{c['fwd_per_op_s'] * 1e6:.2f}", f"{c['bwd_per_op_s'] * 1e6:.2f}",
                  f"{c['bwd_per_call_s'] * 1e6:.2f}")
    return t


def main() -> None:
    parser = _args.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=_args.between(1, 256), default=1, help="torch intra-op threads")
    parser.add_argument("--budget", type=_args.positive, default=1.0,
                        help="seconds of timing per op, size and direction (at least 2 samples)")
    parser.add_argument("--out", type=_args.output, default=OUT)
    args = parser.parse_args()
    start = time.perf_counter()
    rows: list[dict] = []
    with torch_threads(args.threads):
        trivial_s = bench_op_overhead(CPU)
        for name, sizes in OPS.items():
            rows.extend(measure(name, sizes, args.budget))
        chains = [chain(name, 64, args.budget) for name in ("add", "layer_norm", "softmax")]
    fwd_tiny = [r["tiny_s"] for r in rows if r["direction"] == "fwd"]
    bwd_tiny = [r["tiny_s"] for r in rows if r["direction"] == "bwd"]
    summary = {
        "trivial_inplace_add_s": trivial_s,
        "dispatch_fwd_median_s": statistics.median(fwd_tiny),
        "dispatch_fwd_range_s": [min(fwd_tiny), max(fwd_tiny)],
        "dispatch_bwd_range_s": [min(bwd_tiny), max(bwd_tiny)],
        "dispatch_bwd_median_s": statistics.median(bwd_tiny),
        "dispatch_fwd_plus_bwd_median_s": statistics.median(f + b for f, b in zip(fwd_tiny, bwd_tiny, strict=True)),
        "chain_fwd_per_op_median_s": statistics.median(c["fwd_per_op_s"] for c in chains),
        "chain_bwd_per_op_median_s": statistics.median(c["bwd_per_op_s"] for c in chains),
        "chain_bwd_per_call_median_s": statistics.median(c["bwd_per_call_s"] for c in chains),
        "size_independent_count": sum(r["size_independent"] for r in rows),
        "fits": len(rows),
    }
    doc = {"benchmark": "launch_cost", "command": "python benchmarks/launch_cost.py", "threads": args.threads,
           "cpu": host_cpu_model(), "machine": platform.machine(), "python": platform.python_version(),
           "torch": torch.__version__, "load_average_1min": os.getloadavg()[0],
           "wall_s": time.perf_counter() - start, "summary": summary, "ops": rows, "chains": chains}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    console.print(table(rows))
    console.print(chain_table(chains))
    console.print(f"trivial in-place add (microbench.bench_op_overhead): {trivial_s * 1e6:.2f} us; "
                  f"tiny-op median: forward {summary['dispatch_fwd_median_s'] * 1e6:.2f} us, "
                  f"backward {summary['dispatch_bwd_median_s'] * 1e6:.2f} us; intercept within 2 se of the tiny "
                  f"op in {summary['size_independent_count']} of {len(rows)} fits; "
                  f"{args.threads} thread(s), {doc['wall_s']:.0f} s")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    _args.guarded(main)
