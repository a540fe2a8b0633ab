"""Every test here keeps quick CPU calibrations in its own cache folder, never the user's."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUALLOC_CACHE_DIR", raising=False)  # it would come first (tests/conftest.py sets it)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tmp_path / "xdg-cache" / "gpualloc"
