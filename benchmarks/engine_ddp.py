"""The engine's DDP step against plain torchrun DDP, on CPU (gloo), in the same run.

Both sides are ``torchrun --standalone --nproc-per-node 2`` jobs on the same model, the same global batch
(half on each rank), the same loss and SGD, the same torch threads per rank (``OMP_NUM_THREADS``):

* **engine**: ``python -m gpualloc.execute.engine`` on a DDP plan of the model on ``2xcpu``
  (``gpualloc place MODEL --cluster 2xcpu --method ddp``), with ``--no-check --no-memory`` (the checks and the
  memory probe run outside the timed steps anyway);
* **plain**: this script's ``--worker`` mode, the minimal DDP loop a user would write: the model from the zoo,
  ``DistributedDataParallel``, ``loss.backward()``, ``opt.step()``.

A step is timed on each rank from ``zero_grad`` to the end of ``opt.step()`` (the engine's own rule), and the
step time is the median over the timed steps of the slowest rank's step. Repetitions alternate the two
(engine first in even repetitions, plain first in odd ones) so that a change of the machine's load hits both;
the figure is the median over repetitions of engine / plain, of the median step and of the fastest step of each
job (on a shared machine the fastest step is the one least disturbed by other jobs). The 1-minute load
average before and after is recorded (the machine's 2 cores may be shared).

Usage: python benchmarks/engine_ddp.py [--model gpt-tiny] [--batch 32] [--reps 5] [--steps 20] [--out PATH]
Writes benchmarks/results/engine_ddp.json and prints a table.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _args

HERE = Path(__file__).resolve().parent
NPROC = 2


def _worker(args) -> None:
    """Plain DDP under torchrun: the loop a user writes, timed like the engine times its steps."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpualloc.execute.engine.loss import loss_for
    from gpualloc.graph.runnable import build_model

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    model, inputs = build_model(args.model, args.batch, seed=args.seed)
    loss = loss_for(model)
    targets = loss.targets(inputs, args.seed)
    local = args.batch // world
    x = tuple(t[rank * local: (rank + 1) * local] for t in inputs)
    y = targets[rank * local: (rank + 1) * local]
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = ddp(*x)
        value = loss.per_sample(out if isinstance(out, tuple) else (out,), y).mean()
        value.backward()
        opt.step()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    worst = []
    for t in times:
        v = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(v, op=dist.ReduceOp.MAX)
        worst.append(float(v[0]))
    if rank == 0:
        Path(args.worker_out).write_text(json.dumps({"step_time_s": statistics.median(worst),
                                                     "step_times_s": worst}))
    dist.destroy_process_group()


def _torchrun(cmd: list[str], env: dict[str, str], timeout_s: float) -> None:
    """Run a torchrun job in its own process group; end the whole group on a timeout or an error."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[3:6]} failed ({proc.returncode}):\n{err[-3000:]}")


def _plan(model: str, batch: int, folder: Path) -> Path:
    from gpualloc.graph.cached import capture_cached
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.document import write_plan
    from gpualloc.placement.problem import PlacementProblem
    from gpualloc.placement.run import place

    problem = PlacementProblem(capture_cached(model, batch=batch), load_cluster("2xcpu"))
    outcome = place(problem, "ddp", seed=0, hybrid=True)
    path = folder / "plan.json"
    write_plan(path, problem, outcome.plan, "2xcpu", extra=outcome.to_dict(problem))
    return path


def main() -> int:
    p = _args.Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt-tiny", help="zoo model (default gpt-tiny)")
    p.add_argument("--batch", type=_args.between(NPROC, 4096), default=32, help="global batch (default 32)")
    p.add_argument("--reps", type=_args.between(1, 100), default=5, help="repetitions of each side (default 5)")
    p.add_argument("--steps", type=_args.between(1, 10_000), default=20, help="timed steps per job (default 20)")
    p.add_argument("--warmup", type=_args.between(0, 1000), default=3, help="untimed steps first (default 3)")
    p.add_argument("--threads", type=_args.between(1, 1024), default=None,
                   help="torch threads per rank (default: this machine's CPUs / 2)")
    p.add_argument("--seed", type=_args.seed, default=0)
    p.add_argument("--lr", type=_args.positive, default=0.01)
    p.add_argument("--timeout", type=_args.positive, default=600.0, help="seconds per torchrun job")
    p.add_argument("--out", type=_args.output, default=HERE / "results" / "engine_ddp.json")
    p.add_argument("--worker", action="store_true", help=_args.argparse.SUPPRESS)
    p.add_argument("--worker-out", default=None, help=_args.argparse.SUPPRESS)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # end the torchrun groups too
    if args.worker:
        _worker(args)
        return 0
    if args.batch % NPROC:
        p.error(f"--batch {args.batch}: must split evenly over {NPROC} ranks")
    threads = args.threads or max(1, len(os.sched_getaffinity(0)) // NPROC)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="engine-ddp-") as tmp:
        folder = Path(tmp)
        plan = _plan(args.model, args.batch, folder)
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(NPROC)]
        common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed),
                  "--lr", repr(args.lr)]
        engine_cmd = [*torchrun, "-m", "gpualloc.execute.engine", "--plan", str(plan), "--model", args.model,
                      "--optimizer", "sgd", "--out", str(folder / "engine"), "--no-check", "--no-memory", *common]
        plain_cmd = [*torchrun, str(Path(__file__).resolve()), "--worker", "--worker-out", str(folder / "plain.json"),
                     "--model", args.model, "--batch", str(args.batch), *common]

        def engine() -> list[float]:
            _torchrun(engine_cmd, env, args.timeout)
            return json.loads((folder / "engine" / "engine.json").read_text())["step_times_s"]

        def plain() -> list[float]:
            _torchrun(plain_cmd, env, args.timeout)
            return json.loads((folder / "plain.json").read_text())["step_times_s"]

        for rep in range(args.reps):
            order = (("engine", engine), ("plain", plain)) if rep % 2 == 0 else (("plain", plain), ("engine", engine))
            got = {name: run() for name, run in order}
            med = {k: statistics.median(v) for k, v in got.items()}
            low = {k: min(v) for k, v in got.items()}
            rows.append({"rep": rep, "first": order[0][0], "engine_step_s": med["engine"],
                         "plain_step_s": med["plain"], "ratio": med["engine"] / med["plain"],
                         "engine_min_step_s": low["engine"], "plain_min_step_s": low["plain"],
                         "ratio_min": low["engine"] / low["plain"],
                         "engine_steps_s": got["engine"], "plain_steps_s": got["plain"]})
            print(f"rep {rep}: median step engine {med['engine'] * 1e3:.2f} ms, plain {med['plain'] * 1e3:.2f} ms "
                  f"({med['engine'] / med['plain']:.3f}); fastest step engine {low['engine'] * 1e3:.2f} ms, plain "
                  f"{low['plain'] * 1e3:.2f} ms ({low['engine'] / low['plain']:.3f})", flush=True)
    load_after = os.getloadavg()
    ratio = statistics.median(r["ratio"] for r in rows)
    ratio_min = statistics.median(r["ratio_min"] for r in rows)
    doc = {
        "benchmark": "engine_ddp", "model": args.model, "global_batch": args.batch, "processes": NPROC,
        "backend": "gloo", "threads_per_rank": threads, "steps": args.steps, "warmup": args.warmup,
        "reps": args.reps, "optimizer": "sgd", "host_cpus": os.cpu_count(), "processor": platform.processor(),
        "torch": __import__("torch").__version__, "load_avg_1m_before": load_before[0],
        "load_avg_1m_after": load_after[0],
        "engine_step_s_median": statistics.median(r["engine_step_s"] for r in rows),
        "plain_step_s_median": statistics.median(r["plain_step_s"] for r in rows),
        "engine_over_plain_median": ratio, "within_5_percent": abs(ratio - 1.0) <= 0.05,
        "engine_over_plain_fastest_step": ratio_min, "fastest_within_5_percent": abs(ratio_min - 1.0) <= 0.05,
        "rows": rows,
        "command": "python benchmarks/engine_ddp.py " + " ".join(sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\n| model | batch | threads/rank | engine step | plain DDP step | engine / plain, median step "
          f"(median of {args.reps}) | engine / plain, fastest step (median of {args.reps}) |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.model} | {args.batch} | {threads} | {doc['engine_step_s_median'] * 1e3:.2f} ms | "
          f"{doc['plain_step_s_median'] * 1e3:.2f} ms | {ratio:.3f} | {ratio_min:.3f} |")
    print(f"load average (1 min): {load_before[0]:.2f} before, {load_after[0]:.2f} after; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_args.guarded(main))
