"""The scheduling results table: every policy, the DQN agent and the lower bound, side by side.

Part 1, synthetic: on ``adlro16``, for each load and seed, one trace from the Gavel-style generator
(simulation / ML training / data processing mixed) is replayed under every policy. Rows are means,
standard deviations and 95% confidence intervals (Student t) over seeds.

Part 2, real traces the agent never saw in training: windows of Gavel's msr trace, Philly, and
Alibaba's pod list, each *scaled to the cluster*: the window's arrival times are stretched or
compressed so its offered load (reference GPU-seconds over the span, per GPU) is ``load``. Jobs no
device type of the cluster can hold (gangs over 8 GPUs, Alibaba pods pinned to GPU models the
cluster lacks) are rejected and counted.

Both parts run on ``adlro16`` and, in :meth:`SchedTableSpec.full` (``reproduce scheduling``), on
``16xV100+8xT4+8xA100``, which the bundled agent never trained on (real windows on it: real workloads
on GPUs never trained on). Each row carries ``vs_best``: its JCT reduction against the best heuristic
(SRTF, Gavel, Tiresias, EASY, SJF and ``gavel-srtf``; ``vs_best_published`` without it) of the same
cluster, trace and load, and the learned rows a paired 95% CI of it over seeds. ``dqn-hd`` is the
ablation: the agent trained with the hyperdimensional features (``sched-experts-hd.pt``).

Each information level of :attr:`SchedTableSpec.knowledge` (:mod:`gpualloc.scheduling.knowledge`)
runs the table again, side by side: every row carries ``knowledge``, ``needs_durations`` and
``learned``; ``vs_*`` compare rows of the same level only; under ``blind`` a policy that needs
durations gives way to its ``-pred`` version (:func:`~gpualloc.scheduling.knowledge.policies_at`), and
a learned policy that reads what the level hides is left out and named in ``not_run``. The oracle
bound (``oracle-lb``) is one row per workload, labelled ``oracle``; ``vs_oracle_gavel_srtf`` is each
row's gap to the oracle ``gavel-srtf`` where the oracle level ran.
"""

from __future__ import annotations

import math
import time
import warnings
from functools import lru_cache
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from gpualloc.errors import GpuallocWarning, TraceError
from gpualloc.parallel import Executor, SerialExecutor
from gpualloc.hardware.cluster import ClusterSpec, load_cluster
from gpualloc.scheduling.knowledge import KNOWLEDGE, InformationError, policies_at, row_labels
from gpualloc.scheduling.policies import is_learned, needs_durations
from gpualloc.scheduling.metrics import oracle_summary, reduction, summary, x_bound
from gpualloc.scheduling.policies import POLICIES as REGISTRY
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.simulator import Workload, prepare, simulate
from gpualloc.workload.jobs import Trace
from gpualloc.workload.traces import generate, read_trace

POLICIES = ("fcfs", "static-affinity", "sjf", "easy-backfill", "srtf", "tiresias", "las", "tiresias-gittins", "gavel",
            "gavel-srtf", "dqn", "dqn-hd")
PUBLISHED_HEURISTICS = ("srtf", "gavel", "tiresias", "easy-backfill", "sjf", "las", "tiresias-gittins")
"""The published strong heuristics (issue 18's list, and issue 36's non-clairvoyant LAS and Tiresias'
2D-Gittins): ``vs_best_published`` compares with the best of them."""
NON_CLAIRVOYANT = ("las", "tiresias-gittins")
"""Issue 36's non-clairvoyant baselines: in the full table (every level), not in the quick one (CI time)."""
HEURISTICS = (*PUBLISHED_HEURISTICS, "gavel-srtf")
"""Every strong heuristic, ours included: ``vs_best`` compares with the best of them (the stricter bar)."""
BASELINE_SETS = {"best": HEURISTICS, "best_published": PUBLISHED_HEURISTICS}
"""Row key prefix -> the heuristics its best is taken from (``vs_<key>``, ``vs_<key>_ci95``)."""
UNSEEN_CLUSTER = "16xV100+8xT4+8xA100"
"""A cluster the bundled agent never trained on (``reproduce scheduling`` runs it beside ``adlro16``)."""
VARIANTS = {"dqn-hd": ("dqn", "sched-experts-hd.pt")}
"""Table rows that are a registered policy with a bundled agent file (the HD-feature ablation)."""
METRICS = ("avg_jct_s", "throughput_jobs_per_h", "utilization", "p99_jct_s", "makespan_s", "hyperscore",
           "effective_utilization", "saturated_utilization")
MIGRATION_METRICS = ("migrations", "fragmentation_wait_gpu_s")
"""Per-run figures of a table with migration: jobs moved, and GPU-seconds single-node gangs waited while
fragmentation blocked them (means over seeds)."""
REAL_TRACES = (("gavel-msr", "gavel/msr-seed0/0e4a51.trace", "gavel"),
               ("philly", "philly/philly.csv", "philly"),
               ("alibaba", "alibaba-gpu-v2023/openb_pod_list_default.csv", "alibaba"))


@dataclass(frozen=True)
class SchedTableSpec:
    """What to run; ``quick`` is the CI smoke version."""

    cluster: str = "adlro16"
    unseen_cluster: str | None = None
    loads: tuple[float, ...] = (0.5, 0.8, 1.0)
    seeds: int = 5
    jobs: int = 300
    real_jobs: int = 300
    real_load: float = 0.8
    policies: tuple[str, ...] = POLICIES
    knowledge: tuple[str, ...] = ("oracle",)
    migrate: bool = False

    @classmethod
    def full(cls) -> SchedTableSpec:
        """What ``reproduce scheduling`` runs: the defaults plus :data:`UNSEEN_CLUSTER`, at every
        information level."""
        return cls(unseen_cluster=UNSEEN_CLUSTER, knowledge=KNOWLEDGE)

    @classmethod
    def quick(cls) -> SchedTableSpec:
        """One load, 2 seeds, short real-trace windows, and no HD ablation: the expert-choice agents ask
        five experts at every round, which on a real trace's long jobs costs minutes per run."""
        return cls(loads=(0.8,), seeds=2, jobs=120, real_jobs=60, unseen_cluster=None,
                   policies=tuple(p for p in POLICIES if p != "dqn-hd" and p not in NON_CLAIRVOYANT),
                   knowledge=KNOWLEDGE)

    @property
    def clusters(self) -> tuple[str, ...]:
        return (self.cluster,) if self.unseen_cluster is None else (self.cluster, self.unseen_cluster)


def scale_to_load(trace: Trace, cluster: ClusterSpec, load: float) -> Trace:
    """The same jobs with arrivals rescaled so the offered load on ``cluster`` is ``load``."""
    jobs = trace.shifted().jobs
    span = max(j.arrival_s for j in jobs) if jobs else 0.0
    work = sum(j.gpu_seconds for j in jobs)
    target = work / (len(cluster) * load)
    factor = target / span if span > 0 else 1.0
    return Trace(tuple(replace(j, arrival_s=j.arrival_s * factor) for j in jobs), trace.source, trace.format,
                 {**trace.meta, "arrival_scale": factor, "load": load})


def _aggregate(runs: Sequence[dict[str, Any]], oracle: Sequence[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for key in METRICS:
        vals = np.array([r[key] for r in runs], dtype=float)
        vals = vals[~np.isnan(vals)]  # utilisation while jobs wait: over the seeds in which a job waited
        row[key] = float(np.mean(vals)) if len(vals) else math.nan
        row[f"{key}_std"] = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
        if len(vals) < len(runs):
            row[f"{key}_runs"] = int(len(vals))  # how many runs it is defined in (of ``len(runs)``)
    jct = np.array([r["avg_jct_s"] for r in runs])
    if len(jct) > 1:
        half = stats.t.ppf(0.975, len(jct) - 1) * np.std(jct, ddof=1) / np.sqrt(len(jct))
        row["avg_jct_s_ci95"] = [float(jct.mean() - half), float(jct.mean() + half)]
    bounds = [x_bound(r["avg_jct_s"], o["avg_jct_s"]) for r, o in zip(runs, oracle, strict=False)]
    row["x_bound"] = float(np.mean(bounds))
    for key in MIGRATION_METRICS:  # runs with migration (SchedTableSpec.migrate)
        if all(key in r for r in runs):
            row[key] = float(np.mean([r[key] for r in runs]))
    row["rejected"] = int(sum(r["rejected"] for r in runs))
    return row


def _paired_ci(a: Sequence[float], b: Sequence[float]) -> list[float] | None:
    """95% CI of the mean relative reduction ``1 - a/b`` over paired seeds."""
    d = 1.0 - np.asarray(a) / np.asarray(b)
    if len(d) < 2:
        return None
    half = stats.t.ppf(0.975, len(d) - 1) * np.std(d, ddof=1) / np.sqrt(len(d))
    return [float(d.mean() - half), float(d.mean() + half)]


@dataclass(frozen=True)
class SchedRun:
    """One unit of work: one policy on one trace, rebuilt in the worker from these small values.

    A synthetic trace is ``generate(jobs, cluster, load, seed=trace_seed)``; a real one is the first
    ``jobs`` jobs of ``path`` (read as ``fmt``) scaled to ``load``.
    """

    cluster: str
    policy: str
    seed: int
    load: float
    jobs: int
    trace_seed: int | None = None
    path: str | None = None
    fmt: str | None = None
    agent: str | None = None
    cache_dir: str | None = None  # the dqn gate verdicts' cache (gpualloc.cache), or None
    knowledge: str = "oracle"
    migrate: bool = False  # move running jobs to make room for single-node gangs (scheduling.consolidate)


@lru_cache(maxsize=4)
def _workload(cluster: str, load: float, jobs: int, trace_seed: int | None, path: str | None,
              fmt: str | None) -> Workload:
    # cached: every policy of one (trace, seed) replays the same trace, often in the same worker, so
    # the trace, its speed matrix and its job table are built once
    spec = load_cluster(cluster)
    if path is None:
        trace = generate(jobs, spec, load, seed=trace_seed)
    else:
        trace = scale_to_load(read_trace(path, fmt).head(jobs), spec, load)
    return prepare(trace, spec)


def _make(policy: str, agent: str | None, cache_dir: str | None = None):
    """The table's policy ``policy`` (a variant with its bundled agent); our warnings (an agent's
    fallback) are not repeated for every run: :func:`agent_notes` reports each once. With ``cache_dir``,
    a learned policy reads its gate verdict from that cache (a failed gate: no checkpoint loaded)."""
    name = policy
    if name in VARIANTS:
        from gpualloc.rl.sched_policy import bundled_agent_path

        name, agent = VARIANTS[name][0], str(bundled_agent_path(VARIANTS[name][1]))
    options = REGISTRY.entry(name).options
    more = {"agent": agent} if "agent" in options and agent else {}
    if "cache" in options and cache_dir is not None:
        from gpualloc.cache import DiskCache

        more["cache"] = DiskCache(cache_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GpuallocWarning)
        return make_policy(name, **more)


def agent_notes(policies: Sequence[str], agent: str | None = None, cache_dir: str | None = None) -> dict[str, str]:
    """Which policy each learned row runs, one line per learned policy (e.g. a failed gate's fallback)."""
    notes = {name: getattr(_make(name, agent, cache_dir), "note", None) for name in policies}
    return {name: note for name, note in notes.items() if note}


def run_one(run: SchedRun) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Simulate ``run`` at its information level; returns its summary and the oracle lower bound of the
    same result, or ``({"policy": ..., "not_run": why}, None)`` when the policy reads what the level hides."""
    work = _workload(run.cluster, run.load, run.jobs, run.trace_seed, run.path, run.fmt)
    policy = _make(run.policy, run.agent, run.cache_dir)
    try:
        result = simulate(work, work.cluster, policy, seed=run.seed, drop_unplaceable=True, timeline=True,
                          knowledge=run.knowledge, **({"migrate": True, "fragmentation": True} if run.migrate else {}))
    except InformationError as err:
        return {"policy": run.policy, "not_run": str(err)}, None
    out = summary(result)
    if run.migrate:
        out |= {"migrations": float(result.migrations.sum()),
                "fragmentation_wait_gpu_s": float(result.fragmentation_wait_gpu_s)}
    return out, oracle_summary(result)


def _real_traces(data_root: str | Path | None) -> list[tuple[str, Path, str]]:
    """The part-2 traces present under ``data_root``: ``(label, path, format)``."""
    if data_root is None:
        return []
    root = Path(data_root)
    return [(label, root / rel, fmt) for label, rel, fmt in REAL_TRACES if (root / rel).exists()]


def require_real_traces(data_root: str | Path) -> list[tuple[str, Path, str]]:
    """:func:`_real_traces`, for a folder given on purpose (``--train-windows``, a benchmark's ``--data``).

    Raises:
        TraceError: none of :data:`REAL_TRACES` is under ``data_root``.
    """
    real = _real_traces(data_root)
    if not real:
        raise TraceError(f"{data_root}: none of the real traces is there (expected any of "
                         f"{', '.join(rel for _, rel, _ in REAL_TRACES)})")
    return real


def _planned_runs(spec: SchedTableSpec, real: Sequence[tuple[str, Path, str]],
                  agent: str | None, cache_dir: str | None = None) -> list[tuple[str, SchedRun]]:
    """Every simulation, labelled: synthetic (cluster, load, seed, policy), then real (cluster, trace, policy).

    The real-trace windows run on every cluster of the table, the unseen one included: how a policy
    transfers to real workloads on GPUs it was never trained on."""
    where = {c: "" if c == spec.cluster else f"{c} " for c in spec.clusters}  # each label's cluster prefix
    runs: list[tuple[str, SchedRun]] = []
    for cluster in spec.clusters:
        for load in spec.loads:
            for seed in range(spec.seeds):
                for name in spec.policies:  # trace seeds 10_000+ are never the agent's training seeds
                    runs.append((f"{where[cluster]}load {load} seed {seed} {name}",
                                 SchedRun(cluster, name, seed, load, spec.jobs, trace_seed=10_000 + seed,
                                          agent=agent, cache_dir=cache_dir, migrate=spec.migrate)))
    for cluster in spec.clusters:
        for label, path, fmt in real:
            for name in spec.policies:
                runs.append((f"{where[cluster]}{label} {name}",
                             SchedRun(cluster, name, 0, spec.real_load, spec.real_jobs, path=str(path), fmt=fmt,
                                      agent=agent, cache_dir=cache_dir, migrate=spec.migrate)))
    return runs


def _take(results: Iterator[tuple[dict[str, Any], dict[str, Any] | None]],
          policies: Sequence[str]) -> tuple[dict[str, dict], dict]:
    """One trace's runs in policy order; the oracle row comes from the last policy that ran (every run
    of a trace has the same bound). A policy that did not run (``not_run``) is left out."""
    out = {name: next(results) for name in policies}
    oracle = next((o for _, o in reversed(list(out.values())) if o is not None), None)
    if oracle is None:
        raise InformationError("no policy of the table could run at this information level: "
                               + "; ".join(s["not_run"] for s, _ in out.values()))
    return {name: s for name, (s, o) in out.items() if o is not None}, oracle


def _vs_baselines_ci(runs_p: Sequence[dict[str, Any]], per: dict[str, list]) -> dict[str, list[float] | None]:
    """Paired 95% CIs of a policy's JCT reduction against FCFS and static affinity, where they ran."""
    mine = [r["avg_jct_s"] for r in runs_p]
    return {key: _paired_ci(mine, [r["avg_jct_s"] for r in per[base]])
            for key, base in (("vs_fcfs_ci95", "fcfs"), ("vs_static_affinity_ci95", "static-affinity"))
            if base in per}


def _synthetic_rows(spec: SchedTableSpec, cluster: str, load: float,
                    results: Iterator[tuple[dict[str, Any], dict[str, Any]]]) -> list[dict[str, Any]]:
    """Part-1 rows of one load: every policy and the oracle bound, aggregated over seeds."""
    per: dict[str, list] = {p: [] for p in spec.policies}
    oracle = []
    for _seed in range(spec.seeds):
        res, orc = _take(results, spec.policies)
        for p in spec.policies:
            per[p].append(res.get(p))
        oracle.append(orc)
    per = {p: runs for p, runs in per.items() if None not in runs}  # a policy the level stops stops at every seed
    policies = [p for p in spec.policies if p in per]
    rows = []
    for p in [*policies, "oracle-lb"]:
        runs_p = per[p] if p != "oracle-lb" else oracle
        row = {"part": "synthetic", "cluster": cluster, "trace": "synthetic", "load": load, "policy": p,
               "seeds": spec.seeds, **_aggregate(runs_p, oracle)}
        if p != "oracle-lb":
            row.update(_vs_baselines_ci(runs_p, per))
        for key, names in BASELINE_SETS.items():
            if p.startswith("dqn") and any(h in per for h in names):
                best = min((h for h in names if h in per), key=lambda h: np.mean([r["avg_jct_s"] for r in per[h]]))
                row[_best_name(key)] = best
                row[f"vs_{key}_ci95"] = _paired_ci([r["avg_jct_s"] for r in runs_p],
                                                   [r["avg_jct_s"] for r in per[best]])
        rows.append(row)
    return rows


def _real_rows(spec: SchedTableSpec, cluster: str, label: str,
               results: Iterator[tuple[dict[str, Any], dict[str, Any]]]) -> list[dict[str, Any]]:
    """Part-2 rows of one real trace on one cluster: every policy and the oracle bound (one run each)."""
    res, orc = _take(results, spec.policies)
    return [{"part": "real", "cluster": cluster, "trace": label, "load": spec.real_load, "policy": p, "seeds": 1,
             **_aggregate([res[p] if p != "oracle-lb" else orc], [orc])}
            for p in [*spec.policies, "oracle-lb"] if p in res or p == "oracle-lb"]


def _add_vs_fcfs(rows: list[dict[str, Any]]) -> None:
    """Give each row its JCT reduction against FCFS, the best heuristic and the best published one
    (:data:`BASELINE_SETS`) on the same cluster, trace and load, where they ran."""
    for r in rows:
        where = [x for x in rows if x["trace"] == r["trace"] and x["load"] == r["load"]
                 and x["cluster"] == r["cluster"]]
        # compare within a level; the bound (oracle at every level, one row) with the first level's rows
        level = r.get("knowledge") if r["policy"] != "oracle-lb" else next(
            (x.get("knowledge") for x in where if x["policy"] != "oracle-lb"), r.get("knowledge"))
        same = [x for x in where if x.get("knowledge") == level]
        oracle_gs = next((x["avg_jct_s"] for x in where
                          if x["policy"] == "gavel-srtf" and x.get("knowledge", "oracle") == "oracle"), None)
        if oracle_gs is not None and r["policy"] != "oracle-lb":
            r["vs_oracle_gavel_srtf"] = reduction(r["avg_jct_s"], oracle_gs)
        fcfs = next((x["avg_jct_s"] for x in same if x["policy"] == "fcfs"), None)
        if fcfs is not None:
            r["vs_fcfs"] = reduction(r["avg_jct_s"], fcfs)
        for key, names in BASELINE_SETS.items():
            best = [x for x in same if x["policy"] in names]
            if best:
                b = min(best, key=lambda x: x["avg_jct_s"])
                r[f"vs_{key}"] = reduction(r["avg_jct_s"], b["avg_jct_s"])
                r.setdefault(_best_name(key), b["policy"])


def _best_name(key: str) -> str:
    """Row key naming the heuristic a ``vs_<key>`` compares with (``best_heuristic``, ``best_published``)."""
    return "best_heuristic" if key == "best" else key


def run_table(spec: SchedTableSpec, data_root: str | Path | None = None, *, agent: str | Path | None = None,
              progress: Callable[[str], None] | None = None, executor: Executor | None = None,
              cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Run part 1 (and part 2 when ``data_root`` holds the traces); returns rows as plain dicts.

    Every (trace, seed, policy) simulation is one item for ``executor`` (default: in this process);
    the rows do not depend on which executor ran them. ``cache_dir``: a :class:`~gpualloc.cache.DiskCache`
    folder for the learned policies' gate verdicts (a failed gate's agent is then not loaded per run).
    """
    start = time.perf_counter()
    real = _real_traces(data_root)
    cache_dir = None if cache_dir is None else str(cache_dir)
    levels = [(level, replace(spec, policies=policies_at(level, spec.policies))) for level in spec.knowledge]
    runs, slots = _unique_runs(spec, levels, real, None if agent is None else str(agent), cache_dir)

    def done(i: int, _result: object) -> None:
        if progress is not None:
            progress(runs[i][0])

    # results come back in the order of ``runs``; the row builders consume them in that order
    outcomes = list((executor or SerialExecutor()).map(run_one, [r for _, r in runs], on_result=done))
    not_run = {f"{run.knowledge} {s['policy']}": s["not_run"] for (_, run), (s, o) in zip(runs, outcomes, strict=True)
               if o is None}
    rows: list[dict[str, Any]] = []
    for i, (level, sub) in enumerate(levels):
        results = iter([outcomes[k] for k in slots[i]])
        level_rows = [row for cluster in sub.clusters for load in sub.loads
                      for row in _synthetic_rows(sub, cluster, load, results)]
        level_rows += [row for cluster in sub.clusters for label, _path, _fmt in real
                       for row in _real_rows(sub, cluster, label, results)]
        rows += [row | row_labels(row["policy"], level, VARIANTS.get(row["policy"], (row["policy"],))[0])
                 for row in level_rows if row["policy"] != "oracle-lb" or i == 0]  # the bound once: it is oracle
    _add_vs_fcfs(rows)
    return {"spec": {"cluster": spec.cluster, "unseen_cluster": spec.unseen_cluster,
                     "loads": list(spec.loads), "seeds": spec.seeds, "jobs": spec.jobs,
                     "real_jobs": spec.real_jobs, "real_load": spec.real_load, "policies": list(spec.policies),
                     "knowledge": list(spec.knowledge), "migrate": spec.migrate,
                     "policies_by_knowledge": {level: list(sub.policies) for level, sub in levels}},
            "agents": agent_notes(spec.policies, None if agent is None else str(agent), cache_dir),
            "not_run": not_run, "rows": rows, "wall_s": time.perf_counter() - start}


def _level_free(name: str) -> bool:
    """Whether the table's policy ``name`` decides the same at every information level: registered, needs
    no durations and uses no learned model (FCFS, Tiresias, Gavel, ...)."""
    base = VARIANTS.get(name, (name,))[0]
    return base in REGISTRY and not needs_durations(base) and not is_learned(base)


def _run_level(name: str, level: str, levels: Sequence[str]) -> str:
    """The level a policy's runs go at for the table's ``level`` rows: a policy that decides the same at
    every level (:func:`_level_free`) runs once, at ``blind`` when the table has it, and its rows are
    shared by the levels (a hidden read would have failed there, so its decisions cannot depend on the
    level); every other policy runs at each level."""
    return "blind" if "blind" in levels and _level_free(name) else level


def _unique_runs(spec: SchedTableSpec, levels: Sequence[tuple[str, SchedTableSpec]], real, agent: str | None,
                 cache_dir: str | None) -> tuple[list[tuple[str, SchedRun]], list[list[int]]]:
    """The distinct simulations of the table, labelled, and for each level the indices of its runs in the
    order its row builders consume them."""
    names = [level for level, _ in levels]
    runs: list[tuple[str, SchedRun]] = []
    index: dict[SchedRun, int] = {}
    slots: list[list[int]] = []
    for level, sub in levels:
        mine = []
        for label, run in _planned_runs(sub, real, agent, cache_dir):
            run = replace(run, knowledge=_run_level(run.policy, level, names))
            if run not in index:
                index[run] = len(runs)
                runs.append((f"{run.knowledge} {label}" if len(levels) > 1 else label, run))
            mine.append(index[run])
        slots.append(mine)
    return runs, slots


def total_runs(spec: SchedTableSpec, with_real: bool) -> int:
    per_policy = len(spec.clusters) * (len(spec.loads) * spec.seeds + (len(REAL_TRACES) if with_real else 0))
    pairs = {(name, _run_level(name, level, spec.knowledge)) for level in spec.knowledge
             for name in policies_at(level, spec.policies)}
    return len(pairs) * per_policy


TRAIN_WINDOWS = {"gavel-msr": (300, 600, 900), "philly": (1500, 3500, 7000, 30000, 60000),
                 "alibaba": (1000, 2000, 4000)}
"""First jobs of the real-trace windows the agent trains on: past the first 300 jobs, which the table
evaluates (``real_jobs`` is at most 300 in :meth:`SchedTableSpec.full`). Philly's are the windows of a
scan of 18 offsets, 300 to 80,000 (``benchmarks/sched_windows.py``), where Gavel's average JCT is at
least 3 h and SRTF's differs from it by more than 10%, either way: most 150-job Philly windows finish in
minutes under any policy and teach nothing."""
VAL_WINDOWS = {"gavel-msr": (450, 750), "philly": (2500, 70000, 80000), "alibaba": (3000, 5000)}
"""First jobs of the held-out real-trace windows of the agent's validation (and gate)."""


def training_windows(data_root: str | Path, clusters: Sequence[str], *,
                     starts: dict[str, Sequence[int]] | None = None, jobs: int = 150,
                     load: float = 0.8) -> list[tuple[ClusterSpec, Trace]]:
    """Windows of the real traces: ``jobs`` jobs from each start in ``starts`` (per trace label;
    default :data:`TRAIN_WINDOWS`, :data:`VAL_WINDOWS` for validation), scaled to ``load`` on the
    clusters in turn, like the table's real rows.

    Raises:
        TraceError: none of the real traces is under ``data_root`` (:func:`require_real_traces`).
    """
    specs = [load_cluster(c) for c in clusters]
    starts = TRAIN_WINDOWS if starts is None else starts
    real = require_real_traces(data_root)
    out = []
    k = 0
    for label, path, fmt in real:
        whole = read_trace(path, fmt)
        for start in starts.get(label, ()):
            window = Trace(whole.jobs[start:start + jobs], f"{label}[{start}:{start + jobs}]", whole.format,
                           dict(whole.meta))
            if window.jobs:
                spec = specs[k % len(specs)]
                k += 1
                out.append((spec, scale_to_load(window, spec, load)))
    return out
