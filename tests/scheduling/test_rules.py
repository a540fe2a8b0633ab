"""The one set of scheduling rules: decision validity (the simulator and the service reject the same
decisions, for the same reason), placeability and consolidated best fit, with known answers; and the
prepared workload that several runs share."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.base import GPU_DOWN, GPU_FREE, QUEUED, RUNNING, ClusterView, Decision, JobTable, best_fit
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.rules import (
    InvalidDecision,
    check_start,
    fits_types,
    placeable,
    unplaceable_reason,
    validate_decision,
)
from gpualloc.scheduling.simulator import prepare, simulate
from gpualloc.workload.jobs import Job, JobType, Trace
from tests.scheduling.test_simulator import Fixed as _OneDecision

ML = JobType.ML_TRAINING


class Fixed(_OneDecision):
    """The simulator tests' one-decision policy, named for the error messages checked here."""

    name = "fixed"


# ------------------------------------------------- the simulator and the service reject alike

# On 2xV100+1xT4 (GPUs 0, 1: V100; GPU 2: T4): job 0 needs 1 V100 (it may not use the T4), job 1
# needs 2 GPUs of any type. Reasons are written without the job's name, which differs (trace id in
# the simulator, job id in the service).
INVALID = [
    ("wrong gang size", Decision([(0, (0, 1))]), False, "needs 1 GPUs, given 2"),
    ("GPU outside the cluster", Decision([(0, (7,))]), False, "GPU 7 is not in the cluster"),
    ("GPU already taken", Decision([(0, (0,)), (1, (0, 1))]), False, r"GPU 0 is not free \(running job \w+\)"),
    ("mixed device types", Decision([(1, (0, 2))]), False, r"GPUs \(0, 2\) mix device types"),
    ("a GPU twice", Decision([(1, (1, 1))]), False, r"GPUs \(1, 1\) repeat a GPU"),
    ("forbidden type", Decision([(0, (2,))]), False, "may not run on T4"),
    ("started twice", Decision([(0, (0,)), (0, (1,))]), False, "started, but it is not queued"),
    ("unknown job", Decision([(10**6, (0,))]), False, "started, but there is no such job"),
    ("malformed start", Decision([(0,)]), False, r"start \(0,\) is not \(job, gpus\)"),
    ("GPUs not indices", Decision([(0, None)]), False, "GPUs None are not a sequence of GPU indices"),
]
INVALID_PREEMPT = [
    ("preemption off", Decision([], [0]), False, "preempted, but preemption is off for this run"),
    ("preempt a queued job", Decision([], [0]), True, "preempted, but it is not running"),
    ("preempt an unknown job", Decision([], [10**6]), True, "preempted, but there is no such job"),
]
CLUSTER = "2xV100+1xT4"


def _sim_jobs() -> Trace:
    return Trace.of([Job("a", 0.0, ML, 10.0, 1, gpu_types=("V100-16GB",)), Job("b", 0.0, ML, 10.0, 2)])


def _simulator_error(decision: Decision, preemptive: bool) -> str:
    with pytest.raises(SchedulingError) as err:
        simulate(_sim_jobs(), load_cluster(CLUSTER), Fixed(decision, preemptive))
    return str(err.value)


def _view(cluster, table: JobTable, gpu_job=None, preemption=False) -> ClusterView:
    return ClusterView(now_s=0.0, cluster=cluster, type_names=cluster.type_names, gpu_type=cluster.gpu_type,
                       gpu_node=cluster.gpu_node, gpu_job=np.full(len(cluster), GPU_FREE) if gpu_job is None
                       else np.asarray(gpu_job), jobs=table, queue=[], running=[], preemption=preemption)


@pytest.mark.parametrize("what, decision, preemptive, reason", INVALID + INVALID_PREEMPT,
                         ids=[c[0] for c in INVALID + INVALID_PREEMPT])
def test_simulator_rejects_each_invalid_decision_with_its_reason(what, decision, preemptive, reason):
    msg = _simulator_error(decision, preemptive)
    assert re.search(f"^policy fixed: .*{reason}$", msg), (what, msg)


@pytest.mark.parametrize("what, decision, preemptive, reason", INVALID + INVALID_PREEMPT,
                         ids=[c[0] for c in INVALID + INVALID_PREEMPT])
def test_validate_decision_finds_the_same_first_problem(what, decision, preemptive, reason):
    cluster = load_cluster(CLUSTER)
    work = prepare(_sim_jobs(), cluster)
    table = work.jobs.fresh()
    table.status[:] = QUEUED
    view = _view(cluster, table, preemption=preemptive)
    before = view.gpu_job.copy(), table.status.copy()
    problems = validate_decision(decision, view, ["a", "b"].__getitem__)
    assert problems and re.search(f"{reason}$", str(problems[0])), (what, problems)
    assert all(isinstance(p, InvalidDecision) for p in problems)
    np.testing.assert_array_equal(view.gpu_job, before[0])  # nothing changed
    np.testing.assert_array_equal(table.status, before[1])


@pytest.fixture
def service(tmp_path):
    pytest.importorskip("sqlalchemy")
    from gpualloc.service.backends import LocalBackend
    from gpualloc.service.models import JobSpec
    from gpualloc.service.scheduler import Scheduler, normalise_spec
    from gpualloc.service.store import Store
    from tests.service.conftest import kill_runs

    store = Store(tmp_path / "s.db")
    backend = LocalBackend(tmp_path / "runs", stop_grace_s=1.0)
    made = []

    def make(decision: Decision, preemptive: bool):
        sched = Scheduler(store, backend, load_cluster(CLUSTER), tick_s=0.05, preemption=preemptive)
        sched.recover()
        sched.policy = Fixed(decision, preemptive)
        made.append(sched)
        ids = []
        for name, gpus, types in (("a", 1, ["V100"]), ("b", 2, [])):
            spec = JobSpec(name=name, command="sleep 30", num_gpus=gpus, gpu_types=types)
            rec, _ = store.submit(normalise_spec(spec, sched.cluster, sched.types))
            sched.notify_submitted(rec)
            ids.append(rec.id)
        sched.tick()
        return sched, store, ids

    yield make
    for s in made:
        s.stop()
    kill_runs(tmp_path / "runs")
    store.close()


@pytest.mark.parametrize("what, decision, preemptive, reason", INVALID, ids=[c[0] for c in INVALID])
def test_service_ignores_the_same_invalid_starts_for_the_same_reason(service, what, decision, preemptive, reason):
    sched, store, ids = service(decision, preemptive)
    assert sched.last_error is not None, what
    assert re.search(f"^policy \\S+: invalid start ignored: .*{reason}$", sched.last_error), sched.last_error
    # only the valid first start of "GPU already taken" runs; nothing else holds a GPU
    allocs = store.allocations()
    assert allocs == ({0: (ids[0], 1)} if what in ("GPU already taken", "started twice") else {}), what


@pytest.mark.parametrize("what, decision, preemptive, reason", INVALID_PREEMPT, ids=[c[0] for c in INVALID_PREEMPT])
def test_service_ignores_the_same_invalid_preemptions(service, caplog, what, decision, preemptive, reason):
    with caplog.at_level(logging.INFO, logger="gpualloc.service"):
        sched, store, _ = service(decision, preemptive)
    assert any(re.search(f"preemption ignored: .*{reason}$", r.getMessage()) for r in caplog.records), what
    assert store.allocations() == {} and sched.last_error is None


def test_validate_decision_plays_preemptions_before_starts():
    cluster = load_cluster(CLUSTER)
    table = prepare(_sim_jobs(), cluster).jobs.fresh()
    table.status[:] = [RUNNING, QUEUED]
    gpu_job = [0, GPU_FREE, GPU_DOWN]
    # job 1 needs both V100s: only once job 0 is preempted; job 0 may then restart nowhere (GPU 2 is down)
    ok = Decision([(1, (0, 1))], [0])
    assert validate_decision(ok, _view(cluster, table, gpu_job, preemption=True)) == []
    assert [str(p) for p in validate_decision(ok, _view(cluster, table, gpu_job, preemption=False))] == [
        "job 0: preempted, but preemption is off for this run", "job 1: GPU 0 is not free (running job 0)"]
    down = validate_decision(Decision([(1, (0, 1)), (0, (2,))], [0]), _view(cluster, table, gpu_job, True))
    assert [str(p) for p in down] == ["job 0: GPU 2 is not free (down)"]
    assert validate_decision("nope", _view(cluster, table))[0].reason == "decision is a str, not a Decision"


def test_check_start_returns_the_job_its_gpus_and_type():
    cluster = load_cluster(CLUSTER)
    table = prepare(_sim_jobs(), cluster).jobs.fresh()
    table.status[:] = QUEUED
    free = np.full(3, GPU_FREE)
    assert check_start((np.int64(1), [1, 0]), table, free, cluster.gpu_type, cluster.gpu_node,
                       cluster.type_names) == (1, (1, 0), 0)


# ------------------------------------------------------------------------------ placeability

@pytest.mark.parametrize("num_gpus, single_node, speed, fits, reason", [
    (8, True, [1.0, 1.0, 1.0], [True, False, False], None),
    (9, False, [1.0, 1.0, 1.0], [False, False, False], "needs 9 GPUs of one type; largest type has 8"),
    (5, True, [0.0, 1.0, 2.0], [False, False, False], "needs 5 GPUs of one type on one node; largest node has 4"),
    (4, True, [0.0, 1.0, 2.0], [False, True, True], None),
    (1, False, [0.0, 0.0, 0.0], [False, False, False],
     r"may run on none of the device types of cluster adlro16 \(V100-16GB, T4, MI50\)"),
])
def test_placeable_known_answers_on_adlro16(num_gpus, single_node, speed, fits, reason):
    cluster = load_cluster("adlro16")  # one node each: 8 V100, 4 T4, 4 MI50
    speed = np.array([speed])
    assert fits_types(cluster, [num_gpus], [single_node], speed).tolist() == [fits]
    assert placeable(cluster, [num_gpus], [single_node], speed).tolist() == [any(fits)]
    got = unplaceable_reason(cluster, num_gpus, single_node, speed[0])
    assert (got is None) if reason is None else re.fullmatch(reason, got), got


def test_placeable_splits_gangs_over_nodes_only_when_allowed():
    cluster = load_cluster("20xV100")  # nodes of 8, 8, 4
    speed = np.ones((4, 1))
    assert placeable(cluster, [20, 20, 8, 9], [False, True, True, True], speed).tolist() == [True, False, True, False]


# --------------------------------------------------------------------------------- best fit

def _reference_find(need: int, single: bool, gpu_type, gpu_node, free, t: int):
    """Consolidated best fit as ClusterView.find_gpus wrote it before best_fit was the one rule."""
    cand = np.flatnonzero(free & (gpu_type == t))
    if len(cand) < need:
        return None
    nodes = gpu_node[cand]
    uniq, counts = np.unique(nodes, return_counts=True)
    fits = uniq[counts >= need]
    if len(fits):
        node = fits[np.argmin(counts[counts >= need])]
        return tuple(int(g) for g in cand[nodes == node][:need])
    if single:
        return None
    picked: list[int] = []
    for node in uniq[np.argsort(-counts, kind="stable")]:
        picked.extend(int(g) for g in cand[nodes == node][: need - len(picked)])
        if len(picked) == need:
            return tuple(picked)
    return None


def _best_fit_on(cluster, free: np.ndarray, need: int, single: bool, t: int = 0):
    on_node = np.bincount(cluster.gpu_node[free & (cluster.gpu_type == t)], minlength=len(cluster.nodes))
    node_gpus = [np.flatnonzero((cluster.gpu_type == t) & (cluster.gpu_node == n)) for n in range(len(cluster.nodes))]
    return best_fit(need, single, on_node, node_gpus, free)


@pytest.mark.parametrize("free_gpus, need, single, want", [
    # nodes of 8, 8, 4 V100: GPUs 0-7, 8-15, 16-19
    (range(20), 4, False, (16, 17, 18, 19)),  # the fullest node that fits: the 4-GPU node, whole
    (range(20), 5, False, (0, 1, 2, 3, 4)),  # first of the two 8-GPU nodes (ties: lowest node)
    ([0, 1, 2, 8, 9, 10, 11, 12, 16, 17], 2, False, (16, 17)),  # fullest fitting node has 2 free
    ([0, 1, 2, 8, 9, 10, 11, 12, 16, 17], 6, False, (8, 9, 10, 11, 12, 0)),  # emptiest node first
    ([0, 1, 2, 8, 9, 10, 11, 12, 16, 17], 6, True, None),  # no node has 6 free
    ([0, 1, 2, 8, 9, 10, 11, 12, 16, 17], 11, False, None),  # only 10 free
    ([3, 5, 7], 2, True, (3, 5)),  # lowest free indices inside the node
])
def test_best_fit_known_answers(free_gpus, need, single, want):
    cluster = load_cluster("20xV100")
    free = np.zeros(20, dtype=bool)
    free[list(free_gpus)] = True
    assert _best_fit_on(cluster, free, need, single) == want


@given(st.lists(st.booleans(), min_size=28, max_size=28), st.integers(1, 14), st.booleans(), st.integers(0, 1))
@settings(max_examples=200, deadline=None)
def test_best_fit_equals_the_former_view_rule(free_list, need, single, t):
    cluster = load_cluster("20xV100+8xT4")
    free = np.array(free_list)
    want = _reference_find(need, single, cluster.gpu_type, cluster.gpu_node, free, t)
    assert _best_fit_on(cluster, free, need, single, t) == want
    table = JobTable(arrival_s=np.zeros(1), work_s=np.ones(1), num_gpus=np.array([need]), priority=np.zeros(1),
                     type_code=np.zeros(1, dtype=np.int64), single_node=np.array([single]), speed=np.ones((1, 2)))
    gpu_job = np.where(free, GPU_FREE, GPU_DOWN)
    view = _view(cluster, table, gpu_job)
    assert view.find_gpus(0, t) == want
    assert view.find_gpus(0, t, free) == want
    assert view.free_gpus().find(0, t) == want


@given(st.lists(st.booleans(), min_size=160, max_size=160), st.integers(1, 20), st.booleans())
@settings(max_examples=200, deadline=None)
def test_best_fit_on_many_nodes_equals_the_former_view_rule(free_list, need, single):
    cluster = load_cluster("160xV100")  # 20 nodes: more than best_fit loops over in Python
    assert len(cluster.nodes) > 16
    free = np.array(free_list)
    want = _reference_find(need, single, cluster.gpu_type, cluster.gpu_node, free, 0)
    assert _best_fit_on(cluster, free, need, single) == want


# ------------------------------------------------------------------------- prepared workload

def _trace(n: int = 40) -> Trace:
    rng = np.random.default_rng(3)
    return Trace.of([Job(f"j{i}", float(i * 7), ML, float(rng.uniform(20, 300)), int(rng.integers(1, 4)))
                     for i in range(n)])


def test_one_prepared_workload_serves_every_policy_like_a_fresh_trace():
    cluster = load_cluster("adlro16")
    trace = _trace()
    work = prepare(trace, cluster)
    for name in ("fcfs", "sjf", "srtf", "tiresias", "gavel"):
        a = simulate(work, cluster, make_policy(name), check=True)
        b = simulate(trace, cluster, make_policy(name), check=True)
        np.testing.assert_array_equal(a.finish_s, b.finish_s, err_msg=name)
        np.testing.assert_array_equal(a.start_s, b.start_s, err_msg=name)
    assert (work.jobs.status == 0).all()  # the template itself never runs


def test_prepared_workload_is_read_only_and_checked():
    cluster = load_cluster("adlro16")
    trace = _trace(5)
    speed = np.ones((5, 3))
    work = prepare(trace, cluster, speed)
    speed[0, 0] = 9.0  # the caller's matrix is copied
    assert work.speed[0, 0] == 1.0 and not work.speed.flags.writeable and not work.jobs.num_gpus.flags.writeable
    with pytest.raises(SchedulingError, match="prepare"):
        simulate(work, cluster, make_policy("fcfs"), speed=speed)
    with pytest.raises(SchedulingError, match="prepared for cluster adlro16, not 8xA100"):
        simulate(work, load_cluster("8xA100"), make_policy("fcfs"))
    with pytest.raises(SchedulingError, match="non-finite"):
        prepare(trace, cluster, np.full((5, 3), np.nan))
