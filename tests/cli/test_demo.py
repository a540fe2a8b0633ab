"""`gpualloc demo` end to end through the real entry point: the main job must never break silently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GPUALLOC = Path(sys.executable).parent / "gpualloc"


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([str(GPUALLOC), "demo", "--out", str(out), "--batch", "8"], capture_output=True,
                          text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    for step in ("1. capture ResNet-50", "2. the graph", "3. one training step", "4. place it on hetero8",
                 "5. schedule 200 synthetic jobs"):
        assert step in proc.stdout, step
    assert "lower bound:" in proc.stdout and "oracle-lb" in proc.stdout and "relative step time" in proc.stdout
    graph = json.loads((out / "resnet50.json").read_text())
    assert graph["format"] == "gpualloc-graph" and graph["batch_size"] == 8 and len(graph["nodes"]) > 100
    for plot in ("jct_cdf.png", "utilization.png", "queue.png"):
        path = out / "sched-plots" / plot
        assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG", plot


def test_demo_bad_out_folder_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = subprocess.run([str(GPUALLOC), "demo", "--out", str(blocker / "demo")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(blocker) in lines[0], proc.stderr
