"""The benchmarks refuse bad arguments in one line, exit status 2, before any run, and leave the
recorded results alone (``benchmarks/_args.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
RECORDS = {"calibration_report": "calibration", "sailor_plans": "sailor"}  # else the script's name
# {tmp}: the test's temporary folder, which holds a plain file "a-file"


@pytest.mark.parametrize(("script", "args", "message"), [
    ("calibration_report", ["--data", "/nonexistent-data"], "argument --data: /nonexistent-data: not a folder"),
    ("calibration_report", ["--out", "{tmp}"], "is a folder"),
    ("cli_startup", ["--runs", "0"], "argument --runs: 0 is below 1"),
    ("consolidation", ["--loads", "0.8,x"], "argument --loads: 'x' is not a number"),
    ("dqn_latency", ["--threads", "1", "0"], "argument --threads: 0 is below 1"),
    ("dqn_latency", ["--seed", "4294967296"], "argument --seed: 4294967296 is above 4294967295"),
    ("dqn_rollouts", ["--actors", "4", "--round-steps", "2"], "argument --round-steps: 2 is below --actors (4)"),
    ("execution_accuracy", ["--models", "resnet50:8:3"], "3 microbatches do not divide the batch of 8"),
    ("hdc_speed", ["--dims", "32"], "argument --dims: HDEncoder dim: expected an integer in 64..131,072, got 32"),
    ("hybrid_quality", ["--out", "{tmp}/a-file/hybrid.json"], "argument --out: {tmp}/a-file/hybrid.json: cannot write"),
    ("kl_speed", ["--sizes", "100", "1"], "argument --sizes: 1 is below 2"),
    ("knowledge_overhead", ["--runs", "nope:fcfs"], "--runs nope:fcfs: unknown workload 'nope'"),
    ("knowledge_overhead", ["--repeat", "0"], "argument --repeat: 0 is below 1"),
    ("loss_memory", ["--out", "{tmp}"], "argument --out: {tmp}: is a folder"),
    ("optimizer_step", ["--steps", "0"], "argument --steps: 0 is below 1"),
    ("optimizer_step", ["--optimizers", "lamb"], "--optimizers: 'lamb' is not one of sgd, adam"),
    ("optimizer_step", ["--record-from", "/nonexistent.json"], "argument --record-from: /nonexistent.json"),
    ("optimizer_step", ["--record-from", "{tmp}/a-file"], "not a results file of this script"),
    ("placement_quality", ["--clusters", "8xA100,nope"], "argument --clusters: unknown cluster 'nope'"),
    ("placement_quality", ["--data", "{tmp}"], "argument --data: {tmp}: no pipedream-profiles/*.txt in it"),
    ("replan_demo", ["--noise", "nan"], "argument --noise: 'nan': expected a finite number >= 0"),
    ("replan_demo", ["--pipedream", "/nonexistent.txt"], "argument --pipedream: /nonexistent.txt: no such file"),
    ("replan_hybrid", ["--models", "gpt9"], "argument --models: invalid choice: 'gpt9'"),
    ("replan_hybrid", ["--out", "{tmp}/a-file/r.json"], "argument --out: {tmp}/a-file/r.json: cannot write"),
    ("sailor_plans", ["--data", "{tmp}"], "argument --data: {tmp}: no llm_info.json in it"),
    ("service_load", ["--rate", "0"], "argument --rate: '0': expected a finite number > 0"),
    ("simulate_speed", ["--repeats", "3"], "unrecognized arguments: --repeats 3"),
    ("slurm_load", ["--jobs", "0"], "argument --jobs: 0 is below 1"),
    ("telemetry_overhead", ["--samples", "0"], "argument --samples: 0 is below 1"),
    ("sched_speed", ["--runs", "philly:bogus", "--out", "{tmp}/s.json"], "--runs philly:bogus: unknown policy 'bogus'"),
    ("sched_speed", ["--runs", "nope:fcfs", "--out", "{tmp}/s.json"], "--runs nope:fcfs: unknown workload 'nope'"),
    ("sched_speed", ["--runs", "msr:fcfs", "--repeat", "0"], "argument --repeat: 0 is below 1"),
    ("sched_quality", ["--jobs", "0"], "argument --jobs: 0 is below 1"),
    ("sched_quality", ["--load", "nan"], "argument --load: 'nan': expected a finite number > 0"),
    ("sched_quality", ["--cluster", "4xZZZ"], "unknown device type 'ZZZ'"),
    ("sched_quality", ["--policies", "srtf,nope"], "unknown policy 'nope'"),
    ("sched_headroom", ["--data", "/nonexistent-data"], "/nonexistent-data: none of the real traces is there"),
    ("sched_idle_weight", ["--weights", "0.5,x"], "argument --weights: 'x' is not a number"),
    ("sched_variant_oracle", ["--round-s", "0"], "argument --round-s: '0': expected a finite number > 0"),
    ("sched_windows", ["--offsets", "300,x"], "argument --offsets: 'x' is not an integer"),
    ("sched_windows", ["--load", "0"], "argument --load: '0': expected a finite number > 0"),
    ("sched_decision_latency", ["--jobs", "-3"], "argument --jobs: -3 is below 1"),
    ("prediction_quality", ["--set", "interval=2"], "duration predictor: interval must be in (0, 1), got 2.0"),
    ("prediction_quality", ["--data", "{tmp}", "--traces", "pollux"], "no philly/pollux-workloads/workload-1.csv"),
])
def test_bad_arguments_fail_in_one_line_and_keep_the_results(tmp_path, script, args, message):
    (tmp_path / "a-file").write_text("not a folder\n")
    tmp_before = sorted(tmp_path.rglob("*"))
    args, message = [a.replace("{tmp}", str(tmp_path)) for a in args], message.replace("{tmp}", str(tmp_path))
    results = sorted((BENCH / "results").glob(f"{RECORDS.get(script, script)}*"))
    before = {p: p.read_bytes() for p in results}
    proc = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr
    after = sorted((BENCH / "results").glob(f"{RECORDS.get(script, script)}*"))
    assert after == results and {p: p.read_bytes() for p in after} == before
    assert sorted(tmp_path.rglob("*")) == tmp_before  # nothing written where --out pointed either
