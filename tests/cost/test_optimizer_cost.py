"""The optimizer step's cost: its memory traffic against what torch's optimizers really dispatch, the fit of a
measured step, the calibration records and their fallbacks, and the additive floor the hybrid bound uses."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gpualloc.cost import physics
from gpualloc.cost.calibrate import fit_optimizer
from gpualloc.cost.memory import OPTIMIZER_STATES, optimizer_named
from gpualloc.cost.model import Calibration, CostModel, OptimizerCost
from gpualloc.errors import CostModelError
from gpualloc.graph.recipe import MasterWeights
from gpualloc.hardware.catalog import default_catalog

N = 4096  # elements a parameter: large enough that the step's scalars (its count, bias corrections) do not count


class _Traffic(TorchDispatchMode):
    """Bytes every dispatched op reads (its tensor arguments, a repeated one each time; ``copy_`` its source only) and
    writes (its outputs, or the arguments an in-place foreach op mutates), over tensors of more than one element."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in ("detach", "alias", "view", "_conj", "conj", "empty_like"):
            return out  # no data moved
        read = tree_flatten((args[1:], kwargs) if func.overloadpacket.__name__ == "copy_" else (args, kwargs))[0]
        written = tree_flatten(out)[0]
        if not any(isinstance(t, torch.Tensor) for t in written):  # an in-place foreach op returns nothing
            written = [t for a, arg in zip(func._schema.arguments, args, strict=False)
                       if a.alias_info is not None and a.alias_info.is_write for t in tree_flatten(arg)[0]]
        self.bytes += sum(t.numel() * t.element_size() for t in read + written
                          if isinstance(t, torch.Tensor) and t.numel() > 1)
        return out


def _dispatched_bytes(optimizer: str, *, foreach: bool, dtype=torch.float32, tensors: int = 3) -> float:
    params = [torch.zeros(N, dtype=dtype).requires_grad_(True) for _ in range(tensors)]
    cls = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}[optimizer]
    opt = (cls(params, lr=1e-3, foreach=foreach) if dtype == torch.float32
           else MasterWeights(params, cls, lr=1e-3, foreach=foreach))
    for _ in range(2):  # the second step is the steady one (Adam's states exist)
        for p in params:
            p.grad = torch.ones_like(p)
        with _Traffic() as t:
            opt.step()
    return t.bytes / (4.0 * N * tensors)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_the_traffic_rule_is_what_torch_dispatches(optimizer, foreach):
    """OPTIMIZER_PASSES against the bytes of the ops torch's own optimizer dispatches, per tensor and foreach."""
    rule = physics.optimizer_traffic_bytes(1.0, OPTIMIZER_STATES[optimizer], "fp32")
    assert _dispatched_bytes(optimizer, foreach=foreach) == pytest.approx(float(rule))


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_master_weights_add_their_casts(optimizer):
    rule = physics.optimizer_traffic_bytes(1.0, OPTIMIZER_STATES[optimizer], "bf16")
    assert _dispatched_bytes(optimizer, foreach=False, dtype=torch.bfloat16) == pytest.approx(float(rule))
    assert float(rule) == physics.OPTIMIZER_PASSES[OPTIMIZER_STATES[optimizer]] + physics.MASTER_WEIGHT_PASSES


def test_step_time_known_answers():
    # host 10 x 2 us = 20 us; device 1e6 B at 1e9 B/s = 1 ms; fixed 5 us
    assert physics.optimizer_step_s(1e6, 10, 2e-6, 1e9, 5e-6, overlap=False) == pytest.approx(5e-6 + 20e-6 + 1e-3)
    assert physics.optimizer_step_s(1e6, 10, 2e-6, 1e9, 5e-6, overlap=True) == pytest.approx(5e-6 + 1e-3)
    assert physics.optimizer_step_s(1e3, 1000, 2e-6, 1e9, 0.0, overlap=True) == pytest.approx(2e-3)


@pytest.mark.parametrize("overlap", [False, True])
def test_the_fit_recovers_a_known_cost(overlap):
    dev = default_catalog().device("H200")
    truth = OptimizerCost(fixed_s=1e-4, per_tensor_s=1.5e-5, memory=0.7, overlap=overlap)
    rows = []
    for n, size in ((8, 1 << 10), (64, 1 << 10), (512, 1 << 10), (8, 1 << 20), (64, 1 << 20), (8, 1 << 24),
                    (32, 1 << 24)):
        nbytes = 4.0 * n * size
        traffic = float(physics.optimizer_traffic_bytes(nbytes, 2, "fp32"))
        rows.append({"tensors": n, "param_bytes": nbytes,
                     "seconds": physics.optimizer_step_s(traffic, n, truth.per_tensor_s,
                                                         dev.mem_bandwidth_bytes_per_s * truth.memory,
                                                         truth.fixed_s, truth.overlap)})
    cost, rec = fit_optimizer(rows, dev, "adam", "fp32", asynchronous=True)
    assert cost.overlap == overlap
    assert rec["rms_relative_error"] < 1e-6
    for f in ("fixed_s", "per_tensor_s", "memory"):
        assert getattr(cost, f) == pytest.approx(getattr(truth, f), rel=1e-3)
    # on a synchronous device (the CPU) host and device never overlap
    assert fit_optimizer(rows, dev, "adam", "fp32", asynchronous=False)[0].overlap is False


def test_records_and_their_fallbacks():
    cat = default_catalog()
    shipped = Calibration.load()
    h200, v100, cpu = cat.device("H200"), cat.device("V100-16GB"), cat.device("cpu")
    assert shipped.optimizer_cost(h200, "fp32", "adam").fitted_from == "measured"
    assert shipped.optimizer_cost(v100, "fp32", "adam") == shipped.optimizers["default"]["fp32"]["adam"]
    assert shipped.optimizer_cost(cpu, "fp32", "adam") == shipped.optimizers["cpu"]["fp32"]["adam"]
    assert shipped.optimizers["cpu_default"]["fp32"]["adam"].fitted_from == "timed on cpu"
    assert shipped.optimizer_cost(h200, "tf32", "adam") == shipped.optimizer_cost(h200, "fp32", "adam")
    assert shipped.optimizer_cost(h200, "fp16", "adam") == shipped.optimizer_cost(h200, "bf16", "adam")
    assert shipped.optimizer_cost(h200, "fp32", "sgd-momentum") == shipped.optimizer_cost(h200, "fp32", "sgd")
    # a calibration written before optimizers were measured reads the shipped records
    old = dataclasses.replace(shipped, optimizers={})
    assert old.optimizer_cost(h200, "bf16", "adam") == shipped.optimizer_cost(h200, "bf16", "adam")
    # its own record wins, and survives the file round trip
    mine = OptimizerCost(1e-5, 2e-6, 0.5, False, "mine")
    cal = dataclasses.replace(shipped, optimizers={"V100-16GB": {"fp32": {"adam": mine}}})
    back = Calibration.from_dict(cal.to_dict())
    assert back.optimizer_cost(v100, "fp32", "adam") == mine
    assert back.optimizer_cost(v100, "fp32", "sgd") == shipped.optimizers["default"]["fp32"]["sgd"]


def test_a_malformed_record_is_one_line():
    doc = Calibration.load().to_dict()
    doc["optimizers"] = {"H200": {"fp32": {"adam": {"fixed_s": -1, "per_tensor_s": 0, "memory": 1, "overlap": True}}}}
    with pytest.raises(CostModelError, match="fixed_s"):
        Calibration.from_dict(doc, "mine.json")
    with pytest.raises(CostModelError, match="no optimizer keeps 7"):
        optimizer_named(7)


def test_the_cost_model_charges_tensors_and_traffic():
    cost, dev = CostModel(), default_catalog().device("H200")
    c = cost.optimizer_cost(dev, 2)
    one = cost.optimizer_step_s(4e8, dev, 2, tensors=100)
    traffic = 4e8 * 19 / (dev.mem_bandwidth_bytes_per_s * c.memory)
    assert one == pytest.approx(c.fixed_s + max(traffic, 100 * c.per_tensor_s) if c.overlap
                                else c.fixed_s + traffic + 100 * c.per_tensor_s)
    assert cost.optimizer_step_s(4e8, dev, 2, tensors=100_000) > one  # many small tensors: host-bound
    assert cost.optimizer_step_s(4e8, dev, 2, precision="bf16", tensors=100) > 0
    assert cost.optimizer_step_s(0.0, dev, 2, tensors=100) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5e8), st.integers(0, 40)), min_size=1, max_size=12),
       st.sampled_from(["H200", "V100-16GB", "cpu"]), st.sampled_from([0, 1, 2]), st.sampled_from(["fp32", "bf16"]),
       st.data())
def test_the_floor_never_exceeds_the_step_of_any_set(parts, device, states, precision, data):
    cost, dev = CostModel(), default_catalog().device(device)
    if precision == "bf16" and dev.bf16_tflops is None:
        precision = "fp32"
    p = np.array([x for x, _ in parts])
    t = np.array([n for _, n in parts], dtype=float)
    floor = cost.optimizer_floor_s(p, t, dev, states, precision)
    subset = np.array(data.draw(st.lists(st.booleans(), min_size=len(parts), max_size=len(parts))))
    step = cost.optimizer_step_s(float(p[subset].sum()), dev, states, precision=precision,
                                 tensors=float(t[subset].sum()))
    assert floor[subset].sum() <= step * (1 + 1e-12) + 1e-15


def test_a_fit_on_unusable_timings_is_one_line():
    dev = default_catalog().device("H200")
    rows = [{"tensors": 8, "param_bytes": 4e6, "seconds": s} for s in (1e-3, 0.0, 2e-3)]
    with pytest.raises(CostModelError, match="three positive timings"):
        fit_optimizer(rows, dev, "adam", "fp32", asynchronous=True)
    with pytest.raises(CostModelError, match="three positive timings"):
        fit_optimizer(rows[:2], dev, "adam", "fp32", asynchronous=True)


def test_calibrate_refuses_an_optimizer_the_engine_does_not_train_with_before_measuring(cli, tmp_path):
    code, _, err = cli("calibrate", "--optimizers", "adam,lamb", "-o", str(tmp_path / "c.json"))
    assert code == 2 and "--optimizers: 'lamb'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "c.json").exists()
