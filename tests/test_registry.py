"""The one Registry type and the registries built on it (partitioners, policies, telemetry and
service backends)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from gpualloc.errors import GpuallocError, PlacementError, SchedulingError
from gpualloc.registry import Registry, resolve_target


def test_direct_and_lazy_entries_resolve_once():
    reg: Registry = Registry("widget")
    reg.register("direct", np.zeros)
    reg.register("lazy", "numpy:ones", tags=("fast",), options=("dtype",))
    assert reg["direct"] is np.zeros
    assert reg["lazy"] is np.ones and reg["lazy"] is reg["lazy"]
    assert list(reg) == ["direct", "lazy"] and len(reg) == 2 and "lazy" in reg and "nope" not in reg
    assert reg.names("fast") == ["lazy"] and reg.names() == ["direct", "lazy"]
    assert reg.entry("lazy").options == {"dtype"}
    assert reg.create("lazy", shape=3).tolist() == [1.0, 1.0, 1.0]
    assert reg.get("nope") is None and reg.get("direct") is np.zeros


def test_unknown_name_is_one_domain_error_listing_the_known_names():
    reg: Registry = Registry("widget", SchedulingError)
    reg.register("b", int)
    reg.register("a", float)
    with pytest.raises(SchedulingError, match=r"^unknown widget 'c' \(known: a, b\)$"):
        reg["c"]
    with pytest.raises(SchedulingError, match=r"known: a, b, best\)$"):
        raise reg.unknown("c", also=("best",))


def test_duplicate_and_malformed_targets():
    reg: Registry = Registry("widget")
    reg.register("x", int)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("x", float)
    for bad in ("numpy.ones", "numpy:", ":ones", "gpualloc.nope:x", "numpy:no_such_thing"):
        with pytest.raises(GpuallocError, match="registry target"):
            resolve_target(bad)


def test_registries_of_the_package():
    from gpualloc.placement.partition import PARTITIONERS
    from gpualloc.scheduling.policies import POLICIES
    from gpualloc.service.backends import BACKENDS as SERVICE
    from gpualloc.telemetry.backends import BACKENDS as TELEMETRY

    assert "dqn" in PARTITIONERS and "dqn" not in PARTITIONERS.names("heuristic")
    assert set(PARTITIONERS.names("heuristic")) == set(PARTITIONERS) - {"dqn"}
    assert PARTITIONERS.entry("dqn").options == {"agent"} and POLICIES.entry("dqn").options == {"agent", "cache"}
    assert list(TELEMETRY) == ["nvml", "sim", "replay"] and list(SERVICE) == ["local", "ray", "slurm"]
    for reg in (PARTITIONERS, POLICIES, TELEMETRY, SERVICE):
        assert isinstance(reg, Registry)


def test_naming_an_entry_imports_only_that_entry():
    code = ("import sys\nfrom gpualloc.scheduling.policies import make_policy\nfrom gpualloc.telemetry.backends "
            "import BACKENDS\nfrom gpualloc.placement.partition import PARTITIONERS\nmake_policy('fcfs')\n"
            "BACKENDS['replay']\nPARTITIONERS['kl']\n"
            "print(sorted(m for m in ('torch', 'pynvml', 'gpualloc.rl.sched_policy', 'gpualloc.rl.placer') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_place_rejects_unknown_methods_and_options(tiny_problem):
    from gpualloc.placement.run import place

    with pytest.raises(PlacementError, match=r"unknown method 'magic' \(known: .*best"):
        place(tiny_problem, "magic")
    with pytest.raises(PlacementError, match="method 'kl' takes no option 'agent'"):
        place(tiny_problem, "kl", agent="x.pt")
    with pytest.raises(PlacementError, match="method 'best' takes no option 'agent'"):
        place(tiny_problem, "best", agent="x.pt")


def test_dqn_is_an_ordinary_partitioner_with_a_note(tiny_problem):
    from gpualloc.placement.run import place

    outcome = place(tiny_problem, "dqn", seed=0)
    assert outcome.method == "dqn" and outcome.note and outcome.result.feasible
    assert outcome.plan.assignment.shape == (tiny_problem.n,)
    assert place(tiny_problem, "best", seed=0).note.startswith("best of 10 methods")


@pytest.fixture(scope="module")
def tiny_problem():
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.problem import PlacementProblem
    from tests.conftest import diamond

    return PlacementProblem(diamond(), load_cluster("2xA100+2xV100"))


def test_dqn_on_a_cluster_larger_than_the_agent_keeps_the_best_heuristic():
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.problem import PlacementProblem
    from gpualloc.placement.run import place
    from tests.conftest import diamond

    problem = PlacementProblem(diamond(), load_cluster("20xA100+12xV100"))
    outcome = place(problem, "dqn", seed=0)
    best = place(problem, "best", seed=0)
    assert "32 devices > the agent's" in outcome.note and "kept best heuristic" in outcome.note
    assert outcome.result.step_time_s == pytest.approx(best.result.step_time_s)
