"""The disk cache: a stored value comes back for its key only; corrupt or foreign entries are misses
that the next write replaces; writes are atomic; an unwritable folder is a warning, not an error."""

from __future__ import annotations

import os

import pytest

from gpualloc.cache import CacheWarning, DiskCache, code_key, digest, source_hash


def test_a_value_comes_back_for_its_own_key_only(tmp_path):
    cache = DiskCache(tmp_path)
    key = {"model": "m", "batch": 2, "shape": (1, 2)}
    assert cache.get("k", key) is None
    path = cache.put("k", key, {"x": [1, 2.5, None]})
    assert path is not None and path.parent == tmp_path / "k"
    assert cache.get("k", key) == {"x": [1, 2.5, None]}
    assert cache.get("k", {**key, "batch": 3}) is None
    assert cache.get("other", key) is None
    assert [p.name for p in (tmp_path / "k").iterdir()] == [path.name]  # no temporary file left behind


@pytest.mark.parametrize("content", [b"", b"{not json", b"\xff\xfe binary", b"[1, 2]",
                                     b'{"key": {"a": 1}, "value": 5}'])
def test_a_corrupt_or_foreign_entry_is_a_miss_and_is_rewritten(tmp_path, content):
    cache = DiskCache(tmp_path)
    key = {"a": 2}
    path = cache.path("k", key)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    assert cache.get("k", key) is None
    cache.put("k", key, "fresh")
    assert cache.get("k", key) == "fresh"


def test_key_order_does_not_matter_and_digests_differ_per_value():
    assert digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1})
    assert digest({"a": 1}) != digest({"a": 2})


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_folder_warns_and_keeps_nothing(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.warns(CacheWarning, match="cannot write"):
            assert DiskCache(tmp_path / "c").put("k", {"a": 1}, 1) is None
    finally:
        tmp_path.chmod(0o700)


def test_a_cache_under_a_file_warns_and_keeps_nothing(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.warns(CacheWarning, match="cannot write"):
        assert DiskCache(tmp_path / "file" / "c").put("k", {"a": 1}, 1) is None


def test_the_code_key_follows_the_source():
    assert source_hash(["graph/zoo.py"]) == source_hash(["graph/zoo.py"])
    assert source_hash(["graph/zoo.py"]) != source_hash(["graph/capture.py"])
    assert source_hash(["rl/dqn"]) != source_hash(["rl/dqn/agent.py"])  # a folder is all its files
    assert set(code_key(["graph/zoo.py"])) == {"gpualloc", "source"}
