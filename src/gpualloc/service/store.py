"""The service's durable state: jobs, their event history, GPU allocations (SQLAlchemy Core).

SQLite is the default (one file, WAL journal, ``synchronous=FULL``: a commit survives a crash of the
process and of the machine); a ``postgresql://`` URL uses PostgreSQL through the same code (install
a driver such as ``psycopg``). One service owns a store at a time.

**Every change is durable before the call returns.** All writes go through one writer thread that
takes whatever writes are waiting, runs each in its own savepoint inside one transaction and commits
once (group commit): a caller waits for that commit, so an acknowledged submission is on disk, and
concurrent submissions share one fsync. A write that fails (a conflict, a full queue) rolls back its
savepoint only.

Tables:

* ``jobs``: one row per job (state, normalised spec as JSON, current allocation, outcome);
* ``events``: every state change of every job, in order (``submitted``, ``allocated``, ``started``,
  ``finished``, ``failed``, ``cancel_requested``, ``cancelled``, ``requeued``);
* ``allocations``: one row per allocated GPU, keyed by the GPU: the database itself refuses to
  allocate a GPU twice;
* ``meta``: the store's id, its time origin, the current policy, the quota file's teams;
* ``users``: one row per user (name, team, admin flag, SHA-256 of the token; never the token).

Every job records the ``user`` and ``team`` of the token that submitted it.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gpualloc._extras import missing_extra

try:
    from sqlalchemy import (Boolean, Column, bindparam, Float, ForeignKey, Index, Integer, MetaData, String, Table,
                            Text, create_engine, delete, event, func, insert, inspect, select, update)
    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
except ModuleNotFoundError as err:
    raise missing_extra("service", "the service's store (gpualloc serve, gpualloc user)") from err

from gpualloc.service.errors import Conflict, NotFound, QueueFull, ServiceError
from gpualloc.service.models import HOLDING, JobRecord, JobState
from gpualloc.service.users import BOOTSTRAP_USER, User, check_name, digests_match, new_token, token_digest

T = TypeVar("T")
log = logging.getLogger(__name__)

metadata = MetaData()

jobs_t = Table(
    "jobs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(128), unique=True, nullable=True),
    Column("name", String(128), nullable=False),
    Column("state", String(16), nullable=False),
    Column("spec", Text, nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("requeues", Integer, nullable=False, default=0),
    Column("submitted_at", Float, nullable=False),
    Column("allocated_at", Float),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("device_type", String(64)),
    Column("gpus", Text),
    Column("handle", String(256)),
    Column("exit_code", Integer),
    Column("error", Text),
    Column("result", Text),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("user", String(64)),
    Column("team", String(64)),
    Index("ix_jobs_state", "state"),
    Index("ix_jobs_team", "team"),
)

events_t = Table(
    "events", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", Integer, ForeignKey("jobs.id"), nullable=False),
    Column("at", Float, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("detail", Text),
    Index("ix_events_job", "job_id"),
)

allocations_t = Table(
    "allocations", metadata,
    Column("device", Integer, primary_key=True, autoincrement=False),
    Column("job_id", Integer, ForeignKey("jobs.id"), nullable=False),
    Column("attempt", Integer, nullable=False),
)

meta_t = Table(
    "meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

users_t = Table(
    "users", metadata,
    Column("name", String(64), primary_key=True),
    Column("team", String(64), nullable=False),
    Column("admin", Boolean, nullable=False, default=False),
    Column("token_sha256", String(64), nullable=False, unique=True),
    Column("created_at", Float, nullable=False),
    Column("token_at", Float, nullable=False),
)

JOB_COLUMNS_ADDED = ("user", "team")
"""Columns of ``jobs`` added after the first release: a store made before gets them on open (NULL
for its old jobs, which only admins then see)."""

_RAN_TO_END = ((jobs_t.c.state == JobState.FINISHED.value)
               | ((jobs_t.c.state == JobState.FAILED.value) & jobs_t.c.exit_code.is_not(None))) \
    & jobs_t.c.started_at.is_not(None) & jobs_t.c.finished_at.is_not(None)

# Statements of the submission path, built once (submissions are the hot path).
_BY_KEY = select(jobs_t).where(jobs_t.c.idempotency_key == bindparam("key"))
_INSERT_JOB = insert(jobs_t)
_INSERT_EVENT = insert(events_t)

MAX_RESULT_CHARS = 65536
"""Longest stored result or error text (longer ones are cut)."""
SCRUB_IDLE_S, SCRUB_MAX_S = 0.05, 10.0
"""The WAL is checkpointed and truncated (dropping ended jobs' env values) once the writer is idle this long,
or at the latest this long after a wipe."""


def store_url(store: str | Path) -> str:
    """A SQLAlchemy URL for ``store``: a URL as is, anything else a SQLite file path."""
    s = str(store)
    if "://" in s:
        return s
    return f"sqlite:///{Path(s).expanduser().resolve()}"


def sqlite_path(store: str | Path) -> Path | None:
    """The file of a SQLite store (None for other databases and in-memory SQLite)."""
    url = store_url(store)
    if not url.startswith("sqlite:///") or url in ("sqlite://", "sqlite:///:memory:"):
        return None
    return Path(url[len("sqlite:///"):])


class _Redo(Exception):
    """A write of a batch failed in the database: redo the batch one write at a time."""


@dataclass
class _Tx:
    """What a write sees: the connection, the time of the batch, and the change in queued jobs it
    makes (applied to the store's counter only once the batch commits)."""

    conn: Connection
    now: float
    queued_delta: int = 0
    scrubbed: bool = False  # a job's env values were wiped: checkpoint the WAL after the commit


class Store:
    """Jobs, events and allocations in one database.

    Args:
        store: a SQLite file path (created with its folder) or a SQLAlchemy URL.
        max_queued: most jobs waiting in the queue; a submission beyond raises :class:`QueueFull`.
        synchronous: SQLite's ``synchronous`` pragma (``FULL``: durable across power loss;
            ``NORMAL``: across process crashes only, faster).
        clock: Unix time source.

    Raises:
        ServiceError: the database cannot be opened or created.
    """

    def __init__(self, store: str | Path, *, max_queued: int = 100_000, synchronous: str = "FULL",
                 clock: Callable[[], float] = time.time) -> None:
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise ServiceError(f"store: synchronous must be FULL, NORMAL or EXTRA, got {synchronous!r}")
        self.url = store_url(store)
        self.path = sqlite_path(store)
        self.max_queued = int(max_queued)
        self.clock = clock
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Owner-only, like the token: jobs' commands and environments are in here. SQLite gives
            # the -wal and -shm files the database file's permissions.
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        try:
            self.engine = self._engine(synchronous.upper())
            self.uid, self.epoch = self._create_schema()
            with self.engine.connect() as conn:
                self._queued = int(conn.execute(select(func.count()).select_from(jobs_t)
                                                .where(jobs_t.c.state == JobState.QUEUED.value)).scalar_one())
        except SQLAlchemyError as err:
            raise ServiceError(f"store {self.url}: {err.__class__.__name__}: {err}") from err
        self._writes: queue.SimpleQueue = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write_loop, name="gpualloc-store-writer", daemon=True)
        self._closed = False
        self._scrub_pending = False
        self._scrub_since: float | None = None
        self._writer.start()

    # ------------------------------------------------------------------------------ plumbing
    def _engine(self, synchronous: str) -> Engine:
        if self.path is None and not self.url.startswith("sqlite"):
            return create_engine(self.url, pool_pre_ping=True)
        engine = create_engine(self.url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:
            # Let SQLAlchemy, not the sqlite3 module, issue BEGIN: savepoints then work (SQLAlchemy's
            # documented recipe for pysqlite).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA synchronous={synchronous}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA secure_delete=ON")  # freed space is zeroed: an ended job's env leaves no trace
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn) -> None:
            conn.exec_driver_sql("BEGIN")

        return engine

    def _create_schema(self, tries: int = 3) -> tuple[str, float]:
        """Make the tables, add missing columns, read or make the store's id and epoch. Another process
        making the same new store at the same moment (``gpualloc user add`` beside a starting
        ``gpualloc serve``) makes one of the two fail on a table or row the other just made: that one
        tries again and finds them."""
        for attempt in range(tries):
            try:
                metadata.create_all(self.engine)
                self._add_columns()
                return self._init_meta()
            except (OperationalError, IntegrityError):
                if attempt == tries - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    def _add_columns(self) -> None:
        """Add :data:`JOB_COLUMNS_ADDED` to a ``jobs`` table made before them."""
        have = {c["name"] for c in inspect(self.engine).get_columns("jobs")}
        missing = [c for c in JOB_COLUMNS_ADDED if c not in have]
        if missing:
            with self.engine.begin() as conn:
                for name in missing:
                    col = jobs_t.c[name]
                    conn.exec_driver_sql(f'ALTER TABLE jobs ADD COLUMN "{name}" '
                                         f"{col.type.compile(dialect=self.engine.dialect)}")
                conn.exec_driver_sql('CREATE INDEX IF NOT EXISTS ix_jobs_team ON jobs (team)')

    def _init_meta(self) -> tuple[str, float]:
        with self.engine.begin() as conn:
            rows = dict(conn.execute(select(meta_t.c.key, meta_t.c.value)).all())
            if "uid" not in rows:
                rows = {"uid": secrets.token_hex(4), "epoch": repr(self.clock())}
                conn.execute(insert(meta_t), [{"key": k, "value": v} for k, v in rows.items()])
        return rows["uid"], float(rows["epoch"])

    def _write_loop(self) -> None:
        conn: Connection | None = None
        while True:
            try:
                item = self._writes.get(timeout=SCRUB_IDLE_S if self._scrub_pending else None)
            except queue.Empty:  # idle: a wiped job's old pages leave the WAL now
                conn = conn or self.engine.connect()
                self._scrub_wal(conn)
                continue
            if item is None:
                break
            batch = [item]
            while len(batch) < 512:
                try:
                    nxt = self._writes.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._writes.put(None)
                    break
                batch.append(nxt)
            try:
                if conn is None:
                    conn = self.engine.connect()
                self._commit(conn, batch)
                if self._scrub_pending:
                    self._scrub_since = self._scrub_since or time.monotonic()
                    if time.monotonic() - self._scrub_since >= SCRUB_MAX_S:  # never idle: do it anyway
                        self._scrub_wal(conn)
            except Exception as err:  # the connection broke: fail this batch, reconnect for the next
                failure = ServiceError(f"store {self.url}: {err.__class__.__name__}: {err}")
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(failure)
                if conn is not None:
                    conn.invalidate()
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def _scrub_wal(self, conn: Connection) -> None:
        """Copy the WAL into the database and truncate it (SQLite), so the old page images holding an
        ended job's env values are gone; tried again later if readers keep it busy.

        It runs once the writer has been idle :data:`SCRUB_IDLE_S`, or :data:`SCRUB_MAX_S` after the
        wipe under constant writes: a truncated WAL must grow again, and every commit that grows it
        costs more than one that reuses it (a scrub after each ended job cut submissions by a quarter)."""
        if self.path is None:
            self._scrub_pending = False
            return
        try:
            cur = conn.connection.dbapi_connection.cursor()  # outside SQLAlchemy's transaction: no BEGIN
            try:
                cur.execute("PRAGMA busy_timeout=200")
                busy = cur.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            finally:
                cur.execute("PRAGMA busy_timeout=30000")
                cur.close()
        except Exception as err:  # not fatal: the next wipe tries again, and close() checkpoints
            log.warning("store %s: WAL checkpoint failed: %s: %s", self.url, type(err).__name__, err)
            busy = 0
        self._scrub_pending = bool(busy)
        if not busy:
            self._scrub_since = None

    def _commit(self, conn: Connection, batch: list[tuple[Callable[[_Tx], Any], Future]]) -> None:
        """Run ``batch`` in one transaction and commit once.

        A write raises :class:`ServiceError` only from its checks, before it changes anything, so
        such a refusal needs no rollback. Any other failure (the database refused a statement) rolls
        the batch back, and its writes are then redone one transaction each, so only the failing one
        fails.
        """
        try:
            outcomes, delta = self._run(conn, batch)
        except _Redo:
            outcomes, delta = [], 0
            for item in batch:
                try:
                    one, d = self._run(conn, [item], alone=True)
                except Exception as err:
                    one, d = [(item[1], None, err if isinstance(err, ServiceError) else ServiceError(
                        f"store {self.url}: {err.__class__.__name__}: {err}"))], 0
                outcomes += one
                delta += d
        self._queued += delta
        for fut, res, err in outcomes:
            if err is None:
                fut.set_result(res)
            else:
                fut.set_exception(err)

    def _run(self, conn: Connection, batch, alone: bool = False):
        outcomes: list[tuple[Future, Any, BaseException | None]] = []
        delta = 0
        with conn.begin():
            for fn, fut in batch:
                tx = _Tx(conn, self.clock())
                try:
                    res = fn(tx)
                    self._scrub_pending |= tx.scrubbed
                except ServiceError as err:  # a refusal: nothing was written
                    outcomes.append((fut, None, err))
                    continue
                except Exception as err:
                    if alone:
                        raise
                    raise _Redo() from err
                delta += tx.queued_delta
                outcomes.append((fut, res, None))
        return outcomes, delta

    def write_future(self, fn: Callable[[_Tx], T]) -> Future[T]:
        """Queue ``fn(tx)`` for the writer; the future resolves once its batch is committed."""
        if self._closed:
            raise ServiceError("store is closed")
        fut: Future = Future()
        self._writes.put((fn, fut))
        return fut

    def write(self, fn: Callable[[_Tx], T]) -> T:
        """Run ``fn(tx)`` in the writer and wait until it is committed; its error re-raised."""
        return self.write_future(fn).result()

    def close(self) -> None:
        """Finish the queued writes and close the database (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._writes.put(None)
        self._writer.join(timeout=60)
        self.engine.dispose()

    @property
    def queued(self) -> int:
        """Jobs in the queue now (kept by the writer; exact once pending writes are committed)."""
        return self._queued

    # --------------------------------------------------------------------------------- reads
    def get(self, job_id: int) -> JobRecord:
        with self.engine.connect() as conn:
            return _fetch(conn, job_id)

    def list_jobs(self, states: Iterable[JobState] | None = None, *, limit: int | None = None,
                  offset: int = 0, after_id: int | None = None, team: str | None = None) -> list[JobRecord]:
        """Jobs in id order, optionally of some states, of one ``team``, ids above ``after_id``, paged."""
        q = select(jobs_t).order_by(jobs_t.c.id)
        if states is not None:
            q = q.where(jobs_t.c.state.in_([s.value for s in states]))
        if team is not None:
            q = q.where(jobs_t.c.team == team)
        if after_id is not None:
            q = q.where(jobs_t.c.id > after_id)
        if offset:
            q = q.offset(offset)
        if limit is not None:
            q = q.limit(limit)
        with self.engine.connect() as conn:
            return [_record(r) for r in conn.execute(q).mappings()]

    def ran_to_end(self, *, limit: int | None = None, until: float | None = None) -> list[JobRecord]:
        """Jobs that ran to their end (``finished``, or ``failed`` with an exit status, after a start),
        ended at or before ``until``: the ``limit`` most recently ended, oldest end first. What the
        service's duration predictor learns from (:mod:`gpualloc.service.prediction`)."""
        q = select(jobs_t).where(_RAN_TO_END).order_by(jobs_t.c.finished_at.desc(), jobs_t.c.id.desc())
        if until is not None:
            q = q.where(jobs_t.c.finished_at <= until)
        if limit is not None:
            q = q.limit(limit)
        with self.engine.connect() as conn:
            return [_record(r) for r in conn.execute(q).mappings()][::-1]

    def ran_to_end_count(self) -> int:
        """How many jobs :meth:`ran_to_end`."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(jobs_t).where(_RAN_TO_END)).scalar_one())

    def allocations(self) -> dict[int, tuple[int, int]]:
        """``{device: (job id, attempt)}`` of the allocated GPUs."""
        with self.engine.connect() as conn:
            return {int(d): (int(j), int(a)) for d, j, a in conn.execute(
                select(allocations_t.c.device, allocations_t.c.job_id, allocations_t.c.attempt))}

    def events(self, job_id: int | None = None) -> list[dict[str, Any]]:
        """The event history (of one job, or of all), oldest first."""
        q = select(events_t).order_by(events_t.c.id)
        if job_id is not None:
            q = q.where(events_t.c.job_id == job_id)
        with self.engine.connect() as conn:
            return [{"id": r["id"], "job_id": r["job_id"], "at": r["at"], "kind": r["kind"],
                     "detail": json.loads(r["detail"]) if r["detail"] else {}}
                    for r in conn.execute(q).mappings()]

    def teams_of(self, job_ids: Iterable[int]) -> dict[int, str | None]:
        """``{job id: team}`` of the given jobs (those that exist)."""
        ids = sorted({int(j) for j in job_ids})
        if not ids:
            return {}
        with self.engine.connect() as conn:
            return {int(i): t for i, t in conn.execute(select(jobs_t.c.id, jobs_t.c.team).where(jobs_t.c.id.in_(ids)))}

    # --------------------------------------------------------------------------------- users
    def user_by_token(self, token: str) -> User | None:
        """The user holding ``token`` (None: no such token). One indexed lookup by the token's
        SHA-256, then a constant-time comparison of the digest found."""
        digest = token_digest(token)
        with self.engine.connect() as conn:
            row = conn.execute(select(users_t).where(users_t.c.token_sha256 == digest)).mappings().first()
        if row is None or not digests_match(row["token_sha256"], digest):
            return None
        return User(row["name"], row["team"], bool(row["admin"]))

    def users(self) -> list[dict[str, Any]]:
        """Every user: name, team, admin, created_at, token_at (when the token was made), by name."""
        with self.engine.connect() as conn:
            return [{"name": r["name"], "team": r["team"], "admin": bool(r["admin"]), "created_at": r["created_at"],
                     "token_at": r["token_at"]}
                    for r in conn.execute(select(users_t).order_by(users_t.c.name)).mappings()]

    def add_user(self, name: str, team: str, *, admin: bool = False) -> tuple[User, str]:
        """Record a new user of ``team``; returns the user and its token (shown nowhere: the caller
        writes it to its owner's file).

        Raises:
            ServiceError: a bad name; Conflict: the name is taken.
        """
        check_name(name, "user")
        check_name(team, "team")
        if name == BOOTSTRAP_USER:
            raise Conflict(f"user {name!r} is the bootstrap token's holder; choose another name")
        token = new_token()

        def op(tx: _Tx) -> User:
            if tx.conn.execute(select(users_t.c.name).where(users_t.c.name == name)).first() is not None:
                raise Conflict(f"user {name!r} exists already (rotate its token with `gpualloc user token {name} "
                               "--rotate`)")
            tx.conn.execute(insert(users_t).values(name=name, team=team, admin=bool(admin),
                                                   token_sha256=token_digest(token), created_at=tx.now,
                                                   token_at=tx.now))
            return User(name, team, bool(admin))

        return self.write(op), token

    def remove_user(self, name: str) -> None:
        """Forget ``name``: its token stops working at once (its jobs stay, with its name).

        Raises:
            NotFound: no such user.
        """

        def op(tx: _Tx) -> None:
            if tx.conn.execute(delete(users_t).where(users_t.c.name == name)).rowcount == 0:
                raise NotFound(f"no user {name!r}")

        self.write(op)

    def rotate_token(self, name: str) -> str:
        """A new token for ``name``; the old one stops working at once.

        Raises:
            NotFound: no such user.
        """
        token = new_token()

        def op(tx: _Tx) -> None:
            done = tx.conn.execute(update(users_t).where(users_t.c.name == name)
                                   .values(token_sha256=token_digest(token), token_at=tx.now)).rowcount
            if done == 0:
                raise NotFound(f"no user {name!r}")

        self.write(op)
        return token

    def get_meta(self, key: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(select(meta_t.c.value).where(meta_t.c.key == key)).scalar_one_or_none()

    # -------------------------------------------------------------------------------- writes
    def submit_future(self, spec: dict[str, Any], idempotency_key: str | None = None, *, user: str | None = None,
                      team: str | None = None) -> Future[tuple[JobRecord, bool]]:
        """Record a new queued job of ``user`` in ``team``; resolves to ``(record, created)``. A key
        the same user used before with the same spec returns that job (``created`` False) instead of
        adding another.

        Raises:
            Conflict: the key was used before with a different spec (a client bug, not a retry), or
                by another user (whose job is not named).
            QueueFull: the queue holds ``max_queued`` jobs.
        """
        name = str(spec["name"])
        spec_json = json.dumps(spec, separators=(",", ":"))

        def op(tx: _Tx) -> tuple[JobRecord, bool]:
            if idempotency_key is not None:
                row = tx.conn.execute(_BY_KEY, {"key": idempotency_key}).mappings().first()
                if row is not None:
                    if row["user"] != user:
                        raise Conflict("Idempotency-Key already used by another user; use a new key for a new job")
                    if json.loads(row["spec"]) not in (json.loads(spec_json), _scrub(json.loads(spec_json))):
                        raise Conflict(f"Idempotency-Key already used for job {row['id']} with a different "
                                       f"request; use a new key for a new job")
                    return _record(row), False
            if self._queued + tx.queued_delta >= self.max_queued:
                raise QueueFull(f"the queue is full ({self.max_queued} jobs)")
            values = {"idempotency_key": idempotency_key, "name": name, "state": JobState.QUEUED.value,
                      "spec": spec_json, "attempts": 0, "requeues": 0, "submitted_at": tx.now,
                      "cancel_requested": False, "user": user, "team": team}
            job_id = tx.conn.execute(_INSERT_JOB, values).inserted_primary_key[0]
            tx.conn.execute(_INSERT_EVENT, {"job_id": job_id, "at": tx.now, "kind": "submitted", "detail": None})
            tx.queued_delta += 1
            return JobRecord(int(job_id), name, JobState.QUEUED, spec, 0, 0, tx.now, None, None, None, None, (),
                             None, None, None, None, False, idempotency_key, user, team), True

        return self.write_future(op)

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None, *, user: str | None = None,
               team: str | None = None) -> tuple[JobRecord, bool]:
        return self.submit_future(spec, idempotency_key, user=user, team=team).result()

    def cancel(self, job_id: int) -> JobRecord:
        """Cancel a queued job at once; flag a job holding GPUs (the scheduler stops it).

        Raises:
            NotFound, Conflict: no such job; it already ended.
        """

        def op(tx: _Tx) -> JobRecord:
            rec = _fetch(tx.conn, job_id)
            if rec.state.terminal:
                raise Conflict(f"job {job_id} is already {rec.state.value}")
            if rec.state is JobState.QUEUED:
                _set(tx, job_id, state=JobState.CANCELLED.value, finished_at=tx.now)
                tx.queued_delta -= 1
                _event(tx, job_id, "cancelled")
            elif not rec.cancel_requested:
                _set(tx, job_id, cancel_requested=True)
                _event(tx, job_id, "cancel_requested")
            return _fetch(tx.conn, job_id)

        return self.write(op)

    def allocate(self, job_id: int, device_type: str, gpus: Sequence[int]) -> JobRecord:
        """Give ``gpus`` to queued job ``job_id`` as a new attempt.

        Raises:
            Conflict: the job is no longer queued (cancelled meanwhile), or a GPU is taken.
        """
        gpus = tuple(int(g) for g in gpus)

        def op(tx: _Tx) -> JobRecord:
            rec = _fetch(tx.conn, job_id)
            if rec.state is not JobState.QUEUED:
                raise Conflict(f"job {job_id} is {rec.state.value}, not queued")
            attempt = rec.attempts + 1
            taken = tx.conn.execute(select(allocations_t.c.device, allocations_t.c.job_id)
                                    .where(allocations_t.c.device.in_(gpus))).all()
            if taken:
                raise Conflict(f"job {job_id}: GPU {taken[0][0]} is allocated to job {taken[0][1]}")
            tx.conn.execute(insert(allocations_t), [{"device": g, "job_id": job_id, "attempt": attempt} for g in gpus])
            _set(tx, job_id, state=JobState.ALLOCATED.value, attempts=attempt, device_type=device_type,
                 gpus=json.dumps(list(gpus)), allocated_at=tx.now, handle=None, exit_code=None, error=None)
            tx.queued_delta -= 1
            _event(tx, job_id, "allocated", attempt=attempt, device_type=device_type, gpus=list(gpus))
            return _fetch(tx.conn, job_id)

        return self.write(op)

    def mark_started(self, job_id: int, attempt: int, handle: str) -> JobRecord:
        """The backend runs attempt ``attempt`` of the job as ``handle``."""

        def op(tx: _Tx) -> JobRecord:
            rec = _holding(tx, job_id, attempt)
            if rec.state is JobState.RUNNING and rec.handle == handle:
                return rec
            _set(tx, job_id, state=JobState.RUNNING.value, handle=handle, started_at=tx.now)
            _event(tx, job_id, "started", attempt=attempt, handle=handle)
            return _fetch(tx.conn, job_id)

        return self.write(op)

    def mark_ended(self, job_id: int, attempt: int, *, exit_code: int | None, error: str | None = None,
                   result: Any = None, cancelled: bool = False) -> JobRecord:
        """Attempt ``attempt`` ended: ``finished`` when it exited 0 without error, ``cancelled`` when
        ``cancelled``, else ``failed``. Its GPUs are released."""

        def op(tx: _Tx) -> JobRecord:
            _holding(tx, job_id, attempt)
            if cancelled:
                state = JobState.CANCELLED
            elif exit_code == 0 and error is None:
                state = JobState.FINISHED
            else:
                state = JobState.FAILED
            _release(tx, job_id)
            _set(tx, job_id, state=state.value, finished_at=tx.now, exit_code=exit_code,
                 error=_cut(error), result=_cut(json.dumps(result)) if result is not None else None)
            _event(tx, job_id, state.value, attempt=attempt, exit_code=exit_code, error=_cut(error, 512))
            return _fetch(tx.conn, job_id)

        return self.write(op)

    def requeue(self, job_id: int, attempt: int, reason: str, *, max_attempts: int | None = None) -> JobRecord:
        """Put attempt ``attempt`` of a job holding GPUs back in the queue (its GPUs released) -- or,
        when it has had ``max_attempts`` attempts already, fail it with ``reason``."""

        def op(tx: _Tx) -> JobRecord:
            rec = _holding(tx, job_id, attempt)
            _release(tx, job_id)
            if max_attempts is not None and rec.attempts >= max_attempts:
                msg = f"{reason} (gave up after {rec.attempts} attempts)"
                _set(tx, job_id, state=JobState.FAILED.value, finished_at=tx.now, error=_cut(msg))
                _event(tx, job_id, "failed", attempt=attempt, error=_cut(msg, 512))
            elif rec.cancel_requested:
                _set(tx, job_id, state=JobState.CANCELLED.value, finished_at=tx.now)
                _event(tx, job_id, "cancelled", attempt=attempt)
            else:
                _set(tx, job_id, state=JobState.QUEUED.value, requeues=rec.requeues + 1, handle=None)
                tx.queued_delta += 1
                _event(tx, job_id, "requeued", attempt=attempt, reason=_cut(reason, 512))
            return _fetch(tx.conn, job_id)

        return self.write(op)

    def release_stale_allocations(self) -> list[int]:
        """Delete allocations of jobs that hold no GPUs (left by an interrupted write elsewhere);
        returns the GPUs freed."""

        def op(tx: _Tx) -> list[int]:
            stale = jobs_t.c.state.not_in([s.value for s in HOLDING]) | (allocations_t.c.attempt != jobs_t.c.attempts)
            rows = tx.conn.execute(
                select(allocations_t.c.device).select_from(allocations_t.join(jobs_t)).where(stale)
            ).scalars().all()
            if rows:
                tx.conn.execute(delete(allocations_t).where(allocations_t.c.device.in_(rows)))
            return [int(d) for d in rows]

        return self.write(op)

    def set_meta(self, key: str, value: str) -> None:
        def op(tx: _Tx) -> None:
            if tx.conn.execute(update(meta_t).where(meta_t.c.key == key).values(value=value)).rowcount == 0:
                tx.conn.execute(insert(meta_t).values(key=key, value=value))

        self.write(op)


# -------------------------------------------------------------------------------------- helpers
def _cut(text: str | None, limit: int = MAX_RESULT_CHARS) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 3] + "..."


def _record(row: Any) -> JobRecord:
    return JobRecord(
        id=int(row["id"]), name=row["name"], state=JobState(row["state"]), spec=json.loads(row["spec"]),
        attempts=int(row["attempts"]), requeues=int(row["requeues"]), submitted_at=row["submitted_at"],
        allocated_at=row["allocated_at"], started_at=row["started_at"], finished_at=row["finished_at"],
        device_type=row["device_type"], gpus=tuple(json.loads(row["gpus"])) if row["gpus"] else (),
        handle=row["handle"], exit_code=row["exit_code"], error=row["error"],
        result=json.loads(row["result"]) if row["result"] else None, cancel_requested=bool(row["cancel_requested"]),
        idempotency_key=row["idempotency_key"], user=row["user"], team=row["team"])


def _fetch(conn: Connection, job_id: int) -> JobRecord:
    row = conn.execute(select(jobs_t).where(jobs_t.c.id == job_id)).mappings().first()
    if row is None:
        raise NotFound(f"no job {job_id}")
    return _record(row)


def _holding(tx: _Tx, job_id: int, attempt: int) -> JobRecord:
    rec = _fetch(tx.conn, job_id)
    if rec.state not in HOLDING or rec.attempts != attempt:
        raise Conflict(f"job {job_id} is {rec.state.value} at attempt {rec.attempts}, not holding GPUs "
                       f"for attempt {attempt}")
    return rec


def _set(tx: _Tx, job_id: int, **values: Any) -> None:
    if values.get("state") in _TERMINAL:  # env values may be secrets: kept only while the job may still run
        spec = tx.conn.execute(select(jobs_t.c.spec).where(jobs_t.c.id == job_id)).scalar_one()
        values["spec"] = json.dumps(_scrub(json.loads(spec)), separators=(",", ":"))
        tx.scrubbed = True
    tx.conn.execute(update(jobs_t).where(jobs_t.c.id == job_id).values(**values))


_TERMINAL = frozenset(s.value for s in JobState if s.terminal)


def _scrub(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with its target's ``env`` values replaced by None (the names stay)."""
    target = spec.get("target")
    if not isinstance(target, dict) or not target.get("env"):
        return spec
    return {**spec, "target": {**target, "env": dict.fromkeys(target["env"])}}


def _release(tx: _Tx, job_id: int) -> None:
    tx.conn.execute(delete(allocations_t).where(allocations_t.c.job_id == job_id))


def _event(tx: _Tx, job_id: int, kind: str, **detail: Any) -> None:
    tx.conn.execute(insert(events_t).values(job_id=job_id, at=tx.now, kind=kind,
                                            detail=json.dumps(detail) if detail else None))
