"""Trace readers on the real files, their error messages, the native round trip and the generator."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpualloc.errors import TraceError
from gpualloc.hardware.catalog import default_catalog
from gpualloc.hardware.cluster import load_cluster
from gpualloc.limits import MAX_TRACE_S, MAX_WORK_S
from gpualloc.workload.jobs import Job, JobType, Trace
from gpualloc.workload.speed import gavel_steps_per_s, measured_models, speed_matrix
from gpualloc.workload.traces import (ALIBABA_QOS_PRIORITY, READERS, alibaba_cluster, generate,
                                      infer_format, pollux_gpu_seconds, read_alibaba, read_alibaba_nodes,
                                      read_gavel, read_native, read_philly, read_pollux,
                                      read_tiresias, read_trace, write_native)

# ------------------------------------------------------------------------------ real files

def test_philly_real(shared_data):
    path = shared_data / "philly" / "philly.csv"
    start = time.perf_counter()
    t = read_philly(path)
    elapsed = time.perf_counter() - start
    assert len(t) == 82_247 and t.format == "philly"
    assert elapsed < 2.0, f"reading philly.csv took {elapsed:.2f} s"
    arrivals = np.array([j.arrival_s for j in t])
    assert arrivals[0] == 0.0 and (np.diff(arrivals) >= 0).all()
    assert max(j.num_gpus for j in t) == 128
    assert all(j.job_type is JobType.ML_TRAINING and j.model == "" for j in t.jobs[:100])
    assert t.meta["virtual_clusters"] == 15
    # Row 0 of the file: 2017-10-09 07:01:55, 66 s, 1 GPU; the trace starts 2017-09-04 10:30:41.
    first_row = next(j for j in t if j.id == "0")
    assert first_row.work_s == 66.0 and first_row.num_gpus == 1
    assert first_row.arrival_s == (35 * 86400) - (3 * 3600 + 28 * 60 + 46)


def test_tiresias_real(shared_data):
    t = read_tiresias(shared_data / "tiresias" / "60_job.csv")
    assert len(t) == 60
    first = t.jobs[0]
    assert (first.id, first.num_gpus, first.work_s, first.arrival_s, first.model) == ("0", 1, 164.0, 0.0, "vgg19")
    assert t.jobs[1].num_gpus == 8 and t.jobs[1].arrival_s == 30.0


def test_gavel_real(shared_data):
    files = sorted((shared_data / "gavel" / "msr-seed0").glob("*.trace"))
    traces = [read_gavel(f) for f in files]
    assert len(files) == 15 and sum(len(t) for t in traces) == 15_264
    t = read_trace(shared_data / "gavel" / "msr-seed0" / "0e4a51.trace")
    first = t.jobs[0]
    assert first.model == "Transformer (batch size 128)" and first.num_gpus == 1 and first.arrival_s == 0.0
    assert first.work_s == pytest.approx(95121 / gavel_steps_per_s("Transformer (batch size 128)", 1))
    assert first.work_s == pytest.approx(95121 / 5.44610521981264)
    assert t.meta["scale_factor_fallback"] > 0  # CycleGAN/A3C/Recommendation at 2+ GPUs


def test_pollux_real(shared_data):
    paths = sorted((shared_data / "philly" / "pollux-workloads").glob("*.csv"))
    traces = [read_trace(p) for p in paths]
    assert len(traces) == 8 and all(len(t) == 160 and t.format == "pollux" for t in traces)
    first = traces[0].jobs[0]
    assert (first.id, first.arrival_s, first.model, first.num_gpus, first.batch_size) == \
        ("cifar10-0", 107.0, "cifar10", 6, 2048)
    assert first.work_s == pytest.approx(pollux_gpu_seconds()["cifar10"] / 6)
    apps = {j.model for t in traces for j in t}
    assert apps == {"bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"}


def test_pollux_gpu_seconds_ranks_applications():
    secs = pollux_gpu_seconds()
    # Pollux's size classes: ImageNet the largest, YOLOv3 and the speech/QA jobs medium, NCF and
    # CIFAR-10 small (under one GPU-hour).
    assert secs["imagenet"] > secs["yolov3"] > secs["deepspeech2"] > secs["bert"] > secs["cifar10"] > secs["ncf"]
    assert secs["cifar10"] < 3600 and secs["ncf"] < 3600 and secs["imagenet"] > 10 * 3600


def test_alibaba_real(shared_data):
    t = read_alibaba(shared_data / "alibaba-gpu-v2023" / "openb_pod_list_default.csv")
    assert t.meta == {"skipped_cpu_only": 1088, "skipped_unscheduled": 861, "skipped_nonpositive_work": 0}
    assert len(t) == 8152 - 1088 - 861
    first = t.jobs[0]
    assert first.id == "openb-pod-0000" and first.arrival_s == 0.0 and first.work_s == 12_537_496.0
    assert (first.cpu_cores, first.mem_bytes, first.gpu_milli, first.priority) == (12.0, 16 * 2**30, 1000, 2)
    assert first.single_node and first.gpu_types == ()
    second = next(j for j in t if j.id == "openb-pod-0001")
    assert second.gpu_milli == 460 and second.arrival_s == 427_061.0
    assert {j.priority for j in t} == {0, 1, 2}


def test_alibaba_nodes_and_cluster(shared_data):
    path = shared_data / "alibaba-gpu-v2023" / "openb_node_list_gpu_node.csv"
    nodes = read_alibaba_nodes(path)
    assert len(nodes) == 1213 and nodes[0] == ("openb-node-0000", "P100", 2)
    assert {n.device_type for n in nodes} == {"P100", "T4", "V100-16GB", "V100-32GB", "A10", "G2", "G3"}
    cluster = alibaba_cluster(path)
    known = [n for n in nodes if n.device_type not in ("G2", "G3")]
    assert len(cluster.nodes) == len(known) == 1213 - 549 - 39
    assert len(cluster) == sum(n.num_gpus for n in known)
    assert cluster.type_counts()["V100-32GB"] == sum(n.num_gpus for n in known if n.device_type == "V100-32GB")
    mapped = alibaba_cluster(path, unknown_models={"G2": "V100-16GB", "G3": "A100-40GB"})
    assert len(mapped.nodes) == 1213 and len(mapped) == sum(n.num_gpus for n in nodes)


def test_read_trace_infers_every_format(shared_data, tmp_path):
    cases = {
        shared_data / "philly" / "philly.csv": "philly",
        shared_data / "gavel" / "msr-seed0" / "0e4a51.trace": "gavel",
        shared_data / "philly" / "pollux-workloads" / "workload-2.csv": "pollux",
        shared_data / "tiresias" / "60_job.csv": "tiresias",
        shared_data / "alibaba-gpu-v2023" / "openb_pod_list_default.csv": "alibaba",
    }
    for path, fmt in cases.items():
        assert infer_format(path) == fmt
        if fmt != "philly":  # read (and timed) in test_philly_real
            assert read_trace(path).format == fmt
    native = write_native(read_tiresias(shared_data / "tiresias" / "60_job.csv"), tmp_path / "t.parquet")
    assert read_trace(native).format == "native"
    assert set(READERS) == {"native", "gavel", "philly", "pollux", "tiresias", "alibaba"}


def test_read_trace_errors(tmp_path):
    with pytest.raises(TraceError, match=r"^unknown trace format 'swf'; known: native, gavel, philly, "
                                         r"pollux, tiresias, alibaba$"):
        read_trace(write(tmp_path, "a.csv", "id,arrival_s,job_type,work_s\n"), format="swf")
    with pytest.raises(TraceError, match=r"nope\.csv: no such file$"):
        read_trace(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match=r"nope\.trace: no such file$"):
        read_gavel(tmp_path / "nope.trace")
    with pytest.raises(TraceError, match=r"x\.csv:1: cannot tell the trace format .* one of native, gavel"):
        read_trace(write(tmp_path, "x.csv", "a,b\n1,2\n"))
    with pytest.raises(TraceError, match=r"e\.csv: empty file$"):
        read_native(write(tmp_path, "e.csv", ""))


# ------------------------------------------------------------------------------ malformed input

def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


NATIVE = "id,arrival_s,job_type,work_s,num_gpus\n"
GAVEL_OK = "ResNet-18 (batch size 64)\tcmd\t--num_steps\t1\t1000\t0.000000\t1\n"
PHILLY = "timestamp,duration,num_gpus,gpu_time,cluster\n"
POLLUX = "name,time,application,num_replicas,batch_size\n"
TIRESIAS = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
ALIBABA = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
           "deletion_time,scheduled_time\n")
ALIBABA_OK = "p0,12000,16384,1,1000,,LS,Running,0,100,0\n"

MALFORMED = [
    # reader, file name, text, expected message after "<path>:"
    (read_native, "n.csv", NATIVE + "a,0,ml-training,10,1\nb,x,ml-training,10,1\n",
     r"3: arrival_s: expected a non-negative number, got 'x'"),
    (read_native, "n.csv", "id,arrival_s,job_type\na,0,ml-training\n",
     r"1: missing column\(s\) work_s \(found: id, arrival_s, job_type\)"),
    (read_native, "n.csv", NATIVE + "a,0,ml-training,-5,1\n", r"2: work_s: expected a positive number, got '-5'"),
    (read_native, "n.csv", NATIVE + "a,0,ml-training,5,1.5\n", r"2: num_gpus: expected a positive integer, got '1.5'"),
    (read_native, "n.csv", NATIVE + "a,0,gaming,5,1\n", r"2: job_type: unknown job type 'gaming'"),
    (read_native, "n.csv", NATIVE + "a,0,simulation,5,1\n\na,1,simulation,5,1\n", r"4: id: duplicate job id 'a'"),
    (read_native, "n.csv", "id,arrival_s,job_type,work_s,single_node\na,0,simulation,5,maybe\n",
     r"2: single_node: expected true or false, got 'maybe'"),
    (read_native, "n.csv", NATIVE + "a,0,simulation,5,1\nb,0,simulation,5,1,7\n",
     r"3: Expected 5 fields in line 3, saw 6"),
    (read_native, "n.csv", "id,arrival_s,job_type,work_s,gpu_milli\na,0,simulation,5,1001\n",
     r"2: job a: gpu_milli must be in \(0, 1000\], got 1001"),
    (read_gavel, "g.trace", GAVEL_OK + GAVEL_OK.replace("\t1000\t", "\tabc\t"),
     r"2: total_steps: expected a positive number, got 'abc'"),
    (read_gavel, "g.trace", GAVEL_OK + "ResNet-18 (batch size 64)\tcmd\t--num_steps\t1\t1000\n",
     r"2: arrival_time_s: expected a non-negative number, got ''"),
    (read_gavel, "g.trace", GAVEL_OK.replace("\t1000\t", "\t-5\t"),
     r"1: total_steps: expected a positive number, got '-5'"),
    (read_gavel, "g.trace", GAVEL_OK.replace("ResNet-18 (batch size 64)", "GPT-9"),
     r"1: job_type: no measured V100 throughput for 'GPT-9'"),
    (read_philly, "p.csv", PHILLY + "2017-10-09 07:01:55,66.0,x,66.0,c\n",
     r"2: num_gpus: expected a positive integer, got 'x'"),
    (read_philly, "p.csv", "timestamp,num_gpus\n2017-10-09 07:01:55,1\n", r"1: missing column\(s\) duration"),
    (read_philly, "p.csv", PHILLY + "2017-10-09 07:01:55,-66.0,1,66.0,c\n",
     r"2: duration: expected a positive number, got '-66.0'"),
    (read_philly, "p.csv", PHILLY + "2017-13-09 07:01:55,66.0,1,66.0,c\n",
     r"2: timestamp: expected 'YYYY-MM-DD HH:MM:SS', got '2017-13-09 07:01:55'"),
    (read_pollux, "w.csv", POLLUX + "c-0,107,cifar10,six,2048\n",
     r"2: num_replicas: expected a positive integer, got 'six'"),
    (read_pollux, "w.csv", "name,time,num_replicas\nc-0,107,6\n", r"1: missing column\(s\) application"),
    (read_pollux, "w.csv", POLLUX + "c-0,-107,cifar10,6,2048\n",
     r"2: time: expected a non-negative number, got '-107'"),
    (read_pollux, "w.csv", POLLUX + "c-0,107,gpt3,6,2048\n",
     r"2: application: unknown application 'gpt3' \(known: bert"),
    (read_tiresias, "t.csv", TIRESIAS + "0,one,0,606,vgg19,164,30\n",
     r"2: num_gpu: expected a positive integer, got 'one'"),
    (read_tiresias, "t.csv", "job_id,num_gpu,submit_time\n0,1,0\n", r"1: missing column\(s\) duration"),
    (read_tiresias, "t.csv", TIRESIAS + "0,1,0,606,vgg19,-164,30\n",
     r"2: duration: expected a positive number, got '-164'"),
    (read_alibaba, "a.csv", ALIBABA + ALIBABA_OK + "p1,x,16384,1,1000,,LS,Running,0,100,0\n",
     r"3: cpu_milli: expected a non-negative number, got 'x'"),
    (read_alibaba, "a.csv", "name,num_gpu\np0,1\n", r"1: missing column\(s\) cpu_milli, memory_mib, gpu_milli"),
    (read_alibaba, "a.csv", ALIBABA + "p0,12000,16384,1,1000,,LS,Running,0,100,-5\n",
     r"2: scheduled_time: expected a non-negative number, got '-5'"),
    (read_alibaba, "a.csv", ALIBABA + "p0,12000,16384,1,0,,LS,Running,0,100,0\n",
     r"2: gpu_milli: expected a positive integer, got '0'"),
    (read_alibaba, "a.csv", ALIBABA + "p0,12000,16384,1,2000,,LS,Running,0,100,0\n",
     r"2: gpu_milli: expected an integer in 1..1000, got '2000'"),
    (read_alibaba, "a.csv", ALIBABA + "p0,12000,16384,1,1000,,VIP,Running,0,100,0\n",
     r"2: qos: unknown class 'VIP' \(known: HP, LS"),
]


@pytest.mark.parametrize("reader, name, text, message", MALFORMED,
                         ids=[f"{r.__name__}-{i}" for i, (r, *_rest) in enumerate(MALFORMED)])
def test_malformed_input_is_one_line_naming_file_line_field(tmp_path, reader, name, text, message):
    path = write(tmp_path, name, text)
    with pytest.raises(TraceError) as info:
        reader(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert re.match(re.escape(str(path)) + ":" + message, msg), msg


def test_error_chains_from_the_parser(tmp_path):
    path = write(tmp_path, "n.csv", NATIVE + "a,0,simulation,5,1\nb,0,simulation,5,1,7\n")
    with pytest.raises(TraceError) as info:
        read_native(path)
    assert info.value.__cause__ is not None


def test_alibaba_skips_and_counts(tmp_path):
    text = ALIBABA + ALIBABA_OK + (
        "cpu,4000,1024,0,0,,BE,Running,5,100,5\n"          # CPU-only
        "pend,4000,1024,1,500,,BE,Pending,6,100,\n"        # never scheduled
        "zero,4000,1024,1,500,,BE,Failed,7,50,50\n"        # no work
        "spec,8000,2048,2,1000,V100M32|G2|T4,BE,Running,9,109,9\n"
    )
    t = read_alibaba(write(tmp_path, "a.csv", text))
    assert [j.id for j in t] == ["p0", "spec"]
    assert t.meta == {"skipped_cpu_only": 1, "skipped_unscheduled": 1, "skipped_nonpositive_work": 1}
    spec = t.jobs[1]
    assert spec.gpu_types == ("V100-32GB", "G2", "T4") and spec.work_s == 100.0 and spec.arrival_s == 9.0
    assert spec.priority == ALIBABA_QOS_PRIORITY["BE"] == 0 and spec.mem_bytes == 2048 * 2**20


def test_alibaba_arrivals_shift_to_first_kept_pod(tmp_path):
    text = ALIBABA + "cpu,4000,1024,0,0,,BE,Running,5,100,5\np1,1000,1024,1,1000,,HP,Running,50,90,60\n"
    t = read_alibaba(write(tmp_path, "a.csv", text))
    assert t.jobs[0].arrival_s == 0.0 and t.jobs[0].work_s == 30.0 and t.jobs[0].priority == 2


def test_philly_shifts_to_first_timestamp(tmp_path):
    text = PHILLY + "2017-10-09 07:01:55,66.0,1,66.0,c\n\n2017-10-09 07:00:00,10,2,20,c\n"
    t = read_philly(write(tmp_path, "p.csv", text))
    assert [(j.id, j.arrival_s) for j in t] == [("1", 0.0), ("0", 115.0)]


# ------------------------------------------------------------------------------ garbage rows

TOKENS = ["", "0", "1", "8", "-1", "1.5", "nan", "inf", "1e400", "x", "ml-training", "simulation",
          "cifar10", "ncf", "ResNet-18 (batch size 64)", "2017-10-09 07:01:55", "LS", "BE", "HP", "T4|V100M16",
          "G2", "true", "\"", "a,b", "1000", "0.0", "12537496", "  7 "]
FIELD = st.one_of(st.sampled_from(TOKENS), st.text(max_size=8))
HEADERS = {
    read_native: ("n.csv", ",", "id,arrival_s,job_type,work_s,num_gpus,gpu_types,single_node,gpu_milli\n"),
    read_gavel: ("g.trace", "\t", ""),
    read_philly: ("p.csv", ",", PHILLY),
    read_pollux: ("w.csv", ",", POLLUX),
    read_tiresias: ("t.csv", ",", TIRESIAS),
    read_alibaba: ("a.csv", ",", ALIBABA),
}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("garbage")


@pytest.mark.parametrize("reader", list(HEADERS), ids=lambda r: r.__name__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.one_of(st.lists(FIELD, min_size=1, max_size=12), st.text(max_size=40).map(lambda s: [s])),
                     max_size=6))
def test_garbage_rows_raise_only_trace_error(scratch, reader, rows):
    name, sep, header = HEADERS[reader]
    path = scratch / name
    path.write_text(header + "".join(sep.join(r) + "\n" for r in rows), encoding="utf-8")
    try:
        trace = reader(path)
    except TraceError:
        return
    assert isinstance(trace, Trace)


# ------------------------------------------------------------------------------ native round trip

NAMES = sorted(default_catalog().devices)
TEXT = st.text(st.characters(categories=("L", "N", "P", "S"), exclude_characters="\x85"), max_size=12)
JOBS = st.builds(
    Job,
    id=TEXT.filter(bool),
    arrival_s=st.floats(0, MAX_TRACE_S, allow_nan=False),
    job_type=st.sampled_from(list(JobType)),
    work_s=st.floats(1e-6, MAX_WORK_S, allow_nan=False),
    num_gpus=st.integers(1, 64),
    model=TEXT,
    gpu_milli=st.integers(1, 1000),
    cpu_cores=st.floats(0, 512, allow_nan=False),
    mem_bytes=st.integers(0, 2**50),
    priority=st.integers(-3, 3),
    gpu_types=st.lists(st.sampled_from(NAMES), max_size=3).map(tuple),
    single_node=st.booleans(),
    batch_size=st.integers(0, 10**6),
    team=TEXT,
)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(JOBS, max_size=6, unique_by=lambda j: j.id))
def test_native_round_trip(scratch, suffix, jobs):
    trace = Trace.of(jobs, source="mem")
    back = read_native(write_native(trace, scratch / f"rt{suffix}"))
    assert back.jobs == trace.jobs and back.format == "native"


def test_native_defaults_and_aliases(tmp_path):
    t = read_native(write(tmp_path, "n.csv", "id,arrival_s,job_type,work_s,gpu_types\n"
                                             "a,1.5,Simulation,10,V100| t4 |G9\nb,0,data-processing,2,\n"))
    a = next(j for j in t if j.id == "a")
    assert a.gpu_types == ("V100-16GB", "T4", "G9") and a.job_type is JobType.SIMULATION
    assert (a.num_gpus, a.gpu_milli, a.priority, a.single_node, a.model) == (1, 1000, 0, False, "")
    assert [j.id for j in t] == ["b", "a"]


def test_native_team_column(tmp_path):
    """Issue 35: the submitting team, for quotas; absent or empty = the default team."""
    t = read_native(write(tmp_path, "n.csv", "id,arrival_s,job_type,work_s,gpu_types,team\n"
                                             "a,0,ml-training,10,V100|T4, vision \nb,1,ml-training,2,,\n"))
    assert [(j.id, j.team, j.gpu_types) for j in t] == [("a", "vision", ("V100-16GB", "T4")), ("b", "", ())]
    assert read_native(write(tmp_path, "m.csv", "id,arrival_s,job_type,work_s\nc,0,simulation,1\n")).jobs[0].team == ""


def test_philly_virtual_cluster_is_the_team(tmp_path):
    t = read_philly(write(tmp_path, "p.csv", "timestamp,duration,num_gpus,gpu_time,cluster\n"
                                             "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n"
                                             "2017-10-09 07:02:55,10.0,2,20.0,6214e9\n"))
    assert [j.team for j in t] == ["11cb48", "6214e9"]


def test_write_native_rejects_unknown_extension(tmp_path):
    with pytest.raises(TraceError, match=r"t\.json: expected a \.csv, \.parquet or \.pq file name"):
        write_native(Trace.of([]), tmp_path / "t.json")


# ------------------------------------------------------------------------------ generator

@pytest.fixture(scope="module")
def gavel108():
    return load_cluster("gavel108")


def test_generate_reproducible(gavel108):
    a = generate(300, gavel108, 0.8, seed=7)
    b = generate(300, gavel108, 0.8, seed=np.random.default_rng(7))
    c = generate(300, gavel108, 0.8, seed=8)
    assert a == b and a.jobs != c.jobs
    assert a.format == "synthetic" and len(a) == 300 and a.jobs[0].arrival_s == 0.0


def test_generate_gives_the_same_bits_whatever_simd_numpy_dispatches_to():
    """A seeded trace is the same on every CPU: numpy's AVX-512 ``power`` kernel rounds differently from
    the C library's ``pow``, which made one job's work differ in its last bit on AVX-512 machines (and
    with it a golden event log). Here numpy's dispatched kernels are switched off in a subprocess; on a
    CPU without any beyond numpy's baseline both runs take the same path."""
    import json
    import os
    import subprocess
    import sys

    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:  # numpy 1.x
        from numpy.core import _multiarray_umath as umath

    extra = [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)]
    code = ("import json; from gpualloc.hardware.cluster import load_cluster; "
            "from gpualloc.workload.traces import generate; "
            "t = generate(400, load_cluster('8xV100+4xK80'), 1.3, seed=1); "
            "print(json.dumps([[repr(j.work_s), repr(j.arrival_s)] for j in t.jobs]))")
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": " ".join(extra)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    here = generate(400, load_cluster("8xV100+4xK80"), 1.3, seed=1)
    assert json.loads(out.stdout) == [[repr(j.work_s), repr(j.arrival_s)] for j in here.jobs]


def test_generate_leaves_global_rng_alone(gavel108):
    state = np.random.get_state()
    generate(50, gavel108, 1.0, seed=None)
    after = np.random.get_state()
    assert all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y
               for x, y in zip(state, after, strict=False))


def test_generate_statistics(gavel108):
    n = 5000
    t = generate(n, gavel108, 1.5, seed=3)
    gpus = np.array([j.num_gpus for j in t])
    for sf, p in zip((1, 2, 4, 8), (0.70, 0.10, 0.15, 0.05), strict=False):
        assert abs((gpus == sf).mean() - p) < 0.03, sf
    minutes = np.array([j.work_s for j in t]) / 60
    assert minutes.min() >= 10**1.5 * 0.999 and minutes.max() <= 10**4 * 1.001
    assert abs((minutes > 1000).mean() - 0.2) < 0.03
    kinds = np.array([j.job_type.value for j in t])
    assert abs((kinds == "ml-training").mean() - 0.6) < 0.03 and abs((kinds == "simulation").mean() - 0.2) < 0.03
    assert {j.model for j in t if j.job_type is JobType.ML_TRAINING} <= set(measured_models())
    assert {j.model for j in t if j.job_type is not JobType.ML_TRAINING} == {""}
    assert {j.priority for j in t} == {0, 1, 2}
    # Offered load: reference GPU-seconds corrected by each job's mean speed on the cluster, per
    # second of arrivals, over the cluster's GPUs.
    counts = gavel108.type_counts()
    weights = np.array([counts[d.name] for d in gavel108.device_types], dtype=float)
    speed = speed_matrix(t.jobs, gavel108.device_types) @ (weights / weights.sum())
    demand = gpus * minutes * 60 / speed
    last = t.jobs[-1].arrival_s
    offered = (n - 1) / last * demand.mean() / len(gavel108)
    assert abs(offered / 1.5 - 1) < 0.10, offered


def test_generate_caps_gangs_and_honours_mix():
    small = load_cluster("4xA100")
    t = generate(400, small, 1.0, seed=1, mix={"simulation": 1.0, JobType.ML_TRAINING: 0.0})
    assert max(j.num_gpus for j in t) == 4
    assert {j.job_type for j in t} == {JobType.SIMULATION}


@pytest.mark.parametrize("kwargs, message", [
    ({"load": 0.0}, r"generate: load: expected a positive number"),
    ({"num_jobs": -1}, r"generate: num_jobs: expected a non-negative integer"),
    ({"mix": {"simulation": -1.0}}, r"mix: expected non-negative weights"),
    ({"mix": {"gaming": 1.0}}, r"mix: unknown job type 'gaming'"),
])
def test_generate_rejects_bad_arguments(gavel108, kwargs, message):
    args = {"num_jobs": 10, "cluster": gavel108, "load": 1.0, "seed": 0, **kwargs}
    with pytest.raises(TraceError, match=message):
        generate(**args)


def test_first_row_longer_than_header_is_an_error(tmp_path):
    with pytest.raises(TraceError, match=r"n\.csv:2: more fields than the header columns$"):
        read_native(write(tmp_path, "n.csv", NATIVE + "a,0,simulation,5,1,9\n"))
    with pytest.raises(TraceError, match=r"g\.trace:1: more fields than the expected 7 columns$"):
        read_gavel(write(tmp_path, "g.trace", GAVEL_OK.replace("\n", "\textra\n")))
