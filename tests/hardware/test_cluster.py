"""Clusters: presets, shorthand, TOML/YAML files, and their error messages."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.errors import ClusterError
from gpualloc.hardware.catalog import default_catalog
from gpualloc.hardware.cluster import PRESETS, ClusterSpec, build_cluster, load_cluster


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------- presets

@pytest.mark.parametrize("name, counts, n_nodes", [
    ("8xA100", {"A100-40GB": 8}, 1),
    ("adlro16", {"V100-16GB": 8, "T4": 4, "MI50": 4}, 3),
    ("mixed-gen", {"H100-SXM": 8, "A100-40GB": 8, "V100-16GB": 8, "T4": 8}, 4),
    ("gavel108", {"V100-16GB": 36, "P100": 36, "K80": 36}, 27),
])
def test_presets(name, counts, n_nodes):
    c = load_cluster(name)
    assert isinstance(c, ClusterSpec) and c.type_counts() == counts
    assert len(c) == sum(counts.values()) and len(c.nodes) == n_nodes
    assert [d.index for d in c.devices] == list(range(len(c)))


def test_every_preset_loads():
    for name, factory in PRESETS.items():
        assert len(factory()) > 0, name


def test_adlro16_links():
    c = load_cluster("adlro16")
    assert [n.link.kind for n in c.nodes] == ["pcie", "pcie", "pcie"]
    assert c.network.name.startswith("eth-")
    assert [len(n.devices) for n in c.nodes] == [8, 4, 4]


def test_8xa100_is_one_nvlink3_node():
    c = load_cluster("8xA100")
    assert c.nodes[0].link.name == "nvlink3"
    assert c.devices[3].label == "n0.A100-40GB.3"
    assert c.link_between(0, 7).name == "nvlink3" and c.link_between(2, 2) is None


# ----------------------------------------------------------------------------------- shorthand

def test_shorthand_large_cluster():
    c = load_cluster("512xV100+256xP100+256xK80")
    assert len(c) == 1024 and len(c.nodes) == 128
    assert c.type_counts() == {"V100-16GB": 512, "P100": 256, "K80": 256}
    assert c.link_between(0, 7) == default_catalog().link("nvlink2")  # same node: device link
    assert c.link_between(0, 8) == c.network                           # across nodes: network
    assert c.link_between(1020, 1021).name == "pcie3"                  # K80 node
    bw = c.bandwidth
    assert bw.shape == (1024, 1024) and math.isinf(bw[5, 5])
    assert bw[0, 7] == 150e9 and bw[0, 8] == c.network.bandwidth_bytes_per_s


def test_shorthand_partial_nodes_and_network_suffix():
    c = load_cluster("10xA100+3xT4@eth-25g")
    assert [len(n.devices) for n in c.nodes] == [8, 2, 3]
    assert [n.link.name for n in c.nodes] == ["nvlink3", "nvlink3", "pcie3"]
    assert c.network.name == "eth-25g"
    assert c.devices[9].label == "n1.A100-40GB.1"
    assert [t.name for t in c.device_types] == ["A100-40GB", "T4"]


def test_matrices_are_symmetric_with_known_diagonals():
    c = load_cluster("4xA100+4xV100")
    bw, lat = c.bandwidth, c.latency
    assert np.array_equal(bw, bw.T) and np.array_equal(lat, lat.T)
    assert np.all(np.isinf(np.diag(bw))) and np.all(np.diag(lat) == 0)
    assert not (bw.flags.writeable or lat.flags.writeable or c.gpu_mem_bytes.flags.writeable)
    assert c.gpu_mem_bytes.tolist() == [d.type.mem_bytes for d in c.devices]
    for i in range(len(c)):
        for j in range(len(c)):
            if i != j:
                link = c.link_between(i, j)
                assert bw[i, j] == link.bandwidth_bytes_per_s and lat[i, j] == link.latency_s


@pytest.mark.parametrize("spec, pattern", [
    ("4xZ100", r"^'4xZ100': term '4xZ100': unknown device type 'Z100'; known: "),
    ("4xA100+2xQ9", r"term '2xQ9': unknown device type 'Q9'"),
    ("4xA100+V100", r"term 'V100': expected NxTYPE"),
    ("0xA100", r"term '0xA100': count must be positive"),
    ("4xA100@warp", r"network: unknown link type 'warp'"),
    ("nonsense", r"unknown cluster 'nonsense': not a preset"),
])
def test_shorthand_errors(spec, pattern):
    with pytest.raises(ClusterError, match=pattern):
        load_cluster(spec)


def test_to_dict():
    c = load_cluster("adlro16")
    d = c.to_dict()
    assert d["name"] == "adlro16" and len(d["devices"]) == 16 and len(d["nodes"]) == 3
    assert set(d["device_types"]) == {"V100-16GB", "T4", "MI50"}
    assert d["links"][d["network"]]["kind"] == "network"


# --------------------------------------------------------------------------------------- files

TOML = """
name = "lab"
network = "ib-hdr"

[device_types.Gaudi2]            # an inline type with only some fields
mem_gb = 96
tdp_w = 600
idle_w = 100

[[nodes]]
devices = {A100 = 4, T4 = 2}

[[nodes]]
devices = ["V100", "V100"]
count = 2
link = "pcie3"

[[nodes]]
name = "habana"
devices = {Gaudi2 = 8}
"""

YAML = """
name: lab-yaml
device_types:
  MyGPU:
    tensor_tflops: 50
    mem_gib: 24
    tdp_w: 250
    idle_w: 30
    link: pcie4
nodes:
  - devices: {MyGPU: 2, T4: 1}
  - devices: [H100, H100, H100, H100]
    count: 2
"""


def test_toml_file(tmp_path):
    c = load_cluster(write(tmp_path, "cluster.toml", TOML))
    assert c.name == "lab" and c.network.name == "ib-hdr"
    assert c.type_counts() == {"A100-40GB": 4, "T4": 2, "V100-16GB": 4, "Gaudi2": 8}
    assert [n.name for n in c.nodes] == ["n0", "n1", "n2", "habana"]
    assert [n.link.name for n in c.nodes] == ["pcie3", "pcie3", "pcie3", "pcie3"]
    gaudi = c.catalog.device("gaudi2")
    assert gaudi.tensor_tflops is None and gaudi.mem_bytes == 96_000_000_000 and gaudi.source == ""
    assert c.link_between(0, 5).name == "pcie3" and c.link_between(0, 6).name == "ib-hdr"


def test_yaml_file(tmp_path):
    c = load_cluster(str(write(tmp_path, "c.yaml", YAML)))
    assert c.name == "lab-yaml" and c.network.name == "eth-100g"
    assert c.type_counts() == {"MyGPU": 2, "T4": 1, "H100-SXM": 8}
    assert c.nodes[0].link.name == "pcie3"   # mixed node: slowest PCIe among pcie4 and pcie3
    assert c.nodes[1].link.name == "nvlink4" and c.nodes[2].link.name == "nvlink4"
    assert c.devices[0].type.tensor_tflops == 50 and c.devices[0].type.fp32_tflops is None


def test_file_name_defaults_to_stem(tmp_path):
    c = load_cluster(write(tmp_path, "rack7.yml", "nodes:\n  - devices: [T4]\n"))
    assert c.name == "rack7" and len(c) == 1


@pytest.mark.parametrize("name, text, pattern", [
    ("cluster.toml", "name = 'x'\n[[nodes]\n", r"cluster.toml:2: "),
    ("cluster.yaml", "name: x\nnodes:\n  - devices: [A100\n  - x: ]\n", r"cluster.yaml:\d+: "),
    ("cluster.toml", "[[nodes]]\ndevices = ['A100']\n[[nodes]]\ndevices = {Z100 = 1}\n",
     r"cluster.toml: nodes\[1\].devices: unknown device type 'Z100'; known: H100-SXM"),
    ("cluster.toml", "[[nodes]]\ndevices = ['A100']\ncont = 2\n", r"cluster.toml: nodes\[0\].cont: unknown field$"),
    ("cluster.toml", "netwrk = 'ib-hdr'\n[[nodes]]\ndevices = ['A100']\n", r"cluster.toml: netwrk: unknown field$"),
    ("cluster.toml", "[[nodes]]\ndevices = ['A100']\ncount = 0\n",
     r"cluster.toml: nodes\[0\].count: Input should be greater than 0"),
    ("cluster.toml", "[[nodes]]\ndevices = {A100 = 0}\n",
     r"cluster.toml: nodes\[0\].devices: count of 'A100' must be a positive integer"),
    ("cluster.toml", "[[nodes]]\ndevices = []\n",
     r"cluster.toml: nodes\[0\].devices: a node needs at least one device"),
    ("cluster.toml", "name = 'x'\n", r"cluster.toml: nodes: required field is missing"),
    ("cluster.toml", "nodes = []\n", r"cluster.toml: nodes: List should have at least 1 item"),
    ("cluster.toml", "network = 'warp'\n[[nodes]]\ndevices = ['A100']\n",
     r"cluster.toml: network: unknown link type 'warp'"),
    ("cluster.toml", "[[nodes]]\ndevices = ['A100']\nlink = 'warp'\n",
     r"cluster.toml: nodes\[0\].link: unknown link type 'warp'"),
    ("cluster.toml", "[device_types.G]\nmem_gb = 1\ntdp_w = 10\nidle_w = 20\n[[nodes]]\ndevices = ['G']\n",
     r"cluster.toml: device_types.G: idle_w: must be less than tdp_w"),
    ("cluster.toml", "[device_types.G]\nmem_gb = 1\ntdp_w = 10\nidle_w = 2\nflops = 3\n[[nodes]]\ndevices = ['G']\n",
     r"cluster.toml: device_types.G: flops: unknown field$"),
    ("cluster.toml",
     "[device_types.G]\nmem_gb = 1\ntdp_w = 10\nidle_w = 2\nlink = 'warp'\n[[nodes]]\ndevices = ['G']\n",
     r"cluster.toml: device_types.G.link: unknown link type 'warp'"),
    ("cluster.yaml", "- just\n- a list\n", r"cluster.yaml: expected a table"),
])
def test_malformed_files_give_one_line_naming_the_field(tmp_path, name, text, pattern):
    with pytest.raises(ClusterError, match=pattern) as info:
        load_cluster(write(tmp_path, name, text))
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(ClusterError, match=r"nope.toml: cannot read"):
        load_cluster(tmp_path / "nope.toml")


# ------------------------------------------------------------------------- cached index arrays

def _old_index_arrays(c: ClusterSpec) -> dict[str, np.ndarray]:
    """The per-device arrays as the simulator, the service and the policies used to rebuild them."""
    names = [t.name for t in c.device_types]
    gpu_type = np.array([names.index(d.type.name) for d in c.devices], dtype=np.int64)
    gpu_node = np.array([d.node for d in c.devices], dtype=np.int64)
    per_node = np.zeros((len(names), len(c.nodes)), dtype=np.int64)
    np.add.at(per_node, (gpu_type, gpu_node), 1)
    return {"gpu_type": gpu_type, "gpu_node": gpu_node, "gpus_per_type_node": per_node,
            "gpus_per_type": np.array([c.type_counts()[n] for n in names], dtype=np.int64),
            "largest_node_per_type": per_node.max(axis=1)}


def _assert_cached_arrays_match(c: ClusterSpec) -> None:
    assert c.type_names == tuple(t.name for t in c.device_types) == tuple(c.type_counts())
    for name, want in _old_index_arrays(c).items():
        got = getattr(c, name)
        assert got.dtype == np.int64 and not got.flags.writeable, name
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert getattr(c, name) is got, name  # computed once


@pytest.mark.parametrize("name", list(PRESETS))
def test_cached_index_arrays_equal_the_old_computation_on_presets(name):
    _assert_cached_arrays_match(load_cluster(name))


def test_cached_index_arrays_are_read_only():
    c = load_cluster("adlro16")
    with pytest.raises(ValueError, match="read-only"):
        c.gpu_type[0] = 1
    with pytest.raises(ValueError, match="read-only"):
        c.gpus_per_type_node[0, 0] = 0
    np.testing.assert_array_equal(c.gpus_per_type, [8, 4, 4])
    np.testing.assert_array_equal(c.largest_node_per_type, [8, 4, 4])


_TYPES = ["A100-40GB", "V100-16GB", "T4", "MI50", "K80"]


@given(st.lists(st.lists(st.tuples(st.sampled_from(_TYPES), st.integers(1, 3)), min_size=1, max_size=3),
                min_size=1, max_size=5))
@settings(max_examples=40, deadline=None)
def test_cached_index_arrays_equal_the_old_computation_on_random_clusters(nodes):
    cat = default_catalog()
    spec = [(f"n{k}", [cat.device(t) for t, n in node for _ in range(n)], cat.link("pcie3"))
            for k, node in enumerate(nodes)]
    _assert_cached_arrays_match(build_cluster("random", spec, cat.link("eth-100g"), cat))
