"""The job model: validation, ordering, helpers."""

from __future__ import annotations

import pytest

from gpualloc.errors import TraceError
from gpualloc.workload.jobs import JOB_TYPES, Job, JobType, Trace


def job(id_: str = "a", arrival: float = 0.0, **kw) -> Job:
    return Job(id_, arrival, kw.pop("job_type", JobType.ML_TRAINING), kw.pop("work_s", 10.0), **kw)


@pytest.mark.parametrize("kw, field", [
    ({"arrival": -1.0}, "arrival_s"),
    ({"arrival": float("nan")}, "arrival_s"),
    ({"work_s": 0.0}, "work_s"),
    ({"work_s": float("nan")}, "work_s"),
    ({"num_gpus": 0}, "num_gpus"),
    ({"gpu_milli": 0}, "gpu_milli"),
    ({"gpu_milli": 1001}, "gpu_milli"),
])
def test_job_rejects_invalid_fields(kw, field):
    with pytest.raises(TraceError, match=f"job a: {field}"):
        job(**kw)


def test_job_gpu_seconds_and_dict():
    j = job(work_s=100.0, num_gpus=4, gpu_types=("T4",))
    assert j.gpu_seconds == 400.0
    d = j.to_dict()
    assert d["job_type"] == "ml-training" and d["gpu_types"] == ["T4"] and d["num_gpus"] == 4


def test_job_type_parse():
    assert JobType.parse(" ML-Training ") is JobType.ML_TRAINING
    assert JOB_TYPES == (JobType.SIMULATION, JobType.ML_TRAINING, JobType.DATA_PROCESSING)
    with pytest.raises(TraceError, match=r"^x\.csv:3: job_type: unknown job type 'gpu' \(expected one of "
                                         r"simulation, ml-training, data-processing\)$"):
        JobType.parse("gpu", where="x.csv:3: job_type")


def test_trace_sorts_stably_by_arrival():
    t = Trace.of([job("c", 5.0), job("a", 1.0), job("b", 1.0)], source="s")
    assert [j.id for j in t] == ["a", "b", "c"] and len(t) == 3
    assert [j.id for j in t.head(2)] == ["a", "b"]


def test_trace_rejects_duplicate_ids():
    with pytest.raises(TraceError, match="s: duplicate job id 'a'"):
        Trace.of([job("a"), job("a", 2.0)], source="s")


def test_trace_shifted():
    t = Trace.of([job("a", 10.0), job("b", 15.0, job_type=JobType.SIMULATION)]).shifted()
    assert [j.arrival_s for j in t] == [0.0, 5.0]
    assert Trace.of([]).shifted().jobs == ()
