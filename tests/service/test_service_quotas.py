"""``gpualloc serve --quotas``: teams submit under their quota, borrowed GPUs are reclaimed for an
entitled team on the live service, and a team the quota file does not name is refused in one line."""

from __future__ import annotations

import subprocess

import pytest

from gpualloc.service.store import Store

from tests.service.conftest import BASE_URL, GPUALLOC, TestClient, wait_for, wait_state

QUOTAS = """\
[teams.vision]
weight = 2
quota = { V100 = 3, T4 = 1 }

[teams.nlp]
quota = { V100 = 1, T4 = 1 }
"""


def _as(svc, token: str) -> TestClient:
    client = TestClient(svc.app, base_url=BASE_URL)
    client.headers["Authorization"] = f"Bearer {token}"
    return client


@pytest.fixture
def quota_file(tmp_path):
    path = tmp_path / "quotas.toml"
    path.write_text(QUOTAS)
    return path


def test_a_borrowing_team_gives_back_the_gpus_an_entitled_team_asks_for(local_service, quota_file):
    svc = local_service(cluster="4xV100+2xT4", quotas=str(quota_file))
    store = svc.service.store
    nlp = _as(svc, store.add_user("nina", "nlp")[1])
    vision = _as(svc, store.add_user("vic", "vision")[1])
    borrowed = nlp.post("/jobs", json={"name": "big", "command": ["sleep", "60"], "num_gpus": 4,
                                       "gpu_types": ["V100"]}).json()
    assert (borrowed["user"], borrowed["team"]) == ("nina", "nlp")
    assert wait_state(nlp, borrowed["id"], {"running"})["device_type"] == "V100-16GB"  # 3 of them borrowed
    mine = vision.post("/jobs", json={"name": "entitled", "command": ["sleep", "60"], "num_gpus": 2,
                                      "gpu_types": ["V100"]}).json()
    job = wait_state(vision, mine["id"], {"running"})
    assert job["device_type"] == "V100-16GB"
    back = wait_state(nlp, borrowed["id"], {"queued"})  # reclaimed: preempted and queued again
    assert back["requeues"] == 1
    kinds = [e["kind"] for e in nlp.get(f"/jobs/{borrowed['id']}/events").json()]
    assert kinds[:4] == ["submitted", "allocated", "started", "requeued"]
    # the submitted order of gpu_types is the preference: T4 first, though V100s are free
    spill = nlp.post("/jobs", json={"name": "t4-first", "command": ["sleep", "60"],
                                    "gpu_types": ["T4", "V100"]}).json()
    assert spill["spec"]["gpu_types"] == ["T4", "V100-16GB"]
    assert wait_state(nlp, spill["id"], {"running"})["device_type"] == "T4"
    for j in (borrowed, mine, spill):
        svc.client.post(f"/jobs/{j['id']}/cancel")


def test_a_team_without_quota_is_refused_at_submission_and_at_user_creation(local_service, quota_file, tmp_path):
    svc = local_service(cluster="4xV100+2xT4", quotas=str(quota_file))
    ops = _as(svc, svc.service.store.add_user("olga", "ops")[1])
    resp = ops.post("/jobs", json={"name": "x", "command": ["true"]})
    assert resp.status_code == 403, resp.text
    assert resp.json()["detail"].startswith("team 'ops' has no quota in ") and "nlp, vision" in resp.json()["detail"]
    assert svc.client.get("/jobs").json() == []
    # the bootstrap admin's jobs (no team) borrow idle GPUs
    assert svc.client.post("/jobs", json={"name": "admin", "command": ["true"]}).status_code == 201
    # `gpualloc user add` checks the team against the running service's quota file...
    store = svc.config.store
    res = subprocess.run([*GPUALLOC, "user", "add", "otto", "--team", "ops", "--store", store],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.startswith("error: --team 'ops': not a team of the quota file")
    assert "otto" not in [u["name"] for u in svc.service.store.users()]
    ok = subprocess.run([*GPUALLOC, "user", "add", "ned", "--team", "nlp", "--store", store],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    # ...or against --quotas
    other = Store(tmp_path / "other.db")
    other.close()
    res = subprocess.run([*GPUALLOC, "user", "add", "otto", "--team", "ops", "--store", str(tmp_path / "other.db"),
                          "--quotas", str(quota_file)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "not a team of the quota file" in res.stderr


def test_without_borrowing_a_job_above_the_quota_is_refused(local_service, tmp_path):
    path = tmp_path / "strict.toml"
    path.write_text("borrowing = false\n" + QUOTAS)
    svc = local_service(cluster="4xV100+2xT4", quotas=str(path))
    nlp = _as(svc, svc.service.store.add_user("nina", "nlp")[1])
    resp = nlp.post("/jobs", json={"name": "big", "command": ["true"], "num_gpus": 2})
    assert resp.status_code == 422 and "turns borrowing off" in resp.json()["detail"], resp.text
    ok = nlp.post("/jobs", json={"name": "fits", "command": ["true"], "num_gpus": 1})
    assert ok.status_code == 201
    wait_for(lambda: nlp.get(f"/jobs/{ok.json()['id']}").json()["state"] == "finished", what="the job to finish")


@pytest.mark.parametrize(("text", "fragment"), [
    ("[teams.a]\nquota = { V100 = 9 }\n", "sum to 9, above the 4"),
    ("[teams.a]\nquota = { H100 = 1 }\n", "has no H100"),
    ("[teams.a\n", "not valid TOML"),
])
def test_a_bad_quota_file_stops_serve_in_one_line(tmp_path, text, fragment):
    path = tmp_path / "q.toml"
    path.write_text(text)
    res = subprocess.run([*GPUALLOC, "serve", "--port", "0", "--store", str(tmp_path / "s" / "state.db"),
                          "--cluster", "4xV100+2xT4", "--quotas", str(path), "--job-user", "root"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.startswith("error: ") and fragment in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s" / "state.db.token").exists()  # nothing was made
