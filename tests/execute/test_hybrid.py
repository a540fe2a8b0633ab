"""``gpualloc run`` of a hybrid (v2) plan: it runs on the torch-native engine under torchrun (one engine, not
two), shows measured against predicted step time and peak memory with the checks against the unsplit model, and
refuses in one line, before anything starts, what the engine or this host cannot run.

The engine's correctness per plan kind (unequal shares, PP x DP under 1F1B, ZeRO-1, TP x FSDP, Adam) is tested in
tests/execute/engine/; here is the command's path through it.
"""

from __future__ import annotations

import json
import sys

import pytest

from gpualloc.cli.main import main
from gpualloc.hardware.cluster import load_cluster

MODEL, BATCH, LAYERS = "gpt-tiny", 4, 26  # gpt-tiny: LayerNorm, no dropout; 26 graph layers at op level


@pytest.fixture
def cli(monkeypatch, capfd):
    """Run the CLI in-process; ``capfd`` catches what the torchrun ranks write to the file descriptors too."""

    def invoke(*args):
        monkeypatch.setattr(sys, "argv", ["gpualloc", *map(str, args)])
        with pytest.raises(SystemExit) as exc:
            main()
        out, err = capfd.readouterr()
        return (exc.value.code or 0), out, err

    return invoke


def _ddp(shares=(3, 1)) -> dict:
    return {"global_batch": sum(shares), "microbatches": 1, "schedule": "1f1b", "sharding": "none",
            "stages": [{"layers": [0, LAYERS - 1],
                        "replicas": [{"devices": [i], "batch_share": s} for i, s in enumerate(shares)]}]}


def _save(path, body: dict, cluster: str = "2xcpu"):
    labels = [d.label for d in load_cluster(cluster).devices]
    path.write_text(json.dumps({"format": "gpualloc-plan", "version": 2, "graph": MODEL, "cluster": cluster,
                                "devices": labels, **body}))
    return path


@pytest.mark.slow
def test_run_trains_a_ddp_plan_with_shares_3_to_1_on_the_engine(tmp_path, cli):
    plan = _save(tmp_path / "ddp.json", _ddp())
    code, out, err = cli("run", MODEL, "--plan", plan, "--steps", "2", "--warmup", "0", "--threads", "2",
                         "--no-calibrate", "--devices", "cpu,cpu", "--json")  # --devices as the engine places
    assert code == 0, err[-3000:]
    doc = json.loads(out)  # stdout is the report alone: the ranks' own lines went to stderr
    assert doc["runner"] == "engine" and doc["plan_version"] == 2 and doc["plan"] == str(plan)
    assert doc["world_size"] == 2 and doc["backend"] == "gloo" and doc["steps"] == 2
    assert doc["plan_description"].startswith("PP=1 [L0-25 DP=2")
    for name in ("output", "loss", "grad", "weights_after_step"):  # the queue runner's checks, kept
        assert doc["checks"][name]["ok"] is True, doc["checks"]
    assert doc["measured_step_s"] > 0 and doc["predicted_step_s"] > 0
    assert doc["step_error"] == pytest.approx(doc["predicted_step_s"] / doc["measured_step_s"] - 1)
    assert doc["calibration"]["source"] == "shipped"
    ranks = doc["ranks"]
    assert [(r["device"], r["torch_device"], r["local_batch"]) for r in ranks] == [("n0.cpu.0", "cpu", 3),
                                                                                   ("n0.cpu.1", "cpu", 1)]
    for r in ranks:  # per-device peak memory measured and predicted; compute measured and predicted
        assert r["measured_peak_bytes"] > 0 and r["predicted_peak_bytes"] > 0 and r["memory_error"] is not None
        assert r["measured_compute_s"] > 0 and r["predicted_compute_s"] > 0
    # the 3-sample replica holds more activations than the 1-sample one, measured and predicted alike
    assert ranks[0]["measured_peak_bytes"] > ranks[1]["measured_peak_bytes"]
    assert ranks[0]["predicted_peak_bytes"] > ranks[1]["predicted_peak_bytes"]


def _edit_stage(key, value):
    return lambda d: d["stages"][0]["replicas"][1].update({key: value})


def _two_stages_shares_differ(d):
    """Shares 3:1 in the first stage, 2:2 in the second: the engine keeps each pipeline's share fixed."""
    d["stages"] = [{"layers": [0, 12], "replicas": [{"devices": [0], "batch_share": 3},
                                                    {"devices": [1], "batch_share": 1}]},
                   {"layers": [13, LAYERS - 1], "replicas": [{"devices": [2], "batch_share": 2},
                                                             {"devices": [3], "batch_share": 2}]}]


@pytest.mark.parametrize(("edit", "cluster", "extra", "names"), [
    (_edit_stage("devices", [7]), "2xcpu", (), ("stages[0].replicas[1].devices", "0..1")),
    (_edit_stage("batch_share", 2), "2xcpu", (), ("stages[0].replicas", "add up to 5")),
    (lambda d: d["stages"][0].update(layers=[0, LAYERS - 2]), "2xcpu", (), ("cover",)),
    (_two_stages_shares_differ, "4xcpu", (), ("stages[1].replicas[0].batch_share",)),
    (lambda d: d.update(stages=[{"layers": [0, LAYERS - 1], "replicas": [
        {"devices": [0, 1, 2], "batch_share": 4}]}], global_batch=4), "4xcpu", (),
     ("tp", "do not split evenly over tensor parallel 3")),
    (lambda d: None, "2xA100", (), ("no CUDA device",)),
    (lambda d: None, "2xcpu", ("--devices", "cpu,cuda:0"), ("--devices cpu,cuda:0", "device 1 on cpu")),
])
def test_what_the_engine_or_this_host_cannot_run_is_one_line_before_anything_starts(tmp_path, cli, edit, cluster,
                                                                                     extra, names):
    doc = _ddp()
    edit(doc)
    path = _save(tmp_path / "plan.json", doc, cluster)
    code, out, err = cli("run", MODEL, "--plan", path, "--steps", "1", "--no-calibrate", *extra)
    assert code == 2 and out == "", err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1, err
    assert all(n in err for n in names), err
