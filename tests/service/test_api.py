"""The HTTP API on the local backend: auth, validation and limits, the job life cycle, policies."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from gpualloc.service.auth import load_or_create_token, read_token, token_matches
from gpualloc.service.errors import ServiceError

from tests.service.conftest import wait_for, wait_state


# ------------------------------------------------------------------------------------------- auth
def test_token_file_is_created_owner_only_and_reused(tmp_path):
    path = tmp_path / "s.db.token"
    token, created = load_or_create_token(path)
    assert created and len(token) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_token(path) == (token, False)
    os.chmod(path, 0o644)
    with pytest.raises(ServiceError, match="chmod 600"):
        read_token(path)


def test_token_comparison():
    assert token_matches("abc", "Bearer abc") and token_matches("abc", "bearer abc")
    for header in (None, "", "abc", "Bearer ab", "Bearer abcd", "Basic abc", "Bearer \u00e9"):
        assert not token_matches("abc", header)


def test_every_endpoint_but_health_needs_the_token(local_service):
    svc = local_service()
    job = svc.submit(name="secret", command="true", env={"API_KEY": "hunter2"})
    anon = svc.anon
    body = {"name": "x", "command": "true"}
    calls = [("POST", "/jobs", body), ("PUT", "/policy", {"name": "sjf"}), ("POST", f"/jobs/{job['id']}/cancel", None),
             ("GET", "/jobs", None), ("GET", f"/jobs/{job['id']}", None), ("GET", f"/jobs/{job['id']}/events", None),
             ("GET", f"/jobs/{job['id']}/logs", None), ("GET", "/cluster", None), ("GET", "/policy", None),
             ("GET", "/openapi.json", None), ("GET", "/no-such-path", None)]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": svc.service.token}):
        for method, path, payload in calls:
            resp = anon.request(method, path, json=payload, headers=headers)
            assert resp.status_code == 401, (method, path, headers, resp.status_code)
            assert "hunter2" not in resp.text and "secret" not in resp.text
    assert [j["name"] for j in svc.client.get("/jobs").json()] == ["secret"]  # nothing more was recorded
    health = anon.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    for method, path, _ in calls[3:-1]:  # with the token: answered
        assert svc.client.request(method, path).status_code == 200, path
    assert svc.service.token_path.read_text().strip() == svc.service.token


def test_env_values_and_idempotency_keys_are_never_returned(local_service):
    svc = local_service()
    headers = {"Idempotency-Key": "key-0123456789"}
    made = svc.client.post("/jobs", json={"name": "e", "command": "true", "env": {"API_KEY": "hunter2", "B": "x"}},
                           headers=headers)
    assert made.status_code == 201
    job_id = made.json()["id"]
    wait_state(svc.client, job_id, {"finished"})
    answers = [made, svc.client.get("/jobs"), svc.client.get(f"/jobs/{job_id}"),
               svc.client.get(f"/jobs/{job_id}/events"), svc.client.post(f"/jobs/{job_id}/cancel"),
               svc.client.post("/jobs", json={"name": "e", "command": "true", "env": {"API_KEY": "hunter2", "B": "x"}},
                               headers=headers)]
    for resp in answers:
        assert "hunter2" not in resp.text and "key-0123456789" not in resp.text, resp.text
    one = svc.client.get(f"/jobs/{job_id}").json()
    assert one["spec"]["target"]["env"] == ["API_KEY", "B"]  # names only
    assert "idempotency_key" not in one
    schema = svc.client.get("/openapi.json").json()["components"]["schemas"]["JobOut"]
    assert "idempotency_key" not in schema["properties"]
    # the job got the values (it ran and finished); once it ended, the store keeps the names only (issue 35)
    assert svc.service.store.get(job_id).spec["target"]["env"] == {"API_KEY": None, "B": None}


def test_api_job_model_is_the_record_less_hidden_fields():
    from dataclasses import fields

    from gpualloc.service.models import API_HIDDEN, PREDICTION_FIELDS, JobOut, JobRecord

    assert list(JobOut.model_fields) == [f.name for f in fields(JobRecord) if f.name not in API_HIDDEN] + \
        list(PREDICTION_FIELDS)
    assert API_HIDDEN == {"idempotency_key"}


# ------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("body, fragment", [
    ({"name": "x"}, "exactly one of command or callable"),
    ({"name": "x", "command": "a", "callable": "m:f"}, "exactly one of command or callable"),
    ({"name": "x", "command": "echo 'unbalanced"}, "cannot be split"),
    ({"name": "x", "command": ""}, "command is empty"),
    ({"name": "", "command": "true"}, "at least 1 character"),
    ({"name": "x", "command": "true", "num_gpus": 0}, "greater than or equal to 1"),
    ({"name": "x", "command": "true", "work_s": -1}, "greater than 0"),
    ({"name": "x", "command": "true", "bogus": 1}, "Extra inputs"),
    ({"name": "x", "command": "true", "env": {"1BAD": "v"}}, "not a valid variable name"),
    ({"name": "x", "command": "true", "cwd": "relative"}, "absolute"),
    ({"name": "x", "callable": "not a callable"}, "should match pattern"),
    ({"name": "x", "command": "true", "args": [1]}, "go with callable"),
    ({"name": "x", "command": "true", "job_type": "nope"}, "Input should be"),
])
def test_invalid_bodies_get_a_clear_422(local_service, body, fragment):
    svc = local_service()
    resp = svc.client.post("/jobs", json=body, headers=svc.headers)
    assert resp.status_code == 422, resp.text
    assert fragment in resp.text


def test_jobs_the_cluster_cannot_hold_are_refused(local_service):
    svc = local_service()  # adlro16: 8 V100 on one node, 4 T4, 4 MI50

    def post(**body):
        return svc.client.post("/jobs", json={"name": "x", "command": "true", **body}, headers=svc.headers)

    resp = post(device_type="H100")
    assert resp.status_code == 422 and "not in this cluster" in resp.json()["detail"]
    resp = post(num_gpus=5, device_type="T4")
    assert resp.status_code == 422 and "can ever hold" in resp.json()["detail"]
    assert post(num_gpus=9).status_code == 422
    assert post(num_gpus=8, device_type="v100").status_code == 201  # aliases, any case
    assert post(num_gpus=1, gpu_types=["gpu_MI50", "T4"]).status_code == 201  # Ray resource names too


def test_malformed_json_body_limit_and_bad_ids(local_service):
    svc = local_service(max_body_bytes=2048)
    c = svc.client
    resp = c.post("/jobs", content=b"{not json", headers={**svc.headers, "Content-Type": "application/json"})
    assert resp.status_code == 422
    big = {"name": "x", "command": ["echo", "a" * 3000]}
    assert c.post("/jobs", json=big, headers=svc.headers).status_code == 413
    assert c.get("/jobs/0").status_code == 422
    assert c.get(f"/jobs/{2**70}").status_code == 422
    assert c.get("/jobs/12345").status_code == 404
    assert c.get("/jobs", params={"state": "weird"}).status_code == 422
    assert c.get("/jobs", params={"limit": 10**6}).status_code == 422


# ------------------------------------------------------------------------------------ life cycle
def test_command_runs_without_a_shell_on_its_gpus(local_service, tmp_path):
    svc = local_service()
    marker = tmp_path / "should-not-exist"
    job = svc.submit(name="noshell", command=f"echo hi; touch {marker}", device_type="T4", num_gpus=2)
    assert job["spec"]["target"]["argv"] == ["echo", "hi;", "touch", str(marker)]
    done = wait_state(svc.client, job["id"], {"finished", "failed"})
    assert done["state"] == "finished" and done["device_type"] == "T4" and len(done["gpus"]) == 2
    assert not marker.exists()  # ';' was an argument of echo, not a shell operator
    out = (svc.runs_dir / done["handle"] / "stdout.log").read_text()
    assert out.startswith(f"hi; touch {marker}")
    events = [e["kind"] for e in svc.client.get(f"/jobs/{job['id']}/events").json()]
    assert events == ["submitted", "allocated", "started", "finished"]


def test_env_exit_status_callable_and_missing_program(local_service, tmp_path):
    svc = local_service()
    script = ("import os,sys; print(os.environ['GPUALLOC_DEVICE_TYPE'], os.environ['CUDA_VISIBLE_DEVICES'], "
              "os.environ['FOO']); sys.exit(3)")
    bad = svc.submit(name="exit3", command=[sys.executable, "-c", script], device_type="V100", env={"FOO": "bar"})
    call = svc.submit(name="call", callable="math:comb", args=[6, 2])
    raising = svc.submit(name="raise", callable="math:sqrt", args=[-1])
    missing = svc.submit(name="missing", command="/nonexistent/program --x")
    bad = wait_state(svc.client, bad["id"], {"finished", "failed"})
    assert bad["state"] == "failed" and bad["exit_code"] == 3
    assert (svc.runs_dir / bad["handle"] / "stdout.log").read_text().split() == ["V100-16GB", "0", "bar"]
    call = wait_state(svc.client, call["id"], {"finished", "failed"})
    assert call["state"] == "finished" and call["result"] == 15
    raising = wait_state(svc.client, raising["id"], {"finished", "failed"})
    assert raising["state"] == "failed" and "ValueError" in raising["error"]
    missing = wait_state(svc.client, missing["id"], {"finished", "failed"})
    assert missing["exit_code"] == 127 and "command not found" in missing["error"]


def test_queue_limit_cancel_and_cluster_view(local_service):
    svc = local_service(cluster="1xT4", max_queued=2)
    c = svc.client
    long = svc.submit(name="long", command="sleep 60")
    wait_state(c, long["id"], {"running"})
    q1, q2 = svc.submit(name="q1", command="true"), svc.submit(name="q2", command="true")
    full = c.post("/jobs", json={"name": "q3", "command": "true"}, headers=svc.headers)
    assert full.status_code == 429 and "queue is full" in full.json()["detail"]
    cluster = c.get("/cluster").json()
    assert cluster["devices"][0]["state"] == "allocated" and cluster["devices"][0]["job_id"] == long["id"]
    assert cluster["allocations"] == [{"device": 0, "job_id": long["id"], "attempt": 1}]
    assert cluster["device_types"][0]["ray_resource"] == "gpu_T4"
    # cancel a queued job: at once; then the running one: stopped, GPU freed, the next job runs
    assert c.post(f"/jobs/{q1['id']}/cancel", headers=svc.headers).json()["state"] == "cancelled"
    assert c.post(f"/jobs/{q1['id']}/cancel", headers=svc.headers).status_code == 409
    resp = c.post(f"/jobs/{long['id']}/cancel", headers=svc.headers)
    assert resp.status_code == 200 and resp.json()["cancel_requested"]
    stopped = wait_state(c, long["id"], {"cancelled"})
    pid_file = svc.runs_dir / stopped["handle"] / "runner.pid"
    assert pid_file.exists()
    wait_state(c, q2["id"], {"finished"})
    assert c.get("/cluster").json()["allocations"] == []
    states = {j["name"]: j["state"] for j in c.get("/jobs").json()}
    assert states == {"long": "cancelled", "q1": "cancelled", "q2": "finished"}
    assert [j["name"] for j in c.get("/jobs", params={"state": "cancelled"}).json()] == ["long", "q1"]


def test_idempotency_key_returns_the_same_job(local_service):
    svc = local_service()
    headers = {**svc.headers, "Idempotency-Key": "abc"}
    first = svc.client.post("/jobs", json={"name": "once", "command": "true"}, headers=headers)
    again = svc.client.post("/jobs", json={"name": "once", "command": "true"}, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert len(svc.client.get("/jobs").json()) == 1


def test_idempotency_key_reused_with_another_body_is_a_conflict(local_service):
    svc = local_service()
    headers = {**svc.headers, "Idempotency-Key": "abc"}
    first = svc.client.post("/jobs", json={"name": "once", "command": "true"}, headers=headers)
    other = svc.client.post("/jobs", json={"name": "once", "command": "false"}, headers=headers)
    assert (first.status_code, other.status_code) == (201, 409)
    assert "different request" in other.json()["detail"]
    again = svc.client.post("/jobs", json={"name": "once", "command": "true"}, headers=headers)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert len(svc.client.get("/jobs").json()) == 1


def test_policy_switch_is_validated_and_persisted(local_service, tmp_path):
    svc = local_service()
    c = svc.client
    assert c.get("/policy").json()["name"] == "fcfs"
    resp = c.put("/policy", json={"name": "nope"}, headers=svc.headers)
    assert resp.status_code == 422 and "unknown policy" in resp.json()["detail"]
    # the API never imports a module it is sent (module:factory works in the simulator only)
    resp = c.put("/policy", json={"name": "gpualloc.scheduling.policies.simple:SJF"}, headers=svc.headers)
    assert resp.status_code == 422 and "unknown policy" in resp.json()["detail"]
    resp = c.put("/policy", json={"name": "sjf", "options": {"bad": 1}}, headers=svc.headers)
    assert resp.status_code == 422
    resp = c.put("/policy", json={"name": "easy-backfill"}, headers=svc.headers)
    assert resp.status_code == 200 and resp.json()["name"] == "easy-backfill"
    job = svc.submit(name="after-switch", command="true", num_gpus=2)
    assert wait_state(c, job["id"], {"finished"})["state"] == "finished"
    svc.close()
    again = local_service()  # the same store: the policy is remembered
    assert again.client.get("/policy").json()["name"] == "easy-backfill"


def test_openapi_documents_the_endpoints(local_service):
    spec = local_service().client.get("/openapi.json").json()
    assert {"/health", "/jobs", "/jobs/{job_id}", "/jobs/{job_id}/cancel", "/jobs/{job_id}/events", "/cluster",
            "/policy"} <= set(spec["paths"])
    assert "JobSpec" in spec["components"]["schemas"]


def test_second_service_on_the_same_store_is_refused(local_service, tmp_path):
    local_service()
    from gpualloc.service.app import Service, ServiceConfig

    with pytest.raises(ServiceError, match="another gpualloc service"):
        Service(ServiceConfig(store=str(tmp_path / "state.db"), telemetry="none")).open()


def test_sim_telemetry_in_cluster_view(local_service):
    svc = local_service(telemetry="sim", cluster="adlro16")
    tel = svc.client.get("/cluster").json()["telemetry"]
    assert tel["backend"] == "sim" and len(tel["devices"]) == 16
    wait_for(lambda: svc.client.get("/health").json()["scheduler"]["thread_alive"], what="scheduler thread")
