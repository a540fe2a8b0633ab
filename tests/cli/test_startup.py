"""Start-up stays light: the ``gpualloc`` command imports none of the heavy libraries until a command needs
them (``benchmarks/cli_startup.py`` times it; this test keeps the structure that makes it fast)."""

from __future__ import annotations

import socket
import subprocess
import sys

HEAVY = ("torch", "numpy", "pandas", "fastapi", "sqlalchemy", "scipy", "uvicorn", "gymnasium")

_PROBE = """
import sys
sys.argv = ["gpualloc", *sys.argv[1:]]
heavy = {heavy!r}
try:
    {body}
finally:
    print("loaded:" + ",".join(m for m in heavy if m in sys.modules), file=sys.stderr)
"""


def _run(body: str, *args: str) -> subprocess.CompletedProcess:
    code = _PROBE.format(heavy=HEAVY, body=body)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


def _loaded(proc: subprocess.CompletedProcess) -> list[str]:
    line = next(x for x in proc.stderr.splitlines() if x.startswith("loaded:"))
    return [m for m in line.removeprefix("loaded:").split(",") if m]


def test_importing_the_cli_imports_no_heavy_library():
    proc = _run("import gpualloc.cli.main")
    assert proc.returncode == 0, proc.stderr
    assert _loaded(proc) == []


def test_help_and_version_import_no_heavy_library():
    for flag in ("--help", "--version"):
        proc = _run("from gpualloc.cli.main import main; main()", flag)
        assert proc.returncode == 0, proc.stderr
        assert _loaded(proc) == [], flag


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_client_call_imports_no_server_library_and_fails_in_one_line():
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there: connection refused
    proc = _run("from gpualloc.cli.main import main; main()", "jobs", "--server", url)
    assert proc.returncode == 2
    errors = [x for x in proc.stderr.splitlines() if not x.startswith("loaded:")]
    assert len(errors) == 1 and errors[0].startswith("error: ") and "no service answers" in errors[0], proc.stderr
    assert _loaded(proc) == []
