"""``execute_plan`` settings are one ExecuteOptions value; an unknown one is an ExecutionError line."""

from __future__ import annotations

import pytest

from gpualloc.errors import ExecutionError
from gpualloc.execute.run import ExecuteOptions, execute_plan


def test_unknown_option_and_bad_counts_are_execution_errors():
    with pytest.raises(ExecutionError, match="execute_plan: .*'stepz'"):
        execute_plan("resnet-tiny", None, None, None, stepz=3)
    with pytest.raises(ExecutionError, match="need steps >= 1"):
        execute_plan("resnet-tiny", None, None, None, ExecuteOptions(steps=0))
    with pytest.raises(ExecutionError, match="warmup=-1"):
        execute_plan("resnet-tiny", None, None, None, ExecuteOptions(steps=2), warmup=-1)
