"""How well the online duration predictor (``gpualloc.scheduling.predict``) predicts, per real trace.

Each trace is replayed in arrival order with no queueing: job ``i`` arrives at ``arrival_s`` and
finishes ``work_s`` later, and only then joins the history a prediction may learn from. At each job's
arrival the predictor (refitted on its own schedule) predicts its remaining work with nothing done
(``done 0``); at ``arrival + d`` for each attained-service point ``d`` (``--points``), every job still
running then (``work_s > d``) is predicted again given ``d`` done, from the history at that moment.

Reported per trace and point, over every prediction (the cold start included): MAE in seconds and of
``log`` (``|log(median / truth)|``, the typical factor off), Spearman's rank correlation between the
predicted median and the truth, and the share of true values inside the nominal 80% interval; for the
predictor and two naive baselines refreshed at the same moments as the predictor:

* ``global``: the empirical distribution of every finished job's work (its median, its quantiles);
* ``group``: the same within the job's finest submit-time group (every categorical field and the GPU
  count) when that group has 5 finished jobs, else global;

all three conditioned on the work done in the same way (:class:`gpualloc.scheduling.predict.EmpiricalBins`).
A constant prediction has no rank correlation (NaN).

Alibaba is the held-out trace family: no feature or hyper-parameter was chosen on it; it is reported
apart (``held_out``). The other three are where the configuration was chosen (``--set`` tries one).

Run: ``python benchmarks/prediction_quality.py [--data ../shared/data] [--traces philly,gavel-msr,pollux,alibaba]
[--points 600,3600,36000] [--seed 0] [--set key=value ...]``; writes
``benchmarks/results/prediction_quality.json`` (``--out``) and prints a table.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

import _args
import numpy as np
from scipy.stats import spearmanr

from gpualloc.errors import TraceError
from gpualloc.scheduling.predict import DurationPredictor, EmpiricalBins, PredictorConfig
from gpualloc.workload.jobs import Job, SubmitFeatures, Trace
from gpualloc.workload.traces import read_trace

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
OUT = Path(__file__).resolve().parent / "results" / "prediction_quality.json"
TRACES = {  # label: (files under --data, reader)
    "philly": (("philly/philly.csv",), "philly"),
    "gavel-msr": (("gavel/msr-seed0/0e4a51.trace",), "gavel"),
    "pollux": (tuple(f"philly/pollux-workloads/workload-{k}.csv" for k in range(1, 9)), "pollux"),
    "alibaba": (("alibaba-gpu-v2023/openb_pod_list_default.csv",), "alibaba"),
}
HELD_OUT = ("alibaba",)
GROUP_MIN = 5  # finished jobs a group needs before its own distribution is used


def load(label: str, root: Path) -> Trace:
    """The trace; the Pollux workloads (160 jobs each) one after another, each starting when the last
    one's last job arrived, with ids made unique."""
    files, fmt = TRACES[label]
    jobs: list[Job] = []
    offset = 0.0
    for k, rel in enumerate(files):
        path = root / rel
        if not path.exists():
            raise TraceError(f"{path}: not found (--data names the folder holding the real traces)")
        part = read_trace(path, fmt)
        jobs += [Job(**{**j.to_dict(), "id": f"{k}:{j.id}", "arrival_s": j.arrival_s + offset,
                        "job_type": j.job_type, "gpu_types": j.gpu_types}) for j in part.jobs]
        offset = max(j.arrival_s for j in jobs)
    return Trace.of(jobs, source=",".join(files), format=fmt)


def group_codes(feats: SubmitFeatures) -> np.ndarray:
    """Each job's finest submit-time group: every categorical field and the GPU count."""
    cols = [np.asarray(getattr(feats, name), dtype=np.int64) for name in SubmitFeatures.CATEGORICAL]
    cols.append(np.asarray(feats.num_gpus, dtype=np.int64))
    _, codes = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
    return codes.reshape(-1)


class Baselines:
    """The global and per-group empirical distributions of the finished jobs' log-work."""

    def __init__(self, groups: np.ndarray) -> None:
        self.groups = groups
        self.n_groups = int(groups.max()) + 1 if groups.size else 0
        self.global_bins: EmpiricalBins | None = None
        self.group_bins: EmpiricalBins | None = None
        self.group_ok = np.zeros(self.n_groups, dtype=bool)

    def fit(self, hist: np.ndarray, log_work: np.ndarray) -> None:
        if not hist.size:
            self.global_bins = self.group_bins = None
            return
        y = log_work[hist]
        self.global_bins = EmpiricalBins([y])
        g = self.groups[hist]
        counts = np.bincount(g, minlength=self.n_groups)
        self.group_ok = counts >= GROUP_MIN
        order = np.argsort(g, kind="stable")
        splits = np.split(y[order], np.cumsum(counts)[:-1])
        # a group without its own distribution is never asked (global answers): one placeholder sample
        self.group_bins = EmpiricalBins([s if ok else np.zeros(1) for s, ok in zip(splits, self.group_ok, strict=True)])

    def predict(self, jobs: np.ndarray, done: np.ndarray, probs: tuple[float, ...],
                prior: DurationPredictor) -> tuple[np.ndarray, np.ndarray]:
        if self.global_bins is None:  # nothing has finished: the predictor's prior, for both
            q = prior.remaining_quantiles(np.zeros(jobs.size), done, probs)
            return q, q
        zero = np.zeros(jobs.size)
        glob = self.global_bins.remaining(np.zeros(jobs.size, np.int64), zero, done, probs)
        g = self.groups[jobs]
        own = self.group_ok[g]
        group = glob.copy()
        if own.any():
            group[:, own] = self.group_bins.remaining(g[own], zero[own], done[own], probs)
        return glob, group


def replay(trace: Trace, points: list[float], seed: int, overrides: dict, censor: bool = True) -> dict:
    """Every prediction of the replay, with the truth: ``{method: (median, lo, hi)}``, truth, point index."""
    jobs = trace.jobs
    feats = SubmitFeatures.of(jobs)
    arrival = np.array([j.arrival_s for j in jobs])
    work = np.array([j.work_s for j in jobs])
    finish = arrival + work
    by_finish = np.argsort(finish, kind="stable")
    finish_sorted = finish[by_finish]
    log_work = np.log(work)
    # events: (time, job, point index); point 0 is arrival (done 0)
    ev_t, ev_j, ev_p = [arrival], [np.arange(len(jobs))], [np.zeros(len(jobs), np.int64)]
    for k, d in enumerate(points, start=1):
        alive = np.flatnonzero(work > d)
        ev_t.append(arrival[alive] + d)
        ev_j.append(alive)
        ev_p.append(np.full(alive.size, k, np.int64))
    t, j, p = (np.concatenate(x) for x in (ev_t, ev_j, ev_p))
    order = np.lexsort((p, j, t))
    t, j, p = t[order], j[order], p[order]
    done = np.where(p == 0, 0.0, np.asarray([0.0, *points])[p])
    n_hist = np.searchsorted(finish_sorted, t, side="right")  # finished strictly by then (finish <= t)

    predictor = DurationPredictor(seed=seed, **overrides)
    base = Baselines(group_codes(feats))
    c = predictor.config
    probs = (0.5, (1 - c.interval) / 2, (1 + c.interval) / 2)
    out = {name: np.empty((3, t.size)) for name in ("predictor", "global", "group")}
    fit_s = 0.0
    start = 0
    while start < t.size:
        # the state changes only where the schedule refits: the events up to then share it
        stop = int(np.searchsorted(n_hist, predictor.next_refit(), side="left"))
        if stop > start:
            sl = slice(start, stop)
            pred = predictor.predict_features(feats, done[sl], j[sl])
            out["predictor"][:, sl] = pred.median_s, pred.lo_s, pred.hi_s
            out["global"][:, sl], out["group"][:, sl] = base.predict(j[sl], done[sl], probs, predictor)
        if stop < t.size:
            hist = by_finish[: n_hist[stop]]
            now = t[stop]
            running = np.flatnonzero((arrival < now) & (finish > now)) if censor else np.zeros(0, np.int64)
            t0 = time.perf_counter()
            predictor.fit_arrays(feats.take(hist), work[hist], feats.take(running), now - arrival[running])
            fit_s += time.perf_counter() - t0
            base.fit(hist, log_work)
        start = stop
    truth = work[j] - done
    return {"pred": out, "truth": truth, "point": p, "fits": predictor.fits, "fit_s": fit_s}


def scores(median: np.ndarray, lo: np.ndarray, hi: np.ndarray, truth: np.ndarray) -> dict:
    rho = spearmanr(median, truth).statistic if np.ptp(median) > 0 and truth.size > 2 else float("nan")
    return {
        "mae_s": float(np.mean(np.abs(median - truth))),
        "mae_log": float(np.mean(np.abs(np.log(median) - np.log(truth)))),
        "spearman": float(rho),
        # (a relative tolerance: an interval of one repeated value holds it, up to exp(log(x)) != x)
        "coverage": float(np.mean((truth >= lo * (1 - 1e-9)) & (truth <= hi * (1 + 1e-9)))),
    }


def main() -> int:
    parser = _args.Parser(description=__doc__)
    parser.add_argument("--data", type=Path, default=DATA, help="folder holding the real traces (../shared/data)")
    parser.add_argument("--traces", default=",".join(TRACES),
                        help=f"comma-separated, of {', '.join(TRACES)}")
    parser.add_argument("--points", type=_args.numbers(0.0, strict=True), default=[600.0, 3600.0, 36000.0],
                        help="attained-service points (reference seconds of work done)")
    parser.add_argument("--seed", type=_args.seed, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a PredictorConfig field (repeatable)")
    parser.add_argument("--no-censored", action="store_true",
                        help="the predictor learns from finished jobs only (not the running jobs' work so far)")
    parser.add_argument("--out", type=_args.output, default=OUT)
    args = parser.parse_args()
    labels = [x.strip() for x in args.traces.split(",") if x.strip()]
    for label in labels:
        if label not in TRACES:
            parser.error(f"--traces: unknown trace {label!r} (known: {', '.join(TRACES)})")
    types = {f.name: type(getattr(PredictorConfig(), f.name)) for f in fields(PredictorConfig)}
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in types:
            parser.error(f"--set {item}: unknown option (known: {', '.join(types)})")
        try:
            overrides[key] = types[key](value)
        except ValueError:
            parser.error(f"--set {item}: expected a {types[key].__name__}")
    config = PredictorConfig(**overrides)  # bad values: one line, before any work
    for label in labels:
        missing = [rel for rel in TRACES[label][0] if not (args.data / rel).is_file()]
        if missing:
            parser.error(f"--data {args.data}: no {missing[0]} in it (--traces {label})")
    points = sorted(args.points)

    rows = []
    for label in labels:
        trace = load(label, args.data)
        t0 = time.perf_counter()
        run = replay(trace, points, args.seed, overrides, censor=not args.no_censored)
        wall = time.perf_counter() - t0
        for k, name in enumerate(["arrival", *[f"done {d:g} s" for d in points]]):
            sel = run["point"] == k
            if not sel.any():
                continue
            row = {"trace": label, "held_out": label in HELD_OUT, "jobs": len(trace.jobs), "at": name,
                   "done_s": 0.0 if k == 0 else points[k - 1], "n": int(sel.sum())}
            for method, q in run["pred"].items():
                row[method] = scores(q[0][sel], q[1][sel], q[2][sel], run["truth"][sel])
            if k == 0:
                row.update(fits=run["fits"], fit_s=round(run["fit_s"], 2), wall_s=round(wall, 2))
            rows.append(row)
        print(f"{label}: {len(trace.jobs)} jobs, {run['fits']} fits ({run['fit_s']:.1f} s), {wall:.1f} s",
              file=sys.stderr)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python benchmarks/prediction_quality.py " + " ".join(sys.argv[1:]),
        "config": asdict(config), "censored": not args.no_censored, "seed": args.seed, "points_s": points,
        "held_out": list(HELD_OUT), "rows": rows}, indent=1) + "\n")
    print(table(rows))
    return 0


def table(rows: list[dict]) -> str:
    head = (f"{'trace':10s} {'at':14s} {'n':>6s} | {'MAE h':>7s} {'glob':>7s} {'group':>7s} | "
            f"{'log':>5s} {'glob':>5s} {'grp':>5s} | {'rho':>5s} {'grp':>5s} | {'cov':>5s} {'glob':>5s} {'grp':>5s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        p, g, q = r["predictor"], r["global"], r["group"]
        name = r["trace"] + ("*" if r["held_out"] else "")
        lines.append(
            f"{name:10s} {r['at']:14s} {r['n']:6d} | {p['mae_s'] / 3600:7.2f} {g['mae_s'] / 3600:7.2f} "
            f"{q['mae_s'] / 3600:7.2f} | {p['mae_log']:5.2f} {g['mae_log']:5.2f} {q['mae_log']:5.2f} | "
            f"{p['spearman']:5.2f} {q['spearman']:5.2f} | {p['coverage']:5.2f} {g['coverage']:5.2f} "
            f"{q['coverage']:5.2f}")
    lines.append("* held out: no choice was made on it. MAE in hours; log: mean |log(pred/true)|; rho: Spearman; "
                 "cov: share inside the 80% interval")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(_args.guarded(main))
