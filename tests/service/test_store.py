"""The store: durable, group-committed writes; state transitions; no GPU allocated twice.

Every test taking ``make_store`` (or ``store``) runs on SQLite, and also on PostgreSQL when
``GPUALLOC_TEST_POSTGRES_URL`` names a database this test may wipe (e.g.
``postgresql+psycopg://gpualloc:gpualloc@127.0.0.1/gpualloc_test``, with ``pip install
'psycopg[binary]'``); without it the PostgreSQL runs skip.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading

import pytest

from gpualloc.service.errors import Conflict, NotFound, QueueFull
from gpualloc.service.models import JobSpec, JobState
from gpualloc.service.store import Store, store_url


def spec(name: str = "j", **kw) -> dict:
    return JobSpec(name=name, command=kw.pop("command", "true"), **kw).model_dump(mode="json")


POSTGRES_URL = os.environ.get("GPUALLOC_TEST_POSTGRES_URL")


def _wipe_postgres(url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def make_store(request, tmp_path):
    """``make_store(**kwargs)`` opens (and reopens) one database: a SQLite file, or the PostgreSQL
    test database, emptied first."""
    if request.param == "postgresql":
        if not POSTGRES_URL:
            pytest.skip("set GPUALLOC_TEST_POSTGRES_URL to run the store tests on PostgreSQL")
        pytest.importorskip("psycopg")
        _wipe_postgres(POSTGRES_URL)
    where = POSTGRES_URL if request.param == "postgresql" else tmp_path / "s.db"
    opened: list[Store] = []

    def make(**kwargs) -> Store:
        opened.append(Store(where, **kwargs))
        return opened[-1]

    yield make
    for s in opened:
        s.close()


@pytest.fixture
def store(make_store):
    return make_store()


def test_sqlite_file_is_wal_owner_only_and_survives_reopen(tmp_path):
    path = tmp_path / "sub" / "s.db"
    s = Store(path)
    rec, created = s.submit(spec("a"))
    uid, epoch = s.uid, s.epoch
    s.close()
    assert created and rec.state is JobState.QUEUED
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    s2 = Store(path)
    try:
        assert (s2.uid, s2.epoch) == (uid, epoch)
        assert s2.get(rec.id).name == "a" and s2.queued == 1
    finally:
        s2.close()


def test_url_forms():
    assert store_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert store_url("x.db").startswith("sqlite:////")


def test_transitions_and_events(store):
    rec, _ = store.submit(spec("a", num_gpus=2))
    rec = store.allocate(rec.id, "T4", [8, 9])
    assert rec.state is JobState.ALLOCATED and rec.gpus == (8, 9) and rec.attempts == 1
    assert store.allocations() == {8: (rec.id, 1), 9: (rec.id, 1)}
    rec = store.mark_started(rec.id, 1, "h1")
    assert rec.state is JobState.RUNNING and rec.handle == "h1"
    rec = store.mark_ended(rec.id, 1, exit_code=0, result={"loss": 0.5})
    assert rec.state is JobState.FINISHED and rec.result == {"loss": 0.5}
    assert store.allocations() == {}
    assert [e["kind"] for e in store.events(rec.id)] == ["submitted", "allocated", "started", "finished"]
    with pytest.raises(Conflict):
        store.cancel(rec.id)
    with pytest.raises(NotFound):
        store.get(999)
    failed, _ = store.submit(spec("b"))
    store.allocate(failed.id, "T4", [8])
    assert store.mark_ended(failed.id, 1, exit_code=3, error="exited with status 3").state is JobState.FAILED


def test_no_gpu_is_allocated_twice(store):
    a, _ = store.submit(spec("a", num_gpus=2))
    b, _ = store.submit(spec("b", num_gpus=2))
    store.allocate(a.id, "V100-16GB", [0, 1])
    with pytest.raises(Conflict, match="GPU 1"):
        store.allocate(b.id, "V100-16GB", [1, 2])
    assert store.get(b.id).state is JobState.QUEUED  # the refused write left nothing behind
    assert store.allocations() == {0: (a.id, 1), 1: (a.id, 1)}
    with pytest.raises(Conflict, match="not queued"):
        store.allocate(a.id, "V100-16GB", [4, 5])


def test_cancel_queued_and_running(store):
    q, _ = store.submit(spec("q"))
    r, _ = store.submit(spec("r"))
    assert store.cancel(q.id).state is JobState.CANCELLED
    with pytest.raises(Conflict):
        store.allocate(q.id, "T4", [8])  # a cancelled job is never started
    store.allocate(r.id, "T4", [8])
    flagged = store.cancel(r.id)
    assert flagged.state is JobState.ALLOCATED and flagged.cancel_requested
    assert store.mark_ended(r.id, 1, exit_code=None, cancelled=True).state is JobState.CANCELLED
    assert store.queued == 0


def test_requeue_until_max_attempts(store):
    rec, _ = store.submit(spec("x"))
    for attempt in (1, 2):
        store.allocate(rec.id, "T4", [8])
        rec = store.requeue(rec.id, attempt, "lost", max_attempts=3)
        assert rec.state is JobState.QUEUED and rec.requeues == attempt
    store.allocate(rec.id, "T4", [8])
    rec = store.requeue(rec.id, 3, "lost", max_attempts=3)
    assert rec.state is JobState.FAILED and "gave up after 3 attempts" in rec.error
    assert store.allocations() == {}
    with pytest.raises(Conflict):  # a stale attempt cannot change the job
        store.requeue(rec.id, 1, "lost")


def test_idempotency_key_and_queue_limit(make_store):
    s = make_store(max_queued=3)
    first, created = s.submit(spec("a"), "key-1")
    again, created_again = s.submit(spec("a"), "key-1")
    assert created and not created_again and again.id == first.id
    s.submit(spec("b"))
    s.submit(spec("c"))
    with pytest.raises(QueueFull):
        s.submit(spec("d"))
    assert s.submit(spec("a"), "key-1")[0].id == first.id  # a retry is answered even when full
    with pytest.raises(Conflict, match="different request"):  # the same key for another job: a client bug
        s.submit(spec("other"), "key-1")
    s.cancel(first.id)
    s.submit(spec("d"))
    assert len(s.list_jobs([JobState.QUEUED])) == 3


def test_concurrent_submissions_are_each_committed_once(make_store):
    s = make_store()
    ids: list[int] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        for i in range(50):
            rec, _ = s.submit(spec(f"w{k}-{i}"), f"w{k}-{i}")
            with lock:
                ids.append(rec.id)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    s.close()
    assert len(ids) == len(set(ids)) == 400
    s2 = make_store()  # everything acknowledged is on disk
    names = [r.name for r in s2.list_jobs()]
    assert len(names) == len(set(names)) == 400 and s2.queued == 400
    assert len(s2.list_jobs(limit=10, offset=395)) == 5


def test_stale_allocations_are_released(store):
    rec, _ = store.submit(spec("a"))
    store.allocate(rec.id, "T4", [8])

    def corrupt(tx):  # as if a job's end had been written by a version that kept its rows
        from sqlalchemy import update

        from gpualloc.service.store import jobs_t
        tx.conn.execute(update(jobs_t).where(jobs_t.c.id == rec.id).values(state="finished"))

    store.write(corrupt)
    assert store.release_stale_allocations() == [8]
    assert store.allocations() == {}
