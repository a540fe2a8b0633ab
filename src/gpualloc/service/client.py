"""A small HTTP client of the service (used by ``gpualloc submit`` / ``jobs`` / ``logs`` / ``cancel`` /
``policy``).

:meth:`Client.submit` sends an ``Idempotency-Key`` and retries on connection errors, 5xx and 429
until ``retry_s`` runs out: the job is recorded exactly once, and a return means the service has
committed it to its store.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpualloc._extras import missing_extra

try:
    import httpx
except ModuleNotFoundError as err:
    raise missing_extra("service", "the service client (gpualloc submit, jobs, logs, cancel, policy, whoami)") from err

from gpualloc.service.errors import ServiceError


class ClientError(ServiceError):
    """The service refused a request (``status`` is the HTTP status, 0 when it could not be reached)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _detail(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail")
    except (ValueError, AttributeError):
        return resp.text[:500]
    if isinstance(detail, list):  # FastAPI's validation errors
        return "; ".join(f"{'.'.join(str(p) for p in d.get('loc', ())[1:]) or 'body'}: {d.get('msg')}" for d in detail)
    return str(detail)


@dataclass(frozen=True)
class LogChunk:
    """Bytes of a job's log from ``offset``; ask from ``next_offset`` next.

    Attributes:
        data: the bytes.
        next_offset: where the next read starts.
        state: the job's state when read (its log is complete once the state is terminal).
        attempt: the attempt the log belongs to (a re-queued job writes a new log).
    """

    data: bytes
    next_offset: int
    state: str
    attempt: int


TERMINAL_STATES = frozenset({"finished", "failed", "cancelled"})
CONNECT_RETRY_S = 5.0
"""How long a refused connection is retried (a service just started may not listen yet)."""


class Client:
    """The service at ``server`` (``http://127.0.0.1:8765``), with ``token`` (every call but
    :meth:`health` needs it)."""

    def __init__(self, server: str, token: str | None = None, *, timeout_s: float = 30.0) -> None:
        if not server.startswith(("http://", "https://")):
            raise ClientError(f"server must be an http:// or https:// URL, got {server!r}")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server.rstrip("/")
        # Certificates are loaded for https only: a plain http:// base URL (redirects are not followed)
        # never negotiates TLS, and building the CA store costs ~40 ms of every CLI call.
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout_s, trust_env=False,
                                  verify=self.server.startswith("https://"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        # A service started a moment ago (`gpualloc serve ... &`) may not listen yet: a refused connection
        # is retried for CONNECT_RETRY_S (nothing was sent, so any request may be retried).
        deadline = time.monotonic() + CONNECT_RETRY_S
        while True:
            try:
                resp = self._http.request(method, path, **kw)
                break
            except httpx.ConnectError as err:  # the commonest case: nothing listens there
                if time.monotonic() + 0.1 < deadline:
                    time.sleep(0.1)
                    continue
                raise ClientError(f"{self.server}: no service answers ({err}); start one with `gpualloc serve`, "
                                  "or name its URL with --server / GPUALLOC_SERVER") from err
            except httpx.HTTPError as err:
                raise ClientError(f"{self.server}: {type(err).__name__}: {err}") from err
        if resp.status_code >= 400:
            raise ClientError(f"{method} {path}: HTTP {resp.status_code}: {_detail(resp)}", resp.status_code)
        return resp

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        return self._request(method, path, **kw).json()

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")

    def submit(self, spec: dict[str, Any], *, idempotency_key: str | None = None,
               retry_s: float = 30.0) -> dict[str, Any]:
        """Submit ``spec`` (the fields of :class:`~gpualloc.service.models.JobSpec`); the recorded job.

        Raises:
            ClientError: refused (4xx other than 429), or not recorded within ``retry_s``.
        """
        key = idempotency_key or uuid.uuid4().hex
        deadline = time.monotonic() + retry_s
        delay = 0.1
        while True:
            try:
                return self._call("POST", "/jobs", json=spec, headers={"Idempotency-Key": key})
            except ClientError as err:
                retryable = err.status == 0 or err.status == 429 or err.status >= 500
                if not retryable or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(2 * delay, 2.0)

    def jobs(self, states: list[str] | None = None, *, page: int = 1000) -> list[dict[str, Any]]:
        """Every job (optionally of some states), page by page, following ``X-Next-Cursor``."""
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: list[tuple[str, Any]] = [("limit", page), *(("state", s) for s in states or ())]
            if cursor is not None:
                params.append(("cursor", cursor))
            resp = self._request("GET", "/jobs", params=params)
            out.extend(resp.json())
            cursor = resp.headers.get("X-Next-Cursor")
            if cursor is None:
                return out

    def job(self, job_id: int) -> dict[str, Any]:
        return self._call("GET", f"/jobs/{int(job_id)}")

    def events(self, job_id: int) -> list[dict[str, Any]]:
        return self._call("GET", f"/jobs/{int(job_id)}/events")

    def logs(self, job_id: int, stream: str = "stdout", offset: int = 0) -> LogChunk:
        """Bytes of the job's ``stream`` (``"stdout"`` or ``"stderr"``) from ``offset``."""
        resp = self._request("GET", f"/jobs/{int(job_id)}/logs", params={"stream": stream, "offset": int(offset)})
        h = resp.headers
        return LogChunk(resp.content, int(h["X-Next-Offset"]), h["X-Job-State"], int(h["X-Job-Attempt"]))

    def follow_logs(self, job_id: int, stream: str = "stdout", *, follow: bool = True,
                    poll_s: float = 0.5) -> Iterator[bytes]:
        """The job's ``stream`` in pieces, as it grows; with ``follow``, until the job has ended and
        all of its output was read (a new attempt's log is followed from its start)."""
        offset, attempt = 0, None
        while True:
            chunk = self.logs(job_id, stream, offset)
            if attempt is not None and chunk.attempt != attempt:  # re-queued: a new log, from 0
                offset, attempt = 0, chunk.attempt
                continue
            attempt = chunk.attempt
            if chunk.data:
                yield chunk.data
                offset = chunk.next_offset
                continue  # more may be waiting beyond one response
            if not follow or chunk.state in TERMINAL_STATES:
                return
            time.sleep(poll_s)

    def cancel(self, job_id: int) -> dict[str, Any]:
        return self._call("POST", f"/jobs/{int(job_id)}/cancel")

    def me(self) -> dict[str, Any]:
        """Who the token belongs to: ``{"user", "team", "admin"}``."""
        return self._call("GET", "/me")

    def policy(self) -> dict[str, Any]:
        return self._call("GET", "/policy")

    def set_policy(self, name: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._call("PUT", "/policy", json={"name": name, "options": options or {}})

    def wait_healthy(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Poll ``/health`` until it answers ``ok``.

        Raises:
            ClientError: not healthy within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                h = self.health()
                if h.get("status") == "ok":
                    return h
                last = f"status {h.get('status')}"
            except ClientError as err:
                last = str(err)
            time.sleep(0.1)
        raise ClientError(f"{self.server} not healthy within {timeout_s:g} s: {last}")
