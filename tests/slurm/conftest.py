"""A fake Slurm cluster for the tests marked ``slurm``: ``scripts/slurm/fake-cluster.sh`` started
once per session (munged, slurmctld, two slurmd: ``n0`` with ``Gres=gpu:v100:4,gpu:t4:2``, ``n1``
with ``Gres=gpu:v100:2,gpu:t4:2``; the advisory job_submit plugin loaded), ``SLURM_CONF`` pointing
at it, and stopped at the end. Skipped with the reason where Slurm is not installed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpualloc.service.slurm import SQUEUE_FORMAT, SlurmJob, merge_components, parse_squeue
from tests.service.conftest import local_service, server  # noqa: F401 - the service tests' fixtures, shared

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm" / "fake-cluster.sh"
PLUGIN = REPO / "contrib" / "slurm" / "job_submit.lua"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel", "scontrol")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


@dataclass
class FakeSlurm:
    dir: Path
    conf: Path

    def jobs(self) -> list[SlurmJob]:
        """Every job Slurm still knows, the components of a heterogeneous job merged into one."""
        out = subprocess.run(["squeue", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}"],
                             capture_output=True, text=True, timeout=30, check=True)
        parts: dict[str, list[SlurmJob]] = {}
        for job in parse_squeue(out.stdout):
            parts.setdefault(job.job_id.split("+")[0], []).append(job)
        return [merge_components(p) for p in parts.values()]

    def job(self, job_id: str) -> SlurmJob:
        return next(j for j in self.jobs() if j.job_id == job_id)

    def cancel_all(self) -> None:
        subprocess.run(["scancel", "--me"], capture_output=True, timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(j.active for j in self.jobs()):
            time.sleep(0.2)


def _terminate_together(d: Path, timeout_s: float = 10.0) -> None:
    """SIGTERM every daemon of the fake cluster at once and wait for them: each takes ~2 s to stop, and the
    script's ``stop`` (run next: it removes the pid files and kills what is left) stops them one after another."""
    pids = []
    for f in (d / "run").glob("*.pid"):
        try:
            pid = int(f.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = [p for p in pids if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> Iterator[FakeSlurm]:
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} not found): `make test-slurm` installs "
                    f"slurm-wlm and munge, or apt-get install slurm-wlm munge")
    d = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "JOB_SUBMIT_LUA": str(PLUGIN)}
    done = subprocess.run(["bash", str(SCRIPT), "start", str(d)], capture_output=True, text=True, timeout=120, env=env)
    if done.returncode != 0:
        subprocess.run(["bash", str(SCRIPT), "stop", str(d)], capture_output=True, timeout=60)
        logs = "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                         for p in sorted((d / "log").glob("*.log")))
        pytest.fail(f"the fake Slurm cluster did not start:\n{done.stderr}\n{logs}")
    conf = d / "etc" / "slurm.conf"
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)  # every sinfo/sbatch/squeue, and `gpualloc serve` children, use it
    cluster = FakeSlurm(d, conf)
    try:
        yield cluster
    finally:
        cluster.cancel_all()
        _terminate_together(d)
        subprocess.run(["bash", str(SCRIPT), "stop", str(d)], capture_output=True, timeout=60)
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


@pytest.fixture
def fake_slurm(slurm_cluster) -> Iterator[FakeSlurm]:
    """The session's cluster, with every job cancelled after the test."""
    yield slurm_cluster
    slurm_cluster.cancel_all()


def slurm_job_id(runs_dir: Path, job_id: int, attempt: int = 1) -> str:
    return json.loads((runs_dir / f"{job_id}-{attempt}" / "slurm_job.json").read_text())["job_id"]


def expected_gres(job: dict, cluster) -> tuple[str, str]:
    """``(GRES, nodes)`` as :meth:`FakeSlurm.jobs` shows a job the service placed on ``job["gpus"]``:
    one component when every node has the same count, else one per node joined with ``;``."""
    per_node = Counter(cluster.nodes[cluster.devices[g].node].name for g in job["gpus"])
    gtype = "t4" if job["device_type"] == "T4" else "v100"
    nodes = sorted(per_node)
    if len(set(per_node.values())) == 1:
        hostlist = nodes[0] if len(nodes) == 1 else f"n[{nodes[0][1:]}-{nodes[-1][1:]}]"
        return f"gres:gpu:{gtype}:{per_node[nodes[0]]}", hostlist
    return ";".join(f"gres:gpu:{gtype}:{per_node[n]}" for n in nodes), ";".join(nodes)
