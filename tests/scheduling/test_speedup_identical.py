"""The simulator's speed-ups change nothing: event logs and JCTs as recorded before them.

``tests/data/sched_speedup_golden.json`` was written by the code before the speed work of issue 18
(commit named in the file) with ``python tests/scheduling/test_speedup_identical.py``. For every
heuristic policy on a few small workloads (synthetic seeds, with failures and checkpoints on one, a
Philly window and a Gavel msr window, clusters of 2-3 device types) it holds:

* a digest of the event log: every non-empty decision (time, starts with their GPUs, preemptions),
  in order, with exact float text (``repr``);
* a digest of the timeline (time, busy GPUs, queue length after each decision point) and the
  counts of events, decisions, preemptions and failure restarts, and each job's last device type;
* each job's JCT, first start and lost time, compared to 1e-9 relative.

Regenerate only on purpose (a deliberate behaviour change), never to make a speed-up pass.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.base import ClusterView, Decision, Policy
from gpualloc.scheduling.metrics import jct_s
from gpualloc.scheduling.policies import hetero, make_policy
from gpualloc.scheduling.simulator import SimResult, random_failures, simulate
from gpualloc.workload.jobs import Trace
from gpualloc.workload.traces import generate, read_trace

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "sched_speedup_golden.json"
SHARED = ROOT.parent / "shared" / "data"

POLICIES: dict[str, tuple[str, dict]] = {
    "fcfs": ("fcfs", {}),
    "static-affinity": ("static-affinity", {}),
    "sjf": ("sjf", {}),
    "srtf": ("srtf", {}),
    "easy-backfill": ("easy-backfill", {}),
    "tiresias": ("tiresias", {}),
    "gavel": ("gavel", {}),
    "gavel-throughput": ("gavel", {"objective": "max-throughput"}),
}


def _window(trace: Trace, start: int, n: int) -> Trace:
    return Trace(trace.jobs[start:start + n], trace.source, trace.format, dict(trace.meta)).shifted()


def _case(name: str):
    """``(trace, cluster, simulate keyword options)`` of one workload."""
    if name == "synthetic-s0":
        cluster = load_cluster("4xV100+4xP100+4xK80")
        return generate(70, cluster, 1.0, seed=0), cluster, {}
    if name == "synthetic-s1-failures":
        cluster = load_cluster("8xV100+4xK80")
        trace = generate(70, cluster, 1.3, seed=1)
        horizon = trace.jobs[-1].arrival_s + 3 * 86400.0
        failures = random_failures(cluster, horizon, mtbf_s=5 * 86400.0, repair_s=3600.0, seed=1)
        return trace, cluster, {"failures": failures, "checkpoint_interval_s": 900.0, "seed": 1}
    if name == "philly-window":
        cluster = load_cluster("4xV100+2xP100")
        trace = _window(read_trace(SHARED / "philly" / "philly.csv", "philly"), 3000, 80)
        return trace, cluster, {"drop_unplaceable": True}
    if name == "msr-window":
        cluster = load_cluster("4xV100+4xP100+4xK80")
        trace = _window(read_trace(SHARED / "gavel" / "msr-seed0" / "ed69ec.trace"), 100, 70)
        return trace, cluster, {"drop_unplaceable": True}
    raise KeyError(name)


CASES = ("synthetic-s0", "synthetic-s1-failures", "philly-window", "msr-window")


class _Recorder:
    """Passes a policy's decisions through and logs the non-empty ones (any other attribute is the
    policy's own, so hooks the simulator looks for still reach it)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.log: list[str] = []

    def __getattr__(self, name: str):
        return getattr(self.policy, name)

    def decide(self, view: ClusterView) -> Decision:
        d = self.policy.decide(view)
        if d.starts or d.preempt:
            starts = [[int(j), [int(g) for g in gpus]] for j, gpus in d.starts]
            self.log.append(json.dumps([repr(float(view.now_s)), starts, [int(j) for j in d.preempt]]))
        return d


def _digest(items) -> str:
    h = hashlib.sha256()
    for item in items:
        h.update(item.encode())
        h.update(b"\n")
    return h.hexdigest()


def _floats(a: np.ndarray) -> list:
    return [None if not np.isfinite(x) else float(x) for x in np.asarray(a, dtype=float)]


def record(case: str, policy_key: str) -> dict:
    """One run's fingerprint (see the module docstring)."""
    trace, cluster, options = _case(case)
    name, kwargs = POLICIES[policy_key]
    rec = _Recorder(make_policy(name, **kwargs))
    r: SimResult = simulate(trace, cluster, rec, **options)
    timeline = (f"{t!r} {b} {q}" for t, b, q in zip(r.times_s.tolist(), r.busy_gpus.tolist(), r.queue_len.tolist(),
                                                     strict=True))
    return {
        "events_log_sha256": _digest(rec.log),
        "log_len": len(rec.log),
        "timeline_sha256": _digest(timeline),
        "events": r.events,
        "decisions": r.decisions,
        "preemptions": int(r.preemptions.sum()),
        "failure_restarts": int(r.failure_restarts.sum()),
        "run_type": r.run_type.tolist(),
        "rejected": list(r.rejected),
        "jct_s": _floats(jct_s(r)),
        "start_s": _floats(r.start_s),
        "lost_s": _floats(r.lost_s),
    }


def _close(got: list, want: list) -> bool:
    g = np.array([np.nan if x is None else x for x in got], dtype=float)
    w = np.array([np.nan if x is None else x for x in want], dtype=float)
    return g.shape == w.shape and bool(np.all((np.isnan(g) & np.isnan(w))
                                              | (np.abs(g - w) <= 1e-9 * np.maximum(np.abs(w), 1.0))))


@pytest.fixture(scope="module")
def golden() -> dict:
    if not SHARED.is_dir():
        pytest.skip(f"shared data not found at {SHARED}")
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("policy_key", list(POLICIES))
def test_same_event_log_and_jcts_as_before_the_speedups(golden, case, policy_key):
    want = golden["runs"][f"{case}/{policy_key}"]
    got = record(case, policy_key)
    for key in ("log_len", "events_log_sha256", "timeline_sha256", "events", "decisions", "preemptions",
                "failure_restarts", "run_type", "rejected"):
        assert got[key] == want[key], f"{case}/{policy_key}: {key} changed"
    for key in ("jct_s", "start_s", "lost_s"):
        assert _close(got[key], want[key]), f"{case}/{policy_key}: {key} changed beyond 1e-9 relative"


def test_the_golden_runs_are_not_trivial(golden):
    """Each policy preempts or waits somewhere, and the failure case restarts jobs: the log means something."""
    runs = golden["runs"]
    assert len(runs) == len(CASES) * len(POLICIES)
    assert runs["synthetic-s1-failures/fcfs"]["failure_restarts"] > 0
    for key in ("gavel", "gavel-throughput", "tiresias", "srtf"):
        assert sum(runs[f"{case}/{key}"]["preemptions"] for case in CASES) > 0
    assert all(run["log_len"] > 10 for run in runs.values())


def _linprog_allocation(throughput: np.ndarray, num_gpus: np.ndarray, capacity: np.ndarray, objective: str):
    """Gavel's allocation solved by the public ``linprog`` (the path before the speed-ups)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hetero, "_HIGHS", [None, None])
        return hetero.solve_allocation(throughput, num_gpus, capacity, objective=objective)


@pytest.mark.parametrize("objective", ["max-min-fairness", "max-throughput"])
def test_direct_highs_gives_linprogs_solution_bit_for_bit(objective):
    """The LP built as CSC arrays and handed to HiGHS directly returns what ``linprog`` returns, to
    the last bit, on random Gavel-shaped problems (gangs, forbidden pairs, tight capacity)."""
    rng = np.random.default_rng(7)
    for _ in range(60):
        m = int(rng.integers(2, 70))
        thr = rng.choice([0.0, 0.3, 0.5, 1.0, 1.7, 2.4], size=(m, 3)) * (rng.random((m, 3)) < 0.9)
        g = rng.choice([1, 1, 1, 2, 4, 8], size=m).astype(float)
        cap = rng.integers(2, 13, size=3).astype(float)
        assert hetero._highs_options()[0] is not None
        fast = hetero.solve_allocation(thr, g, cap, objective=objective)
        slow = _linprog_allocation(thr, g, cap, objective)
        np.testing.assert_array_equal(fast, slow)


def test_the_reused_highs_object_forgets_the_previous_model():
    """One HiGHS object is reused per thread: a problem's solution does not depend on what that object
    solved before it (forwards, backwards, each on a fresh object and in another thread: the same bits)."""
    import threading

    rng = np.random.default_rng(11)
    problems = []
    for _ in range(25):
        m = int(rng.integers(2, 60))
        thr = rng.choice([0.0, 0.3, 0.5, 1.0, 1.7, 2.4], size=(m, 3)) * (rng.random((m, 3)) < 0.9)
        g = rng.choice([1, 1, 1, 2, 4, 8], size=m).astype(float)
        problems.append((thr, g, rng.integers(2, 13, size=3).astype(float)))
    forward = [hetero.solve_allocation(*pb) for pb in problems]
    backward = [hetero.solve_allocation(*pb) for pb in problems[::-1]][::-1]
    fresh = []
    for pb in problems:
        hetero._SOLVER.highs = None
        fresh.append(hetero.solve_allocation(*pb))
    other: list = []
    worker = threading.Thread(target=lambda: other.extend(hetero.solve_allocation(*pb) for pb in problems))
    worker.start()
    worker.join()
    for a, b, c, d in zip(forward, backward, fresh, other, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(a, d)


def test_lp_columns_are_linprogs_matrix():
    """The CSC arrays built from the pair pattern are the matrix ``linprog`` assembles from blocks."""
    from scipy import sparse

    feas = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]], dtype=bool)
    rows, cols = np.nonzero(feas)
    g = np.array([1.0, 2.0, 4.0, 8.0])[rows]
    w = np.linspace(0.5, 2.0, rows.size)
    m, t, p = 4, 3, rows.size
    pair = np.arange(p)
    fair = np.flatnonzero(feas.any(axis=1))
    blocks = sparse.vstack([sparse.csr_array((np.ones(p), (rows, pair)), shape=(m, p)),
                            sparse.csr_array((g, (cols, pair)), shape=(t, p)),
                            -sparse.csr_array((w, (rows, pair)), shape=(m, p))[fair]])
    want = sparse.hstack([blocks, sparse.vstack([sparse.csr_array((m + t, 1)),
                                                 sparse.csr_array(np.ones((fair.size, 1)))])]).tocsc()
    indptr, indices, data = hetero._lp_columns(rows, cols, g, w, m, t, with_z=fair.size)
    np.testing.assert_array_equal(indptr, want.indptr)
    np.testing.assert_array_equal(indices, want.indices)
    np.testing.assert_array_equal(data, want.data)


@pytest.mark.parametrize("policy_key", ["fcfs", "sjf", "easy-backfill", "gavel"])
def test_a_subclass_of_a_policy_that_skips_the_refresh_sees_current_progress(policy_key):
    """``reads_running_progress = False`` counts for the class that says it only: a subclass reading
    running jobs' progress gets it brought up to date (A: 10 s of work at speed 2, seen at 4 s)."""
    from gpualloc.workload.jobs import Job, JobType

    base = type(make_policy(POLICIES[policy_key][0]))
    assert base.__dict__["reads_running_progress"] is False
    seen = []

    class Watch(base):
        def decide(self, view):
            for j in view.running:
                seen.append((view.now_s, float(view.jobs.remaining_s[j]), float(view.jobs.attained_gpu_s[j])))
            return super().decide(view)

    trace = Trace.of([Job("A", 0, JobType.ML_TRAINING, 10, 2), Job("B", 4, JobType.ML_TRAINING, 1, 1)])
    simulate(trace, load_cluster("4xV100"), Watch(), speed=np.array([[2.0], [1.0]]))
    assert (4.0, 2.0, 8.0) in seen


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    runs = {f"{case}/{key}": record(case, key) for case in CASES for key in POLICIES}
    GOLDEN.write_text(json.dumps({"written_by": "tests/scheduling/test_speedup_identical.py", "commit": commit,
                                  "runs": runs}, indent=1) + "\n")
    print(f"wrote {GOLDEN} ({len(runs)} runs)", file=sys.stderr)


if __name__ == "__main__":
    main()
