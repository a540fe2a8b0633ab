"""Fuzz every operation of the OpenAPI spec with malformed and near-valid input (hypothesis): the
service answers 4xx or 2xx, never 5xx.

The service's one GPU is held by a long job for the whole run, so nothing a fuzzed body asks to
run is ever started (fuzzed jobs that validate just wait in the queue)."""

from __future__ import annotations

import json
import math
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpualloc.scheduling.policies import POLICIES
from tests.service.conftest import LocalService, kill_runs, wait_state

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**80, max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
FIELDS = {
    "name": st.text(max_size=200) | JSON,
    "num_gpus": st.integers(min_value=-5, max_value=2**70) | JSON,
    "device_type": st.sampled_from(["V100", "T4", "MI50", "t4", "gpu_T4", "H100", ""]) | JSON,
    "gpu_types": st.lists(st.sampled_from(["T4", "V100", "x", ""]), max_size=20) | JSON,
    "job_type": st.sampled_from(["ml-training", "simulation", "data-processing", "?"]) | JSON,
    "work_s": st.floats(allow_nan=True, allow_infinity=True) | JSON,
    "priority": st.integers(min_value=-2**70, max_value=2**70) | JSON,
    "single_node": st.booleans() | JSON,
    "model": st.text(max_size=200) | JSON,
    "command": st.text(max_size=100) | st.lists(st.text(max_size=20), max_size=5) | JSON,
    "callable": st.sampled_from(["math:sqrt", "os:getcwd", "bad", "a.b:c"]) | st.text(max_size=30) | JSON,
    "args": st.lists(JSON, max_size=4) | JSON,
    "kwargs": st.dictionaries(st.text(max_size=8), JSON, max_size=4) | JSON,
    "env": st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=4) | JSON,
    "cwd": st.sampled_from(["/tmp", "rel", ""]) | st.text(max_size=20) | JSON,
    "bogus": JSON,
}
JOB_BODIES = st.fixed_dictionaries({}, optional=FIELDS) | JSON
POLICY_BODIES = st.fixed_dictionaries(
    {}, optional={"name": st.sampled_from([p for p in POLICIES if p != "dqn"]) | st.text(max_size=20) | JSON,
                  "options": st.dictionaries(st.text(max_size=10), JSON, max_size=3) | JSON,
                  "extra": JSON}) | JSON
ADVICE_BODIES = st.fixed_dictionaries(
    {}, optional={"gpus": st.integers(min_value=-5, max_value=5000) | JSON,
                  "gpu_type": st.sampled_from(["T4", "t4", "V100", "gpu:t4", ""]) | st.text(max_size=70) | JSON,
                  "duration_s": st.floats(allow_nan=True, allow_infinity=True) | JSON,
                  "single_node": st.booleans() | JSON, "job_type": st.text(max_size=20) | JSON,
                  "name": st.text(max_size=140) | JSON, "extra": JSON}) | JSON
RAW = st.binary(max_size=300) | st.sampled_from([b"", b"{", b"[" * 5000 + b"]" * 5000, b'{"name": "\\ud800"}',
                                                 b'{"name": "a", "command": "x", "num_gpus": 1e400}'])
PATH_IDS = st.integers(min_value=-2**70, max_value=2**70) | st.text(min_size=1, max_size=20)


def _dump(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@pytest.fixture(scope="module")
def blocked(tmp_path_factory):
    """A service on a 1-GPU cluster whose GPU is held by a long job throughout."""
    tmp = tmp_path_factory.mktemp("fuzz")
    svc = LocalService(tmp, cluster="1xT4", max_body_bytes=16384)
    try:
        long = svc.submit(name="holder", command="sleep 600")
        wait_state(svc.client, long["id"], {"running"})
        yield svc, long["id"]
    finally:
        svc.close()
        kill_runs(tmp / "state.db.runs")


def _no_5xx(resp) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])


def _body_and_raw(send, path: str, body, raw: bytes, headers: dict) -> None:
    """Send the generated JSON body, then the raw bytes, to ``path``; neither may give a 5xx."""
    _no_5xx(send(path, content=_dump(body), headers=headers))
    _no_5xx(send(path, content=raw, headers=headers))


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])


@FUZZ
@given(body=JOB_BODIES, raw=RAW, key=st.none() | st.text(max_size=200))
def test_fuzz_submit(blocked, body, raw, key):
    svc, _ = blocked
    headers = {**svc.headers, "Content-Type": "application/json"}
    if key is not None and key.isascii() and key.isprintable():
        headers["Idempotency-Key"] = key
    _body_and_raw(svc.client.post, "/jobs", body, raw, headers)
    _no_5xx(svc.anon.post("/jobs", content=_dump(body), headers={"Content-Type": "application/json"}))


@FUZZ
@given(body=POLICY_BODIES, raw=RAW)
def test_fuzz_policy(blocked, body, raw):
    svc, _ = blocked
    headers = {**svc.headers, "Content-Type": "application/json"}
    _body_and_raw(svc.client.put, "/policy", body, raw, headers)


@FUZZ
@given(job=PATH_IDS, state=st.lists(st.text(max_size=12), max_size=3), limit=JSON, offset=JSON,
       cursor=st.none() | st.text(max_size=80), stream=st.sampled_from(["stdout", "stderr"]) | st.text(max_size=8))
def test_fuzz_paths_and_queries(blocked, job, state, limit, offset, cursor, stream):
    svc, holder = blocked
    c = svc.client
    if job == holder:
        job = -holder
    job = quote(str(job), safe="")
    _no_5xx(c.get(f"/jobs/{job}"))
    _no_5xx(c.get(f"/jobs/{job}/events"))
    _no_5xx(c.post(f"/jobs/{job}/cancel", headers=svc.headers))
    params = [("state", s) for s in state]
    for name, value in (("limit", limit), ("offset", offset)):
        if isinstance(value, (int, str)) and not isinstance(value, bool):
            params.append((name, str(value)))
        elif isinstance(value, float) and math.isfinite(value):
            params.append((name, repr(value)))
    if cursor is not None:
        params.append(("cursor", cursor))
    _no_5xx(c.get("/jobs", params=params))
    log_params = [("stream", stream), *((k, v) for k, v in params if k in ("offset", "limit"))]
    _no_5xx(c.get(f"/jobs/{job}/logs", params=log_params))
    _no_5xx(c.get(f"/jobs/{holder}/logs", params=log_params))


@FUZZ
@given(body=ADVICE_BODIES, raw=RAW)
def test_fuzz_advise(blocked, body, raw):
    svc, _ = blocked
    headers = {**svc.headers, "Content-Type": "application/json"}
    _body_and_raw(svc.client.post, "/advise", body, raw, headers)
    assert svc.anon.post("/advise", content=_dump(body), headers={"Content-Type": "application/json"}).status_code \
        == 401


def test_every_openapi_operation_was_fuzzed(blocked):
    """The fuzzers above cover the whole spec: a new endpoint must be added to them."""
    svc, _ = blocked
    ops = {(m.upper(), p) for p, item in svc.client.get("/openapi.json").json()["paths"].items() for m in item}
    covered = {("POST", "/jobs"), ("PUT", "/policy"), ("GET", "/jobs/{job_id}"), ("GET", "/jobs/{job_id}/events"),
               ("POST", "/jobs/{job_id}/cancel"), ("GET", "/jobs"), ("GET", "/jobs/{job_id}/logs"),
               ("POST", "/advise")}
    read_only = {("GET", "/health"), ("GET", "/cluster"), ("GET", "/policy"), ("GET", "/me")}  # no input to fuzz
    assert ops == covered | read_only
    for method, path in read_only:
        assert svc.client.request(method, path).status_code == 200
    # the holder kept its GPU: no fuzzed job ever ran
    assert svc.client.get("/cluster").json()["devices"][0]["job_id"] is not None
    assert all(j["state"] in ("queued", "cancelled") for j in svc.client.get("/jobs").json()[1:])
