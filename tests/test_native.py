"""quiet_stdout: native writes to file descriptor 1 vanish, Python's own output before it is kept."""

from __future__ import annotations

import os

from gpualloc.native import quiet_stdout


def test_native_writes_are_dropped_and_python_output_is_kept(capfd):
    print("before", end="")  # buffered: flushed before fd 1 is redirected, so it is not lost
    with quiet_stdout():
        os.write(1, b"HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();\n")
    os.write(1, b"after")
    assert capfd.readouterr().out == "beforeafter"


def test_stdout_is_restored_after_an_error(capfd):
    try:
        with quiet_stdout():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    os.write(1, b"visible")
    assert capfd.readouterr().out == "visible"
