"""``gpualloc simulate``: the JSON interface scripts rely on, comparisons, plots and one-line errors."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli import run_main, runner
from gpualloc.cli.main import app
from tests.conftest import SHARED_DATA

KEYS = {"policy", "jobs", "avg_jct_s", "p50_jct_s", "p99_jct_s", "throughput_jobs_per_h", "utilization",
        "effective_utilization", "makespan_s", "lower_bound_avg_jct_s", "hyperscore", "sim_wall_s"}


def sim(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def test_generate_json_has_the_documented_keys():
    proc = sim("simulate", "--cluster", "adlro16", "--generate", "60", "--load", "0.8", "--seed", "3",
              "--policy", "sjf", "--json")
    row = json.loads(proc.stdout)
    assert KEYS <= set(row)
    assert row["policy"] == "sjf" and row["jobs"] == 60
    assert row["avg_jct_s"] >= row["lower_bound_avg_jct_s"] > 0


def test_same_seed_same_numbers():
    args = ("simulate", "--generate", "40", "--seed", "5", "--policy", "fcfs", "--json")
    a, b = json.loads(sim(*args).stdout), json.loads(sim(*args).stdout)
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert a == b


@pytest.mark.skipif(not (SHARED_DATA / "tiresias" / "60_job.csv").exists(), reason="shared data missing")
def test_trace_file_with_records(tmp_path):
    out = tmp_path / "r.json"
    proc = sim("simulate", "--cluster", "16xV100", "--trace", str(SHARED_DATA / "tiresias" / "60_job.csv"),
               "--format", "tiresias", "--policy", "fcfs", "--json", "-o", str(out))
    assert json.loads(proc.stdout)["jobs"] == 60
    records = json.loads(out.read_text())["jobs_records"]
    assert len(records) == 60 and all(r["finish_s"] >= r["arrival_s"] for r in records)


def test_compare_table_json_and_plots(tmp_path):
    proc = sim("simulate", "compare", "--generate", "50", "--policies", "fcfs,sjf,srtf", "--plots",
               str(tmp_path / "plots"), "--json")
    doc = json.loads(proc.stdout)
    assert [r["policy"] for r in doc["results"]] == ["fcfs", "sjf", "srtf", "oracle-lb"]
    oracle, runs = doc["results"][-1], doc["results"][:-1]
    assert oracle["lower_bound_avg_jct_s"] <= oracle["capacity_lower_bound_avg_jct_s"]
    assert oracle["capacity_lower_bound_avg_jct_s"] <= min(r["avg_jct_s"] for r in runs)
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"jct_cdf.png", "utilization.png", "queue.png"}
    table = sim("simulate", "compare", "--generate", "30", "--policies", "fcfs,sjf").stdout
    assert "oracle-lb" in table and "x bound" in table and "capacity lower bound:" in table


@pytest.mark.parametrize("args, message", [
    (("--policy", "nope", "--generate", "5"), "unknown policy 'nope'"),
    (("--trace", "missing.csv", "--format", "philly"), "missing.csv"),
    (("--generate", "5", "--cluster", "3xNOPE"), "NOPE"),
    (("--policy", "fcfs"), "exactly one of --trace"),
])
def test_bad_input_is_one_line(args, message):
    proc = run_main("simulate", *args)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_job_larger_than_the_cluster(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("id,arrival_s,job_type,work_s,num_gpus\nbig,0,ml-training,100,32\nok,1,ml-training,10,1\n"
                     "huge,2,ml-training,10,64\n")
    for command in ("simulate", "simulate compare"):
        proc = run_main(*command.split(), "--trace", str(trace), "--json")
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.strip().splitlines() == [
            "error: job big needs 32 GPUs of one type; largest type has 8 (2 of 3 jobs cannot run on this cluster); "
            "--drop-unplaceable rejects such jobs instead"]
    proc = sim("simulate", "--trace", str(trace), "--policy", "fcfs", "--json", "--drop-unplaceable")
    row = json.loads(proc.stdout)
    assert row["rejected"] == 2 and row["jobs"] == 1
    proc = sim("simulate", "--trace", str(trace), "--policy", "fcfs", "--drop-unplaceable")
    assert "fcfs on adlro16: 3 jobs (2 rejected: no device type can run them)" in proc.stdout


def test_dqn_policy_and_train_scheduler_cli(tmp_path):
    """Train a tiny expert-choice agent from a --config file, then schedule with it."""
    out, cfg = tmp_path / "s.pt", tmp_path / "run.toml"
    cfg.write_text('clusters = ["4xV100+4xT4"]\nexperts = ["srtf", "fcfs"]\ntrain_traces = 2\nnum_jobs = [15, 20]\n'
                   'val_loads = [0.9]\nbc_rounds = 1\nbc_episodes = 1\nbc_epochs = 1\nsteps = 0\n')
    result = runner.invoke(app, ["train", "scheduler", "--config", str(cfg), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.exists() and "teacher" in result.stdout
    row = json.loads(sim("simulate", "--cluster", "4xV100+4xT4", "--generate", "30", "--policy", "dqn",
                         "--agent", str(out), "--json").stdout)
    assert row["policy"] == "dqn" and row["jobs"] == 30


@pytest.mark.slow
def test_train_scheduler_names_a_train_windows_folder_without_traces(tmp_path):
    proc = run_main("train", "scheduler", "--experts", "gavel,srtf", "--steps", "0", "--train-windows",
                    str(tmp_path / "typo"), "-o", str(tmp_path / "s.pt"))
    assert proc.returncode == 2 and "typo: none of the real traces is there" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "s.pt").exists()


def test_bundled_agent_fallback_is_one_warning_line():
    """The bundled agent fails its gate: `dqn` says so in one line (no source location) and runs its teacher."""
    proc = run_main("simulate", "--cluster", "adlro16", "--generate", "20", "--seed", "1", "--policy", "dqn", "--json")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: learned agent worse than its teacher gavel-srtf")
    teacher = run_main("simulate", "--cluster", "adlro16", "--generate", "20", "--seed", "1", "--policy", "gavel-srtf",
                       "--json")
    assert json.loads(proc.stdout)["avg_jct_s"] == json.loads(teacher.stdout)["avg_jct_s"]


def test_progress_bars_leave_nothing_in_logs():
    """stderr that is not a terminal gets no progress bars, not even the blank line a finished bar leaves."""
    proc = run_main("simulate", "compare", "--generate", "20", "--policies", "fcfs,sjf,srtf")
    assert proc.returncode == 0 and proc.stderr == "" and "oracle-lb" in proc.stdout
