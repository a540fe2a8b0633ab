"""The HTTP API (FastAPI; OpenAPI docs at ``/docs``) over one :class:`Service`.

Endpoints (mutating ones need ``Authorization: Bearer <token>``):

=======  ==========================  ==========================================================
GET      ``/health``                 liveness and a summary; no token
POST     ``/jobs``                   submit (201; 200 when ``Idempotency-Key`` was seen before)
GET      ``/jobs``                   list (``state``, ``limit``, ``offset``)
GET      ``/jobs/{id}``              one job
GET      ``/jobs/{id}/events``       its state changes
POST     ``/jobs/{id}/cancel``       cancel (a queued job at once, a running one is stopped)
GET      ``/cluster``                devices, allocations, telemetry
GET      ``/policy``                 the current policy and the ones available
PUT      ``/policy``                 switch policy
=======  ==========================  ==========================================================

Errors are JSON ``{"detail": ...}``: 401 bad token, 404 no such job, 409 wrong state, 413 body too
large, 422 invalid body, 429 queue full.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import math
import os
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Header, HTTPException, Path as PathParam, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gpualloc import __version__
from gpualloc.errors import AgentError, GpuallocError, SchedulingError
from gpualloc.hardware.cluster import ClusterSpec, load_cluster
from gpualloc.scheduling.policies import POLICIES
from gpualloc.service.auth import default_token_path, load_or_create_token, token_matches
from gpualloc.service.backends import Backend, make_backend
from gpualloc.service.errors import Conflict, InvalidJob, NotFound, QueueFull, ServiceError
from gpualloc.service.models import JobOut, JobRecord, JobSpec, JobState, PolicyChange
from gpualloc.service.scheduler import DeviceTypes, Scheduler, normalise_spec, stored_policy
from gpualloc.service.store import Store, sqlite_path

log = logging.getLogger("gpualloc.service")

MAX_PAGE = 10_000


@dataclass
class ServiceConfig:
    """Everything ``gpualloc serve`` configures.

    Attributes:
        store: SQLite file or database URL.
        cluster: preset, shorthand or cluster file the policy schedules.
        backend: ``"local"`` or ``"ray"``.
        ray_address: join this Ray cluster (default: start a local Ray declaring the cluster's
            device types as resources).
        ray_num_cpus: CPUs of a locally started Ray.
        policy, policy_options: the policy (default: the one stored, else ``fcfs``).
        token_file: default ``<store>.token``.
        max_queued: queue length limit (429 beyond).
        max_body_bytes: request body limit (413 beyond).
        on_lost, max_attempts, preemption, tick_s: see :class:`~gpualloc.service.scheduler.Scheduler`.
        telemetry: ``"auto"`` (NVML when it opens, else none), ``"none"``, ``"nvml"`` or ``"sim"``.
        runs_dir: local backend's run folders (default ``<store>.runs``); Ray backend's logs.
        synchronous: SQLite synchronous pragma.
    """

    store: str = "gpualloc-service.db"
    cluster: str = "adlro16"
    backend: str = "local"
    ray_address: str | None = None
    ray_num_cpus: int | None = None
    policy: str | None = None
    policy_options: dict[str, Any] = field(default_factory=dict)
    token_file: str | None = None
    max_queued: int = 100_000
    max_body_bytes: int = 64 * 1024
    on_lost: str = "requeue"
    max_attempts: int = 3
    preemption: bool = False
    telemetry: str = "auto"
    tick_s: float = 0.5
    runs_dir: str | None = None
    synchronous: str = "FULL"


class Service:
    """The running parts: store, token, backend, scheduler, telemetry.

    :meth:`open` reconciles with the backend before it returns, so the API answers only once every
    job of the store is accounted for.
    """

    def __init__(self, config: ServiceConfig, *, cluster: ClusterSpec | None = None) -> None:
        self.config = config
        self.cluster = cluster if cluster is not None else load_cluster(config.cluster)
        self.types = DeviceTypes.of(self.cluster)
        self.store: Store | None = None
        self.backend: Backend | None = None
        self.scheduler: Scheduler | None = None
        self.telemetry = None
        self.telemetry_name = "none"
        self.token = ""
        self.token_created = False
        self.token_path = Path(config.token_file) if config.token_file else default_token_path(config.store)
        self._lock_fd: int | None = None
        self._telemetry_lock = threading.Lock()
        self.recovery: dict[str, list[int]] = {}

    def open(self) -> "Service":
        cfg = self.config
        path = sqlite_path(cfg.store)
        try:
            if path is not None:
                self._lock(path)
            self.token, self.token_created = load_or_create_token(self.token_path)
            self.store = Store(cfg.store, max_queued=cfg.max_queued, synchronous=cfg.synchronous)
            base = path if path is not None else Path(self.token_path)
            runs = Path(cfg.runs_dir) if cfg.runs_dir else base.with_name(base.name + ".runs")
            if cfg.backend == "ray":
                options: dict[str, Any] = {
                    "resources": dict(zip(self.types.names, self.types.resources)), "instance": self.store.uid,
                    "address": cfg.ray_address, "num_cpus": cfg.ray_num_cpus, "log_dir": runs,
                    "temp_dir": f"/tmp/gr-{self.store.uid}",
                    "local_resources": {res: float(n) for res, n in zip(
                        self.types.resources, [self.cluster.type_counts()[t] for t in self.types.names])}}
            else:
                options = {"runs_dir": runs}
            self.backend = make_backend(cfg.backend, **options)
            name, popts = cfg.policy, cfg.policy_options
            if name is None:
                name, popts = stored_policy(self.store) or ("fcfs", {})
            self.scheduler = Scheduler(self.store, self.backend, self.cluster, policy=name, policy_options=popts,
                                       tick_s=cfg.tick_s, on_lost=cfg.on_lost, max_attempts=cfg.max_attempts,
                                       preemption=cfg.preemption)
            self.recovery = self.scheduler.start()
            self._open_telemetry()
        except BaseException:
            self.close()
            raise
        return self

    def _lock(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ServiceError(f"{path}: another gpualloc service is using this store") from None
        self._lock_fd = fd

    def _open_telemetry(self) -> None:
        name = self.config.telemetry
        if name == "none":
            return
        from gpualloc.telemetry.backends import open_backend
        from gpualloc.telemetry.base import TelemetryError

        try:
            if name == "auto":
                self.telemetry, self.telemetry_name = open_backend("nvml"), "nvml"
            elif name == "sim":
                self.telemetry, self.telemetry_name = open_backend("sim", cluster=self.cluster), "sim"
            else:
                self.telemetry, self.telemetry_name = open_backend(name), name
        except TelemetryError as err:
            if name != "auto":
                raise ServiceError(f"telemetry {name}: {err}") from err

    def telemetry_sample(self) -> dict[str, Any] | None:
        if self.telemetry is None:
            return None
        with self._telemetry_lock:
            try:
                return {"backend": self.telemetry_name, "devices": [r.to_dict() for r in self.telemetry.sample()]}
            except Exception as err:  # a failed reading is reported, not fatal
                return {"backend": self.telemetry_name, "error": f"{type(err).__name__}: {err}"}

    def close(self) -> None:
        """Stop scheduling and close everything (runs keep going where the backend allows)."""
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.telemetry is not None:
            try:
                self.telemetry.close()
            except Exception:
                pass
            self.telemetry = None
        if self.backend is not None:
            self.backend.close()
            self.backend = None
        if self.store is not None:
            self.store.close()
            self.store = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _job(rec: JobRecord) -> dict[str, Any]:
    return rec.to_dict()


class BodyLimit:
    """ASGI middleware: refuse request bodies over ``limit`` bytes with 413 (by Content-Length, or
    while reading a body sent without one)."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, int(limit)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                try:
                    too_big = int(value) > self.limit
                except ValueError:
                    return await self._reject(send, 400, "bad Content-Length header")
                if too_big:
                    return await self._reject(send, 413, f"request body larger than {self.limit} bytes")
        seen = 0
        sent_response = False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge()
            return message

        async def tracking_send(message):
            nonlocal sent_response
            if message["type"] == "http.response.start":
                sent_response = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not sent_response:
                await self._reject(send, 413, f"request body larger than {self.limit} bytes")

    @staticmethod
    async def _reject(send, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _printable(value: Any) -> Any:
    """``value`` with every string valid UTF-8 and every float finite, so it can be sent as JSON."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [_printable(v) for v in value]
    if isinstance(value, dict):
        return {_printable(str(k)): _printable(v) for k, v in value.items()}
    return value


class _TooLarge(Exception):
    pass


_STATUS = ((NotFound, 404), (Conflict, 409), (QueueFull, 429), (InvalidJob, 422), (SchedulingError, 422),
           (AgentError, 422))


def create_app(service: Service) -> FastAPI:
    """The FastAPI app of ``service``; the app's lifespan opens the service (unless already open)
    and closes it."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        opened_here = service.scheduler is None
        if opened_here:
            await run_in_threadpool(service.open)
        try:
            yield
        finally:
            if opened_here:
                await run_in_threadpool(service.close)

    app = FastAPI(title="gpualloc scheduler service", version=__version__, lifespan=lifespan,
                  description="Submit GPU jobs; a gpualloc scheduling policy allocates the cluster's devices "
                              "and a backend (local processes or Ray) runs them. Mutating endpoints need "
                              "`Authorization: Bearer <token>` (printed on first start, stored beside the store).")
    app.add_middleware(BodyLimit, limit=service.config.max_body_bytes)
    bearer = HTTPBearer(auto_error=False, description="The token from the file beside the store.")

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, err: RequestValidationError) -> Response:
        # FastAPI's own handler echoes the input, which may not be encodable (inf, lone surrogates).
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
                  for e in err.errors()]
        return Response(json.dumps({"detail": _printable(errors)}), status_code=422, media_type="application/json")

    @app.exception_handler(GpuallocError)
    async def _domain_error(_request: Request, err: GpuallocError) -> JSONResponse:
        for cls, status in _STATUS:
            if isinstance(err, cls):
                headers = {"Retry-After": "1"} if status == 429 else None
                return JSONResponse({"detail": str(err)}, status_code=status, headers=headers)
        return JSONResponse({"detail": str(err)}, status_code=503)

    def auth(request: Request, _cred: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if not token_matches(service.token, request.headers.get("authorization")):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    def store() -> Store:
        if service.store is None:
            raise ServiceError("the service is not open")
        return service.store

    @app.get("/health", summary="Liveness and a summary (no token needed)")
    def health() -> dict[str, Any]:
        sched = service.scheduler
        return {"status": "ok" if sched is not None and sched.status()["thread_alive"] else "starting",
                "version": __version__, "cluster": service.cluster.name,
                "backend": service.config.backend, "store": "sqlite" if sqlite_path(service.config.store) else "sql",
                "scheduler": None if sched is None else sched.status(),
                "queued_in_store": None if service.store is None else service.store.queued}

    @app.post("/jobs", status_code=201, response_model=JobOut, summary="Submit a job",
              responses={200: {"description": "Already submitted with this Idempotency-Key"},
                         401: {}, 413: {}, 422: {}, 429: {}})
    async def submit(spec: JobSpec, _: None = Depends(auth),
                     idempotency_key: str | None = Header(None, alias="Idempotency-Key", min_length=1, max_length=128,
                                                          description="Retries with the same key add no job.")
                     ) -> Response:
        norm = normalise_spec(spec, service.cluster, service.types)
        rec, created = await asyncio.wrap_future(store().submit_future(norm, idempotency_key))
        if created:
            service.scheduler.notify_submitted(rec)
        # Serialised here rather than re-validated through the response model (the hot path).
        return Response(json.dumps(_printable(rec.to_dict())), status_code=201 if created else 200,
                        media_type="application/json")

    @app.get("/jobs", response_model=list[JobOut], summary="List jobs (id order)")
    def list_jobs(state: list[JobState] | None = Query(None, description="Only these states."),
                  limit: int = Query(1000, ge=1, le=MAX_PAGE), offset: int = Query(0, ge=0, le=2**62)
                  ) -> list[dict[str, Any]]:
        return [_job(r) for r in store().list_jobs(state, limit=limit, offset=offset)]

    job_id_param = PathParam(ge=1, le=2**62, description="The job's id.")

    @app.get("/jobs/{job_id}", response_model=JobOut, summary="One job", responses={404: {}})
    def get_job(job_id: int = job_id_param) -> dict[str, Any]:
        return _job(store().get(job_id))

    @app.get("/jobs/{job_id}/events", summary="A job's state changes, oldest first", responses={404: {}})
    def job_events(job_id: int = job_id_param) -> list[dict[str, Any]]:
        store().get(job_id)
        return store().events(job_id)

    @app.post("/jobs/{job_id}/cancel", response_model=JobOut, summary="Cancel a job",
              responses={401: {}, 404: {}, 409: {}})
    def cancel_job(job_id: int = job_id_param, _: None = Depends(auth)) -> dict[str, Any]:
        rec = store().cancel(job_id)
        service.scheduler.notify_cancel(job_id)
        return _job(rec)

    @app.get("/cluster", summary="Devices, allocations and telemetry")
    def cluster() -> dict[str, Any]:
        allocs = store().allocations()
        down = set(service.scheduler.down_gpus()) if service.scheduler else set()
        counts = service.cluster.type_counts()
        devices = []
        for d in service.cluster.devices:
            owner = allocs.get(d.index)
            devices.append({"index": d.index, "node": service.cluster.nodes[d.node].name, "local_index": d.local_index,
                            "type": d.type.name, "label": d.label,
                            "state": "allocated" if owner else ("down" if d.index in down else "free"),
                            "job_id": owner[0] if owner else None})
        return {"name": service.cluster.name,
                "backend": service.backend.describe() if service.backend else None,
                "device_types": [{"name": n, "vendor": v, "ray_resource": r, "count": counts[n]}
                                 for n, v, r in zip(service.types.names, service.types.vendors, service.types.resources)],
                "devices": devices,
                "allocations": [{"device": g, "job_id": j, "attempt": a} for g, (j, a) in sorted(allocs.items())],
                "telemetry": service.telemetry_sample()}

    @app.get("/policy", summary="The current policy")
    def get_policy() -> dict[str, Any]:
        sched = service.scheduler
        return {"name": sched.policy_name, "options": sched.policy_options, "preemption": sched.preemption,
                "available": sorted(POLICIES)}

    @app.put("/policy", summary="Switch policy", responses={401: {}, 422: {}})
    def put_policy(change: PolicyChange, _: None = Depends(auth)) -> dict[str, Any]:
        service.scheduler.set_policy(change.name, change.options)
        return get_policy()

    return app
