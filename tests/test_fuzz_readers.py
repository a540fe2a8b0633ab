"""Property tests: every file reader and every size argument, fed random bytes, random text and random
integers, either succeeds or raises a GpuallocError (one line), never another exception or a hang."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpualloc.errors import GpuallocError
from gpualloc.limits import MAX_DEVICES, MAX_JOBS, MAX_MICROBATCHES, MAX_SEED

FUZZ = settings(max_examples=40, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture],
                derandomize=True)

# Field names the readers look for, so random documents reach past the first check.
KEYS = ("format", "version", "name", "nodes", "edges", "id", "src", "dst", "bytes", "flops", "batch_size",
        "devices", "default", "cpu_default", "compute", "memory", "launch_s", "assignment", "microbatches",
        "count", "link", "network", "device_types", "time_ms", "fwd", "bwd", "gpu-graph", "gpualloc-graph")
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                    st.sampled_from(KEYS), st.text(max_size=8))
JSON_DOCS = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)), max_leaves=20)
CSV_WORDS = st.sampled_from(["id", "arrival_s", "job_type", "work_s", "num_gpus", "ml-training", "1", "0",
                             "-1", "1e309", "nan", "V100", "A100|T4", "true", "", "x", "2020-01-01 00:00:00",
                             "name", "time", "application", "num_replicas", "gpu_milli", "creation_time",
                             "num_gpu", "sn", "model", "gpu", "sample", "index"])
CSV_TEXT = st.lists(st.lists(CSV_WORDS, min_size=1, max_size=6).map(",".join), max_size=6).map("\n".join)


def _allowed(call) -> None:
    try:
        call()
    except GpuallocError as err:
        assert "\n" not in str(err).strip(), str(err)


def _writer(tmp_path: Path, name: str):
    path = tmp_path / name

    def write(content: bytes | str) -> Path:
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            path.write_bytes(content)
        return path

    return write


def _graph(path):
    from gpualloc.graph.ir import OpGraph

    OpGraph.load(path)


def _pipedream(path):
    from gpualloc.graph.importers import import_pipedream

    import_pipedream(path)


def _calibration(path):
    from gpualloc.cost.model import Calibration

    Calibration.load(path)


def _plan(path):
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.problem import PlacementProblem
    from gpualloc.placement.document import read_plan
    from tests.conftest import diamond

    read_plan(path).plan_for(PlacementProblem(diamond(), load_cluster("2xA100")))


def _cluster(path):
    from gpualloc.hardware.cluster import load_cluster

    load_cluster(path)


def _trace(fmt):
    def read(path):
        from gpualloc.workload.traces import READERS, read_trace

        assert fmt is None or fmt in READERS
        read_trace(path, fmt)

    return read


def _alibaba_nodes(path):
    from gpualloc.workload.traces import alibaba_cluster

    alibaba_cluster(path)


def _telemetry(path):
    from gpualloc.telemetry.replay import read_records

    read_records(path)


JSON_READERS = [("g.json", _graph), ("cal.json", _calibration), ("plan.json", _plan)]
TEXT_READERS = [("g.txt", _pipedream), ("c.toml", _cluster), ("c.yaml", _cluster)]
CSV_READERS = [("t.csv", _trace(None)), *((f"t-{f}.csv", _trace(f)) for f in
                                          ("native", "philly", "pollux", "tiresias", "alibaba")),
               ("t.trace", _trace("gavel")), ("nodes.csv", _alibaba_nodes), ("rec.csv", _telemetry)]
EVERY_READER = [*JSON_READERS, *TEXT_READERS, *CSV_READERS, ("t.parquet", _trace("native")),
                ("rec.parquet", _telemetry)]


@pytest.mark.parametrize("name, reader", EVERY_READER, ids=[n for n, _ in EVERY_READER])
@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes(tmp_path, name, reader, data):
    path = _writer(tmp_path, name)(data)
    _allowed(lambda: reader(path))


@pytest.mark.parametrize("name, reader", JSON_READERS, ids=[n for n, _ in JSON_READERS])
@FUZZ
@given(doc=JSON_DOCS)
def test_random_json(tmp_path, name, reader, doc):
    path = _writer(tmp_path, name)(json.dumps(doc))
    _allowed(lambda: reader(path))


@pytest.mark.parametrize("name, reader", [*TEXT_READERS, *CSV_READERS],
                         ids=[n for n, _ in [*TEXT_READERS, *CSV_READERS]])
@FUZZ
@given(text=st.one_of(st.text(max_size=200), CSV_TEXT))
def test_random_text(tmp_path, name, reader, text):
    path = _writer(tmp_path, name)(text)
    _allowed(lambda: reader(path))


TOML_LINES = st.lists(st.sampled_from([
    "[[nodes]]", "devices = {V100 = 8}", "devices = {A100 = 100000000}", "count = 100000000", "count = -1",
    "count = 4", "devices = [\"T4\", \"T4\"]", "network = \"ib-hdr\"", "link = \"nvlink3\"", "name = \"x\"",
    "[device_types.X]", "mem_gb = 16", "fp32_tflops = 1e309", "devices = {X = 2}", "devices = {}",
]), max_size=8).map("\n".join)


@FUZZ
@given(text=TOML_LINES)
def test_random_cluster_toml(tmp_path, text):
    path = _writer(tmp_path, "c.toml")(text)
    _allowed(lambda: _cluster(path))


@FUZZ
@given(text=st.text(alphabet="0123456789xX*+@ AVT10-e", max_size=30))
def test_random_shorthand(text):
    from gpualloc.hardware.cluster import load_cluster

    _allowed(lambda: load_cluster(text))


@FUZZ
@given(n=st.integers(-2**70, 2**70))
def test_random_sizes(n):
    """Every size the library takes: in range it works, out of range it is one GpuallocError."""
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.problem import PlacementProblem
    from gpualloc.workload.traces import generate
    from tests.conftest import diamond

    spec = load_cluster("2xA100")
    if abs(n) <= 50 or not 0 <= n <= MAX_JOBS:
        _allowed(lambda: generate(n, spec, 0.8, seed=0))  # only tiny or refused n: generation is linear in n
    if not 0 <= n <= MAX_SEED or n < 1000:
        _allowed(lambda: generate(3, spec, 0.8, seed=n))
    if n < 1 or n > MAX_MICROBATCHES or n <= 64:
        _allowed(lambda: PlacementProblem(diamond(), spec, microbatches=n))
    if n < 1 or n > MAX_DEVICES or n <= 64:
        _allowed(lambda: load_cluster(f"{n}xV100"))


@pytest.mark.parametrize("option, args", [
    ("--microbatches", ["place", "{g}", "-c", "2xA100", "-m", "static"]),
    ("--batch", ["cost", "estimate", "{g}", "--devices", "T4"]),
    ("--generate", ["simulate", "-c", "2xA100"]),
    ("--seed", ["simulate", "-c", "2xA100", "--generate", "3"]),
    ("--head", ["simulate", "-c", "2xA100", "--generate", "3"]),
])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(n=st.one_of(st.integers(-2**70, -1), st.integers(MAX_SEED + 1, 2**70), st.integers(0, 3)))
def test_random_size_options(tmp_path, option, args, n):
    """Out-of-range sizes on the command line: a usage error (exit 2), never a traceback."""
    from typer.testing import CliRunner

    from gpualloc.cli.main import app
    from tests.conftest import diamond

    g = tmp_path / "g.json"
    if not g.exists():
        diamond().save(g)
    result = CliRunner().invoke(app, [a.format(g=g) for a in args] + [option, str(n)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert isinstance(result.exception, GpuallocError), repr(result.exception)
    assert result.exit_code in (0, 1, 2), result.output  # 1: a GpuallocError, which main() turns into 2
    if n < 0 or n > MAX_SEED:
        assert result.exit_code == 2, result.output


# ------------------------------------------------------------------- absurd numbers in every trace reader
NUMBER_TEXT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-2**70, 2**70).map(str),
    st.sampled_from(["1e308", "1e300", "-1e308", "1e-320", "nan", "inf", "-inf", "0", "1", "8", "3.2e8",
                     "315576001", "9007199254740993", "1e30"]),
)
TRACE_TEMPLATES = {  # one row of each format, its numbers left open; a second, ordinary row after it
    "native": ("t.csv", "id,arrival_s,job_type,work_s,num_gpus,cpu_cores,mem_bytes,priority,batch_size\n"
                        "a,{},ml-training,{},{},{},{},{},{}\nb,0,ml-training,60,1,0,0,0,0\n"),
    "philly": ("t.csv", "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,{},{},{},c\n"
                        "2017-10-09 07:01:56,60,1,60,c\n"),
    "tiresias": ("t.csv", "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
                          "0,{},{},{},vgg19,{},{}\n1,1,0,10,vgg19,60,1\n"),
    "pollux": ("t.csv", "name,time,application,num_replicas,batch_size\ncifar10-0,{},cifar10,{},{}\n"
                        "cifar10-1,0,cifar10,1,128\n"),
    "alibaba": ("t.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
                         "deletion_time,scheduled_time\np0,{},{},{},{},,LS,Running,{},{},{}\n"
                         "p1,1000,1024,1,1000,,LS,Running,0,60,0\n"),
    "gavel": ("t.trace", "Transformer (batch size 128)\tpython3 train.py\t-step\t{}\t{}\t{}\t1\n"
                         "Transformer (batch size 128)\tpython3 train.py\t-step\t1\t100\t0.0\t1\n"),
}


@pytest.mark.parametrize("fmt", list(TRACE_TEMPLATES))
@FUZZ
@given(data=st.data())
def test_absurd_trace_numbers(tmp_path, fmt, data):
    """Whatever numbers a trace holds, a reader yields jobs inside ``limits.TRACE_LIMITS`` (never NaN, infinity
    or 1e308) or refuses the file in one line naming it; and what it yields simulates without a numpy warning
    and with finite metrics."""
    import math
    import warnings

    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.limits import TRACE_LIMITS
    from gpualloc.scheduling.metrics import summary
    from gpualloc.scheduling.policies import make_policy
    from gpualloc.scheduling.simulator import simulate
    from gpualloc.workload.traces import read_trace

    name, template = TRACE_TEMPLATES[fmt]
    numbers = [data.draw(NUMBER_TEXT) for _ in range(template.count("{}"))]
    path = _writer(tmp_path, name)(template.format(*numbers))
    try:
        trace = read_trace(path, fmt)
    except GpuallocError as err:
        assert "\n" not in str(err).strip() and str(path) in str(err), str(err)
        return
    for job in trace.jobs:
        for field, (low, high, _) in TRACE_LIMITS.items():
            value = getattr(job, field)
            assert math.isfinite(value) and low <= value <= high, (field, value, numbers)
    cluster = load_cluster("4xV100")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's overflow / invalid-value warnings
        try:
            result = simulate(trace, cluster, make_policy("fcfs"))
        except GpuallocError as err:  # e.g. a job larger than the cluster: one line
            assert "\n" not in str(err).strip(), str(err)
            return
    for key, value in summary(result).items():
        assert not isinstance(value, float) or math.isfinite(value) or key in _UNDEFINED_OK, (key, value, numbers)


_UNDEFINED_OK = {"saturated_utilization"}  # undefined (NaN) when no job ever waited: printed as null / '-'
