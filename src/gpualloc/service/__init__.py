"""The scheduler as a service: the simulator's policies deciding on a real cluster.

* :mod:`~gpualloc.service.models`: job requests (pydantic) and records;
* :mod:`~gpualloc.service.store`: durable state (SQLite WAL by default, PostgreSQL by URL);
* :mod:`~gpualloc.service.backends`: where jobs run (``local`` processes, ``ray`` actors);
* :mod:`~gpualloc.service.runner`: one job attempt (argv without a shell, or a Python callable);
* :mod:`~gpualloc.service.scheduler`: the loop that asks a policy and records before acting;
* :mod:`~gpualloc.service.auth`: the bearer token;
* :mod:`~gpualloc.service.app`: the FastAPI app; :mod:`~gpualloc.service.client`: its HTTP client.

Nothing is imported here: a job's runner imports :mod:`~gpualloc.service.runner` alone.
"""
