"""A small HTTP client of the service (used by ``gpualloc submit`` / ``jobs`` / ``cancel`` / ``policy``).

:meth:`Client.submit` sends an ``Idempotency-Key`` and retries on connection errors, 5xx and 429
until ``retry_s`` runs out: the job is recorded exactly once, and a return means the service has
committed it to its store.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx

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


class Client:
    """The service at ``server`` (``http://127.0.0.1:8765``), with ``token`` for mutating calls."""

    def __init__(self, server: str, token: str | None = None, *, timeout_s: float = 30.0) -> None:
        if not server.startswith(("http://", "https://")):
            raise ClientError(f"server must be an http:// or https:// URL, got {server!r}")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server.rstrip("/")
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout_s, trust_env=False)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kw)
        except httpx.HTTPError as err:
            raise ClientError(f"{self.server}: {type(err).__name__}: {err}") from err
        if resp.status_code >= 400:
            raise ClientError(f"{method} {path}: HTTP {resp.status_code}: {_detail(resp)}", resp.status_code)
        return resp.json()

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")

    def submit(self, spec: dict[str, Any], *, idempotency_key: str | None = None, retry_s: float = 30.0) -> dict[str, Any]:
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
        """Every job (optionally of some states), fetched page by page."""
        out: list[dict[str, Any]] = []
        while True:
            params: list[tuple[str, Any]] = [("limit", page), ("offset", len(out))]
            params += [("state", s) for s in states or ()]
            batch = self._call("GET", "/jobs", params=params)
            out.extend(batch)
            if len(batch) < page:
                return out

    def job(self, job_id: int) -> dict[str, Any]:
        return self._call("GET", f"/jobs/{int(job_id)}")

    def events(self, job_id: int) -> list[dict[str, Any]]:
        return self._call("GET", f"/jobs/{int(job_id)}/events")

    def cancel(self, job_id: int) -> dict[str, Any]:
        return self._call("POST", f"/jobs/{int(job_id)}/cancel")

    def cluster(self) -> dict[str, Any]:
        return self._call("GET", "/cluster")

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
