"""HD encoder: determinism per seed, the algebra of bind and bundle, level similarity, stable vectors
for unseen symbols, shapes, edge inputs, argument errors, and the adapter on a simulator view."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from gpualloc.errors import AgentError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.rl.hdc import HDEncoder, bind, hd_features, table_codes
from gpualloc.scheduling.base import Decision
from gpualloc.scheduling.simulator import Simulation
from gpualloc.workload.jobs import JOB_TYPES, JobType
from gpualloc.workload.traces import generate


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity; 0.0 when either vector is zero."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norm = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / norm if norm > 0 else 0.0


ENC = HDEncoder(seed=0)  # dim 4096: building one takes a few ms
STATE = ({"V100": 0.5, "T4": 1.0, "A100": 0.0}, [(0, "ml-training", 4), (2, JobType.SIMULATION, 1)])


def everything(enc: HDEncoder) -> list[np.ndarray]:
    return [enc.encode_gpu_type("V100"), enc.encode_level(0.3), enc.encode_gpu("T4", 0.7),
            enc.encode_job(1, "data-processing", 8), enc.encode_cluster_state(*STATE),
            enc.project(enc.encode_cluster_state(*STATE)),
            enc.bundle([enc.encode_gpu_type("x"), -enc.encode_gpu_type("x")])]


def test_same_seed_same_vectors_other_seed_other_vectors():
    again, other = HDEncoder(seed=0), HDEncoder(seed=1)
    for a, b, c in zip(everything(ENC), everything(again), everything(other), strict=True):
        assert np.array_equal(a, b)
        assert not np.array_equal(a, c)
    assert abs(cosine(ENC.encode_gpu_type("V100"), other.encode_gpu_type("V100"))) < 0.1
    rebuilt = HDEncoder.from_dict(HDEncoder(seed=np.random.default_rng(7)).to_dict())
    drawn = HDEncoder(seed=np.random.default_rng(7))
    assert rebuilt.seed == drawn.seed
    assert all(np.array_equal(a, b) for a, b in zip(everything(rebuilt), everything(drawn), strict=True))


def test_random_symbols_are_nearly_orthogonal():
    names = [f"GPU-{i}" for i in range(20)] + ["V100", "A100", "T4", "K80", "P100"]
    hvs = [ENC.encode_gpu_type(n) for n in names]
    assert max(abs(cosine(a, b)) for a, b in itertools.combinations(hvs, 2)) < 0.1
    for hv in hvs:
        assert set(np.unique(hv)) == {-1, 1}


def test_unseen_symbol_gets_a_stable_vector():
    """Vectors hang on the name and the seed only, not on what was asked before."""
    fresh = HDEncoder(seed=0)
    for n in ("A", "B", "C"):
        fresh.encode_gpu_type(n)
    assert np.array_equal(fresh.encode_gpu_type("MadeUp-9000"), ENC.encode_gpu_type("MadeUp-9000"))
    assert abs(cosine(ENC.encode_gpu_type("MadeUp-9000"), ENC.encode_gpu_type("MadeUp-9001"))) < 0.1


@pytest.mark.parametrize("levels", [2, 5, 16])
def test_level_similarity_falls_with_distance(levels):
    enc = HDEncoder(dim=1024, levels=levels, seed=3)
    lv = [enc.encode_level(i / (levels - 1)) for i in range(levels)]
    for i, j in itertools.product(range(levels), repeat=2):
        assert cosine(lv[i], lv[j]) == pytest.approx(1 - abs(i - j) / (levels - 1), abs=2.5 / 1024)  # flips rounded
    sims = [cosine(lv[0], v) for v in lv]
    assert all(a > b for a, b in itertools.pairwise(sims))
    assert np.array_equal(enc.encode_level(0.49 / (levels - 1)), lv[0])  # quantised to the nearest level


def test_bind_is_its_own_inverse_and_dissimilar():
    a, b = ENC.encode_gpu_type("V100"), ENC.encode_level(0.7)
    ab = bind(a, b)
    assert np.array_equal(bind(ab, b), a)
    assert abs(cosine(ab, a)) < 0.1 and abs(cosine(ab, b)) < 0.1
    assert np.array_equal(ENC.encode_gpu("V100", 0.7), ab)


def test_bundle_keeps_its_members_similar():
    a, b, c, d = (ENC.encode_gpu_type(n) for n in "abcd")
    s = ENC.bundle([a, b, c])
    assert all(cosine(s, m) > 0.3 for m in (a, b, c))
    assert abs(cosine(s, d)) < 0.1
    assert cosine(ENC.bundle([a, b, c], [3, 1, 1]), a) > cosine(s, a)  # weights count
    tie = ENC.bundle([a, -a])  # every entry ties: the seeded tie-break, the same each time
    assert set(np.unique(tie)) == {-1, 1} and np.array_equal(tie, ENC.bundle([b, -b]))


def test_states_and_jobs_keep_their_similarity_structure():
    base = ENC.encode_cluster_state({"V100": 0.5, "T4": 0.2})
    near = ENC.encode_cluster_state({"V100": 0.55, "T4": 0.2})
    far = ENC.encode_cluster_state({"V100": 1.0, "T4": 0.2})
    other = ENC.encode_cluster_state({"A100": 0.5, "T4": 0.2})
    assert cosine(base, near) > cosine(base, far) > cosine(base, other)
    job = ENC.encode_job(1, "ml-training", 4)
    assert cosine(job, ENC.encode_job(1, "ml-training", 8)) > cosine(job, ENC.encode_job(2, "simulation", 1))
    # the projection keeps it: nearby states give nearby features
    f = ENC.project(np.stack([base, near, other]))
    assert np.linalg.norm(f[0] - f[1]) < np.linalg.norm(f[0] - f[2])


def test_state_is_a_set_of_types_and_jobs():
    """Cluster-agnostic: the order of the GPU types (and of the queued jobs) does not matter."""
    util, jobs = STATE
    flipped = ENC.encode_cluster_state(dict(reversed(util.items())), list(reversed(jobs)))
    assert np.array_equal(flipped, ENC.encode_cluster_state(util, jobs))
    codes = [JOB_TYPES.index(JobType(j[1])) for j in jobs]
    arrays = ENC.encode_arrays(list(util), list(util.values()), [j[0] for j in jobs], codes, [j[2] for j in jobs])
    assert np.array_equal(arrays, ENC.encode_cluster_state(util, jobs))
    assert cosine(ENC.encode_cluster_state(util), ENC.encode_cluster_state(util, jobs)) > 0.3


def test_many_members_sum_exactly():
    """Row sums switch to wider integers past 127 rows: 200 copies of one job and one unlike it."""
    util = {f"T{i}": 0.5 for i in range(130)}
    hv = ENC.encode_cluster_state(util, [(0, "simulation", 1)] * 200 + [(2, "ml-training", 8)])
    assert cosine(hv, ENC.encode_job(0, "simulation", 1)) > 0.3
    assert cosine(hv, ENC.encode_gpu("T7", 0.5)) > 0.02  # one of 130 members: cos ~ 0.05
    assert abs(cosine(hv, ENC.encode_gpu("T7", 0.0))) < cosine(hv, ENC.encode_gpu("T7", 0.5))


def test_shapes_dtypes_and_ranges():
    enc = HDEncoder(dim=1000, out_dim=12, levels=8, seed=2)
    for hv in everything(enc)[:5] + everything(enc)[6:]:
        assert hv.shape == (1000,) and hv.dtype == np.int8
    f = enc.project(enc.encode_cluster_state(*STATE))
    assert f.shape == (12,) and f.dtype == np.float32 and np.all(np.abs(f) <= 1.0)
    batch = enc.project(np.stack([enc.encode_gpu_type(str(i)) for i in range(500)]))
    assert batch.shape == (500, 12) and batch.dtype == np.float32
    assert 4 * batch.std() == pytest.approx(1.0, abs=0.05)  # unit variance before the /4 squash
    assert np.array_equal(enc.project(2.5 * enc.encode_gpu_type("0")), batch[0])  # scale-free
    util, jobs = STATE
    feats = enc.features(list(util), list(util.values()), enc.job_codes([0, 2], [1, 0], [4, 1]))
    assert np.array_equal(feats, enc.project(enc.encode_cluster_state(*STATE)))
    with pytest.raises(ValueError):  # shared cached tables are read-only
        enc.encode_gpu_type("V100")[0] = 0


@pytest.mark.parametrize(("util", "jobs"), [
    ({"V100": 0.0, "T4": 1.0}, []),
    ({}, []),
    ({}, [(0, "simulation", 1)]),
    ({"V100": 1.0}, [(-1000, "ml-training", 1), (10**9, "data-processing", 4096)]),
])
def test_edge_inputs_give_finite_bipolar_vectors(util, jobs):
    hv = ENC.encode_cluster_state(util, jobs)
    assert set(np.unique(hv)) <= {-1, 1}
    f = ENC.project(hv)
    assert np.all(np.isfinite(f)) and np.all(np.abs(f) <= 1.0)
    assert np.array_equal(ENC.project(np.zeros(ENC.dim)), np.zeros(ENC.out_dim, np.float32))


@pytest.mark.parametrize(("call", "message"), [
    (lambda: HDEncoder(dim=63), "dim"),
    (lambda: HDEncoder(dim=10**9), "dim"),
    (lambda: HDEncoder(levels=1), "levels"),
    (lambda: HDEncoder(dim=64, levels=33), "levels"),
    (lambda: HDEncoder(out_dim=0), "out_dim"),
    (lambda: HDEncoder(seed=-1), "seed"),
    (lambda: HDEncoder.from_dict({"dim": 64, "colour": 1}), "colour"),
    (lambda: ENC.encode_level(1.5), "level=1.5"),
    (lambda: ENC.encode_gpu("V100", float("nan")), "level=nan"),
    (lambda: ENC.encode_cluster_state({"V100": -0.1}), "utilisation=-0.1"),
    (lambda: ENC.encode_job(0, "training", 1), "unknown job type"),
    (lambda: ENC.encode_job(0, "simulation", 0), "job 0: gpus=0.0 must be >= 1"),
    (lambda: ENC.encode_job(0, "simulation", float("nan")), "gpus=nan"),
    (lambda: ENC.encode_job(float("inf"), "simulation", 1), "priority=inf must be finite"),
    (lambda: ENC.encode_arrays([], [], [0, 1], [0, 1], [1, 0.5]), "job 1: gpus=0.5"),
    (lambda: ENC.encode_arrays(["V100"], [0.1, 0.2]), "2 utilisations for 1 GPU types"),
    (lambda: ENC.encode_arrays([], [], [0], [7], [1]), "job type code 7 must be in 0..2"),
    (lambda: ENC.encode_arrays([], [], [0], [-1], [1]), "job type code -1"),
    (lambda: ENC.project(np.ones(10)), "length 10"),
    (lambda: ENC.bundle(np.ones((2, 10))), "bundle"),
    (lambda: ENC.bundle(np.ones((2, ENC.dim)), [1.0]), "bundle"),
])
def test_bad_arguments_raise_one_line_agent_errors(call, message):
    with pytest.raises(AgentError, match=message) as err:
        call()
    assert "\n" not in str(err.value)


def test_hd_features_on_a_simulator_view():
    cluster = load_cluster("4xV100+2xT4")
    sim = Simulation(generate(12, cluster, 2.0, seed=4), cluster)
    sim.decide(Decision([]))  # let a few jobs queue up
    view = sim.view
    while len(view.queue) < 3:
        sim.decide(Decision([]))
        view = sim.view
    j = int(view.queue[0])
    gpus = view.find_gpus(j, 0)
    assert gpus is not None
    sim.decide(Decision([(j, gpus)]))
    view = sim.view
    f = hd_features(view, ENC)
    assert f.shape == (ENC.out_dim,) and f.dtype == np.float32 and np.all(np.abs(f) <= 1.0)

    busy = np.bincount(view.gpu_type, weights=(view.gpu_job >= 0), minlength=len(view.type_names))
    util = busy / view.total_by_type()
    assert util.max() > 0  # one type is partly in use
    q = list(view.queue)
    jobs = [(int(view.jobs.priority[k]), JOB_TYPES[view.jobs.type_code[k]], int(view.jobs.num_gpus[k])) for k in q]
    expected = ENC.project(ENC.encode_cluster_state(dict(zip(view.type_names, util, strict=True)), jobs))
    assert np.array_equal(f, expected)

    codes = table_codes(view, ENC)  # once per run: the same features, computed once for every job
    assert np.array_equal(hd_features(view, ENC, codes=codes), f)
    some = hd_features(view, ENC, jobs=q[:1])
    assert not np.array_equal(some, f)
    assert np.array_equal(hd_features(view, ENC, jobs=q[:1], codes=codes), some)
    with pytest.raises(AgentError, match="job codes for 16 levels, encoder has 8"):
        hd_features(view, HDEncoder(levels=8), codes=codes)
    with pytest.raises(AgentError, match="job codes for 1 jobs"):
        hd_features(view, ENC, codes=codes.take(np.array([0])))
    measured = np.full(len(view.gpu_job), np.nan)  # unknown metrics count as idle
    assert np.array_equal(hd_features(view, ENC, utilization=measured),
                          hd_features(view, ENC, utilization=np.zeros(len(view.gpu_job))))
    with pytest.raises(AgentError, match="utilisation values"):
        hd_features(view, ENC, utilization=np.zeros(2))
