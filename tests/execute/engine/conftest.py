"""Run the engine under ``torchrun`` in a subprocess: a fresh port, a timeout, and the whole process group killed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EngineRun:
    returncode: int
    stdout: str
    stderr: str
    out: Path

    @property
    def engine(self) -> dict[str, Any]:
        return json.loads((self.out / "engine.json").read_text())

    def rank(self, r: int) -> dict[str, Any]:
        return json.loads((self.out / f"rank{r}.json").read_text())


def write_plan(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"format": "gpualloc-plan", "version": 2, **doc}))
    return path


def _run(cmd: list[str], out: Path, timeout: float) -> EngineRun:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the engine ran past {timeout} s:\n{stderr[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return EngineRun(proc.returncode, stdout, stderr, out)


def torchrun(nproc: int, plan: Path, model: str, out: Path, *extra: str, timeout: float = 240) -> EngineRun:
    """``torchrun --nproc-per-node nproc -m gpualloc.execute.engine --plan plan --model model --out out ...``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), "-m", "gpualloc.execute.engine", "--plan", str(plan),
           "--model", model, "--out", str(out), *extra]
    return _run(cmd, out, timeout)


def engine_alone(plan: Path, model: str, out: Path, *extra: str, timeout: float = 120) -> EngineRun:
    """The per-rank program as one process, without torchrun (what a refusal before the process group sees)."""
    cmd = [sys.executable, "-m", "gpualloc.execute.engine", "--plan", str(plan), "--model", model, "--out", str(out),
           *extra]
    return _run(cmd, out, timeout)
