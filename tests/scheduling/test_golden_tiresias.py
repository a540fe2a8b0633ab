"""Golden runs: Tiresias' 60-job trace under FCFS.

* On its own cluster (16 nodes x 4 GPUs) no job ever waits, so every JCT is the job's duration in
  the trace: checkable by hand.
* On 2 of those nodes (8 GPUs) jobs queue; the JCTs are stored in
  ``tests/data/tiresias60_fcfs_jct.json`` and every run must reproduce them exactly. They stay
  hand-checkable: on V100s (the reference device) a started job runs exactly its duration, so
  JCT = queueing delay + duration.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.metrics import jct_s, queueing_delay_s
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.simulator import simulate
from gpualloc.workload.traces import read_tiresias

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "tiresias60_fcfs_jct.json"
CLUSTER = """name = "tiresias-60"
network = "eth-10g"

[[nodes]]
devices = {V100 = 4}
count = {count}
"""


def cluster(tmp_path, nodes: int):
    spec = tmp_path / f"cluster{nodes}.toml"
    spec.write_text(CLUSTER.replace("{count}", str(nodes)))
    return load_cluster(spec)


@pytest.fixture
def run(shared_data, tmp_path):
    trace = read_tiresias(shared_data / "tiresias" / "60_job.csv")
    small = cluster(tmp_path, 2)
    return trace, lambda: simulate(trace, small, make_policy("fcfs"), check=True)


def test_on_its_own_cluster_every_jct_is_the_duration(shared_data, tmp_path):
    trace = read_tiresias(shared_data / "tiresias" / "60_job.csv")
    r = simulate(trace, cluster(tmp_path, 16), make_policy("fcfs"), check=True)
    np.testing.assert_array_equal(jct_s(r), [j.work_s for j in trace.jobs])


def test_same_jcts_on_every_run_and_golden(run):
    trace, go = run
    first, second = go(), go()
    np.testing.assert_array_equal(jct_s(first), jct_s(second))
    golden = json.loads(GOLDEN.read_text())
    assert list(first.job_ids) == golden["job_ids"]
    np.testing.assert_allclose(jct_s(first), golden["jct_s"], rtol=0, atol=1e-9)


def test_jct_is_queueing_plus_duration(run):
    trace, go = run
    r = go()
    duration = np.array([j.work_s for j in trace.jobs])
    np.testing.assert_allclose(jct_s(r), queueing_delay_s(r) + duration, rtol=1e-12)
    assert np.all(jct_s(r) >= duration) and np.any(queueing_delay_s(r) > 0)
    # the first job arrives to an empty cluster: its JCT is its duration (164 s in the trace)
    assert jct_s(r)[0] == pytest.approx(164.0)
