"""The built-in hardware catalog and the catalog-row schema."""

from __future__ import annotations

import pytest

from gpualloc.errors import CatalogError
from gpualloc.hardware.catalog import default_catalog, load_catalog
from gpualloc.hardware.schema import DeviceRow, LinkRow

REQUIRED = {
    "H100-SXM": ["H100"],
    "H200": ["H200-SXM"],
    "A100-40GB": ["A100", "A100-SXM4-40GB"],
    "A100-80GB": [],
    "V100-16GB": ["V100", "V100-SXM2-16GB"],
    "V100-32GB": [],
    "T4": [],
    "P100": ["P100-16GB"],
    "K80": [],
    "A10": [],
    "L4": [],
    "RTX-2080Ti": ["2080Ti", "RTX2080Ti"],
    "RTX-6000": ["Quadro RTX 6000", "RTX6000"],
    "MI50": [],
    "MI100": [],
    "MI250X": [],
    "MI300X": [],
    "cpu": [],
}
LINKS = ["nvlink1", "nvlink2", "nvlink3", "nvlink4", "pcie3", "pcie4", "pcie5", "infinity-fabric",
         "ib-edr", "ib-hdr", "ib-ndr", "eth-10g", "eth-25g", "eth-100g"]

GOOD_ROW = {"name": "X1", "vendor": "nvidia", "architecture": "test", "tensor_tflops": 100,
            "fp32_tflops": 10, "mem_gb": 16, "mem_bandwidth_gbps": 900, "tdp_w": 300, "idle_w": 40,
            "source": "test"}


@pytest.fixture(scope="module")
def cat():
    return default_catalog()


def test_every_required_device_is_present_with_positive_numbers(cat):
    assert set(REQUIRED) <= set(cat.devices)
    for dev in cat.devices.values():
        assert dev.tensor_tflops > 0 and dev.fp32_tflops > 0 and dev.fp64_tflops > 0, dev.name
        assert dev.mem_bytes > 0 and dev.mem_bandwidth_bytes_per_s > 0, dev.name
        assert 0 < dev.idle_w < dev.tdp_w, dev.name
        assert dev.source.strip(), dev.name
        assert dev.link in cat.links, dev.name
        assert dev.vendor in ("nvidia", "amd", "intel", "other")


def test_every_required_link_is_present_with_positive_numbers(cat):
    assert set(LINKS) <= set(cat.links)
    for link in cat.links.values():
        assert link.bandwidth_bytes_per_s > 0 and link.latency_s > 0 and link.source.strip()


def test_known_datasheet_numbers(cat):
    h100, a100, v100, t4, mi50 = (cat.device(n) for n in ("H100", "A100", "V100", "T4", "MI50"))
    assert h100.tensor_tflops == pytest.approx(989, abs=1)  # dense BF16, not the 1979 sparse figure
    assert (a100.tensor_tflops, a100.fp32_tflops, a100.mem_bytes) == (312.0, 19.5, 40 * 2**30)
    assert (v100.tensor_tflops, v100.fp32_tflops, v100.fp64_tflops) == (125.0, 15.7, 7.8)
    assert (t4.tensor_tflops, t4.fp32_tflops, t4.fp64_tflops) == (65.0, 8.1, 0.25)
    assert (mi50.tensor_tflops, mi50.fp32_tflops, mi50.fp64_tflops) == (26.5, 13.3, 6.6)
    assert cat.device("MI300X").tensor_tflops == pytest.approx(1307.4)
    assert v100.mem_bandwidth_bytes_per_s == 900e9
    assert cat.link("nvlink3").bandwidth_bytes_per_s == 300e9
    assert cat.link("pcie3").latency_s == pytest.approx(10e-6)


def test_best_intra_node_links(cat):
    expected = {"V100": "nvlink2", "A100": "nvlink3", "H100": "nvlink4", "H200": "nvlink4",
                "T4": "pcie3", "K80": "pcie3", "MI50": "pcie4"}
    for name, link in expected.items():
        assert cat.device(name).link == link
    assert cat.link(cat.device("MI250X").link).kind == "infinity-fabric"
    assert cat.link(cat.device("MI300X").link).kind == "infinity-fabric"


@pytest.mark.parametrize("alias, canonical", [
    (alias, name) for name, aliases in REQUIRED.items() for alias in [name, *aliases]
] + [("a100", "A100-40GB"), ("quadro rtx 6000", "RTX-6000")])
def test_aliases_resolve_case_insensitively(cat, alias, canonical):
    assert cat.device(alias).name == canonical


def test_unknown_device_and_link_name_themselves(cat):
    with pytest.raises(CatalogError, match=r"unknown device type 'Z100'; known: H100-SXM"):
        cat.device("Z100")
    with pytest.raises(CatalogError, match=r"unknown link type 'warp'"):
        cat.link("warp")


def test_to_dict_round_trips_fields(cat):
    d = cat.device("A100").to_dict()
    assert d["name"] == "A100-40GB" and "A100" in d["aliases"] and d["mem_bytes"] == 40 * 2**30


def test_device_row_units():
    dev = DeviceRow.parse({**GOOD_ROW, "mem_gb": None, "mem_gib": 2}, "w").to_device_type()
    assert dev.mem_bytes == 2 * 2**30 and dev.mem_bandwidth_bytes_per_s == 900e9
    assert DeviceRow.parse(GOOD_ROW, "w").to_device_type().mem_bytes == 16_000_000_000
    dev = DeviceRow.parse({"name": "m", "mem_bytes": 10, "tdp_w": 5, "idle_w": 1}, "w",
                          require_source=False).to_device_type()
    assert (dev.tensor_tflops, dev.mem_bandwidth_bytes_per_s, dev.link, dev.source) == (None, None, "pcie3", "")
    link = LinkRow.parse({"name": "X", "kind": "pcie", "bandwidth_gbps": 2, "latency_us": 5,
                          "source": "s"}, "w").to_link_type()
    assert (link.name, link.bandwidth_bytes_per_s, link.latency_s) == ("x", 2e9, pytest.approx(5e-6))


@pytest.mark.parametrize("change, pattern", [
    ({"tensor_tflops": -1}, r"^w: tensor_tflops: Input should be greater than 0"),
    ({"tdp_w": "lots"}, r"^w: tdp_w: "),
    ({"mem_gb": None}, r"^w: mem_gb: required field is missing \(give one of mem_gb, mem_gib, mem_bytes\)"),
    ({"mem_gib": 16}, r"^w: mem_gb: give only one of"),
    ({"idle_w": 400}, r"^w: idle_w: must be less than tdp_w"),
    ({"vendr": "nvidia"}, r"^w: vendr: unknown field$"),
    ({"source": ""}, r"^w: source: required"),
    ({"vendor": "acme"}, r"^w: vendor: "),
])
def test_malformed_device_row_names_the_field(change, pattern):
    with pytest.raises(CatalogError, match=pattern) as info:
        DeviceRow.parse({**GOOD_ROW, **change}, "w")
    assert "\n" not in str(info.value)


def test_malformed_link_row_names_the_field():
    with pytest.raises(CatalogError, match=r"^w: kind: "):
        LinkRow.parse({"name": "x", "kind": "warp", "bandwidth_gbps": 1, "latency_us": 1, "source": "s"}, "w")
    with pytest.raises(CatalogError, match=r"^w: latency_us: required"):
        LinkRow.parse({"name": "x", "kind": "pcie", "bandwidth_gbps": 1, "source": "s"}, "w")


def test_malformed_catalog_file_names_row_and_field(tmp_path):
    path = tmp_path / "cat.toml"
    path.write_text('[link.pcie3]\nkind = "pcie"\nbandwidth_gbps = 15.75\nlatency_us = 10\nsource = "s"\n'
                    '[device.X1]\nmem_gb = 16\ntdp_w = 300\nidle_w = 40\nsource = "s"\nfp32_tflops = 0\n')
    with pytest.raises(CatalogError, match=r"cat.toml: device.X1: fp32_tflops: Input should be greater than 0"):
        load_catalog(path)
    path2 = tmp_path / "cat2.toml"
    path2.write_text('[device.X1]\nmem_gb = 16\ntdp_w = 300\nidle_w = 40\nsource = "s"\nlink = "warp"\n')
    with pytest.raises(CatalogError, match=r"cat2.toml: device.X1: link: unknown link type 'warp'"):
        load_catalog(path2)
    path3 = tmp_path / "cat3.toml"
    path3.write_text('[device.X1\n')
    with pytest.raises(CatalogError, match=r"cat3.toml: "):
        load_catalog(path3)


def test_missing_or_binary_catalog_file_is_one_line(tmp_path):
    with pytest.raises(CatalogError, match=r"nope.toml: cannot read: "):
        load_catalog(tmp_path / "nope.toml")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(CatalogError, match=r"bin.toml: not UTF-8 text \(a binary file\?\): byte 128"):
        load_catalog(binary)
