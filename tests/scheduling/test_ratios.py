"""Derived ratios of a comparison (x bound, vs FCFS): one formula each, in scheduling.metrics."""

from __future__ import annotations

import math

import pytest

from gpualloc.scheduling.metrics import reduction, with_ratios, x_bound


def test_known_answers():
    assert x_bound(30.0, 10.0) == 3.0
    assert math.isnan(x_bound(30.0, 0.0))
    assert reduction(75.0, 100.0) == pytest.approx(0.25)
    assert reduction(150.0, 100.0) == pytest.approx(-0.5)
    assert math.isnan(reduction(1.0, 0.0))


def test_with_ratios_adds_x_bound_and_vs_reference():
    rows = [{"policy": "fcfs", "avg_jct_s": 200.0, "lower_bound_avg_jct_s": 50.0},
            {"policy": "sjf", "avg_jct_s": 100.0, "lower_bound_avg_jct_s": 50.0},
            {"policy": "oracle-lb", "avg_jct_s": 50.0, "lower_bound_avg_jct_s": 50.0}]
    out = {r["policy"]: r for r in with_ratios(rows)}
    assert out["fcfs"]["x_bound"] == 4.0 and out["fcfs"]["vs_fcfs"] == 0.0
    assert out["sjf"]["x_bound"] == 2.0 and out["sjf"]["vs_fcfs"] == pytest.approx(0.5)
    assert out["oracle-lb"]["x_bound"] == 1.0 and out["oracle-lb"]["vs_fcfs"] == pytest.approx(0.75)
    assert "x_bound" not in rows[0]  # the input rows are left as they were
    other = with_ratios(rows, reference="oracle-lb")
    assert other[1]["vs_oracle_lb"] == pytest.approx(-1.0)
    assert all(math.isnan(r["vs_fcfs"]) for r in with_ratios(rows[1:]))  # no FCFS run: unknown, not 0
