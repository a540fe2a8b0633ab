"""Errors of the scheduler service. Each maps to one HTTP status in :mod:`gpualloc.service.app`."""

from __future__ import annotations

from gpualloc.errors import GpuallocError


class ServiceError(GpuallocError):
    """The service cannot do what was asked (bad configuration, unreadable store, ...)."""


class NotFound(ServiceError):
    """No job with that id (HTTP 404)."""


class Conflict(ServiceError):
    """The job is not in a state that allows the change (HTTP 409): cancelling a finished job,
    allocating a job that was cancelled meanwhile, a GPU that is already allocated."""


class QueueFull(ServiceError):
    """The queue holds as many jobs as the service accepts (HTTP 429)."""


class InvalidJob(ServiceError):
    """A job the cluster can never run: an unknown device type, more GPUs than any allowed type has
    (HTTP 422)."""


class BackendError(ServiceError):
    """The execution backend could not launch, poll or stop a run."""


class InvalidRequest(ServiceError):
    """A request the service refuses whatever the cluster's state (HTTP 422): a policy agent outside
    the agents folder, a paging cursor it did not make. The message starts with the field."""


class Forbidden(ServiceError):
    """The token is valid but its user may not do this (HTTP 403): a non-admin changing the policy."""
