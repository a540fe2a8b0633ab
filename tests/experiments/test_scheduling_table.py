"""`gpualloc reproduce scheduling`: rows, confidence intervals, real traces scaled to the cluster."""

from __future__ import annotations

import json

import pytest

from gpualloc.experiments.scheduling_table import SchedTableSpec, scale_to_load
from gpualloc.hardware.cluster import load_cluster
from gpualloc.workload.traces import generate

ROW_KEYS = {"policy", "load", "avg_jct_s", "throughput_jobs_per_h", "utilization", "p99_jct_s", "hyperscore",
            "avg_jct_s_std", "throughput_jobs_per_h_std"}


def test_scale_to_load_sets_the_offered_load():
    cluster = load_cluster("adlro16")
    trace = generate(200, cluster, 0.3, seed=1)
    scaled = scale_to_load(trace, cluster, 0.9)
    span = scaled.jobs[-1].arrival_s
    work = sum(j.gpu_seconds for j in scaled.jobs)
    assert work / (len(cluster) * span) == pytest.approx(0.9)
    assert [j.id for j in scaled.jobs] == [j.id for j in trace.jobs]


@pytest.mark.slow
def test_reproduce_scheduling_quick_json(tmp_path, shared_data):
    from tests.cli.test_cli import invoke

    # 2 worker processes (CI has 2 cores): the agent's runs on the real windows take minutes serially
    # two of the three levels (the estimate rows are built as the blind ones: tests/scheduling/test_knowledge*.py);
    # all three cost the suite another minute
    # --jobs 10 (quick's own 120 synthetic / 60 real jobs cost ~55 s more): what is checked here is the rows' interface,
    # the levels, policies and traces present, the bound and the files, none of which depends on the number of jobs;
    # the rest of --quick (load, seeds, policies, every real trace) is as users run it
    doc = json.loads(invoke("reproduce", "scheduling", "--quick", "--json", "--data", str(shared_data),
                            "--workers", "2", "--knowledge", "oracle,blind", "--jobs", "10",
                            "--out", str(tmp_path)).stdout)
    rows = doc["rows"]
    for r in rows:  # the interface scripts rely on (issue 36)
        assert {"knowledge", "policy", "avg_jct_s", "trace", "load", "cluster", "needs_durations", "learned"} <= set(r)
        assert isinstance(r["needs_durations"], bool) and isinstance(r["learned"], bool)
    assert {r["knowledge"] for r in rows} == {"oracle", "blind"}
    assert {r["knowledge"] for r in rows if r["policy"] == "oracle-lb"} == {"oracle"}
    synthetic = [r for r in rows if r["trace"] == "synthetic" and r["knowledge"] == "oracle"]
    assert {r["policy"] for r in synthetic} == {*SchedTableSpec.quick().policies, "oracle-lb"}
    assert {"dqn", "gavel", "srtf", "tiresias"} <= set(SchedTableSpec.quick().policies)
    for r in synthetic:
        assert ROW_KEYS <= set(r)
        assert r["avg_jct_s"] >= next(x["avg_jct_s"] for x in synthetic if x["policy"] == "oracle-lb") * (1 - 1e-9)
        lo, hi = r["avg_jct_s_ci95"]
        assert lo <= r["avg_jct_s"] <= hi
    assert {r["trace"] for r in rows} == {"synthetic", "gavel-msr", "philly", "alibaba"}
    for name in ("table.md", "summary.md", "levels.md", "results.json", "avg_jct.png", "real_traces.png"):
        assert (tmp_path / name).exists()
    assert set(doc["agents"]) == {"dqn"}  # which policy the learned rows ran, said once in the summary
    assert doc["real_traces"] == "included: gavel-msr, philly, alibaba"
    assert f"- `dqn`: {doc['agents']['dqn']}" in (tmp_path / "summary.md").read_text()


def test_agent_notes_say_each_learned_policy_once(recwarn):
    import warnings

    from gpualloc.experiments.scheduling_table import agent_notes
    from gpualloc.scheduling.policies import make_policy

    warnings.simplefilter("always")
    notes = agent_notes(["fcfs", "gavel-srtf", "dqn", "dqn-hd"])
    assert set(notes) == {"dqn", "dqn-hd"} and not recwarn.list  # the runs stay quiet: the notes say it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert notes["dqn"] == make_policy("dqn").note


def test_real_windows_run_on_every_cluster_of_the_table(shared_data):
    """The unseen cluster gets the real-trace windows too (transfer to real workloads on GPUs never trained
    on), each row compared only with the heuristics of its own cluster, trace and load."""
    from gpualloc.experiments.scheduling_table import _planned_runs, _real_traces, run_table, total_runs

    spec = SchedTableSpec(unseen_cluster="4xV100+4xT4", loads=(0.8,), seeds=1, jobs=12, real_jobs=12,
                          policies=("fcfs", "srtf"))
    real = _real_traces(shared_data)
    assert len(_planned_runs(spec, real, None)) == total_runs(spec, True) == 2 * 2 * (1 + len(real))
    rows = run_table(spec, shared_data)["rows"]
    real_rows = [r for r in rows if r["part"] == "real"]
    assert {(r["cluster"], r["trace"]) for r in real_rows} == {(c, label) for c in spec.clusters
                                                              for label, _, _ in real}
    for r in real_rows:  # srtf is the one heuristic here (fcfs is a baseline, not among the heuristics)
        srtf = next(x for x in real_rows
                    if (x["cluster"], x["trace"], x["policy"]) == (r["cluster"], r["trace"], "srtf"))
        assert r["vs_best"] == pytest.approx(1.0 - r["avg_jct_s"] / srtf["avg_jct_s"])
    assert len({r["avg_jct_s"] for r in real_rows if r["policy"] == "srtf"}) == 2 * len(real)  # distinct runs


def test_training_windows_are_unseen_by_the_table_and_keep_the_trace_format(shared_data):
    from gpualloc.experiments.scheduling_table import (REAL_TRACES, TRAIN_WINDOWS, VAL_WINDOWS,
                                                       training_windows)

    assert SchedTableSpec.full().real_jobs <= 300
    for label in TRAIN_WINDOWS:
        spans = [(s, s + 150) for s in (*TRAIN_WINDOWS[label], *VAL_WINDOWS.get(label, ()))]
        assert min(s for s, _ in spans) >= 300  # the table evaluates the first real_jobs jobs
        ordered = sorted(spans)
        assert all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:], strict=False))  # train and val disjoint
    clusters = ["adlro16", "4xA100+4xV100+8xT4"]
    train = training_windows(shared_data, clusters)
    val = training_windows(shared_data, clusters, starts=VAL_WINDOWS)
    assert len(train) == sum(map(len, TRAIN_WINDOWS.values())) and len(val) == sum(map(len, VAL_WINDOWS.values()))
    formats = {label: fmt for label, _, fmt in REAL_TRACES}
    for spec, trace in train + val:
        label = trace.source.split("[")[0]
        assert trace.format == formats[label] and len(trace.jobs) == 150 and spec.name in clusters
        assert trace.meta["load"] == 0.8


def test_vs_best_takes_every_heuristic_and_vs_best_published_only_the_published_ones():
    from gpualloc.experiments.scheduling_table import _add_vs_fcfs

    key = {"cluster": "c", "trace": "synthetic", "load": 0.8}
    rows = [{**key, "policy": p, "avg_jct_s": jct}
            for p, jct in (("fcfs", 400.0), ("srtf", 120.0), ("gavel", 100.0), ("gavel-srtf", 80.0), ("dqn", 90.0))]
    _add_vs_fcfs(rows)
    dqn = rows[-1]
    assert dqn["best_heuristic"] == "gavel-srtf" and dqn["vs_best"] == pytest.approx(1 - 90 / 80)
    assert dqn["best_published"] == "gavel" and dqn["vs_best_published"] == pytest.approx(0.1)
    assert dqn["vs_fcfs"] == pytest.approx(1 - 90 / 400)


def test_summary_names_both_bests_and_skips_traces_without_the_learned_policy():
    from gpualloc.experiments.scheduling_table import _add_vs_fcfs
    from gpualloc.reports.tables import scheduling_summary_markdown

    metrics = {"p99_jct_s": 7200.0, "makespan_s": 36_000.0, "saturated_utilization": 0.5}
    rows = [{"cluster": "c", "trace": t, "load": 0.8, "policy": p, "avg_jct_s": jct, **metrics}
            for t in ("synthetic", "philly") for p, jct in (("gavel", 3600.0), ("gavel-srtf", 1800.0), ("dqn", 2700.0))
            if not (t == "philly" and p == "dqn")]
    _add_vs_fcfs(rows)
    lines = scheduling_summary_markdown(rows).splitlines()
    assert len(lines) == 3
    assert "| c | synthetic | 0.8 | gavel-srtf | 0.50 | gavel | 1.00 | 0.75 | -50.0% | +25.0% |" in lines[2]
    assert scheduling_summary_markdown([r for r in rows if r["policy"] != "dqn"]) == ""


def test_levels_side_by_side_share_a_line_with_the_pred_policy_and_bold_each_levels_best():
    from gpualloc.experiments.scheduling_table import _add_vs_fcfs
    from gpualloc.reports.tables import scheduling_levels_markdown

    key = {"cluster": "c", "trace": "synthetic", "load": 0.8}
    rows = [{**key, "policy": p, "knowledge": k, "avg_jct_s": h * 3600.0}
            for k, p, h in (("oracle", "gavel", 3.0), ("oracle", "gavel-srtf", 2.0), ("oracle", "srtf", 2.5),
                            ("blind", "gavel", 3.0), ("blind", "srtf-pred", 2.6), ("blind", "tiresias", 4.0))]
    rows.append({**key, "policy": "oracle-lb", "knowledge": "oracle", "avg_jct_s": 3600.0})
    _add_vs_fcfs(rows)
    lines = scheduling_levels_markdown(rows).splitlines()
    assert lines[0] == ("| cluster | trace | load | policy | oracle: avg JCT (h) [vs oracle gavel-srtf] | "
                        "blind: avg JCT (h) [vs oracle gavel-srtf] |")
    assert "| c | synthetic | 0.8 | gavel | 3.00 [-50.0%] | **3.00 [-50.0%]** |" in lines  # blind's best heuristic
    assert "| c | synthetic | 0.8 | gavel-srtf | **2.00 [+0.0%]** | - |" in lines
    assert "| c | synthetic | 0.8 | srtf / srtf-pred | 2.50 [-25.0%] | 2.60 [-30.0%] |" in lines  # a loss, as it is
    assert "| c | synthetic | 0.8 | oracle-lb | 1.00 | - |" in lines
    assert scheduling_levels_markdown([r for r in rows if r["knowledge"] == "oracle"]) == ""  # one level


def test_utilisation_while_waiting_averages_the_seeds_in_which_a_job_waited():
    from gpualloc.experiments.scheduling_table import METRICS, _aggregate
    from gpualloc.reports.tables import scheduling_markdown, scheduling_summary_markdown

    base = {key: 1.0 for key in METRICS} | {"rejected": 0}
    runs = [base | {"avg_jct_s": 3600.0, "saturated_utilization": u} for u in (0.6, float("nan"), 0.8)]
    row = _aggregate(runs, [{"avg_jct_s": 1800.0}] * 3)
    assert row["saturated_utilization"] == pytest.approx(0.7) and row["avg_jct_s"] == 3600.0
    assert row["saturated_utilization_runs"] == 2 and "avg_jct_s_runs" not in row
    never = _aggregate([base | {"saturated_utilization": float("nan")}] * 2, [{"avg_jct_s": 1.0}] * 2)
    assert never["saturated_utilization"] != never["saturated_utilization"]  # no seed had a job wait: NaN
    rows = [{"cluster": "c", "trace": "synthetic", "load": 1.0, "policy": p, **never, "best_heuristic": "gavel-srtf"}
            for p in ("gavel-srtf", "dqn")]
    assert scheduling_summary_markdown(rows).splitlines()[2].endswith("| - | - |")  # not "nan%"
    two_of_three = {"cluster": "c", "trace": "synthetic", "load": 1.0, "policy": "gavel-srtf", "seeds": 3, **row,
                    "vs_fcfs": 0.0}
    assert "| 70.0% ± 14.1% (2 of 3 seeds) |" in scheduling_markdown([two_of_three])


@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_reproduce_scheduling_data_without_traces_is_one_line(tmp_path, folder):
    """A --data folder given on purpose that holds no real trace (a typo, the wrong folder) stops before any
    run, in one line, rather than writing a table without the real-trace rows."""
    from tests.cli.test_cli import run_main

    data = tmp_path / folder
    if folder == "empty":
        data.mkdir()
    out = tmp_path / "out"
    proc = run_main("reproduce", "scheduling", "--quick", "--data", str(data), "--out", str(out))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {data}: none of the real traces is there"), proc.stderr
    assert not (out / "results.json").exists()
