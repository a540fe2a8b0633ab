"""A policy of one's own, named ``package.module:factory``: imported from the current folder, run by the
same simulator (every decision checked) and compared in the same table as the built-in policies."""

from __future__ import annotations

import json
import textwrap
import uuid

import numpy as np
import pytest

from gpualloc.errors import SchedulingError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling import metrics
from gpualloc.scheduling.policies import make_policy, policy_options
from gpualloc.scheduling.simulator import simulate
from gpualloc.workload.traces import generate

from tests.cli.test_cli import run_main

SOURCE = textwrap.dedent('''
    from gpualloc.scheduling.base import Decision
    from gpualloc.scheduling.policies.simple import SJF


    class MySJF(SJF):
        """The built-in SJF under another name: the known answer."""
        name = "my-sjf"


    def make(width=1):
        return MySJF()


    class DoubleBooks:
        name = "double-books"
        preemptive = False
        round_s = None

        def decide(self, view):
            return Decision([(j, (0,)) for j in view.queue])


    class NoRound:
        name = "no-round"
        preemptive = False

        def decide(self, view):
            return Decision([])


    def broken():
        raise RuntimeError("cannot build")

    NOT_CALLABLE = 3
''')


@pytest.fixture
def own(tmp_path, monkeypatch) -> str:
    """A fresh module (a new name each time: imports are cached) in the current folder; its name."""
    name = f"ownpol_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(SOURCE)
    monkeypatch.chdir(tmp_path)
    return name


def test_own_policy_runs_like_the_builtin_it_copies(own):
    cluster = load_cluster("adlro16")
    trace = generate(80, cluster, 0.9, seed=3)
    mine = simulate(trace, cluster, make_policy(f"{own}:MySJF"), check=True)
    builtin = simulate(trace, cluster, make_policy("sjf"), check=True)
    assert mine.policy == "my-sjf"
    assert metrics.summary(mine)["avg_jct_s"] == metrics.summary(builtin)["avg_jct_s"]
    assert make_policy(f"{own}:make", width=2).name == "my-sjf"  # options go to the factory
    assert policy_options(f"{own}:make") == frozenset() and "agent" in policy_options("dqn")


@pytest.mark.parametrize(("attr", "needle"), [
    ("NoSuch", "has no callable 'NoSuch'"),
    ("NOT_CALLABLE", "has no callable 'NOT_CALLABLE'"),
    ("broken", "broken() failed: RuntimeError: cannot build"),
    ("NoRound", "NoRound lacks round_s"),
])
def test_own_policy_faults_are_one_line(own, attr, needle):
    with pytest.raises(SchedulingError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        make_policy(f"{own}:{attr}")


def test_unknown_module_and_plain_names():
    with pytest.raises(SchedulingError, match="cannot import 'gpualloc_no_such_pkg'"):
        make_policy("gpualloc_no_such_pkg:Policy")
    with pytest.raises(SchedulingError, match=r"unknown policy 'nope' \(known: "):
        make_policy("nope")


def test_own_policy_decisions_are_checked(own):
    cluster = load_cluster("2xV100")
    trace = generate(6, cluster, 2.0, seed=0)
    with pytest.raises(SchedulingError, match=r"policy double-books: job .*: GPU 0 is not free"):
        simulate(trace, cluster, make_policy(f"{own}:DoubleBooks"))


def test_cli_compares_an_own_policy(own):
    proc = run_main("simulate", "compare", "--cluster", "adlro16", "--generate", "60", "--seed", "1",
                    "--policies", f"sjf,{own}:MySJF", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["policy"]: r for r in json.loads(proc.stdout)["results"]}
    assert rows["my-sjf"]["avg_jct_s"] == rows["sjf"]["avg_jct_s"]
    bad = run_main("simulate", "--generate", "20", "--policy", f"{own}:DoubleBooks")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "double-books" in bad.stderr


def test_the_documented_example_runs(tmp_path, monkeypatch):
    """docs/scheduling.md's policy of one's own, as printed there, runs to the end of a trace."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "scheduling.md").read_text()
    code = re.search(r"```python\n# mypol.py, in the folder you run gpualloc from\n(.*?)```", doc, re.S)
    assert code, "the documented example is gone"
    name = f"docpol_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(code.group(1))
    monkeypatch.chdir(tmp_path)
    cluster = load_cluster("adlro16")
    result = simulate(generate(40, cluster, 0.8, seed=0), cluster, make_policy(f"{name}:LongestFirst"), check=True)
    assert result.policy == "longest-first" and len(result.job_ids) == 40 and not np.isnan(result.finish_s).any()
