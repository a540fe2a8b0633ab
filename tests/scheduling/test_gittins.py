"""The Gittins index of an empirical size distribution: known answers computed by hand, and a brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.errors import SchedulingError
from gpualloc.scheduling.policies.gittins import GittinsTable, compress, gittins_index


def test_two_point_known_answer_and_the_jump_after_the_first_atom():
    # S = 1 or 10, each with probability 1/2.
    # a = 0: Δ = 1 gives P = 1/2, E[min(S, 1)] = 1 -> 1/2; Δ = 10 gives 1 / E[S] = 1/5.5. So 1/2.
    # a = 0.5: Δ = 0.5 gives (1/2) / 0.5 = 1 (the index rises towards the atom).
    # a = 1: only S = 10 is left: 1 / 9 (the jump down once the first atom has passed).
    g = gittins_index([1.0, 10.0], [0.0, 0.5, 0.9, 1.0, 5.0, 10.0, 11.0])
    np.testing.assert_allclose(g, [0.5, 1.0, 0.5 / 0.1, 1 / 9, 1 / 5, 0.0, 0.0])


def test_three_point_known_answer():
    # S in {1, 2, 10}, 1/3 each. a = 0: Δ=1: (1/3)/1; Δ=2: (2/3)/((1+2+2)/3) = 0.4; Δ=10: 3/13. -> 0.4
    # a = 1: S in {2, 10}: Δ=1: (1/2)/1 = 0.5; Δ=9: 1/((1+9)/2) = 0.2. -> 0.5;  a = 2: 1/8.
    g = gittins_index([1.0, 2.0, 10.0], [0.0, 1.0, 2.0])
    np.testing.assert_allclose(g, [0.4, 0.5, 1 / 8])


def test_fixed_quantum_and_weights():
    # Δ = 3 at a = 0 on {1, 10}: P(S <= 3) = 1/2, E[min(S, 3)] = (1 + 3)/2 = 2 -> 1/4
    np.testing.assert_allclose(gittins_index([1.0, 10.0], 0.0, delta=3.0), [0.25])
    # weights are multiplicities
    np.testing.assert_allclose(gittins_index([1.0, 10.0], [0.0, 1.0, 4.0], weights=[2, 1]),
                               gittins_index([1.0, 1.0, 10.0], [0.0, 1.0, 4.0]))


def test_deterministic_size_is_fcfs_like_and_pareto_is_las_like():
    a = np.linspace(0, 4.5, 10)
    g = gittins_index([5.0], a)
    np.testing.assert_allclose(g, 1 / (5 - a))  # increasing: a job that ran longer goes first
    sizes = np.random.default_rng(0).pareto(1.2, 2000) * 100  # Lomax: heavy tail, decreasing hazard rate
    table = GittinsTable(sizes)
    late = table.lookup(np.quantile(sizes, [0.5, 0.9, 0.99]))
    assert table.values[0] > late[0] > late[1] > late[2] > 0  # fresh jobs first, as LAS


def _brute(sizes: np.ndarray, a: float) -> float:
    alive = sizes[sizes > a]
    if not alive.size:
        return 0.0
    best = 0.0
    for d in np.concatenate([alive - a, np.linspace(1e-6, alive.max() - a + 1, 100)]):
        p = np.mean(alive - a <= d + 1e-12)
        e = np.mean(np.minimum(alive - a, d))
        best = max(best, p / e)
    return best


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=8), st.floats(0.0, 31.0))
def test_matches_a_brute_force_supremum(sizes, a):
    s = np.asarray(sizes, dtype=float)
    assert gittins_index(s, a)[0] == pytest.approx(_brute(s, a), rel=1e-9)


def test_table_lookup_uses_the_last_atom_passed():
    for table in (GittinsTable([1.0, 10.0], bins_per_decade=None), GittinsTable([1.0, 10.0])):  # both on the grid
        np.testing.assert_allclose(table.atoms, [1.0, 10.0])
        np.testing.assert_allclose(table.values, [0.5, 1 / 9, 0.0])
        np.testing.assert_allclose(table.lookup(np.array([0.0, 0.99, 1.0, 9.9, 10.0, 50.0])),
                                   [0.5, 0.5, 1 / 9, 1 / 9, 0.0, 0.0])


def test_compress_moves_sizes_up_onto_the_grid():
    atoms, weights = compress([1.0, 1.1, 1.3, 100.0, 0.0], bins_per_decade=10)
    np.testing.assert_allclose(atoms, [0.0, 1.0, 10 ** 0.1, 10 ** 0.2, 100.0])
    np.testing.assert_array_equal(weights, [1, 1, 1, 1, 1])
    atoms, weights = compress([2.0, 3.0, 9.0, 0.5], bins_per_decade=1)
    np.testing.assert_allclose(atoms, [1.0, 10.0])
    np.testing.assert_array_equal(weights, [1, 3])
    atoms, weights = compress([1.0, 1.0, 2.0], bins_per_decade=None)  # the samples themselves
    np.testing.assert_array_equal(atoms, [1.0, 2.0])
    np.testing.assert_array_equal(weights, [2, 1])


@pytest.mark.parametrize("call", [lambda: gittins_index([-1.0], 0.0), lambda: gittins_index([1.0], 0.0, delta=0.0),
                                  lambda: gittins_index([1.0, 2.0], 0.0, weights=[1.0]),
                                  lambda: gittins_index([np.nan], 0.0), lambda: compress([1.0], bins_per_decade=0.0),
                                  lambda: GittinsTable([1.0], delta=-2.0)])
def test_bad_input_is_a_scheduling_error(call):
    with pytest.raises(SchedulingError, match="gittins"):
        call()
