"""The scheduling benchmarks refuse bad arguments in one line, exit status 2, before any run, and
leave the recorded results alone (``benchmarks/_args.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize(("script", "args", "message"), [
    ("sched_speed", ["--runs", "philly:bogus"], "--runs philly:bogus: unknown policy 'bogus'"),
    ("sched_speed", ["--runs", "nope:fcfs"], "--runs nope:fcfs: unknown workload 'nope'"),
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
])
def test_bad_arguments_fail_in_one_line_and_keep_the_results(tmp_path, script, args, message):
    results = sorted((BENCH / "results").glob(f"{script}*.json"))
    before = {p: p.read_bytes() for p in results}
    extra = ["--out", str(tmp_path / "speed.json")] if script == "sched_speed" else []
    proc = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), *args, *extra], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert {p: p.read_bytes() for p in results} == before and not (tmp_path / "speed.json").exists()
