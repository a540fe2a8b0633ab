"""Captured zoo graphs are cached: a hit is the same graph without tracing, any key change misses, and a
corrupt entry is traced again and rewritten."""

from __future__ import annotations

import pytest

import gpualloc.graph.capture as capture_mod
from gpualloc.cache import DiskCache
from gpualloc.graph import cached
from gpualloc.graph.cached import KIND, capture_cached, capture_key


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A cache holding resnet-tiny at batch 2 (one real trace), and that graph."""
    cache = DiskCache(tmp_path_factory.mktemp("cache"))
    return cache, capture_cached("resnet-tiny", batch=2, cache=cache)


@pytest.fixture
def traces(monkeypatch):
    """The models traced during a test (the real capture runs)."""
    seen = []
    real = capture_mod.capture

    def spy(model, **kw):
        seen.append((model, kw["batch"], kw["granularity"]))
        return real(model, **kw)

    monkeypatch.setattr(capture_mod, "capture", spy)
    return seen


def test_a_hit_is_the_same_graph_without_tracing(warm, traces):
    cache, graph = warm
    again = capture_cached("resnet-tiny", batch=2, cache=cache)
    assert traces == []
    assert again is not graph and again.to_dict() == graph.to_dict()
    assert again.meta == graph.meta and again.batch_size == 2


def test_a_changed_key_misses(warm, traces):
    cache, _ = warm
    g = capture_cached("resnet-tiny", batch=3, cache=cache)
    assert traces == [("resnet-tiny", 3, "op")] and g.batch_size == 3
    key = capture_key("resnet-tiny", 2)
    for changed in ({"granularity": "layer"}, {"torch": "0.0"}, {"source": "0" * 64}, {"gpualloc": "0.0.0"},
                    {"model": "bert-tiny"}):
        assert cache.get(KIND, {**key, **changed}) is None, changed


def test_a_code_change_changes_the_key(monkeypatch):
    before = capture_key("resnet50", 32)
    monkeypatch.setattr(cached, "CAPTURE_SOURCES", (*cached.CAPTURE_SOURCES, "cost/model.py"))
    assert capture_key("resnet50", 32)["source"] != before["source"]


def test_a_corrupt_entry_is_traced_again_and_rewritten(warm, traces):
    cache, graph = warm
    path = cache.path(KIND, capture_key("resnet-tiny", 2))
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])  # truncated
    again = capture_cached("resnet-tiny", batch=2, cache=cache)
    assert traces == [("resnet-tiny", 2, "op")] and again.to_dict() == graph.to_dict()
    assert path.read_bytes() == good


def test_a_stored_graph_the_schema_refuses_is_traced_again(warm, traces):
    cache, graph = warm
    key = capture_key("resnet-tiny", 2)
    cache.put(KIND, key, {"format": "gpualloc-graph", "nodes": "not a list"})
    assert capture_cached("resnet-tiny", batch=2, cache=cache).to_dict() == graph.to_dict()
    assert len(traces) == 1 and cache.get(KIND, key) == graph.to_dict()


def test_no_cache_and_factories_always_trace(tmp_path, traces, monkeypatch):
    monkeypatch.setattr(capture_mod, "capture", lambda model, **kw: traces.append(model) or "graph")
    assert capture_cached("resnet-tiny", batch=2, cache=None) == "graph"
    assert capture_cached("pkg.mod:factory", batch=2, cache=DiskCache(tmp_path)) == "graph"
    assert traces == ["resnet-tiny", "pkg.mod:factory"] and not any(tmp_path.iterdir())
