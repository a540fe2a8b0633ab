"""Team quotas, borrowing, reclaim, fair share and type preferences (scheduling/quotas.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpualloc.hardware.catalog import default_catalog
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.base import GPU_FREE, QUEUED, RUNNING, Decision
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.quotas import QuotaError, QuotaPolicy, Quotas, team_index, team_usage
from gpualloc.scheduling.simulator import simulate
from gpualloc.workload.jobs import Job, JobType, Trace
from tests.scheduling.quota_cases import CASES, VISION_NLP, build_view

ML = JobType.ML_TRAINING
CLUSTER = "4xV100+2xT4"
V100, T4 = "V100-16GB", "T4"
POLICIES = ("fcfs", "sjf", "srtf", "easy-backfill", "static-affinity", "tiresias", "gavel", "gavel-srtf")


def _run(jobs, policy="fcfs", quotas=VISION_NLP, **kw):
    q = Quotas.from_dict(quotas) if isinstance(quotas, dict) else quotas
    speed = kw.pop("speed", np.ones((len(jobs), 2)))
    trace = Trace.of(jobs)
    return simulate(trace, load_cluster(CLUSTER), make_policy(policy), quotas=q, check=True,
                    speed=_allowed(trace.jobs, speed), **kw)


def _allowed(jobs, speed):
    """Speed 0 on the types a job's gpu_types leaves out (what the speed model does); ``jobs`` in the
    trace's order (by arrival)."""
    speed = np.array(speed, dtype=float)
    for i, j in enumerate(jobs):
        if j.gpu_types:
            for t, name in enumerate((V100, T4)):
                if name not in j.gpu_types:
                    speed[i, t] = 0.0
    return speed


# ------------------------------------------------------------------------------ the shared table

@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_shared_decision_table(case):
    view, quotas, names = build_view(case)
    decision = QuotaPolicy(make_policy(case.policy), quotas).decide(view)
    catalog = default_catalog()
    got = {names[j]: view.type_names[int(view.gpu_type[gpus[0]])] for j, gpus in decision.starts}
    assert got == {k: catalog.device(v).name for k, v in case.starts.items()}, case.why
    assert sorted(names[j] for j in decision.preempt) == sorted(case.preempt), case.why


# ------------------------------------------------------------------------------ known answers

def test_borrow_then_reclaim():
    # nlp borrows all 4 V100s; vision's 2-GPU job arrives at 10 s and gets its quota back at once
    jobs = [Job("n1", 0, ML, 1000, 4, team="nlp", gpu_types=(V100,)),
            Job("v1", 10, ML, 100, 2, team="vision", gpu_types=(V100,))]
    r = _run(jobs, restart_penalty_s=30)
    assert r.start_s.tolist() == [0.0, 10.0]
    assert r.preemptions.tolist() == [1, 0]
    # n1 did 10 s, waited for v1 (110 s), then restarted with the 30 s penalty: 110 + 30 + 990
    assert r.finish_s.tolist() == [1130.0, 110.0]
    assert r.gpu_s_by_type[0, 0] == pytest.approx(10 * 4 + (1130 - 110) * 4)


def test_without_quotas_no_reclaim():
    jobs = [Job("n1", 0, ML, 1000, 4, team="nlp", gpu_types=(V100,)),
            Job("v1", 10, ML, 100, 2, team="vision", gpu_types=(V100,))]
    r = simulate(Trace.of(jobs), load_cluster(CLUSTER), make_policy("fcfs"),
                 speed=_allowed(Trace.of(jobs).jobs, np.ones((2, 2))))
    assert r.start_s.tolist() == [0.0, 1000.0]


def test_spill_over_and_back():
    # vision fills its 3 V100s and nlp its 1; nlp's second job prefers V100 and spills to T4
    jobs = [Job("v1", 0, ML, 500, 3, team="vision", gpu_types=(V100,)),
            Job("n1", 0, ML, 500, 1, team="nlp", gpu_types=(V100,)),
            Job("n2", 1, ML, 100, 1, team="nlp", gpu_types=(V100, T4)),
            Job("n3", 600, ML, 100, 1, team="nlp", gpu_types=(V100, T4))]
    r = _run(jobs)
    assert [r.type_names[t] for t in r.run_type] == [V100, V100, T4, V100]
    assert r.start_s.tolist() == [0.0, 0.0, 1.0, 600.0]


def test_default_team_borrows_and_is_reclaimed():
    jobs = [Job("d1", 0, ML, 1000, 4, gpu_types=(V100,)),
            Job("n1", 5, ML, 100, 1, team="nlp", gpu_types=(V100,))]
    r = _run(jobs, restart_penalty_s=0)
    assert r.start_s.tolist() == [0.0, 5.0]
    assert r.preemptions.tolist() == [1, 0]
    assert r.finish_s.tolist() == [1100.0, 105.0]


def test_no_borrowing_caps_each_team():
    jobs = [Job("n1", 0, ML, 100, 1, team="nlp", gpu_types=(V100,)),
            Job("n2", 0, ML, 100, 1, team="nlp", gpu_types=(V100,))]
    r = _run(jobs, quotas={**VISION_NLP, "borrowing": False})
    assert r.start_s.tolist() == [0.0, 100.0]  # V100s idle, but nlp's quota is 1


def test_no_borrowing_refuses_a_job_its_team_can_never_run():
    jobs = [Job("d1", 0, ML, 100, 1)]
    with pytest.raises(QuotaError, match="job d1: needs 1 GPUs, more than team"):
        _run(jobs, quotas={**VISION_NLP, "borrowing": False})


def test_unknown_team_is_refused():
    with pytest.raises(QuotaError, match="job x: team 'audio' is not in"):
        _run([Job("x", 0, ML, 100, 1, team="audio")])


def test_zero_quota_wrapper_is_the_inner_policy():
    jobs = [Job(str(i), 10.0 * i, ML, 50.0 + 37 * (i % 5), 1 + i % 3) for i in range(12)]
    speed = np.array([[1.0, 0.5]] * 12)
    cl = load_cluster(CLUSTER)
    for name in POLICIES:
        a = simulate(Trace.of(jobs), cl, make_policy(name), speed=speed)
        b = simulate(Trace.of(jobs), cl, make_policy(name), speed=speed, quotas=Quotas.from_dict(VISION_NLP),
                     check=True)
        assert np.array_equal(a.finish_s, b.finish_s), name
        assert np.array_equal(a.run_type, b.run_type), name


# ------------------------------------------------------------------------------ quota files

def test_from_file_reads_the_example(tmp_path):
    from pathlib import Path

    q = Quotas.from_file(Path(__file__).parents[2] / "examples" / "quotas.toml")
    assert [t.name for t in q.teams] == ["vision", "nlp"]
    assert q.teams[0].quota == {V100: 3, T4: 1}
    q.check(load_cluster(CLUSTER))


@pytest.mark.parametrize("text, message", [
    ("[teams.a]\nquota = { X9000 = 1 }\n", "teams.a.quota.X9000: unknown device type 'X9000'"),
    ("[teams.a]\nquota = { V100 = -1 }\n", "teams.a.quota.V100: expected a whole number of GPUs"),
    ("[teams.a]\nquota = { V100 = 1e9 }\n", "teams.a.quota.V100: expected a whole number of GPUs"),
    ("[teams.a]\nweight = 0\n", "teams.a.weight: expected a number in"),
    ("[teams.a]\nquota = { V100 = 3 }\n[teams.b]\nquota = { V100 = 2 }\n",
     "quotas of V100-16GB sum to 5, above the 4 V100-16GB GPUs"),
    ("[teams.a]\nquota = { A100 = 1 }\n", "teams.a.quota.A100-40GB: cluster 4xV100\\+2xT4 has no A100-40GB"),
    ("[teams.a]\n[teams.a]\n", "q.toml: not valid TOML"),
    ("[[teams]]\nname = 'a'\n[[teams]]\nname = 'a'\n", "teams.a: team 'a' is given twice"),
    ("borrowing = 'yes'\n", "borrowing: expected true or false"),
    ("teamz = 1\n", "unknown field 'teamz'"),
    ("[teams.a]\nquota = { V100 = 1, V100-16GB = 1 }\n", "device type V100-16GB is given twice"),
])
def test_bad_quota_files(tmp_path, text, message):
    path = tmp_path / "q.toml"
    path.write_text(text)
    with pytest.raises(QuotaError, match=message) as err:
        Quotas.from_file(path).check(load_cluster(CLUSTER))
    assert "\n" not in str(err.value) and str(path) in str(err.value)


# ------------------------------------------------------------------------------ properties

@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 10))
    teams = ["", "vision", "nlp"]
    jobs = []
    for i in range(n):
        types = draw(st.sampled_from([(), (V100,), (T4,), (V100, T4), (T4, V100)]))
        jobs.append(Job(str(i), float(draw(st.integers(0, 400))), ML, float(draw(st.integers(1, 300))),
                        draw(st.integers(1, 2 if types == (T4,) else 4)), gpu_types=types,
                        team=draw(st.sampled_from(teams))))
    qv = draw(st.integers(0, 4))
    qn = draw(st.integers(0, 4 - qv))
    tv = draw(st.integers(0, 2))
    tn = draw(st.integers(0, 2 - tv))
    quotas = {"teams": {"vision": {"weight": draw(st.sampled_from([1, 2, 3])), "quota": {"V100": qv, "T4": tv}},
                        "nlp": {"quota": {"V100": qn, "T4": tn}}}}
    return jobs, quotas, draw(st.sampled_from(POLICIES)), draw(st.sampled_from([0.0, 30.0]))


class _Watch:
    """Records, after each decision is planned, the state it leads to, and checks it independently."""

    def __init__(self, policy, quotas):
        self.policy, self.quotas = policy, quotas
        self.name, self.preemptive, self.round_s = policy.name, policy.preemptive, policy.round_s
        self.checked = 0

    def decide(self, view):
        d = self.policy.decide(view)
        self._check_after(view, d)
        return d

    def _check_after(self, view, d: Decision) -> None:
        jobs = view.jobs
        names, q, _ = self.quotas.matrix(view.type_names)
        team_of = team_index(jobs.team_names, names)[np.asarray(jobs.team)]
        gpu_job = view.gpu_job.copy()
        status = jobs.status.copy()
        run_type = jobs.run_type.copy()
        for p in d.preempt:
            gpu_job[gpu_job == p] = GPU_FREE
            status[p], run_type[p] = QUEUED, -1
        for j, gpus in d.starts:
            assert (gpu_job[list(gpus)] == GPU_FREE).all(), "a GPU given twice"
            gpu_job[list(gpus)] = j
            status[j], run_type[j] = RUNNING, view.gpu_type[gpus[0]]
        u = np.zeros_like(q)
        for j in np.flatnonzero(status == RUNNING):
            u[team_of[j], run_type[j]] += jobs.num_gpus[j]
        over = np.maximum(u - q, 0)
        if not self.quotas.borrowing:
            assert (u <= q).all(), "a team above its quota without borrowing"
        # every preempted job was reclaimable (its team above its quota before) or swapped in its team
        u0 = team_usage(view, team_of, len(q))
        started_teams = {int(team_of[j]) for j, _ in d.starts}
        for p in d.preempt:
            k, t = team_of[p], jobs.run_type[p]
            assert u0[k, t] > q[k, t] or k in started_teams, "a guaranteed job was preempted"
        # the reclaim guarantee: no entitled job waits while free + reclaimable GPUs would hold it
        free = gpu_job == GPU_FREE
        for j in np.flatnonzero(status == QUEUED):
            k, need = team_of[j], jobs.num_gpus[j]
            for t in range(len(view.type_names)):
                if jobs.speed[j, t] > 0 and u[k, t] + need <= q[k, t]:
                    room = int((free & (view.gpu_type == t)).sum()) + int(over[:, t].sum() - over[k, t])
                    assert room < need, f"job {j} of team {names[k]} entitled on {view.type_names[t]} waits"
        self.checked += 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_quota_invariants(scenario):
    """No GPU given twice, no job lost, no team above quota but by reclaimable borrowing, and an
    entitled team gets its GPUs at the decision point where it needs them (its arrival or a completion),
    so within one round plus the preempted job's restart penalty."""
    jobs, quotas, policy, penalty = scenario
    q = Quotas.from_dict(quotas)
    watch = _Watch(QuotaPolicy(make_policy(policy), q), q)
    trace = Trace.of(jobs)
    speed = _allowed(trace.jobs, np.array([[1.0, 0.6]] * len(jobs)))
    r = simulate(trace, load_cluster(CLUSTER), watch, speed=speed, restart_penalty_s=penalty, check=True)
    assert r.completed.all()  # no job lost
    assert watch.checked > 0
    # preferences: a job never runs on a type its list leaves out
    for i, j in enumerate(trace.jobs):
        if j.gpu_types:
            assert r.type_names[r.run_type[i]] in j.gpu_types


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_strict_quotas_hold(scenario):
    jobs, quotas, policy, penalty = scenario
    # every job in a team whose quota covers it on some type, so that each can run without borrowing
    quotas = {"borrowing": False, "teams": {"vision": {"quota": {"V100": 4, "T4": 0}},
                                            "nlp": {"quota": {"V100": 0, "T4": 2}}}}
    jobs = [Job(j.id, j.arrival_s, ML, j.work_s, min(j.num_gpus, 2), team="vision" if i % 2 else "nlp")
            for i, j in enumerate(jobs)]
    q = Quotas.from_dict(quotas)
    watch = _Watch(QuotaPolicy(make_policy(policy), q), q)
    r = simulate(Trace.of(jobs), load_cluster(CLUSTER), watch, speed=np.ones((len(jobs), 2)),
                 restart_penalty_s=penalty, check=True)
    assert r.completed.all()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_zero_demand_teams_change_nothing(scenario):
    """Quotas for teams with no jobs: the wrapper decides exactly as the inner policy."""
    jobs, quotas, policy, penalty = scenario
    jobs = [Job(j.id, j.arrival_s, ML, j.work_s, j.num_gpus) for j in jobs]  # no team, no list
    speed = np.array([[1.0, 0.6]] * len(jobs))
    cl = load_cluster(CLUSTER)
    a = simulate(Trace.of(jobs), cl, make_policy(policy), speed=speed, restart_penalty_s=penalty)
    b = simulate(Trace.of(jobs), cl, make_policy(policy), speed=speed, restart_penalty_s=penalty,
                 quotas=Quotas.from_dict(quotas), check=True)
    for field in ("start_s", "finish_s", "run_type", "preemptions"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field


# ------------------------------------------------------------------------------ per-team figures and the CLI

def test_demand_s_is_the_union_of_intervals():
    from gpualloc.scheduling.metrics import demand_s

    assert demand_s(np.array([0.0, 5.0, 20.0, 22.0]), np.array([10.0, 8.0, 30.0, 25.0])) == 20.0
    assert demand_s(np.zeros(0), np.zeros(0)) == 0.0


def test_team_summary_known_answer():
    from gpualloc.scheduling.metrics import team_summary

    # nlp holds 4 V100s for 10 s, loses them to vision for 100 s, then runs 990 s more (no penalty)
    jobs = [Job("n1", 0, ML, 1000, 4, team="nlp", gpu_types=(V100,)),
            Job("v1", 10, ML, 100, 2, team="vision", gpu_types=(V100,))]
    r = _run(jobs, restart_penalty_s=0)
    rows = {row["team"]: row for row in team_summary(r)}
    assert set(rows) == {"vision", "nlp"}
    nlp, vision = rows["nlp"], rows["vision"]
    assert nlp["demand_s"] == 1100.0 and vision["demand_s"] == 100.0
    assert nlp["by_type"][V100]["received_gpu_s"] == 4 * 10 + 4 * 990
    assert nlp["by_type"][V100]["entitled_gpu_s"] == 1 * 1100  # quota 1 V100 while it had a job
    assert vision["by_type"][V100]["received_gpu_s"] == 2 * 100
    assert vision["by_type"][V100]["entitled_gpu_s"] == 3 * 100
    assert vision["avg_jct_s"] == 100.0 and nlp["avg_jct_s"] == 1100.0
    assert nlp["received_vs_entitled"] == pytest.approx(4000 / (1100 * 2))  # V100 and T4 quotas of 1


def test_simulate_compare_with_quotas_json_and_table():
    import json

    from typer.testing import CliRunner

    from gpualloc.cli.main import app

    root = __import__("pathlib").Path(__file__).parents[2] / "examples"
    args = ["simulate", "compare", "-c", CLUSTER, "-t", str(root / "teams_trace.csv"), "--quotas",
            str(root / "quotas.toml"), "--policies", "fcfs,srtf"]
    out = CliRunner().invoke(app, [*args, "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    runs = [r for r in doc["results"] if r["policy"] != "oracle-lb"]
    for r in runs:
        teams = {t["team"]: t for t in r["teams"]}
        assert set(teams) == {"(none)", "vision", "nlp"}
        assert sum(t["jobs"] for t in teams.values()) == 40
        assert teams["vision"]["by_type"][V100]["quota"] == 3
    table = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "per team" in table.stdout and "vision" in table.stdout


def test_job_table_teams_and_preferences():
    from gpualloc.scheduling.base import PREF_NONE, JobTable
    from gpualloc.scheduling.quotas import job_types_in_order

    jobs = [Job("a", 0, ML, 1, team="nlp", gpu_types=(T4, V100)), Job("b", 1, ML, 1),
            Job("c", 2, ML, 1, team="vision", gpu_types=(V100,))]
    speed = np.array([[1.0, 0.5], [1.0, 0.5], [1.0, 0.0]])
    table = JobTable.from_trace(Trace.of(jobs), speed, (V100, T4))
    assert table.team_names == ("", "nlp", "vision") and table.team.tolist() == [1, 0, 2]
    assert table.pref_rank.tolist() == [[1, 0], [0, 0], [0, PREF_NONE]]
    assert [job_types_in_order(table, j) for j in range(3)] == [[1, 0], [0, 1], [0]]
    fresh = table.fresh()
    assert fresh.team is table.team and fresh.pref_rank is table.pref_rank
    # a table built by hand (the service's live table) defaults to no team and no preference
    bare = JobTable(arrival_s=np.zeros(2), work_s=np.ones(2), num_gpus=np.ones(2, dtype=np.int64),
                    priority=np.zeros(2, dtype=np.int64), type_code=np.zeros(2, dtype=np.int64),
                    single_node=np.zeros(2, dtype=bool), speed=np.ones((2, 2)))
    assert bare.team.tolist() == [0, 0] and bare.team_names == ("",) and not bare.pref_rank.any()


@pytest.mark.parametrize("policy", ["fcfs", "srtf", "gavel"])
def test_quotas_with_failures(policy):
    """GPUs that fail and come back: quotas still hold and every job finishes (check mode)."""
    from gpualloc.scheduling.simulator import random_failures
    from gpualloc.workload.traces import read_native

    root = __import__("pathlib").Path(__file__).parents[2] / "examples"
    trace, cluster = read_native(root / "teams_trace.csv").head(20), load_cluster(CLUSTER)
    failures = random_failures(cluster, 200_000, 50_000, 3600, seed=1)
    r = simulate(trace, cluster, make_policy(policy), quotas=Quotas.from_file(root / "quotas.toml"),
                 failures=failures, checkpoint_interval_s=600, check=True)
    assert r.completed.all() and r.failure_restarts.sum() > 0


@settings(max_examples=60, deadline=None)
@given(free=st.integers(1, 4), order=st.lists(st.sampled_from(["vision", "nlp"]), max_size=10),
       wv=st.integers(1, 3), wn=st.integers(1, 3), policy=st.sampled_from(["fcfs", "sjf", "srtf"]))
def test_borrowing_is_weighted_max_min(free, order, wv, wn, policy):
    """Teams borrowing free V100s (no V100 quota) get them by weighted max-min: work-conserving, and a
    team left wanting never has fewer borrowed GPUs per weight than another team has minus one GPU."""
    from tests.scheduling.quota_cases import QuotaCase, Queued, Running

    running = (Running("d0", "", 4 - free, "V100"),) if free < 4 else ()
    queued = tuple(Queued(f"{team[0]}{i}", team, 1, ("V100",)) for i, team in enumerate(order))
    case = QuotaCase("fair", "", running, queued, starts={}, policy=policy,
                     quotas={"teams": {"vision": {"weight": wv, "quota": {"T4": 1}},
                                       "nlp": {"weight": wn, "quota": {"T4": 1}}}})
    view, quotas, names = build_view(case)
    decision = QuotaPolicy(make_policy(policy), quotas).decide(view)
    got = {"vision": 0, "nlp": 0}
    for j, _ in decision.starts:
        got[case.queued[j - len(running)].team] += 1
    want = {"vision": order.count("vision"), "nlp": order.count("nlp")}
    assert sum(got.values()) == min(free, len(order)) and not decision.preempt
    weight = {"vision": wv, "nlp": wn}
    for a in got:
        for b in got:
            if a != b and got[a] < want[a]:  # a left wanting
                assert (got[b] - 1) / weight[b] <= got[a] / weight[a] + 1e-9, (got, want, weight)
