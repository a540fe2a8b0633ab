"""Every test here keeps quick CPU calibrations in its own cache folder, never the user's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def own_cache_folder(root: Path, monkeypatch) -> Path:
    """``root/xdg-cache/gpualloc``, the CLI's cache folder from now on (``XDG_CACHE_HOME``; the session's
    ``GPUALLOC_CACHE_DIR`` would come first, so it goes), with ``graphs/`` the session's: the traced zoo graphs
    (keyed by model, batch, torch and the capture code) are shared as in every other test folder, so resnet-tiny
    or gpt-tiny is traced once, not again in every test; the calibrations (``cpu-*.json``, at the folder's top)
    stay this folder's own."""
    session = os.environ.get("GPUALLOC_CACHE_DIR")  # set for the whole session by tests/conftest.py
    monkeypatch.delenv("GPUALLOC_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(root / "xdg-cache"))
    folder = root / "xdg-cache" / "gpualloc"
    if session:
        shared = Path(session) / "graphs"
        shared.mkdir(parents=True, exist_ok=True)
        folder.mkdir(parents=True)
        (folder / "graphs").symlink_to(shared, target_is_directory=True)
    return folder


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    return own_cache_folder(tmp_path, monkeypatch)


@pytest.fixture(scope="session")
def session_cache_dir() -> str | None:
    """The session's cache folder (tests/conftest.py), read before any test here sets its own."""
    return os.environ.get("GPUALLOC_CACHE_DIR")


@pytest.fixture
def session_calibration(private_cache, session_cache_dir, monkeypatch):
    """For a test of a run, not of calibrating: ``gpualloc run``'s quick CPU calibration (and the traced graphs)
    come from the session's cache folder, so it is measured once for the session (per threads and ranks), not in
    every such test; tests/execute/test_quick_calibration.py measures its own, fresh, in its private folder."""
    if session_cache_dir:
        monkeypatch.setenv("GPUALLOC_CACHE_DIR", session_cache_dir)
