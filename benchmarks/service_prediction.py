"""The service's run-time prediction (issue 36): its cost and what it learns from job names.

A store is filled with ``--history`` jobs that ran to their end, one after another on the one T4 of
``1xT4``, under ``--names`` job names (``job3-17``: name key ``job3``); each name has a median run time
drawn log-uniform in e^3..e^9 s, and each job's run time is that median x a log-normal factor (sigma
``--sigma``). Then ``--queued`` jobs are submitted under the same names and a scheduler opens the
store (the service's start: recovery and the predictor's warm start). Measured: the warm start, a
refit alone, ``describe`` (what ``GET /jobs`` adds) for 100 and for every queued job, and the queued
jobs' predicted median against their name's true median (Spearman; median |log ratio|). No process
is started (a backend that runs nothing); the store's clock is set, so run times are exact.

Results go to ``benchmarks/results/service_prediction.json``.

Run: ``python benchmarks/service_prediction.py [--history 2500] [--queued 2000] [--names 20] [--seed 0]``
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import _args
import numpy as np
from scipy.stats import spearmanr

from gpualloc.errors import write_text
from gpualloc.hardware.cluster import load_cluster
from gpualloc.service.backends import RunState, RunStatus
from gpualloc.service.scheduler import Scheduler
from gpualloc.service.store import Store

OUT = Path(__file__).resolve().parent / "results" / "service_prediction.json"


class _Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


class _NoRuns:
    """A backend that runs nothing (every attempt stays running)."""

    name = "none"

    def handle(self, job_id, attempt, n_groups=1):
        return f"none-{job_id}-{attempt}"

    def launch(self, req):
        return self.handle(req.job_id, req.attempt)

    def poll(self, runs):
        return {r.key: RunState(RunStatus.RUNNING) for r in runs}

    def stop(self, run):
        pass

    def release(self, run):
        pass

    def cleanup(self, keep):
        return []

    def capacity(self):
        return None

    def log_path(self, handle, stream):
        return None


def _spec(name: str) -> dict:
    return {"name": name, "num_gpus": 1, "gpu_types": [], "job_type": "ml-training", "time_limit_s": None,
            "priority": 0, "single_node": False, "model": "", "target": {"argv": ["true"]}}


def _median_ms(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> int:
    p = _args.Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--history", type=_args.at_least(10), default=2500, help="jobs that ran to their end")
    p.add_argument("--queued", type=_args.at_least(100), default=2000, help="jobs queued at the start")
    p.add_argument("--names", type=_args.at_least(2), default=20, help="job names")
    p.add_argument("--sigma", type=_args.non_negative, default=0.5, help="log-normal spread of a name's run times")
    p.add_argument("--seed", type=_args.seed, default=0)
    p.add_argument("--out", type=_args.output, default=OUT)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    names = [f"job{k}" for k in range(a.names)]
    median_s = {k: float(np.exp(rng.uniform(3, 9))) for k in names}
    with tempfile.TemporaryDirectory() as tmp:
        clock = _Clock()
        store = Store(Path(tmp) / "s.db", clock=clock, synchronous="NORMAL")
        try:
            t0 = time.perf_counter()
            for i in range(a.history):
                key = names[i % a.names]
                rec, _ = store.submit(_spec(f"{key}-{i}"))
                clock.t += 1.0
                store.allocate(rec.id, "T4", (0,))
                store.mark_started(rec.id, 1, f"h{rec.id}")
                clock.t += median_s[key] * float(rng.lognormal(0.0, a.sigma))
                store.mark_ended(rec.id, 1, exit_code=0)
            fill_s = time.perf_counter() - t0
            for i in range(a.queued):
                store.submit(_spec(f"{names[i % a.names]}-{10**6 + i}"))
            sched = Scheduler(store, _NoRuns(), load_cluster("1xT4"), clock=clock)
            t0 = time.perf_counter()
            sched.recover()
            warm_s = time.perf_counter() - t0
            history = sched.history
            refit_ms = _median_ms(history.refit, 3)
            queued = store.list_jobs()[a.history:]
            d100 = _median_ms(lambda: history.describe(queued[:100]))
            d_all = _median_ms(lambda: history.describe(queued))
            pred = history.describe(queued)
            got = np.array([q["predicted_remaining_s"] for q in pred])
            true = np.array([median_s[r.name.split("-")[0]] for r in queued])
            row = {"history": a.history, "queued": a.queued, "names": a.names, "sigma": a.sigma, "seed": a.seed,
                   "stage": history.stage, "fitted_on": history.predictor.n_history, "fill_s": fill_s,
                   "warm_start_s": warm_s, "refit_ms": refit_ms, "describe_100_ms": d100,
                   f"describe_{a.queued}_ms": d_all, "spearman": float(spearmanr(got, true)[0]),
                   "median_abs_log_ratio": float(np.median(np.abs(np.log(got / true)))),
                   "host": platform.node(), "python": platform.python_version()}
        finally:
            store.close()
    write_text(a.out, json.dumps(row, indent=1) + "\n")
    print("| history | queued | stage | warm start (s) | refit (ms) | describe 100 (ms) | describe all (ms) "
          "| Spearman | median abs log ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {a.history} | {a.queued} | {row['stage']} | {warm_s:.2f} | {refit_ms:.0f} | {d100:.1f} | {d_all:.1f} | "
          f"{row['spearman']:.3f} | {row['median_abs_log_ratio']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(_args.guarded(main))
