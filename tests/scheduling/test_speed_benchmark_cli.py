"""``benchmarks/sched_speed.py`` refuses bad arguments in one line, exit status 2, before any run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sched_speed.py"


@pytest.mark.parametrize(("args", "message"), [
    (["--runs", "philly:bogus"], "--runs philly:bogus: unknown policy 'bogus'"),
    (["--runs", "nope:fcfs"], "--runs nope:fcfs: unknown workload 'nope'"),
    (["--runs", "msr:fcfs", "--repeat", "0"], "--repeat must be >= 1"),
])
def test_bad_arguments_fail_in_one_line(tmp_path, args, message):
    out = tmp_path / "speed.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and message in proc.stderr
    assert not out.exists()
