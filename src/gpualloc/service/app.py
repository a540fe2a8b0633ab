"""The HTTP API (FastAPI) over one :class:`Service`.

Every endpoint but ``GET /health`` needs ``Authorization: Bearer <token>``, ``/openapi.json``
included (an ASGI middleware checks it before anything else, so a new endpoint cannot forget it):

=======  ==========================  ==========================================================
GET      ``/health``                 liveness and a summary; no token
GET      ``/me``                     who the token is: user, team, admin
POST     ``/jobs``                   submit (201; 200 when ``Idempotency-Key`` was seen with the same body)
GET      ``/jobs``                   list (``state``, ``limit``, ``cursor``); ``X-Next-Cursor`` when more
GET      ``/jobs/{id}``              one job (``env`` values and idempotency keys are never shown)
GET      ``/jobs/{id}/events``       its state changes
GET      ``/jobs/{id}/logs``         its ``stdout``/``stderr`` bytes from ``offset`` (latest attempt)
POST     ``/jobs/{id}/cancel``       cancel (a queued job at once, a running one is stopped)
GET      ``/cluster``                devices, allocations, telemetry
GET      ``/policy``                 the current policy and the ones available
PUT      ``/policy``                 switch policy (admins only; a ``dqn`` agent only from the agents folder)
GET      ``/openapi.json``           the schema
=======  ==========================  ==========================================================

**Users and teams.** A token is the bootstrap admin's (the token file beside the store) or a stored
user's (:mod:`gpualloc.service.users`). Jobs record the submitter's user and team from the token. A
user who is not an admin lists, reads, follows the logs of and cancels only their own team's jobs: a
job of another team answers 404, exactly as a job that does not exist, so its id is not revealed;
``GET /cluster`` shows other teams' allocations without their job ids. Only admins may ``PUT
/policy`` (403 otherwise).

A request whose ``Host`` header does not name the bound address is refused with 400 (DNS
rebinding). ``/docs`` and ``/redoc`` exist only with ``ServiceConfig.docs`` (their assets come from
a CDN). Errors are JSON ``{"detail": ...}``: 400 bad Host, 401 bad token, 403 not allowed to this user
(a non-admin changing the policy, a team the quota file does not name), 404 no such job, 409 wrong
state or an idempotency key reused for another body, 413 body too large, 422 invalid request,
429 queue full.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import fcntl
import importlib.util
import ipaddress
import json
import logging
import math
import os
import re
import socket
import threading
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from gpualloc._extras import missing_extra

try:
    from fastapi import APIRouter, Depends, FastAPI, Header, Path as PathParam, Query, Request, Response
    from fastapi.concurrency import run_in_threadpool
    from fastapi.exceptions import RequestValidationError
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import HTMLResponse, JSONResponse
    from fastapi.security import HTTPBearer
except ModuleNotFoundError as err:
    raise missing_extra("service", "gpualloc serve") from err

from gpualloc import __version__
from gpualloc.errors import AgentError, GpuallocError, SchedulingError
from gpualloc.hardware.cluster import ClusterSpec, load_cluster
from gpualloc.hardware.slurm import slurm_cluster_arg
from gpualloc.scheduling.knowledge import check_knowledge, require_policy
from gpualloc.scheduling.policies import POLICIES
from gpualloc.scheduling.quotas import Quotas
from gpualloc.service.auth import (check_store_files, default_store, default_token_path, load_or_create_token,
                                   token_matches)
from gpualloc.service.backends import Backend, host_device_indices, make_backend
from gpualloc.service.config import ServiceConfig
from gpualloc.service.slurm import AdviceRequest, advise
from gpualloc.service.errors import Conflict, Forbidden, InvalidJob, InvalidRequest, NotFound, QueueFull, ServiceError
from gpualloc.service.models import JobOut, JobRecord, JobSpec, JobState, PolicyChange
from gpualloc.service.scheduler import DeviceTypes, Scheduler, check_policy_name, normalise_spec, stored_policy
from gpualloc.service.store import Store, sqlite_path
from gpualloc.service.users import BOOTSTRAP, NO_TEAM, User, bearer

log = logging.getLogger("gpualloc.service")

MAX_PAGE = 10_000
"""Most jobs one ``GET /jobs`` returns."""
MAX_LOG_CHUNK = 1 << 20
"""Most log bytes one ``GET /jobs/{id}/logs`` returns."""
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
"""``Host`` names accepted for a loopback bind, besides the bound one."""
PUBLIC_PATHS = frozenset({"/health"})
"""The only paths served without the token (plus ``/docs`` and ``/redoc`` when turned on)."""
DOCS_PATHS = frozenset({"/docs", "/redoc"})


def bundled_agents_dir() -> Path:
    """``gpualloc/rl/data``: the scheduling agents shipped with the package (found without importing
    the learning code, which pulls in torch)."""
    spec = importlib.util.find_spec("gpualloc.rl")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


class Service:
    """The running parts: store, token, backend, scheduler, telemetry.

    :meth:`open` reconciles with the backend before it returns, so the API answers only once every
    job of the store is accounted for.
    """

    def __init__(self, config: ServiceConfig, *, cluster: ClusterSpec | None = None) -> None:
        if config.store is None:
            config = replace(config, store=default_store())
        self.config = config
        self.cluster = cluster if cluster is not None else load_cluster(config.cluster)
        check_knowledge(config.knowledge)
        if config.policy is not None:  # before open() makes a store or a token
            check_policy_name(config.policy)
            require_policy(config.policy, config.knowledge, self.checked_policy_options(config.policy_options))
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
        self.quotas: Quotas | None = None
        self.quota_teams: frozenset[str] | None = None
        if config.quotas is not None:  # before open(): a bad file is one line, and nothing is made
            self.quotas = Quotas.from_file(config.quotas)
            self.quotas.check(self.cluster)
            self.quota_teams = frozenset(t.name for t in self.quotas.teams)

    def open(self) -> Service:
        cfg = self.config
        path = sqlite_path(cfg.store)
        try:
            if path is not None:
                check_store_files(path, private_folder=cfg.job_users is not None and cfg.job_users.switches)
                self._lock(path)
            self.token, self.token_created = load_or_create_token(self.token_path)
            self.store = Store(cfg.store, max_queued=cfg.max_queued, synchronous=cfg.synchronous)
            # what `gpualloc user add` checks a new user's team against
            self.store.set_meta("quota_teams", json.dumps(
                {"file": cfg.quotas, "teams": None if self.quota_teams is None else sorted(self.quota_teams)}))
            base = path if path is not None else Path(self.token_path)
            runs = Path(cfg.runs_dir) if cfg.runs_dir else base.with_name(base.name + ".runs")
            host = host_device_indices([d.type.vendor for d in self.cluster.devices])  # one host holding every node
            if cfg.backend == "ray":
                options: dict[str, Any] = {
                    "resources": dict(zip(self.types.names, self.types.resources, strict=False)),
                    "instance": self.store.uid,
                    "address": cfg.ray_address, "num_cpus": cfg.ray_num_cpus, "log_dir": runs,
                    "temp_dir": f"/tmp/gr-{self.store.uid}",
                    # a Ray started here holds every node on this host: device indices host-wide
                    "host_indices": None if cfg.ray_address else {
                        (d.node, d.local_index): h for d, h in zip(self.cluster.devices, host, strict=True)},
                    "local_resources": {res: float(n) for res, n in zip(
                        self.types.resources, [self.cluster.type_counts()[t] for t in self.types.names], strict=False)}}
            elif cfg.backend == "slurm":  # the partition of a slurm:PART cluster
                partition = slurm_cluster_arg(cfg.cluster)
                options = {"runs_dir": runs, "instance": self.store.uid, "cluster": self.cluster,
                           "partition": partition if isinstance(partition, str) else None}
            else:  # every node on this host: device indices host-wide, per vendor
                options = {"runs_dir": runs, "job_users": cfg.job_users, "host_indices": host}
            self.backend = make_backend(cfg.backend, **options)
            name, popts = cfg.policy, cfg.policy_options
            if name is None:
                name, popts = stored_policy(self.store) or ("fcfs", {})
            popts = self.checked_policy_options(popts)
            self.scheduler = Scheduler(self.store, self.backend, self.cluster, policy=name, policy_options=popts,
                                       tick_s=cfg.tick_s, on_lost=cfg.on_lost, max_attempts=cfg.max_attempts,
                                       preemption=cfg.preemption, quotas=self.quotas, knowledge=cfg.knowledge,
                                       default_limit_s=cfg.default_time_limit_s,
                                       predictor_options=cfg.predictor_options, migrate=cfg.migrate)
            self.recovery = self.scheduler.start()
            self._open_telemetry()
        except BaseException:
            self.close()
            raise
        return self

    @property
    def agents_dir(self) -> Path:
        return Path(self.config.agents_dir) if self.config.agents_dir else bundled_agents_dir()

    def checked_policy_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` with ``agent`` (if any) resolved to a file inside :attr:`agents_dir`.

        Loading an agent unpickles it, so only the operator's folder may provide one.

        Raises:
            InvalidRequest: ``agent`` is not a string naming a file in that folder (links followed).
        """
        agent = options.get("agent")
        if agent is None:
            return dict(options)
        root = self.agents_dir.resolve()
        path = (root / agent).resolve() if isinstance(agent, str) and agent and "\x00" not in agent else None
        if path is None or not path.is_relative_to(root) or not path.is_file():
            raise InvalidRequest(f"options.agent: {_printable(str(agent))[:300]!r} is not an agent file in {root} "
                                 f"(the service loads agents only from its --agents-dir)")
        return {**options, "agent": str(path)}

    async def authenticate(self, authorization: str | None) -> User | None:
        """The holder of the ``Authorization`` header's bearer token: the bootstrap admin for the
        token file's token (compared in constant time), else the stored user whose token it is, else
        None. Looked up on every request, so a removed user or a rotated token is refused at once."""
        if not self.token:
            return None
        if token_matches(self.token, authorization):
            return BOOTSTRAP
        given = bearer(authorization)
        if given is None or self.store is None or len(given) > 512:
            return None
        return await run_in_threadpool(self.store.user_by_token, given)

    def check_team(self, user: User) -> None:
        """Refuse a submission of a team the quota file does not name (the bootstrap admin's jobs,
        of no team, run on borrowed capacity only).

        Raises:
            Forbidden: quotas are on and ``user``'s team has none.
        """
        if self.quota_teams is not None and user.team != NO_TEAM and user.team not in self.quota_teams:
            raise Forbidden(f"team {user.team!r} has no quota in {self.config.quotas} (teams: "
                            f"{', '.join(sorted(self.quota_teams)) or 'none'}); ask an admin to add it")

    def check_quota_fit(self, user: User, spec: dict[str, Any]) -> None:
        """With borrowing off, refuse a job larger than its team's quota of every type it may use (it
        could never start).

        Raises:
            InvalidJob: naming the team, the GPUs asked and the quotas.
        """
        if self.quotas is None or self.quotas.borrowing:
            return
        names, q, _ = self.quotas.matrix(self.types.names)
        k = names.index(user.team) if user.team in names else 0
        allowed = spec["gpu_types"] or list(self.types.names)
        if not any(spec["num_gpus"] <= q[k, self.types.names.index(t)] for t in allowed):
            have = ", ".join(f"{t} {int(q[k, self.types.names.index(t)])}" for t in allowed)
            raise InvalidJob(f"num_gpus: {spec['num_gpus']} GPUs is more than team {user.team or '(none)'!r} may "
                             f"hold ({have}) and {self.config.quotas} turns borrowing off")

    def predictions(self, records: list[JobRecord]) -> list[dict[str, Any] | None]:
        """Each record's predicted remaining run time (:meth:`StoreHistory.describe
        <gpualloc.service.prediction.StoreHistory.describe>`), None where there is none."""
        history = None if self.scheduler is None else self.scheduler.history
        if history is None:
            return [None] * len(records)
        return history.describe(records)

    def job_for(self, user: User, job_id: int) -> JobRecord:
        """Job ``job_id`` if ``user`` may see it.

        Raises:
            NotFound: no such job, or one of another team (the same answer: a job id of another team
                is not revealed).
        """
        rec = self.store.get(job_id)
        if not user.sees(rec.team):
            raise NotFound(f"no job {job_id}")
        return rec

    def read_log(self, job_id: int, stream: str, offset: int, limit: int) -> tuple[bytes, dict[str, str]]:
        """Bytes ``offset`` .. ``offset + limit`` of the latest attempt's ``stream``, and headers
        saying where the log ends and where the job is (``X-Next-Offset``, ``X-Log-Size``,
        ``X-Job-State``, ``X-Job-Attempt``). A job not started yet has an empty log.

        Raises:
            NotFound: no such job.
        """
        rec = self.store.get(job_id)
        data, size = b"", 0
        path = self.backend.log_path(rec.handle, stream) if rec.handle and self.backend else None
        if path is not None:
            try:
                with open(path, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    if offset < size:  # past the end there is nothing (and a far offset is EINVAL to seek)
                        fh.seek(offset)
                        data = fh.read(limit)
            except FileNotFoundError:
                pass
        return data, {"X-Next-Offset": str(offset + len(data)), "X-Log-Size": str(size),
                      "X-Job-State": rec.state.value, "X-Job-Attempt": str(rec.attempts)}

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

        kind = "nvml" if name == "auto" else name
        try:
            self.telemetry = open_backend(kind, **({"cluster": self.cluster} if kind == "sim" else {}))
            self.telemetry_name = kind
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


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening), for the server to take over: binding
    it first lets ``gpualloc serve`` fail before it prints or writes anything.

    Raises:
        ServiceError: the host does not resolve, or the port is in use or not allowed.
    """
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as err:
        raise ServiceError(f"--host {host!r}: cannot resolve it: {err}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a listening socket still refuses
    try:
        sock.bind(addr)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise ServiceError(f"cannot listen on {host}:{port}: port {port} is in use") from None
        raise ServiceError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    return sock


def _split_host(value: str) -> tuple[str, str | None] | None:
    """``Host`` header -> ``(host, port or None)``, host lower-case without IPv6 brackets; None if
    malformed."""
    m = re.fullmatch(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[^:\[\]]+))(?::(?P<port>\d{1,5}))?", value)
    if m is None:
        return None
    return (m["v6"] or m["name"]).lower().rstrip("."), m["port"]


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostCheck:
    """ASGI middleware: refuse (400) a request whose ``Host`` header names another host than the one
    bound, so a web page whose DNS name was rebound to this address cannot reach the API.

    Accepted: the bound host; for a loopback bind also ``localhost``, ``127.0.0.1`` and ``[::1]``; for
    a wildcard bind (``0.0.0.0``, ``::``) those, this machine's name and any IP address (a rebinding
    page has a DNS name); ``allowed`` names. The port, when given, must be the bound one.
    """

    def __init__(self, app, host: str, port: int | None, allowed: tuple[str, ...] = ()) -> None:
        self.app, self.port = app, port
        bound = host.strip("[]").lower()
        names = {bound, *(a.lower() for a in allowed)}
        wildcard = bound in ("", "0.0.0.0", "::")
        if wildcard or bound == "localhost" or (_is_ip(bound) and ipaddress.ip_address(bound).is_loopback):
            names |= LOOPBACK_HOSTS
        if wildcard:
            names.add(socket.gethostname().lower())
        self.names, self.any_ip = frozenset(names), wildcard

    def allows(self, header: str) -> bool:
        parts = _split_host(header)
        if parts is None:
            return False
        name, port = parts
        if port is not None and self.port is not None and int(port) != self.port:
            return False
        return name in self.names or (self.any_ip and _is_ip(name))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        header = next((v for k, v in scope.get("headers", ()) if k == b"host"), b"").decode("latin-1")
        if not self.allows(header):
            return await _reply(send, 400, f"Host header {header[:100]!r} does not name this service")
        return await self.app(scope, receive, send)


USER_KEY = "gpualloc.user"
"""Where :class:`RequireToken` leaves the request's :class:`~gpualloc.service.users.User` in the ASGI scope."""


class RequireToken:
    """ASGI middleware: every path but ``public`` needs ``Authorization: Bearer <token>`` (401),
    checked before the request is routed or its body read. ``authenticate(header)`` returns the
    token's :class:`~gpualloc.service.users.User` or None; the user is left in ``scope[USER_KEY]``
    for the routes (:func:`current_user`)."""

    def __init__(self, app, authenticate, public: frozenset[str]) -> None:
        self.app, self.authenticate, self.public = app, authenticate, public

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in self.public:
            return await self.app(scope, receive, send)
        auth = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        user = await self.authenticate(None if auth is None else auth.decode("latin-1"))
        if user is None:
            return await _reply(send, 401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")])
        scope[USER_KEY] = user
        return await self.app(scope, receive, send)


def current_user(request: Request) -> User:
    """The user :class:`RequireToken` authenticated for this request."""
    return request.scope[USER_KEY]


async def _reply(send, status: int, detail: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def _cursor(job_id: int) -> str:
    """The opaque ``X-Next-Cursor`` of a page ending at ``job_id``."""
    return base64.urlsafe_b64encode(f"after:{job_id}".encode()).decode().rstrip("=")


def _after_id(cursor: str) -> int:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (ValueError, UnicodeError):
        text = ""
    m = re.fullmatch(r"after:(\d{1,18})", text)
    if m is None:
        raise InvalidRequest("cursor: not a cursor this service gave (copy it from X-Next-Cursor)")
    return int(m[1])


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
                    return await _reply(send, 400, "bad Content-Length header")
                if too_big:
                    return await _reply(send, 413, f"request body larger than {self.limit} bytes")
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
                await _reply(send, 413, f"request body larger than {self.limit} bytes")


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


_STATUS = ((NotFound, 404), (Forbidden, 403), (Conflict, 409), (QueueFull, 429), (InvalidJob, 422),
           (InvalidRequest, 422),
           (SchedulingError, 422), (AgentError, 422))


def create_app(service: Service) -> FastAPI:
    """The FastAPI app of ``service``; the app's lifespan opens the service (unless already open)
    and closes it."""
    cfg = service.config
    app = FastAPI(title="gpualloc scheduler service", version=__version__, lifespan=_lifespan(service),
                  openapi_url=None, docs_url=None, redoc_url=None,
                  description="Submit GPU jobs; a gpualloc scheduling policy allocates the cluster's devices "
                              "and a backend (local processes or Ray) runs them. Every endpoint but `/health` "
                              "needs `Authorization: Bearer <token>` (printed on first start, stored beside "
                              "the store).")
    # Outermost last: the Host check, then the token, then the body limit.
    app.add_middleware(BodyLimit, limit=cfg.max_body_bytes)
    app.add_middleware(RequireToken, authenticate=service.authenticate,
                       public=PUBLIC_PATHS | (DOCS_PATHS if cfg.docs else frozenset()))
    app.add_middleware(HostCheck, host=cfg.host, port=cfg.port, allowed=tuple(cfg.allowed_hosts))
    _add_error_handlers(app)
    _add_health(app, service)
    # RequireToken enforces the token; this dependency only declares it in the OpenAPI schema.
    api = APIRouter(dependencies=[Depends(HTTPBearer(auto_error=False,
                                                      description="The token from the file beside the store."))],
                    responses={401: {"description": "Missing or wrong bearer token"}})
    _add_job_routes(api, service)
    _add_cluster_routes(api, service)

    @api.get("/openapi.json", include_in_schema=False)
    def openapi() -> dict[str, Any]:
        return app.openapi()

    app.include_router(api)
    if cfg.docs:
        _add_docs(app)
    return app


def _lifespan(service: Service):
    """The app's lifespan: opens ``service`` unless it is already open, and then closes it."""

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

    return lifespan


def _add_error_handlers(app: FastAPI) -> None:
    """Invalid requests and domain errors as JSON ``{"detail": ...}`` with the status of :data:`_STATUS`."""

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


def _open_store(service: Service) -> Store:
    if service.store is None:
        raise ServiceError("the service is not open")
    return service.store


def _add_health(app: FastAPI, service: Service) -> None:
    cfg = service.config

    @app.get("/health", summary="Liveness and a summary (no token needed)")
    def health() -> dict[str, Any]:
        sched = service.scheduler
        return {"status": "ok" if sched is not None and sched.status()["thread_alive"] else "starting",
                "version": __version__, "cluster": service.cluster.name,
                "backend": cfg.backend, "store": "sqlite" if sqlite_path(cfg.store) else "sql",
                "scheduler": None if sched is None else sched.status(),
                "queued_in_store": None if service.store is None else service.store.queued}


def _add_job_routes(api: APIRouter, service: Service) -> None:
    """``/jobs`` and ``/jobs/{id}/...``."""

    def store() -> Store:
        return _open_store(service)

    @api.post("/jobs", status_code=201, response_model=JobOut, summary="Submit a job",
              responses={200: {"description": "Already submitted with this Idempotency-Key and this body"},
                         409: {"description": "This Idempotency-Key was used with another body"},
                         413: {}, 422: {}, 429: {}})
    async def submit(spec: JobSpec, request: Request,
                     idempotency_key: str | None = Header(None, alias="Idempotency-Key", min_length=1, max_length=128,
                                                          description="Retries with the same key add no job.")
                     ) -> Response:
        user = current_user(request)
        service.check_team(user)
        norm = normalise_spec(spec, service.cluster, service.types)
        service.check_quota_fit(user, norm)
        rec, created = await asyncio.wrap_future(store().submit_future(norm, idempotency_key, user=user.name,
                                                                       team=user.team))
        if created:
            service.scheduler.notify_submitted(rec)
        # Serialised here rather than re-validated through the response model (the hot path).
        return Response(json.dumps(_printable(rec.to_api())), status_code=201 if created else 200,
                        media_type="application/json")

    @api.get("/jobs", response_model=list[JobOut], summary="List jobs (id order), one page",
             description="At most `limit` jobs. When there are more, the `X-Next-Cursor` response header holds "
                         "an opaque cursor: pass it as `cursor` for the next page (no header: the last page).")
    def list_jobs(response: Response, request: Request,
                  state: list[JobState] | None = Query(None, description="Only these states."),
                  limit: int = Query(1000, ge=1, le=MAX_PAGE),
                  cursor: str | None = Query(None, min_length=1, max_length=64,
                                             description="`X-Next-Cursor` of the previous page."),
                  offset: int = Query(0, ge=0, le=2**62, description="Skip this many (after `cursor`).")
                  ) -> list[dict[str, Any]]:
        after = None if cursor is None else _after_id(cursor)
        user = current_user(request)
        recs = store().list_jobs(state, limit=limit + 1, offset=offset, after_id=after,
                                 team=None if user.admin else user.team)
        if len(recs) > limit:
            recs = recs[:limit]
            response.headers["X-Next-Cursor"] = _cursor(recs[-1].id)
        return [r.to_api(p) for r, p in zip(recs, service.predictions(recs), strict=True)]

    job_id_param = PathParam(ge=1, le=2**62, description="The job's id.")

    @api.get("/jobs/{job_id}", response_model=JobOut, summary="One job", responses={404: {}})
    def get_job(request: Request, job_id: int = job_id_param) -> dict[str, Any]:
        rec = service.job_for(current_user(request), job_id)
        return rec.to_api(service.predictions([rec])[0])

    @api.get("/jobs/{job_id}/events", summary="A job's state changes, oldest first", responses={404: {}})
    def job_events(request: Request, job_id: int = job_id_param) -> list[dict[str, Any]]:
        service.job_for(current_user(request), job_id)
        return store().events(job_id)

    @api.get("/jobs/{job_id}/logs", summary="A job's output, from a byte offset", response_class=Response,
             responses={200: {"content": {"application/octet-stream": {}},
                              "description": "The bytes; headers `X-Next-Offset` (ask from there next), "
                                             "`X-Log-Size`, `X-Job-State`, `X-Job-Attempt` (a new attempt "
                                             "starts a new log)."},
                        404: {}})
    def job_logs(request: Request, job_id: int = job_id_param, stream: Literal["stdout", "stderr"] = Query("stdout"),
                 offset: int = Query(0, ge=0, le=2**62), limit: int = Query(MAX_LOG_CHUNK, ge=1, le=MAX_LOG_CHUNK)
                 ) -> Response:
        service.job_for(current_user(request), job_id)
        data, headers = service.read_log(job_id, stream, offset, limit)
        return Response(data, media_type="application/octet-stream", headers=headers)

    @api.post("/jobs/{job_id}/cancel", response_model=JobOut, summary="Cancel a job", responses={404: {}, 409: {}})
    def cancel_job(request: Request, job_id: int = job_id_param) -> dict[str, Any]:
        service.job_for(current_user(request), job_id)
        rec = store().cancel(job_id)
        service.scheduler.notify_cancel(job_id)
        return rec.to_api()


def _add_cluster_routes(api: APIRouter, service: Service) -> None:
    """``/cluster`` and ``/policy``."""

    @api.get("/me", summary="Who the token belongs to: user, team, admin")
    def me(request: Request) -> dict[str, Any]:
        return current_user(request).to_api()

    @api.get("/cluster", summary="Devices, allocations and telemetry (other teams' job ids hidden unless admin)")
    def cluster(request: Request) -> dict[str, Any]:
        return _cluster_summary(service, current_user(request))

    @api.get("/policy", summary="The current policy")
    def get_policy() -> dict[str, Any]:
        sched = service.scheduler
        return {"name": sched.policy_name, "options": sched.policy_options, "preemption": sched.preemption,
                "knowledge": sched.knowledge, "available": sorted(POLICIES)}

    @api.put("/policy", summary="Switch policy (admins only)", responses={403: {}, 422: {}})
    def put_policy(change: PolicyChange, request: Request) -> dict[str, Any]:
        user = current_user(request)
        if not user.admin:
            raise Forbidden(f"only an admin may change the policy (user {user.name!r} of team {user.team!r} is "
                            "not one)")
        service.scheduler.set_policy(change.name, service.checked_policy_options(change.options))
        return get_policy()

    @api.post("/advise", summary="Which GPUs a job run by another scheduler should get (Slurm's job_submit "
                                 "plugin asks this)", responses={422: {}})
    def post_advise(request: AdviceRequest) -> dict[str, Any]:
        return advise(service.scheduler, service.backend, request)


def _cluster_summary(service: Service, user: User = BOOTSTRAP) -> dict[str, Any]:
    """The body of ``GET /cluster``: device types, each device's state, allocations, telemetry. A job
    id of a team ``user`` may not see is shown as None (the GPU still shows as allocated)."""
    store = _open_store(service)
    allocs = store.allocations()
    if not user.admin:
        teams = store.teams_of(j for j, _ in allocs.values())
        allocs = {g: (j if user.sees(teams.get(j)) else None, a) for g, (j, a) in allocs.items()}
    down = set(service.scheduler.down_gpus()) if service.scheduler else set()
    counts = service.cluster.type_counts()
    devices = []
    for d in service.cluster.devices:
        owner = allocs.get(d.index)
        devices.append({"index": d.index, "node": service.cluster.nodes[d.node].name, "local_index": d.local_index,
                        "type": d.type.name, "label": d.label,
                        "state": "allocated" if owner else ("down" if d.index in down else "free"),
                        "job_id": owner[0] if owner else None})
    types = service.types
    return {"name": service.cluster.name,
            "backend": service.backend.describe() if service.backend else None,
            "device_types": [{"name": n, "vendor": v, "ray_resource": r, "count": counts[n]}
                             for n, v, r in zip(types.names, types.vendors, types.resources, strict=False)],
            "devices": devices,
            "allocations": [{"device": g, "job_id": j, "attempt": a if j is not None else None}
                            for g, (j, a) in sorted(allocs.items())],
            "telemetry": service.telemetry_sample()}


REDOC_JS = "https://cdn.jsdelivr.net/npm/redoc@2/bundles/redoc.standalone.js"


def _add_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and ``/redoc``, assets from a CDN. A browser cannot send the bearer
    token for the schema, so each page carries the schema in itself (no job data is in it)."""

    @app.get("/docs", include_in_schema=False)
    def swagger() -> HTMLResponse:
        # Swagger UI reads `spec` instead of fetching `url` when it is given.
        return get_swagger_ui_html(openapi_url="", title=f"{app.title} - Swagger UI",
                                   swagger_ui_parameters={"spec": app.openapi()})

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        # Escaped so that no "</script>" inside a string can end the element.
        spec = json.dumps(app.openapi()).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        return HTMLResponse(f"""<!DOCTYPE html><html><head><title>{app.title} - ReDoc</title>
<meta charset="utf-8"/></head><body><div id="redoc"></div><script src="{REDOC_JS}"></script>
<script>Redoc.init({spec}, {{}}, document.getElementById("redoc"))</script></body></html>""")
