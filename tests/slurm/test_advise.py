"""``POST /advise`` (what the Slurm job_submit plugin asks): on an in-process local-backend service,
no Slurm needed."""

from __future__ import annotations

from tests.service.conftest import wait_state

CLUSTER = "4xV100+2xT4"  # n0: 4 x V100, n1: 2 x T4


def test_advice_names_the_type_nodes_and_gres_the_policy_picks(local_service):
    svc = local_service(cluster=CLUSTER)
    r = svc.client.post("/advise", json={"gpus": 2, "gpu_type": "t4"})
    assert r.status_code == 200, r.text
    assert r.json() == {"gpu_type": "T4", "nodes": ["n1"], "gres": {"n1": "gpu:t4:2"}, "busy": False}
    r = svc.client.post("/advise", json={"gpus": 3, "duration_s": 600})
    assert r.status_code == 200, r.text
    assert r.json()["gpu_type"] == "V100-16GB" and r.json()["nodes"] == ["n0"]
    assert r.json()["gres"] == {"n0": "gpu:v100-16gb:3"}  # no Slurm backend: the catalog name, lower case


def test_advice_avoids_gpus_the_services_jobs_hold_and_says_busy_when_none_are_free(local_service):
    svc = local_service(cluster=CLUSTER)
    job = svc.submit(name="hog", command=["sleep", "30"], num_gpus=4, device_type="V100")
    wait_state(svc.client, job["id"], {"running"})
    free = svc.client.post("/advise", json={"gpus": 1}).json()
    assert free["gpu_type"] == "T4" and not free["busy"]  # the V100s are taken
    busy = svc.client.post("/advise", json={"gpus": 4, "gpu_type": "V100"}).json()
    assert busy == {"gpu_type": "V100-16GB", "nodes": ["n0"], "gres": {"n0": "gpu:v100-16gb:4"}, "busy": True}
    # the running job and the service's own scheduling are untouched by advice
    assert svc.client.get(f"/jobs/{job['id']}").json()["state"] == "running"
    assert svc.client.get("/health").json()["scheduler"]["queued"] == 0


def test_advice_refuses_bad_requests_and_needs_the_token(local_service):
    svc = local_service(cluster=CLUSTER)
    assert svc.anon.post("/advise", json={"gpus": 1}).status_code == 401
    never = svc.client.post("/advise", json={"gpus": 5, "single_node": True})
    assert never.status_code == 422 and "can ever hold" in never.json()["detail"]
    unknown = svc.client.post("/advise", json={"gpus": 1, "gpu_type": "K80"})
    assert unknown.status_code == 422 and "not in this cluster" in unknown.json()["detail"]
    for body in ({"gpus": 0}, {"gpus": 1, "duration_s": -1}, {"gpus": 1, "extra": 1}, {}):
        assert svc.client.post("/advise", json=body).status_code == 422, body
