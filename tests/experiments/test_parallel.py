"""Executors: serial, local processes and Ray give the same results in the same order."""

from __future__ import annotations

import json
import shutil
import tempfile

import pytest

from gpualloc.parallel import ProcessExecutor, RayExecutor, SerialExecutor, make_executor
from gpualloc.experiments.scheduling_table import SchedTableSpec, run_table
from tests.cli.test_cli import invoke

SPEC = SchedTableSpec(loads=(0.8,), seeds=2, jobs=30, policies=("fcfs", "sjf", "dqn"))


def square_after(x: tuple[int, float]) -> int:
    """Sleeps so that later items finish first: results must still come back in input order."""
    import time

    n, delay = x
    time.sleep(delay)
    return n * n


ITEMS = [(n, 0.05 * (4 - n)) for n in range(5)]


@pytest.fixture(scope="module")
def ray_executor(tmp_path_factory):
    """One local Ray for the module: 2 CPUs, no dashboard, its session folder under the test's tmp path.

    Ray puts unix sockets in its temp folder and socket paths are limited to ~107 bytes, so a long
    pytest tmp path (deep --basetemp, long user name) falls back to a short folder under /tmp.
    """
    pytest.importorskip("ray")
    temp = tmp_path_factory.mktemp("ray")
    short = len(str(temp)) > 40
    if short:
        temp = tempfile.mkdtemp(prefix="r", dir="/tmp")
    executor = RayExecutor(num_cpus=2, temp_dir=str(temp))
    yield executor
    executor.close()
    if short:
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def serial_table():
    return run_table(SPEC)["rows"]


def rows_json(rows) -> str:
    return json.dumps(rows, sort_keys=True)


def test_serial_executor_keeps_order_and_reports_each_result():
    seen = []
    assert SerialExecutor().map(square_after, ITEMS, on_result=lambda i, r: seen.append((i, r))) == [0, 1, 4, 9, 16]
    assert seen == [(0, 0), (1, 1), (2, 4), (3, 9), (4, 16)]


@pytest.mark.slow
def test_process_executor_keeps_order_when_items_finish_out_of_order():
    seen = []
    with ProcessExecutor(2) as ex:
        assert ex.map(square_after, ITEMS, on_result=lambda i, r: seen.append(i)) == [0, 1, 4, 9, 16]
        assert ex.map(square_after, []) == []
    assert sorted(seen) == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_ray_executor_keeps_order(ray_executor):
    seen = []
    assert ray_executor.map(square_after, ITEMS, on_result=lambda i, r: seen.append(i)) == [0, 1, 4, 9, 16]
    assert sorted(seen) == [0, 1, 2, 3, 4]


def test_make_executor_picks_by_options(ray_executor):
    assert isinstance(make_executor(False, None, None), SerialExecutor)
    assert isinstance(make_executor(False, None, 1), SerialExecutor)
    with make_executor(False, None, 2) as ex:
        assert isinstance(ex, ProcessExecutor) and ex.workers == 2
    with pytest.raises(ValueError):
        ProcessExecutor(0)
    joined = make_executor(True, None, 2)  # Ray is already up: joins it, and leaves it up on close
    assert isinstance(joined, RayExecutor)
    joined.close()
    assert ray_executor.map(square_after, [(3, 0.0)]) == [9]


@pytest.mark.slow
def test_run_table_rows_are_the_same_in_processes(serial_table):
    assert {r["policy"] for r in serial_table} == {"fcfs", "sjf", "dqn", "oracle-lb"}
    with ProcessExecutor(2) as ex:
        assert rows_json(run_table(SPEC, executor=ex)["rows"]) == rows_json(serial_table)


@pytest.mark.slow
def test_run_table_rows_are_the_same_on_ray(serial_table, ray_executor):
    progress = []
    rows = run_table(SPEC, executor=ray_executor, progress=progress.append)["rows"]
    assert rows_json(rows) == rows_json(serial_table)
    assert len(progress) == 2 * 3 and all(p.startswith("load 0.8 seed") for p in progress)


@pytest.mark.slow
def test_reproduce_scheduling_quick_on_ray(tmp_path, ray_executor, serial_table):
    doc = json.loads(invoke("reproduce", "scheduling", "--quick", "--ray", "--json", "--no-real-traces",
                            "--loads", "0.8", "--jobs", "30", "--out", str(tmp_path)).stdout)
    assert doc["spec"]["jobs"] == 30 and doc["spec"]["loads"] == [0.8]
    assert "--jobs 30" in doc["command"] and (tmp_path / "table.md").exists()
    assert doc["real_traces"] == "skipped: --no-real-traces" and doc["command"].endswith(" --no-real-traces")
    cli = {r["policy"]: r["avg_jct_s"] for r in doc["rows"] if r["knowledge"] == "oracle"}  # SPEC's level
    assert {r["policy"]: r["avg_jct_s"] for r in serial_table}.items() <= cli.items()
