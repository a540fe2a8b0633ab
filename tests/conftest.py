"""Shared fixtures: tiny graphs, the shared data folder, the gpu marker."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpualloc.graph.ir import OpEdge, OpGraph, OpNode, OpTiming

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session", autouse=True)
def _gpualloc_cache(tmp_path_factory):
    """The CLI's cache (traced zoo graphs, gate verdicts) in a folder of this session, not the user's: the
    suite neither reads a stale entry from nor writes to ~/.cache, and traces each zoo model once."""
    import os

    before = os.environ.get("GPUALLOC_CACHE_DIR")
    os.environ["GPUALLOC_CACHE_DIR"] = str(tmp_path_factory.mktemp("gpualloc-cache"))
    yield
    if before is None:
        os.environ.pop("GPUALLOC_CACHE_DIR", None)
    else:
        os.environ["GPUALLOC_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


def diamond(bytes_: float = 4e6) -> OpGraph:
    """a -> (b, c) -> d: the smallest graph with parallel branches."""
    nodes = [
        OpNode("a", "a", "input", output_bytes=bytes_),
        OpNode("b", "b", "matmul", flops=2e9, bytes_read=bytes_, bytes_written=bytes_, param_bytes=1e6,
               output_bytes=bytes_),
        OpNode("c", "c", "relu", flops=1e6, bytes_read=bytes_, bytes_written=bytes_, output_bytes=bytes_),
        OpNode("d", "d", "add", flops=1e6, bytes_read=2 * bytes_, bytes_written=bytes_, output_bytes=bytes_,
               time_ms={"V100-16GB": OpTiming(0.5, 1.0)}),
    ]
    edges = [OpEdge("a", "b", bytes_), OpEdge("a", "c", bytes_), OpEdge("b", "d", bytes_), OpEdge("c", "d", bytes_)]
    return OpGraph("diamond", nodes, edges, batch_size=8)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one thread for a module (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``):
    for small networks thread start-up costs more than it saves, and CI has 2 cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def diamond_graph() -> OpGraph:
    return diamond()


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run ``gpualloc ARGS...`` through ``main()`` (domain errors become one line and exit 2); returns
    ``(exit status, stdout, stderr)``. A test module may define its own ``cli`` with another shape."""
    from gpualloc.cli.main import main

    def run(*args) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["gpualloc", *map(str, args)])
        with pytest.raises(SystemExit) as exc:
            main()
        out, err = capsys.readouterr()
        return (0 if exc.value.code is None else exc.value.code), out, err

    return run


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run only where CUDA is available; elsewhere they skip with the reason."""
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch is a dependency
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
