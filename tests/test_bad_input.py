"""Bad input through the real entry point: exit status 2 and one line on stderr naming the file or
field, never a traceback, a hang or NaN (issue 13, "bad input")."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gpualloc.errors import CaptureError, ClusterError, GraphError, PlacementError, TraceError
from gpualloc.limits import MAX_DEVICES, MAX_JOBS, MAX_MICROBATCHES, MAX_SEED

from tests.conftest import diamond

BINARY = bytes(range(256)) * 4  # not UTF-8 from byte 0x80 on


def one_line_error(cli, *args: str, names: str) -> str:
    code, _, err = cli(*args)
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and names in lines[0], err
    return lines[0]


def usage_error(cli, *args: str, option: str) -> None:
    """A value outside an option's documented range: Typer's usage error, exit 2, the option named."""
    code, _, err = cli(*args)
    assert code == 2, err
    assert "Traceback" not in err and option in err, err


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "diamond.json"
    diamond().save(path)
    return path


@pytest.fixture
def binary(tmp_path):
    def make(name: str):
        path = tmp_path / name
        path.write_bytes(BINARY)
        return path

    return make


# ---------------------------------------------------------------------------------------- binary files
@pytest.mark.parametrize("args, name", [
    (("graph", "show", "{f}"), "g.json"),
    (("graph", "import", "{f}", "--format", "pipedream"), "g.txt"),
    (("hw", "show", "{f}"), "c.toml"),
    (("hw", "show", "{f}"), "c.yaml"),
    (("cost", "calibration", "--file", "{f}"), "cal.json"),
    (("simulate", "-c", "adlro16", "-t", "{f}"), "t.csv"),
    (("simulate", "-c", "adlro16", "-t", "{f}", "--format", "philly"), "t.csv"),
])
def test_binary_input_files(cli, binary, args, name):
    f = binary(name)
    line = one_line_error(cli, *(a.format(f=f) for a in args), names=str(f))
    assert "Unicode" not in line and f"{f}: not UTF-8 text (a binary file?): byte 128" in line  # one message


def test_binary_plan_and_calibration_to_place(cli, binary, graph_file):
    plan = binary("plan.json")
    one_line_error(cli, "place", "evaluate", graph_file, "-c", "2xA100", "--plan", plan, names=str(plan))
    cal = binary("cal.json")
    one_line_error(cli, "place", graph_file, "-c", "2xA100", "--calibration", cal, names=str(cal))


# ---------------------------------------------------------------------------------------- outputs
def test_outputs_into_missing_folders_are_created(cli, tmp_path, graph_file):
    plan, gantt = tmp_path / "a" / "b" / "plan.json", tmp_path / "c" / "gantt.png"
    code, _, err = cli("place", graph_file, "-c", "2xA100", "-m", "static", "-o", plan, "--plot", gantt)
    assert code == 0, err
    assert json.loads(plan.read_text())["assignment"] and gantt.stat().st_size > 0
    out = tmp_path / "d" / "run.json"
    code, _, err = cli("simulate", "run", "-c", "adlro16", "--generate", "5", "-o", out)
    assert code == 0, err
    assert json.loads(out.read_text())["jobs_records"]
    folder = tmp_path / "f" / "plots"
    code, _, err = cli("simulate", "compare", "-c", "adlro16", "--generate", "5", "--policies", "fcfs",
                       "--plots", folder)
    assert code == 0, err
    assert (folder / "jct_cdf.png").is_file()


def test_graph_import_into_missing_folder(cli, tmp_path, shared_data):
    out = tmp_path / "e" / "g.json"
    code, _, err = cli("graph", "import", shared_data / "pipedream-profiles" / "resnet18.txt", "--format",
                       "pipedream", "-o", out)
    assert code == 0, err
    assert json.loads(out.read_text())["nodes"]


def test_output_under_a_file_is_one_line(cli, tmp_path, graph_file):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    one_line_error(cli, "place", graph_file, "-c", "2xA100", "-o", blocker / "plan.json", names=str(blocker))
    one_line_error(cli, "place", graph_file, "-c", "2xA100", "-o", tmp_path, names=str(tmp_path))


def test_ensure_output_is_the_one_rule(tmp_path):
    from gpualloc.cli.common import ensure_output
    from gpualloc.errors import OutputError

    assert ensure_output(tmp_path / "x" / "y", folder=True) == tmp_path / "x" / "y"
    assert (tmp_path / "x" / "y").is_dir()
    assert ensure_output(tmp_path / "p" / "q.json") == tmp_path / "p" / "q.json" and (tmp_path / "p").is_dir()
    assert ensure_output(None) is None
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputError, match=r"^--out .*f/d: cannot create the folder"):
        ensure_output(tmp_path / "f" / "d", folder=True, option="--out")


FULL = "/dev/full"  # every write fails with ENOSPC, for any user


@pytest.mark.skipif(not __import__("os").path.exists(FULL), reason="needs /dev/full")
@pytest.mark.parametrize("args", [
    ("graph", "import", "{profile}", "--format", "pipedream", "-o", FULL),
    ("place", "{graph}", "-c", "2xA100", "-m", "static", "-o", FULL),
    ("simulate", "run", "-c", "adlro16", "--generate", "5", "-o", FULL),
], ids=["graph-import-o", "place-o", "simulate-out"])
def test_a_failing_write_is_one_line(cli, graph_file, shared_data, args):
    """A disk that fails the write (ENOSPC) is the one 'cannot write' line, exit 2, never an OSError.
    (Not ``--plot``: matplotlib's PNG writer does not report a failed write on a device file.)"""
    profile = shared_data / "pipedream-profiles" / "resnet18.txt"
    line = one_line_error(cli, *(str(a).format(graph=graph_file, profile=profile) for a in args), names=FULL)
    assert "cannot write: No space left on device" in line, line


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="needs Linux /proc")
def test_unwritable_output_folder_is_refused_before_the_work(cli, graph_file):
    """/proc takes no new file, even for root: refused when the options are parsed, naming the option."""
    line = one_line_error(cli, "place", graph_file, "-c", "2xA100", "-o", "/proc/plan.json", names="/proc/plan.json")
    assert line.startswith("error: --output /proc/plan.json: cannot write in /proc: "), line
    line = one_line_error(cli, "graph", "capture", "resnet50", "-o", "/proc/g.json", names="/proc/g.json")
    assert line.startswith("error: --output /proc/g.json: cannot write in /proc: "), line  # before tracing
    line = one_line_error(cli, "simulate", "compare", "-c", "adlro16", "--generate", "5", "--policies", "fcfs",
                          "--plots", "/proc/gpualloc-plots", names="--plots /proc/gpualloc-plots")
    assert "cannot create the folder" in line, line


def test_a_failed_write_keeps_the_previous_file(cli, tmp_path, graph_file, monkeypatch):
    """Interrupted writes (a JSON document, a plot) leave the earlier output whole and no scratch file."""
    import matplotlib.figure

    plan, gantt = tmp_path / "plan.json", tmp_path / "gantt.png"
    plan.write_text("recorded plan")
    gantt.write_bytes(b"recorded png")
    plan.chmod(0o640)

    def full(self, *args, **kwargs):
        Path(args[0]).write_bytes(b"half")  # part of the file was written, then the disk filled
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    line = one_line_error(cli, "place", graph_file, "-c", "2xA100", "-m", "static", "--plot", gantt, names=str(gantt))
    assert "No space left on device" in line
    monkeypatch.setattr(Path, "write_text", lambda self, *a, **k: full(self, self))
    line = one_line_error(cli, "place", graph_file, "-c", "2xA100", "-m", "static", "-o", plan, names=str(plan))
    monkeypatch.undo()
    assert plan.read_text() == "recorded plan" and gantt.read_bytes() == b"recorded png"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["diamond.json", "gantt.png", "plan.json"]
    code, _, err = cli("place", graph_file, "-c", "2xA100", "-m", "static", "-o", plan)
    assert code == 0, err
    assert json.loads(plan.read_text())["assignment"] and plan.stat().st_mode & 0o777 == 0o640  # mode kept


def test_atomic_output_in_the_library(tmp_path):
    from gpualloc.errors import OutputError, TraceError, atomic_output, write_text
    from gpualloc.workload.jobs import Job, JobType, Trace
    from gpualloc.workload.traces import read_native, write_native

    out = tmp_path / "t.csv"
    trace = Trace.of([Job("a", 0.0, JobType.ML_TRAINING, 5.0)])
    write_native(trace, out)
    with pytest.raises(TraceError, match=r"t.csv: cannot write: boom"):
        with atomic_output(out, TraceError) as tmp:
            assert tmp.parent == out.parent and tmp.suffix == ".csv" and tmp != out
            tmp.write_text("half")
            raise OSError("boom")
    assert read_native(out).jobs == trace.jobs and len(list(tmp_path.iterdir())) == 1
    with pytest.raises(OutputError, match=r"^/proc/x.json: cannot write: "):
        write_text("/proc/x.json", "{}")
    write_text(__import__("os").devnull, "not a regular file: written in place, never replaced")
    assert Path(__import__("os").devnull).is_char_device()


# ---------------------------------------------------------------------------------------- sizes
def test_size_options_have_documented_bounds(cli, graph_file):
    usage_error(cli, "place", graph_file, "-c", "2xA100", "--microbatches", "1000000000", option="--microbatches")
    usage_error(cli, "simulate", "-c", "adlro16", "--generate", "1000000000", option="--generate")
    usage_error(cli, "simulate", "-c", "adlro16", "--generate", "5", "--seed", "-1", option="--seed")
    usage_error(cli, "place", graph_file, "-c", "2xA100", "--seed", str(MAX_SEED + 1), option="--seed")
    code, out, _ = cli("place", "--help")
    assert code == 0 and str(MAX_MICROBATCHES) in out


def test_huge_clusters_are_refused(cli, tmp_path):
    one_line_error(cli, "hw", "show", "100000000xV100", names="100000000xV100")
    one_line_error(cli, "hw", "show", f"{MAX_DEVICES}xV100+8xT4", names=f"{MAX_DEVICES + 8:,} devices")
    toml = tmp_path / "big.toml"
    toml.write_text("[[nodes]]\ndevices = {V100 = 8}\ncount = 100000000\n")
    one_line_error(cli, "hw", "show", toml, names="nodes[0].count")
    toml.write_text("[[nodes]]\ndevices = {V100 = 8}\ncount = 4000\n")
    one_line_error(cli, "hw", "show", toml, names="nodes[0]")
    yml = tmp_path / "big.yaml"
    yml.write_text("nodes:\n  - devices: {V100: 100000000}\n")
    one_line_error(cli, "hw", "show", yml, names="nodes[0].devices")


@pytest.mark.parametrize("row, field", [
    ("b,1e308,ml-training,10,1", "arrival_s: 1e+308 is above the limit of 315,576,000 (10 years)"),
    ("b,5,ml-training,1e300,1", "work_s: 1e+300 is above the limit of 315,576,000 (10 years)"),
    ("b,5,ml-training,10,100000", "num_gpus: 100000 is above the limit of 16,384 (the devices of the largest cluster)"),
])
def test_absurd_trace_values(cli, tmp_path, row, field):
    """Issue 35: arrival_s=1e308 leaked a numpy overflow warning and energy_j null; work_s=1e300 ran."""
    trace = tmp_path / "t.csv"
    trace.write_text(f"id,arrival_s,job_type,work_s,num_gpus\na,0,ml-training,10,1\n{row}\n")
    line = one_line_error(cli, "simulate", "-c", "adlro16", "-t", trace, "--json", names=f"{trace}:3: ")
    assert line.endswith(field), line


def test_library_enforces_the_same_bounds():
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.problem import PlacementProblem
    from gpualloc.workload.traces import generate

    spec = load_cluster("adlro16")
    with pytest.raises(TraceError, match="num_jobs"):
        generate(MAX_JOBS + 1, spec, 0.8, seed=0)
    with pytest.raises(TraceError, match="seed"):
        generate(5, spec, 0.8, seed=-1)
    assert len(generate(5, spec, 0.8, seed=np.random.default_rng(0))) == 5
    with pytest.raises(PlacementError, match="microbatches"):
        PlacementProblem(diamond(), load_cluster("2xA100"), microbatches=MAX_MICROBATCHES + 1)
    with pytest.raises(ClusterError, match="count"):
        load_cluster(f"{MAX_DEVICES + 1}xA100")


def test_empty_device_list(cli, graph_file):
    one_line_error(cli, "cost", "estimate", graph_file, "--devices", "", names="devices")
    one_line_error(cli, "cost", "estimate", graph_file, "--devices", " , ", names="devices")


# ---------------------------------------------------------------------------------------- traces, NaN
def test_header_only_trace_is_an_error(cli, tmp_path):
    trace = tmp_path / "empty.csv"
    trace.write_text("id,arrival_s,job_type,work_s\n")
    one_line_error(cli, "simulate", "-c", "adlro16", "-t", trace, "--json", names=f"{trace}: no jobs")
    one_line_error(cli, "simulate", "compare", "-c", "adlro16", "-t", trace, names=f"{trace}: no jobs")


def test_print_json_never_writes_nan(capsys):
    from gpualloc.cli.common import print_json

    print_json({"a": math.nan, "b": [math.inf, 1.5, -math.inf], "c": (2, "x")})
    out = capsys.readouterr().out
    assert "NaN" not in out and "Infinity" not in out
    assert json.loads(out) == {"a": None, "b": [None, 1.5, None], "c": [2, "x"]}


# ---------------------------------------------------------------------------------------- calibration
CAL_OK = {"compute": 0.5, "memory": 0.5, "launch_s": 1e-5}


@pytest.mark.parametrize("doc, field", [
    ({"devices": {"T4": {**CAL_OK, "compute": -1}}, "default": CAL_OK, "cpu_default": CAL_OK}, "devices.T4.compute"),
    ({"devices": {}, "default": {**CAL_OK, "memory": 0}, "cpu_default": CAL_OK}, "default.memory"),
    ({"devices": {}, "default": CAL_OK, "cpu_default": {**CAL_OK, "launch_s": -1e-3}}, "cpu_default.launch_s"),
    ({"devices": {}, "cpu_default": CAL_OK}, "default"),
    ({"devices": {"T4": {"compute": 0.5}}, "default": CAL_OK, "cpu_default": CAL_OK}, "devices.T4.memory"),
    ([1, 2], "malformed calibration"),
])
def test_bad_calibrations_name_the_field(cli, tmp_path, graph_file, doc, field):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc))
    one_line_error(cli, "cost", "calibration", "--file", path, names=field)
    code, out, err = cli("place", graph_file, "-c", "2xA100", "--calibration", path, "--json")
    assert code == 2 and "inf" not in out and field in err


def test_non_finite_calibration(tmp_path):
    from gpualloc.cost.model import Calibration
    from gpualloc.errors import CostModelError

    path = tmp_path / "cal.json"
    path.write_text('{"devices": {}, "default": {"compute": NaN, "memory": 1, "launch_s": 0}, '
                    '"cpu_default": {"compute": 1, "memory": 1, "launch_s": 0}}')
    with pytest.raises(CostModelError, match="default.compute"):
        Calibration.load(path)


# ---------------------------------------------------------------------------------------- plans
def test_plan_for_another_cluster(cli, tmp_path, graph_file):
    plan = tmp_path / "plan.json"
    code, _, err = cli("place", graph_file, "-c", "2xA100+2xV100", "-m", "static", "-o", plan)
    assert code == 0, err
    one_line_error(cli, "place", "evaluate", graph_file, "-c", "2xA100", "--plan", plan, names="devices")
    one_line_error(cli, "place", "evaluate", graph_file, "-c", "2xA100+2xT4", "--plan", plan, names="devices[2]")
    doc = json.loads(plan.read_text())
    plan.write_text(json.dumps({**doc, "microbatches": -3}))
    one_line_error(cli, "place", "evaluate", graph_file, "-c", "2xA100+2xV100", "--plan", plan,
                   names="microbatches")
    plan.write_text(json.dumps({**doc, "devices": "all"}))
    one_line_error(cli, "place", "evaluate", graph_file, "-c", "2xA100+2xV100", "--plan", plan, names="devices")


# ---------------------------------------------------------------------------------------- graphs
def test_empty_graph_is_an_error(cli, tmp_path):
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"format": "gpualloc-graph", "version": 1, "nodes": []}))
    one_line_error(cli, "place", path, "-c", "2xA100", names="nodes")
    with pytest.raises(GraphError, match="no operators"):
        from gpualloc.graph.ir import OpGraph

        OpGraph("g", [], [])


MODELS = textwrap.dedent("""
    import torch
    from torch import nn

    class Constant(nn.Module):
        def forward(self, x):
            return 3

    def constant():
        return Constant()

    def wrong_shape():
        return nn.Sequential(nn.Linear(10, 5), nn.ReLU())

    def example_inputs(batch):
        return (torch.randn(batch, 7),)
""")


@pytest.fixture
def models(tmp_path, monkeypatch):
    (tmp_path / "badmodels_bi.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield "badmodels_bi"
    sys.modules.pop("badmodels_bi", None)


def test_model_computing_nothing(models):
    from gpualloc.graph.capture import capture

    with pytest.raises(CaptureError, match="no operators"):
        capture(f"{models}:constant")


@pytest.mark.slow
def test_wrong_input_shape_is_one_line_without_torch_logs(models, tmp_path):
    """A subprocess: torch's log handlers hold the real stderr, which capsys would not see."""
    import subprocess

    result = subprocess.run([sys.executable, "-m", "gpualloc.cli.main", "graph", "capture", f"{models}:wrong_shape",
                             "-o", str(tmp_path / "g.json")], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot trace") and "RuntimeError" in lines[0], lines[:5]


def test_capture_restores_torch_log_levels(models):
    import logging

    from gpualloc.graph.capture import capture

    names = ("torch", "torch._subclasses.fake_tensor", "torch.export")
    levels = {n: logging.getLogger(n).level for n in names}
    with pytest.raises(CaptureError, match="cannot trace"):
        capture(f"{models}:wrong_shape")
    assert {n: logging.getLogger(n).level for n in names} == levels


@pytest.mark.parametrize("args, name, text", [
    (("hw", "show", "{f}"), "c.yaml", "[" * 100_000),
    (("hw", "show", "{f}"), "c.toml", "a = " + "[" * 100_000),
    (("graph", "show", "{f}"), "g.json", "[" * 100_000),
    (("cost", "calibration", "--file", "{f}"), "cal.json", "[" * 100_000),
])
def test_deeply_nested_documents(cli, tmp_path, args, name, text):
    f = tmp_path / name
    f.write_text(text)
    one_line_error(cli, *(a.format(f=f) for a in args), names=f"{f}: ")


def test_placement_seed_is_checked_by_the_library():
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.problem import PlacementProblem
    from gpualloc.placement.run import place

    problem = PlacementProblem(diamond(), load_cluster("2xA100"))
    with pytest.raises(PlacementError, match="seed"):
        place(problem, "kl", seed=-1)
    assert place(problem, "kl", seed=np.random.default_rng(0)).result.step_time_s > 0


def test_infinite_device_peak_in_a_cluster_file(cli, tmp_path):
    toml = tmp_path / "inf.toml"
    toml.write_text('[device_types.X]\nmem_gb = 16\nfp32_tflops = 1e309\ntdp_w = 300\nidle_w = 30\n'
                    'mem_bandwidth_gbps = 900\n[[nodes]]\ndevices = {X = 2}\n')
    one_line_error(cli, "hw", "show", toml, names="device_types.X: fp32_tflops")


@pytest.mark.parametrize("text, field", [
    ("[teams.a]\nquota = { V100 = -2 }\n", "teams.a.quota.V100: expected a whole number of GPUs"),
    ("[teams.a]\nquota = { H9 = 1 }\n", "teams.a.quota.H9: unknown device type 'H9'"),
    ("[teams.a]\nquota = { V100 = 3 }\n[teams.b]\nquota = { V100 = 3 }\n", "quotas of V100-16GB sum to 6, above the 4"),
    ("[teams.a\n", "not valid TOML"),
])
def test_bad_quota_files(cli, tmp_path, text, field):
    """Issue 35: a quota file that names an unknown type, a negative quota, or more GPUs than the cluster has."""
    quotas = tmp_path / "q.toml"
    quotas.write_text(text)
    for command in (("simulate",), ("simulate", "compare", "--policies", "fcfs")):
        trace = Path(__file__).parents[1] / "examples" / "teams_trace.csv"
        line = one_line_error(cli, *command, "-c", "4xV100+2xT4", "-t", trace,
                              "--quotas", quotas, "--json", names=str(quotas))
        assert field in line, line
    quotas.write_bytes(BINARY)
    one_line_error(cli, "simulate", "-c", "4xV100+2xT4", "--generate", "3", "--quotas", quotas, names=str(quotas))
