"""Closing the loop: an engine run's records -> a calibration that `place --calibration` plans with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpualloc.cli.main import app
from gpualloc.cost.model import Calibration
from gpualloc.errors import EngineError
from gpualloc.execute.engine.record import compare_run, fit_run, predict_run, read_run
from gpualloc.graph.cached import capture_cached
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.document import write_plan
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.run import place

BATCH = 8
runner = CliRunner()


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """gpt-tiny on 2xcpu, a speed-proportional DDP plan written as `place -o` writes it."""
    graph = capture_cached("gpt-tiny", batch=BATCH)
    cluster = load_cluster("2xcpu")
    problem = PlacementProblem(graph, cluster)
    outcome = place(problem, "ddp-speed", seed=0, hybrid=True)
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    write_plan(path, problem, outcome.plan, "2xcpu", extra={**outcome.to_dict(problem), "calibration": None})
    return path, graph, cluster, outcome.plan


def write_run(folder: Path, plan, cluster, busy, *, factor: float, peak: int = 50_000_000, optimizer=None) -> Path:
    """Rank records of a run whose every rank computed ``factor`` x ``busy`` (its predicted compute) and stepped
    its optimizer in ``optimizer[device]`` seconds (default a tenth of that compute)."""
    folder.mkdir(parents=True, exist_ok=True)
    devices = sorted(plan.devices)
    names = []
    for rank, d in enumerate(devices):
        stage = next(i for i, s in enumerate(plan.stages) if d in s.devices)
        replica = next(i for i, r in enumerate(plan.stages[stage].replicas) if d in r.devices)
        share = plan.stages[stage].replicas[replica].batch_share
        t = factor * busy[d]
        doc = {"rank": rank, "world_size": len(devices), "device": d, "device_type": cluster.devices[d].type.name,
               "torch_device": "cpu", "stage": stage, "replica": replica, "tp_rank": 0, "local_batch": share,
               "microbatches": plan.microbatches, "step_times_s": [1.5 * t, 1.4 * t, 1.6 * t],
               "stage_forward_s": t / 3, "stage_backward_s": 2 * t / 3,
               "optimizer_s": 0.1 * t if optimizer is None else optimizer[d],
               "peak_memory_bytes": peak, "peak_reserved_bytes": None, "loss": 1.0 if stage == len(plan.stages) - 1
               else None}
        names.append(f"rank{rank}.json")
        (folder / names[-1]).write_text(json.dumps(doc))
    engine = {"format": "gpualloc-engine-run", "plan": "plan.json", "model": "gpt-tiny", "world_size": len(devices),
              "backend": "gloo", "schedule": plan.schedule, "steps": 3, "warmup": 1,
              "step_time_s": 1.5 * factor * max(busy), "ranks": names,
              "checks": {"loss": {"unsplit": 1.0, "engine": 1.0, "abs_err": 0.0, "ok": True}}}
    (folder / "engine.json").write_text(json.dumps(engine))
    return folder


def test_known_times_give_the_expected_efficiency(planned, tmp_path):
    _, graph, cluster, plan = planned
    base = Calibration.load()
    before = predict_run(plan, graph, cluster, base, optimizer="adam")
    assert all(before.optimizer_s[d] > 0 for d in plan.devices)
    run = read_run(write_run(tmp_path / "run", plan, cluster, before.busy_s, factor=2.0,
                             optimizer=[3.0 * x for x in before.optimizer_s]))
    rows = compare_run(run, before, cluster)
    assert [r.compute_error for r in rows] == pytest.approx([-0.5, -0.5])
    fitted = fit_run(run, rows, before, base, cluster)
    cpu = cluster.catalog.device("cpu")
    old, new = base.efficiency(cpu), fitted.efficiency(cpu)
    assert new.compute == pytest.approx(old.compute / 2) and new.memory == pytest.approx(old.memory / 2)
    assert new.launch_s == pytest.approx(old.launch_s * 2)
    assert fitted.fit["engine_run"]["scale"] == {"cpu": pytest.approx(2.0)}
    # the loop closes: the same plan predicted with the fitted calibration computes what was measured
    after = predict_run(plan, graph, cluster, fitted, optimizer="adam")
    for d in plan.devices:
        assert after.busy_s[d] == pytest.approx(2.0 * before.busy_s[d], rel=1e-9)
        # ... and steps the optimizer in what was measured (fitted apart: 3x)
        assert after.optimizer_s[d] == pytest.approx(3.0 * before.optimizer_s[d], rel=1e-9)
    assert fitted.fit["measured"]["cpu"]["engine"]["optimizer_scale"] == pytest.approx(3.0)
    assert "engine run of gpt-tiny" in fitted.optimizer_cost(cpu, "fp32", "adam").fitted_from
    mem = fitted.fit["engine_run"]["memory"]["correction_bytes"]["cpu"]
    assert mem == pytest.approx(50_000_000 - (before.peak_mem_bytes[0] - before.reserve_bytes[0]))
    # the file is a calibration: the one reader takes it back unchanged
    fitted.save(tmp_path / "run.json")
    again = Calibration.load(tmp_path / "run.json")
    assert again.optimizer_cost(cpu, "fp32", "adam") == fitted.optimizer_cost(cpu, "fp32", "adam")
    assert again.efficiency(cpu) == new and json.loads((tmp_path / "run.json").read_text())["format"] == \
        "gpualloc-calibration"


def test_a_replica_that_waits_inside_its_backward_is_left_out_of_the_fit(planned, tmp_path):
    """3:1 shares: the small replica's backward holds DDP's wait for the big one; the fit uses the big one."""
    from gpualloc.placement.hybrid.plan import HybridStage, Replica, make_plan

    _, graph, cluster, _ = planned
    L = PlacementProblem(graph, cluster).hybrid.L
    plan = make_plan([HybridStage(0, L - 1, (Replica((0,), 6), Replica((1,), 2)))], BATCH, 1, n_devices=2)
    base = Calibration.load()
    before = predict_run(plan, graph, cluster, base, optimizer="adam")
    assert before.busy_s[1] < 0.9 * before.busy_s[0]
    waited = [before.busy_s[0], before.busy_s[0]]  # rank 1 finishes with rank 0: its own work plus the wait
    run = read_run(write_run(tmp_path / "run", plan, cluster, waited, factor=2.0))
    fitted = fit_run(run, compare_run(run, before, cluster), before, base, cluster)
    assert fitted.fit["engine_run"]["scale"]["cpu"] == pytest.approx(2.0)
    assert fitted.fit["measured"]["cpu"]["engine"]["ranks_fitted"] == [0]


def test_launch_collect_writes_a_calibration_that_place_reads(planned, tmp_path):
    path, graph, cluster, plan = planned
    busy = predict_run(plan, graph, cluster, Calibration.load(), optimizer="adam").busy_s
    folder = write_run(tmp_path / "run", plan, cluster, busy, factor=3.0)
    out = tmp_path / "run.json"
    res = runner.invoke(app, ["launch", str(path), "--out", str(folder), "--collect", "--no-calibrate",
                              "--calibration-out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["scale"]["cpu"] == pytest.approx(3.0)
    assert report["checks"]["loss"]["ok"] is True and len(report["ranks"]) == 2

    def step(*extra: str) -> float:
        r = runner.invoke(app, ["place", "gpt-tiny", "--cluster", "2xcpu", "--method", "ddp-speed", "--batch",
                                str(BATCH), "--json", *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)["step_time_s"]

    shipped, measured = step(), step("--calibration", str(out))
    # compute is 3x slower; communication and the optimizer step (its own calibration) are not scaled
    assert measured > 1.5 * shipped


@pytest.mark.parametrize("breakage, field", [
    (lambda d: d.pop("stage_forward_s"), "stage_forward_s: missing"),
    (lambda d: d.update(step_times_s=[]), "step_times_s"),
    (lambda d: d.update(local_batch="4"), "local_batch: expected int"),
    (lambda d: d.update(stage_backward_s=float("nan")), "stage_backward_s"),
])
def test_a_bad_rank_record_is_one_line_naming_file_and_field(planned, tmp_path, breakage, field):
    _, graph, cluster, plan = planned
    folder = write_run(tmp_path / "run", plan, cluster, [1e-3] * len(cluster), factor=1.0)
    doc = json.loads((folder / "rank1.json").read_text())
    breakage(doc)
    (folder / "rank1.json").write_text(json.dumps(doc))
    with pytest.raises(EngineError) as err:
        read_run(folder)
    assert "rank1.json" in str(err.value) and field in str(err.value) and "\n" not in str(err.value)


def test_a_bad_run_folder_through_the_cli_is_exit_2(planned, tmp_path):
    import subprocess
    import sys

    path = planned[0]
    (tmp_path / "engine.json").write_text('{"format": "gpualloc-engine-run", "world_size": 2}')
    proc = subprocess.run([sys.executable, "-m", "gpualloc.cli.main", "launch", str(path), "--out", str(tmp_path),
                           "--collect", "--no-calibrate"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "engine.json: step_time_s: missing" in proc.stderr
