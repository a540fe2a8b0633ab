"""The torch-native engine measured against gpualloc's prediction on CPU (gloo): the rows of docs/execution.md.

Each case is a hybrid plan of one zoo model, written as ``gpualloc place -o`` writes plans, and run with
``gpualloc launch PLAN --json --calibration-out`` (torchrun, one process per plan device, the engine's checks
against the unsplit model). The prediction is the one ``launch`` prints: ``simulate_plan`` with the quick CPU
calibration that ``gpualloc run`` uses (measured once on this machine and cached). Closing the loop: every case
is predicted again with the calibration fitted from the first case's run (``--calibration-out``), as
``gpualloc place --calibration run.json`` would plan with it.

Cases (gpt-tiny, global batch 32 by default): DDP with equal and unequal (3:1) shares on 2xcpu, PP2 with 1F1B
(4 microbatches; the layers cut in half) on 2xcpu, PP2 x DP2 on 4xcpu.

Usage: python benchmarks/engine_rows.py [--model gpt-tiny] [--batch 32] [--steps 10] [--out PATH]
Writes benchmarks/results/engine_rows.json and prints the Markdown rows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import _args

HERE = Path(__file__).resolve().parent


def _cases(L: int, batch: int):
    from gpualloc.placement.hybrid.plan import HybridStage, Replica

    half, q = L // 2, batch // 4
    return [
        ("DDP 1:1", "2xcpu", [HybridStage(0, L - 1, (Replica((0,), batch // 2), Replica((1,), batch // 2)))], 1),
        ("DDP 3:1", "2xcpu", [HybridStage(0, L - 1, (Replica((0,), 3 * q), Replica((1,), batch - 3 * q)))], 1),
        ("PP2 1F1B", "2xcpu", [HybridStage(0, half - 1, (Replica((0,), batch),)),
                               HybridStage(half, L - 1, (Replica((1,), batch),))], 4),
        ("PP2 x DP2", "4xcpu", [HybridStage(0, half - 1, (Replica((0,), batch // 2), Replica((1,), batch // 2))),
                                HybridStage(half, L - 1, (Replica((2,), batch // 2), Replica((3,), batch // 2)))], 2),
    ]


def _launch(args: list[str], timeout_s: float) -> dict:
    """``gpualloc launch ... --json`` in its own process group (ended, torchrun included, on a timeout)."""
    proc = subprocess.Popen([sys.executable, "-m", "gpualloc.cli.main", "launch", *args, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)  # launch ends torchrun's own group on SIGTERM
        proc.communicate(timeout=30)
        raise
    if proc.returncode != 0:
        raise SystemExit(f"gpualloc launch {' '.join(args)} failed ({proc.returncode}):\n{err[-3000:]}")
    return json.loads(out)


def main() -> int:
    p = _args.Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt-tiny", help="zoo model (default gpt-tiny)")
    p.add_argument("--batch", type=_args.between(8, 4096), default=32, help="global batch (default 32)")
    p.add_argument("--steps", type=_args.between(1, 10_000), default=10, help="timed steps (default 10)")
    p.add_argument("--warmup", type=_args.between(0, 1000), default=2, help="untimed steps (default 2)")
    p.add_argument("--timeout", type=_args.positive, default=600.0, help="seconds per launch")
    p.add_argument("--out", type=_args.output, default=HERE / "results" / "engine_rows.json")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # end the torchrun groups too
    if args.batch % 8:
        p.error(f"--batch {args.batch}: must be a multiple of 8 (shares 3:1 and 4 microbatches)")

    from gpualloc.cost.model import Calibration
    from gpualloc.execute.engine.record import predict_run
    from gpualloc.graph.cached import capture_cached
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.document import write_plan
    from gpualloc.placement.hybrid.plan import make_plan
    from gpualloc.placement.problem import PlacementProblem

    graph = capture_cached(args.model, batch=args.batch)
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="engine-rows-") as tmp:
        folder = Path(tmp)
        plans = []
        for i, (name, spec, stages, m) in enumerate(_cases(PlacementProblem(graph, load_cluster("2xcpu")).hybrid.L,
                                                          args.batch)):
            cluster = load_cluster(spec)
            problem = PlacementProblem(graph, cluster)
            plan = make_plan(stages, args.batch, m, n_devices=len(cluster))
            path = folder / f"plan{i}.json"
            write_plan(path, problem, plan, spec, extra={"method": name})
            plans.append((name, spec, cluster, plan))
            report = _launch([str(path), "--model", args.model, "--steps", str(args.steps), "--warmup",
                              str(args.warmup), "--optimizer", "sgd", "--out", str(folder / f"run{i}"),
                              "--calibration-out", str(folder / f"run{i}.json")], args.timeout)
            rows.append({"case": name, "cluster": spec, "plan": report["plan_description"], **{
                k: report[k] for k in ("measured_step_s", "predicted_step_s", "step_error", "prediction", "checks",
                                       "ranks", "scale", "memory", "calibration")}})
            print(f"{name}: measured {report['measured_step_s'] * 1e3:.1f} ms, predicted "
                  f"{report['predicted_step_s'] * 1e3:.1f} ms ({report['step_error']:+.0%})", flush=True)
        fitted = Calibration.load(folder / "run0.json")
        for row, (_, _, cluster, plan) in zip(rows, plans, strict=True):
            again = predict_run(plan, graph, cluster, fitted, optimizer="sgd")
            row["predicted_step_s_with_run0"] = again.step_time_s
            row["step_error_with_run0"] = again.step_time_s / row["measured_step_s"] - 1.0
    load_after = os.getloadavg()
    doc = {"benchmark": "engine_rows", "model": args.model, "global_batch": args.batch, "steps": args.steps,
           "warmup": args.warmup, "host_cpus": os.cpu_count(), "torch": __import__("torch").__version__,
           "load_avg_1m_before": load_before[0], "load_avg_1m_after": load_after[0], "rows": rows,
           "command": "python benchmarks/engine_rows.py " + " ".join(sys.argv[1:])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")

    print("\n| case | plan | measured step | predicted (quick CPU calibration) | predicted (fitted on DDP 1:1's run) "
          "| peak memory per rank, measured / predicted | loss, grad, weights = unsplit |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        mem = ", ".join(f"{(x['measured_peak_bytes'] or 0) / 1e6:.1f} / {x['predicted_peak_bytes'] / 1e6:.1f} MB"
                        for x in r["ranks"])
        ok = ", ".join("yes" if c.get("ok") else ("no" if c.get("ok") is not None else "-")
                       for c in r["checks"].values())
        print(f"| {r['case']} | {r['plan'].replace('|', chr(92) + '|')} | {r['measured_step_s'] * 1e3:.1f} ms | "
              f"{r['predicted_step_s'] * 1e3:.1f} ms ({r['step_error']:+.0%}) | "
              f"{r['predicted_step_s_with_run0'] * 1e3:.1f} ms ({r['step_error_with_run0']:+.0%}) | {mem} | {ok} |")
    print(f"\nload average (1 min): {load_before[0]:.2f} before, {load_after[0]:.2f} after; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_args.guarded(main))
