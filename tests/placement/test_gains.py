"""Gains over reference plans and memory fill: computed once in placement.run, for the CLI and reports."""

from __future__ import annotations

import math

import pytest

from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.run import compare, gain, gains, memory_fill
from tests.conftest import diamond


def test_gain_known_answers():
    assert gain(75.0, 100.0) == pytest.approx(0.25)
    assert gain(200.0, 100.0) == pytest.approx(-1.0)
    assert math.isnan(gain(1.0, 0.0))


def test_gains_of_a_comparison():
    problem = PlacementProblem(diamond(), load_cluster("2xV100"))
    outcomes = compare(problem, ["static", "round-robin", "kl"], seed=0)
    by = {o.method: o.result.step_time_s for o in outcomes}
    table = dict(zip([o.method for o in outcomes], gains(outcomes), strict=True))
    assert table["static"]["static"] == 0.0 and table["round-robin"]["round-robin"] == 0.0
    assert table["kl"]["static"] == pytest.approx(1 - by["kl"] / by["static"])
    assert table["static"]["round-robin"] == pytest.approx(1 - by["static"] / by["round-robin"])
    only = gains([o for o in outcomes if o.method == "kl"])
    assert math.isnan(only[0]["static"])  # no static plan to compare with: unknown
    for o in outcomes:
        fill = memory_fill(problem, o)
        assert fill == pytest.approx(max(o.result.peak_mem_bytes / problem.mem_cap_bytes)) and 0 < fill < 1
