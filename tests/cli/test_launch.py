"""`gpualloc launch`: the host check before anything starts, and the torchrun command it runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gpualloc.cli import launch as launch_cli
from gpualloc.cli.main import app
from gpualloc.errors import EngineError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.document import read_plan, write_plan
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.run import place
from tests.conftest import diamond

runner = CliRunner()

TWO_NODES = """name = "two-cpu-nodes"
[[nodes]]
name = "h"
devices = ["cpu", "cpu"]
count = 2
"""


def plan_file(tmp_path, cluster_spec: str, name: str = "plan.json"):
    clus = load_cluster(cluster_spec)
    problem = PlacementProblem(diamond(), clus)
    outcome = place(problem, "ddp-speed", seed=0, hybrid=True)
    path = tmp_path / name
    write_plan(path, problem, outcome.plan, cluster_spec)
    return path, clus


@pytest.fixture
def no_spawn(monkeypatch):
    """Fail the test if launch would start torchrun."""
    def refuse(cmd, env, **kw):
        raise AssertionError(f"torchrun was started: {cmd}")
    monkeypatch.setattr(launch_cli, "run_torchrun", refuse)


def test_a_gpu_plan_on_this_cpu_host_fails_in_one_line_before_spawning(tmp_path):
    path, _ = plan_file(tmp_path, "2xA100")
    proc = subprocess.run([sys.executable, "-m", "gpualloc.cli.main", "launch", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.count("\n") == 1 and "A100-40GB GPU" in proc.stderr and "no CUDA device" in proc.stderr


def test_a_plan_for_another_cluster_fails_in_one_line(tmp_path, no_spawn):
    path, _ = plan_file(tmp_path, "2xcpu")
    res = runner.invoke(app, ["launch", str(path), "--cluster", "4xcpu"])
    assert isinstance(res.exception, EngineError), res.output
    message = str(res.exception)
    assert "\n" not in message and "devices" in message and "4xcpu" in message


def test_a_precision_the_devices_cannot_train_in_fails_in_one_line_before_spawning(tmp_path, no_spawn):
    """A hand-made bf16 plan for CPUs: the planner's own precision rule refuses it before anything runs."""
    import json

    path, _ = plan_file(tmp_path, "2xcpu")
    doc = json.loads(path.read_text())
    doc["precision"] = "bf16"
    path.write_text(json.dumps(doc))
    res = runner.invoke(app, ["launch", str(path)])
    assert isinstance(res.exception, EngineError), res.output
    message = str(res.exception)
    assert "\n" not in message and "bf16" in message and "'cpu'" in message

def test_host_share_checks_gpu_count_and_type(tmp_path):
    path, clus = plan_file(tmp_path, "2xA100")
    saved = read_plan(path)
    with pytest.raises(EngineError, match="this host has 1 CUDA device"):
        launch_cli.host_share(str(path), saved, clus, nnodes=1, node_rank=0, cuda_count=1)
    with pytest.raises(EngineError, match=r"is a A100-40GB, this host's cuda:0 is a NVIDIA H100 80GB HBM3"):
        launch_cli.host_share(str(path), saved, clus, nnodes=1, node_rank=0, cuda_count=2,
                              cuda_names=("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"))
    share = launch_cli.host_share(str(path), saved, clus, nnodes=1, node_rank=0, cuda_count=2,
                                  cuda_names=("NVIDIA A100-SXM4-40GB",) * 2)
    assert share.torch_devices == ("cuda:0", "cuda:1") and share.ranks == (0, 1)


def test_multi_node_share_and_command(tmp_path):
    spec = tmp_path / "two.toml"
    spec.write_text(TWO_NODES)
    path, clus = plan_file(tmp_path, str(spec))
    saved = read_plan(path)
    with pytest.raises(EngineError, match="runs on 2 node"):
        launch_cli.host_share(str(path), saved, clus, nnodes=1, node_rank=0, cuda_count=0)
    share = launch_cli.host_share(str(path), saved, clus, nnodes=2, node_rank=1, cuda_count=0)
    assert share.ranks == (2, 3) and share.world_size == 4 and share.torch_devices == ("cpu", "cpu")
    cmd = launch_cli.torchrun_command(path, "diamond", share, steps=2, warmup=0, seed=0, optimizer="sgd", lr=None,
                                      out=tmp_path / "out", check=True, node_rank=1, master_addr="10.0.0.1",
                                      master_port=29511)
    text = " ".join(cmd)
    assert "-m torch.distributed.run --nproc-per-node 2 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 " \
           "--master-port 29511 -m gpualloc.execute.engine" in text
    res = runner.invoke(app, ["launch", str(path), "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                              "--print-command"])
    assert res.exit_code == 0 and "--nnodes 2 --node-rank 1 --master-addr 10.0.0.1" in res.stdout, res.output
    res = runner.invoke(app, ["launch", str(path), "--nnodes", "2", "--print-command"])
    assert isinstance(res.exception, EngineError) and "--master-addr" in str(res.exception)


def test_print_command_runs_nothing(tmp_path, no_spawn):
    path, _ = plan_file(tmp_path, "2xcpu")
    res = runner.invoke(app, ["launch", str(path), "--print-command", "--steps", "3", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "-m torch.distributed.run --nproc-per-node 2 --standalone -m gpualloc.execute.engine" in res.stdout
    assert f"--plan {path}" in res.stdout and "--steps 3" in res.stdout and not (tmp_path / "o").exists()


@pytest.mark.slow
def test_launch_runs_the_plan_under_torchrun_and_closes_the_loop(tmp_path):
    """A real run: torchrun with 2 gloo ranks, the engine's checks, and the run as a calibration file."""
    import json
    import os
    import signal

    from gpualloc.cost.model import Calibration

    path = tmp_path / "plan.json"
    place = runner.invoke(app, ["place", "gpt-tiny", "--cluster", "2xcpu", "--method", "ddp-speed", "--batch", "4",
                                "-o", str(path), "--json"])
    assert place.exit_code == 0, place.output
    cal = tmp_path / "run.json"
    proc = subprocess.Popen([sys.executable, "-m", "gpualloc.cli.main", "launch", str(path), "--steps", "1",
                             "--warmup", "0", "--out", str(tmp_path / "run"), "--no-calibrate", "--threads", "2",
                             "--calibration-out", str(cal), "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # launch ends torchrun's group on SIGTERM
        proc.communicate(timeout=30)
        raise
    assert proc.returncode == 0, err[-2000:]
    report = json.loads(out)
    assert all(c["ok"] for c in report["checks"].values()), report["checks"]
    assert len(report["ranks"]) == 2 and all(r["measured_compute_s"] > 0 for r in report["ranks"])
    assert report["scale"]["cpu"] > 0 and Calibration.load(cal).fit["engine_run"]["world_size"] == 2


@pytest.mark.slow
def test_two_nodes_rendezvous_and_node_0_reports(tmp_path):
    """Multi-node for real, on one host: a pipeline over two one-CPU nodes, each node's `gpualloc launch
    --nnodes 2 --node-rank r` its own torchrun agent, meeting at node 0's address; node 0 reports the run."""
    import json
    import os
    import signal

    from tests.execute.engine.conftest import free_port

    spec = tmp_path / "two.toml"
    spec.write_text('name = "2nodes-cpu"\n[[nodes]]\ndevices = { cpu = 1 }\n[[nodes]]\ndevices = { cpu = 1 }\n')
    path = tmp_path / "plan.json"
    placed = runner.invoke(app, ["place", "gpt-tiny", "--cluster", str(spec), "--method", "pipeline",
                                 "--microbatches", "2", "--batch", "8", "-o", str(path), "--json"])
    assert placed.exit_code == 0, placed.output
    port = free_port()
    logs = {r: (tmp_path / f"node{r}.out", tmp_path / f"node{r}.err") for r in (0, 1)}  # files: no pipe fills up
    procs = {r: subprocess.Popen([sys.executable, "-m", "gpualloc.cli.main", "launch", str(path), "--nnodes", "2",
                                  "--node-rank", str(r), "--master-addr", "127.0.0.1", "--master-port", str(port),
                                  "--out", str(tmp_path / "run"), "--steps", "1", "--warmup", "0", "--no-calibrate",
                                  "--json"], stdout=logs[r][0].open("w"), stderr=logs[r][1].open("w"),
                                 start_new_session=True) for r in (1, 0)}
    try:
        for p in procs.values():
            p.wait(timeout=240)
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
    assert all(p.returncode == 0 for p in procs.values()), [err.read_text()[-2000:] for _, err in logs.values()]
    assert "node 0 reports" in logs[1][0].read_text()
    report = json.loads(logs[0][0].read_text())
    assert [r["device"] for r in sorted(report["ranks"], key=lambda r: r["rank"])] == ["n0.cpu.0", "n1.cpu.0"]
    assert all(c["ok"] for c in report["checks"].values()), report["checks"]
