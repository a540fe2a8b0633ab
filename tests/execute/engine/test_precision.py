"""The engine runs what the planner plans: ZeRO-2, and the training precisions (issue 38, E8).

The multi-process runs are ``slow`` (2 gloo ranks under torchrun, gpt-tiny); each shares one job among several
asserts. The engine's own checks compare its first step with the unsplit model run in the same recipe on every
rank (see :mod:`gpualloc.execute.engine.rank`); these tests read them back and make sure they were made.
"""

from __future__ import annotations

import pytest

from gpualloc.placement.hybrid.runnable import SHARDINGS_RUN, reasons
from tests.execute.engine.conftest import torchrun, write_plan
from tests.placement.test_launchable import hybrid

GPT_LAYERS = 26  # gpt-tiny's layer sequence (op-level graph)


def _one_stage(sharding: str = "none", precision: str = "fp32") -> dict:
    """gpt-tiny on 2 devices, one stage, DP2 with unequal shares 5:3 of a batch of 8."""
    return {"cluster": "2xA100", "global_batch": 8, "microbatches": 1, "sharding": sharding, "precision": precision,
            "stages": [{"layers": [0, GPT_LAYERS - 1], "replicas": [{"devices": [0], "batch_share": 5},
                                                                    {"devices": [1], "batch_share": 3}]}]}


def _assert_matches(engine: dict) -> None:
    checks = engine["checks"]
    for name in ("output", "loss", "grad", "weights_after_step"):
        assert checks[name]["ok"] is True, (name, checks)
    assert checks["grad"]["parameters"] > 0


# ------------------------------------------------------------------------------------------------ the rule
def test_the_rule_runs_zero2():
    assert "zero2" in SHARDINGS_RUN
    assert reasons(hybrid([(0, 1, [([0], 6), ([1], 2)]), (2, 3, [([2], 6), ([3], 2)])], sharding="zero2")) == []


# ------------------------------------------------------------------------------------------------ torchrun
@pytest.mark.slow
def test_zero2_unequal_shares_adam_matches_the_unsplit_model(tmp_path):
    """ZeRO-2 (FSDP2, reshard_after_forward=False) over 2 ranks with shares 5:3: loss, outputs, every gradient and
    the weights after one Adam step equal the unsplit model's (fp32 tolerances of the engine's checks)."""
    plan = write_plan(tmp_path / "plan.json", _one_stage("zero2"))
    run = torchrun(2, plan, "gpt-tiny", tmp_path / "out", "--steps", "1", "--warmup", "0", "--no-memory",
                   "--optimizer", "adam")
    assert run.returncode == 0, run.stderr[-3000:]
    engine = run.engine
    _assert_matches(engine)
    assert engine["sharding"] == "zero2" and engine["mesh"] == {"pp": 1, "dp": 2, "tp": 1}
    assert engine["checks"]["loss"]["abs_err"] <= 1e-5 * abs(engine["checks"]["loss"]["unsplit"])
    assert (run.rank(0)["local_batch"], run.rank(1)["local_batch"]) == (5, 3)
