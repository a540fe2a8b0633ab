"""Users and teams, tested as an attacker would: a user of one team tries to list, read, follow the logs
of and cancel another team's jobs, to change the policy, to use a removed or rotated token, to pick a
team in the request body, and to find a token in any answer, log or the store."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpualloc.service.errors import Conflict, NotFound, ServiceError
from gpualloc.service.store import Store
from gpualloc.service.users import BOOTSTRAP_USER, token_digest

from tests.service.conftest import BASE_URL, TestClient, wait_state


def _as(svc, token: str) -> TestClient:
    client = TestClient(svc.app, base_url=BASE_URL)  # not entered: the service is opened once
    client.headers["Authorization"] = f"Bearer {token}"
    return client


@pytest.fixture
def teams(local_service):
    """A service with alice and carol in team vision, bob in nlp, and root, an admin of team ops."""
    svc = local_service(cluster="2xT4")
    store = svc.service.store
    tokens = {name: store.add_user(name, team, admin=(name == "root"))[1]
              for name, team in (("alice", "vision"), ("carol", "vision"), ("bob", "nlp"), ("root", "ops"))}
    clients = {name: _as(svc, tok) for name, tok in tokens.items()}
    return svc, tokens, clients


def _job(client, name: str, **spec) -> dict:
    resp = client.post("/jobs", json={"name": name, "command": ["true"], **spec})
    assert resp.status_code == 201, resp.text
    return resp.json()


def test_me_says_who_the_token_is(teams):
    svc, _, c = teams
    assert c["alice"].get("/me").json() == {"user": "alice", "team": "vision", "admin": False}
    assert c["root"].get("/me").json() == {"user": "root", "team": "ops", "admin": True}
    assert svc.client.get("/me").json() == {"user": BOOTSTRAP_USER, "team": "", "admin": True}


def test_a_user_sees_and_cancels_only_their_teams_jobs(teams):
    svc, _, c = teams
    # long jobs on a tiny cluster: some wait in the queue, so a cancel would change them
    a = _job(c["alice"], "a", command=["sleep", "30"], num_gpus=2)
    b = _job(c["bob"], "b", command=["sleep", "30"], num_gpus=2)
    b2 = _job(c["bob"], "b2")
    assert (a["user"], a["team"], b["user"], b["team"]) == ("alice", "vision", "bob", "nlp")
    assert [j["id"] for j in c["alice"].get("/jobs").json()] == [a["id"]]
    assert [j["id"] for j in c["carol"].get("/jobs").json()] == [a["id"]]  # same team
    assert [j["id"] for j in c["bob"].get("/jobs").json()] == [b["id"], b2["id"]]
    assert [j["id"] for j in c["bob"].get("/jobs", params={"limit": 1}).json()] == [b["id"]]  # paging, filtered
    assert {j["id"] for j in c["root"].get("/jobs").json()} == {a["id"], b["id"], b2["id"]}
    assert {j["id"] for j in svc.client.get("/jobs").json()} == {a["id"], b["id"], b2["id"]}

    # another team's job answers exactly as a job that does not exist
    missing = 10**9
    for path in ("", "/events", "/logs"):
        theirs = c["alice"].get(f"/jobs/{b['id']}{path}")
        none = c["alice"].get(f"/jobs/{missing}{path}")
        assert theirs.status_code == none.status_code == 404, (path, theirs.text)
        assert theirs.json()["detail"] == f"no job {b['id']}" and none.json()["detail"] == f"no job {missing}"
        assert "nlp" not in theirs.text and "bob" not in theirs.text
        assert c["carol"].get(f"/jobs/{a['id']}{path}").status_code == 200
    refused = c["alice"].post(f"/jobs/{b['id']}/cancel")
    assert refused.status_code == 404 and refused.json()["detail"] == f"no job {b['id']}"
    assert svc.service.store.get(b["id"]).cancel_requested is False
    assert svc.service.store.get(b["id"]).state.value in ("queued", "allocated", "running")
    # their own team's job: allowed (carol cancels alice's)
    assert c["carol"].post(f"/jobs/{a['id']}/cancel").status_code == 200
    # an admin cancels any team's job
    assert c["root"].post(f"/jobs/{b['id']}/cancel").status_code == 200
    wait_state(svc.client, b["id"], {"cancelled"})


def test_other_teams_allocations_show_no_job_id(teams):
    svc, _, c = teams
    a = _job(c["alice"], "a", command=["sleep", "30"], num_gpus=1)
    wait_state(svc.client, a["id"], {"running"})
    seen = {name: [x["job_id"] for x in c[name].get("/cluster").json()["allocations"]] for name in c}
    assert seen["alice"] == seen["carol"] == seen["root"] == [a["id"]]
    assert seen["bob"] == [None]
    devices = c["bob"].get("/cluster").json()["devices"]
    assert [d["state"] for d in devices].count("allocated") == 1 and all(d["job_id"] is None for d in devices)
    c["alice"].post(f"/jobs/{a['id']}/cancel")


def test_only_admins_change_the_policy(teams):
    svc, _, c = teams
    for name in ("alice", "bob"):
        resp = c[name].put("/policy", json={"name": "sjf"})
        assert resp.status_code == 403 and "only an admin" in resp.json()["detail"], resp.text
    assert svc.client.get("/policy").json()["name"] == "fcfs"
    assert c["alice"].get("/policy").status_code == 200  # reading is allowed
    assert c["root"].put("/policy", json={"name": "sjf"}).status_code == 200
    assert svc.service.scheduler.policy_name == "sjf"
    assert svc.client.put("/policy", json={"name": "fcfs"}).status_code == 200  # the bootstrap admin too


def test_removed_and_rotated_tokens_are_refused_at_once(teams):
    svc, tokens, c = teams
    store = svc.service.store
    assert c["bob"].get("/jobs").status_code == 200
    store.remove_user("bob")
    for method, path in (("GET", "/jobs"), ("GET", "/me"), ("POST", "/jobs")):
        assert c["bob"].request(method, path, json={"name": "x", "command": "true"}).status_code == 401
    new = store.rotate_token("alice")
    assert new != tokens["alice"]
    assert c["alice"].get("/me").status_code == 401
    assert _as(svc, new).get("/me").json()["user"] == "alice"
    with pytest.raises(NotFound):
        store.rotate_token("bob")
    with pytest.raises(NotFound):
        store.remove_user("bob")


def test_the_team_comes_from_the_token_never_the_body(teams):
    svc, _, c = teams
    for extra in ({"team": "nlp"}, {"user": "bob"}, {"team": "nlp", "user": "root"}):
        resp = c["alice"].post("/jobs", json={"name": "sneaky", "command": ["true"], **extra})
        assert resp.status_code == 422, resp.text
    assert c["bob"].get("/jobs").json() == [] and c["root"].get("/jobs").json() == []
    job = _job(c["alice"], "honest")
    rec = svc.service.store.get(job["id"])
    assert (rec.user, rec.team) == ("alice", "vision")


def test_an_idempotency_key_of_another_user_reveals_nothing(teams):
    _, _, c = teams
    body = {"name": "same", "command": ["true"]}
    first = c["alice"].post("/jobs", json=body, headers={"Idempotency-Key": "k-123456"})
    assert first.status_code == 201
    again = c["alice"].post("/jobs", json=body, headers={"Idempotency-Key": "k-123456"})
    assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])
    other = c["bob"].post("/jobs", json=body, headers={"Idempotency-Key": "k-123456"})
    assert other.status_code == 409 and str(first.json()["id"]) not in other.json()["detail"], other.text
    assert c["bob"].get("/jobs").json() == []


def test_tokens_never_appear_in_answers_logs_or_the_store(teams, caplog):
    svc, tokens, c = teams
    caplog.set_level(logging.DEBUG)
    job = _job(c["alice"], "t")
    wait_state(c["alice"], job["id"], {"finished"})
    answers = []
    for client in c.values():
        for method, path in (("GET", "/me"), ("GET", "/jobs"), ("GET", f"/jobs/{job['id']}"),
                             ("GET", f"/jobs/{job['id']}/events"), ("GET", f"/jobs/{job['id']}/logs"),
                             ("GET", "/cluster"), ("GET", "/policy"), ("PUT", "/policy"), ("GET", "/openapi.json")):
            resp = client.request(method, path, json={"name": "fcfs"} if method == "PUT" else None)
            answers.append(resp.text + str(resp.headers))
    bad = _as(svc, tokens["alice"] + "x").get("/me")
    assert bad.status_code == 401
    answers.append(bad.text + str(bad.headers))
    secrets = [*tokens.values(), svc.service.token]
    for text in [*answers, caplog.text]:
        for tok in secrets:
            assert tok not in text
    svc.service.store.close()  # flush: the WAL is checkpointed into the file
    raw = b"".join(p.read_bytes() for p in Path(svc.config.store).parent.glob("state.db*") if p.is_file()
                   and not p.name.endswith(".token"))
    for tok in tokens.values():
        assert tok.encode() not in raw
    assert token_digest(tokens["alice"]).encode() in raw  # what is kept instead


def test_user_names_are_checked_and_unique(tmp_path):
    store = Store(tmp_path / "s.db")
    try:
        store.add_user("alice", "vision")
        with pytest.raises(Conflict, match="exists already"):
            store.add_user("alice", "nlp")
        with pytest.raises(Conflict, match="bootstrap"):
            store.add_user(BOOTSTRAP_USER, "ops")
        for name in ("", "a b", "-x", "e\u202egnp", "x" * 65, "a/b", "é"):
            with pytest.raises(ServiceError, match="a name is 1 to 64"):
                store.add_user(name, "t")
            with pytest.raises(ServiceError, match="team"):
                store.add_user("ok", name)
        assert [u["name"] for u in store.users()] == ["alice"]
    finally:
        store.close()


def test_a_store_made_before_users_gains_the_columns_and_hides_old_jobs(tmp_path, local_service):
    path = tmp_path / "state.db"
    old = Store(path)
    old.submit({"name": "old", "num_gpus": 1, "gpu_types": [], "job_type": "ml-training", "work_s": 1.0,
                "priority": 0, "single_node": False, "model": "", "target": {"argv": ["true"]}})
    old.close()
    with sqlite3.connect(path) as db:  # the schema of the release before users
        db.execute("DROP INDEX ix_jobs_team")
        db.execute("ALTER TABLE jobs DROP COLUMN team")
        db.execute('ALTER TABLE jobs DROP COLUMN "user"')
        db.execute("DROP TABLE users")
    svc = local_service(cluster="2xT4")  # the same store file
    rec = svc.service.store.get(1)
    assert (rec.name, rec.user, rec.team) == ("old", None, None)
    alice = _as(svc, svc.service.store.add_user("alice", "vision")[1])
    assert alice.get("/jobs").json() == [] and alice.get("/jobs/1").status_code == 404
    assert [j["name"] for j in svc.client.get("/jobs").json()] == ["old"]


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``gpualloc ARGS`` run in this process through the CLI's own entry point (``main``: one line and
    exit status 2 on bad input), stdout and stderr captured (a subprocess would spend a second on imports)."""
    import contextlib
    import io

    from gpualloc.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    code = 0
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = ["gpualloc", *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def test_user_commands_write_the_token_to_a_private_file_and_never_print_it(tmp_path):
    store = tmp_path / "svc" / "state.db"
    add = _cli("user", "add", "alice", "--team", "vision", "--store", str(store))
    assert add.returncode == 0, add.stderr
    path = tmp_path / "svc" / "state.db.tokens" / "alice.token"
    token = path.read_text().strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert str(path) in add.stdout and token not in add.stdout + add.stderr
    chosen = tmp_path / "keys" / "bob.token"
    assert _cli("user", "add", "bob", "--team", "nlp", "--admin", "--store", str(store),
                "--token-file", str(chosen)).returncode == 0
    db = Store(store)
    try:
        assert db.user_by_token(token).name == "alice" and db.user_by_token(chosen.read_text().strip()).admin
    finally:
        db.close()
    listed = _cli("user", "list", "--store", str(store), "--json")
    assert [(u["name"], u["team"], u["admin"]) for u in json.loads(listed.stdout)] == [
        ("alice", "vision", False), ("bob", "nlp", True)]
    assert token not in listed.stdout
    # bad input: one line, exit 2
    for args, fragment in ((("user", "add", "alice", "--team", "x"), "exists already"),
                           (("user", "add", "a b", "--team", "x"), "a name is"),
                           (("user", "token", "alice"), "--rotate"),
                           (("user", "remove", "nobody"), "no user 'nobody'")):
        res = _cli(*args, "--store", str(store))
        assert res.returncode == 2 and res.stderr.startswith("error: ") and fragment in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
    rot = _cli("user", "token", "alice", "--rotate", "--store", str(store))
    assert rot.returncode == 0 and path.read_text().strip() != token
    assert path.read_text().strip() not in rot.stdout + rot.stderr
    assert _cli("user", "remove", "alice", "--store", str(store)).returncode == 0
    assert not path.exists()


def test_a_token_file_in_a_folder_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    res = _cli("user", "add", "alice", "--team", "vision", "--store", str(tmp_path / "s.db"),
               "--token-file", str(shared / "alice.token"))
    assert res.returncode == 2 and "others may write" in res.stderr, res.stderr
    assert not (shared / "alice.token").exists()
    db = Store(tmp_path / "s.db")
    try:
        assert db.users() == []  # no user whose token nobody holds
    finally:
        db.close()


def test_whoami_and_jobs_with_a_user_token(server, tmp_path):
    srv = server(cluster="2xT4").start()
    env = {**os.environ, "GPUALLOC_SERVER": srv.url}
    env.pop("GPUALLOC_TOKEN", None)
    for name, team in (("alice", "vision"), ("bob", "nlp")):
        assert _cli("user", "add", name, "--team", team, "--store", str(srv.store)).returncode == 0
    tokens = {n: str(tmp_path / "state.db.tokens" / f"{n}.token") for n in ("alice", "bob")}
    who = _cli("whoami", "--token-file", tokens["alice"], env=env)
    assert who.returncode == 0 and who.stdout.strip() == "alice (team vision)", who.stderr
    sub = _cli("submit", "--name", "mine", "--command", "true", "--token-file", tokens["alice"], env=env,
               cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    mine = _cli("jobs", "--json", "--token-file", tokens["alice"], env=env)
    theirs = _cli("jobs", "--json", "--token-file", tokens["bob"], env=env)
    assert [j["name"] for j in json.loads(mine.stdout)] == ["mine"]
    assert json.loads(theirs.stdout) == []
    table = _cli("jobs", "--token-file", str(srv.tmp / "state.db.token"), env=env)  # the bootstrap admin
    row = next(line for line in table.stdout.splitlines() if "mine" in line)
    assert "vision" in row and "alice" in row, table.stdout
    nope = _cli("cancel", "1", "--token-file", tokens["bob"], env=env)
    assert nope.returncode == 2 and "no job 1" in nope.stderr
    pol = _cli("policy", "sjf", "--token-file", tokens["bob"], env=env)
    assert pol.returncode == 2 and "HTTP 403" in pol.stderr and "only an admin" in pol.stderr
    log = srv.log.read_text()
    for path in tokens.values():
        assert Path(path).read_text().strip() not in log


def test_user_commands_check_the_store_as_serve_does(tmp_path):
    store = tmp_path / "new" / "state.db"
    assert _cli("user", "add", "alice", "--team", "vision", "--store", str(store)).returncode == 0
    assert stat.S_IMODE(store.parent.stat().st_mode) == 0o700  # made private, as serve makes it
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: another user could have made the store there first
    res = _cli("user", "add", "bob", "--team", "nlp", "--store", str(shared / "state.db"))
    assert res.returncode == 2 and "others may write" in res.stderr, res.stderr
    assert not (shared / "state.db").exists()
