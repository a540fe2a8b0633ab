"""cost.links: measured link bandwidth by message size (Sailor's fits), by hand and as properties."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.cost import links, physics
from gpualloc.cost.links import BandwidthCurve, bus_bandwidth_bytes_per_s, load_link_curves
from gpualloc.errors import CostModelError
from gpualloc.hardware.catalog import LinkType, default_catalog

CATALOG = default_catalog()
NVLINK2 = CATALOG.link("nvlink2")
V100 = (-0.2045115, 7.21163513, 22.24208487)  # intra_node_bandwidths.json ["V100-16"]["2"], GB/s
V100_CAP = 68281636948.0


def fit_gb_s(c, nbytes):
    x = math.log2(nbytes / 1e6)
    return c[0] * x * x + c[1] * x + c[2]


# ------------------------------------------------------------------------------------------ known answers


def test_v100_nvlink_curve_is_the_fit_at_1_and_16_mb_and_the_cap_at_1_gb():
    bw = bus_bandwidth_bytes_per_s(NVLINK2, np.array([1e6, 16e6, 1e9]))
    assert bw[0] == pytest.approx(22.24208487e9, rel=1e-12)  # x = 0: c0
    assert bw[1] == pytest.approx((16 * V100[0] + 4 * V100[1] + V100[2]) * 1e9, rel=1e-12)
    assert fit_gb_s(V100, 1e9) * 1e9 > V100_CAP  # the fit passes the largest measured value ...
    assert bw[2] == V100_CAP  # ... and is capped there


def test_a_curve_below_its_cap_at_1_gb_is_the_fit_there():
    eth25 = CATALOG.link("eth-25g")  # two 1-GPU A100 VMs: ["us-central1-a"]["A100-40"]["1"] -> same
    c = (-0.0024414231124647644, 0.1408627339370467, 1.116822757126346)
    assert bus_bandwidth_bytes_per_s(eth25, 1e9) == pytest.approx(fit_gb_s(c, 1e9) * 1e9, rel=1e-12)
    assert bus_bandwidth_bytes_per_s(eth25, 1e6) == pytest.approx(c[2] * 1e9, rel=1e-12)


def test_a_4xv100_nvlink_node_reaches_36_to_68_gb_s_not_the_catalogs_150():
    bw = bus_bandwidth_bytes_per_s(NVLINK2, 2.0 ** np.arange(23, 31))  # 8 MiB .. 1 GiB
    assert np.all((bw >= 36e9) & (bw <= 68.3e9))
    assert NVLINK2.bandwidth_bytes_per_s == 150e9


def test_below_the_smallest_size_used_the_bandwidth_holds_and_never_goes_negative():
    # the V100 fit itself is negative at 64 KiB (x = -3.93); below 1 MB the curve holds its value at 1 MB
    assert fit_gb_s(V100, 2**16) < 0
    np.testing.assert_allclose(bus_bandwidth_bytes_per_s(NVLINK2, [0, 1, 2**16, 1e6]), 22.24208487e9)


def test_a_fit_past_its_vertex_is_held_at_its_top_so_bandwidth_never_falls():
    c = (-0.5, 4.0, 10.0)  # vertex at x = 4 (16 MB): 18 GB/s, then falling
    curve = BandwidthCurve(c, 100e9, "test", "test")
    assert curve.x_range() == (0.0, 4.0)
    assert curve.bandwidth_bytes_per_s(1e9) == pytest.approx(18e9)
    convex = BandwidthCurve((0.5, 4.0, 10.0), 100e9, "test", "test", min_nbytes=2**-6 * 1e6)  # bottom at x = -4
    assert convex.x_range()[0] == -4.0
    assert convex.bandwidth_bytes_per_s(2**-6 * 1e6) == pytest.approx(2e9)  # not the 16 GB/s the fit gives at x = -6


def test_unmeasured_links_take_the_nominal_peak_times_the_shape_of_their_kind():
    sizes = np.array([1e6, 16e6, 256e6, 1e9])
    v100 = load_link_curves().curves["v100-nvlink-pair"]
    own = LinkType("my-nvlink", "nvlink", 100e9, 3e-6)
    np.testing.assert_allclose(bus_bandwidth_bytes_per_s(own, sizes),
                               100e9 * v100.bandwidth_bytes_per_s(sizes) / V100_CAP)
    gh200 = load_link_curves().curves["gh200-nvlink-pair"]  # nvlink4 is named for the GH200 pair's shape
    np.testing.assert_allclose(bus_bandwidth_bytes_per_s(CATALOG.link("nvlink4"), sizes), 450e9 * gh200.shape(sizes))
    odd = LinkType("carrier-pigeon", "avian", 1e3, 1.0)  # a kind with no curve: the nominal peak
    np.testing.assert_array_equal(bus_bandwidth_bytes_per_s(odd, sizes), 1e3)


def test_a_measured_link_declared_slower_than_its_curve_keeps_its_own_peak():
    slow = LinkType("nvlink2", "nvlink", 30e9, 3e-6)
    assert bus_bandwidth_bytes_per_s(slow, 1e9) == 30e9
    assert bus_bandwidth_bytes_per_s(slow, 1e6) == pytest.approx(22.24208487e9)


def test_every_catalog_link_rises_with_size_and_stays_under_its_peak():
    sizes = np.logspace(0, 12, 200)
    for link in CATALOG.links.values():
        bw = bus_bandwidth_bytes_per_s(link, sizes)
        assert np.all(np.diff(bw) >= 0), link.name
        assert np.all(bw <= link.bandwidth_bytes_per_s), link.name
        assert bw[0] < bw[-1], link.name  # small messages get less than large


def test_transfer_and_ring_allreduce_use_physics_at_the_sizes_bandwidth():
    t = links.transfer_time_s(16e6, NVLINK2)
    assert t == pytest.approx(3e-6 + 16e6 / ((16 * V100[0] + 4 * V100[1] + V100[2]) * 1e9))
    # Sailor's estimate_ar_time: 2 (n - 1) sends of the chunk nbytes / n, each at the chunk's bandwidth
    chunk_s = 3e-6 + 16e6 / bus_bandwidth_bytes_per_s(NVLINK2, 16e6)
    assert links.ring_allreduce_s(64e6, 4, NVLINK2) == pytest.approx(2 * 3 * chunk_s)
    assert links.ring_allreduce_s(64e6, 1, NVLINK2) == 0.0
    np.testing.assert_allclose(links.ring_allreduce_s(np.array([64e6]), np.array([4]), NVLINK2),
                               physics.ring_allreduce_s(64e6, 4, 3e-6, bus_bandwidth_bytes_per_s(NVLINK2, 16e6)))


def test_the_shipped_fits_are_the_shared_sailor_files(shared_data):
    intra = json.loads((shared_data / "sailor-profiles/network/intra_node_bandwidths.json").read_text())
    net = json.loads((shared_data / "sailor-profiles/network/multizone_bandwidths_het.json").read_text())
    z = "us-central1-a"
    want = {"v100-nvlink-pair": intra["V100-16"]["2"], "a100-nvlink-pair": intra["A100-40"]["2"],
            "gh200-nvlink-pair": intra["GH-96"]["2"], "rtx2080-pcie-pair": intra["RTX-2080"]["2"],
            "gcp-a100-1gpu-vm": net[z]["A100-40"]["1"][z]["A100-40"]["1"],
            "gcp-a100-4gpu-vm": net[z]["A100-40"]["4"][z]["A100-40"]["4"]}
    for name, curve in load_link_curves().curves.items():
        assert [list(curve.coeffs), curve.max_bytes_per_s] == want[name], name


def test_the_docs_table_has_a_row_for_every_catalog_link_and_is_the_one_in_the_docs():
    text = links.format_tables()
    assert all(f"| {name} |" in text for name in CATALOG.links)
    assert "| nvlink2 | measured | v100-nvlink-pair | 22.2 | 47.8 | 66.8 | 68.3 | 68.3 | 150.0 |" in text
    assert text in (Path(__file__).resolve().parents[2] / "docs" / "cost-model.md").read_text()


# ------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d: d["curves"]["v100-nvlink-pair"].pop("coeffs"), "curves.v100-nvlink-pair.coeffs"),
    (lambda d: d["curves"]["v100-nvlink-pair"].update(min_nbytes=2**16), "curves.v100-nvlink-pair.coeffs"),
    (lambda d: d["curves"]["v100-nvlink-pair"].update(max_bytes_per_s=-1), "curves.v100-nvlink-pair.max_bytes_per_s"),
    (lambda d: d["links"]["nvlink2"].update(curve="nope"), "links.nvlink2.curve"),
    (lambda d: d["kind_shapes"].update(pcie="nope"), "kind_shapes.pcie"),
    (lambda d: d["links"]["nvlink2"].update(use="sometimes"), "links.nvlink2.use"),
])
def test_a_malformed_curves_file_names_the_field(tmp_path, edit, field):
    from importlib import resources

    doc = json.loads(resources.files("gpualloc.cost").joinpath("data/link_curves.json").read_text())
    edit(doc)
    path = tmp_path / "curves.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CostModelError, match=f"curves.json: {field}"):
        load_link_curves(path)


def test_a_curve_with_bad_numbers_is_refused():
    with pytest.raises(CostModelError, match="coeffs"):
        BandwidthCurve((1.0, math.nan, 1.0), 1e9, "t", "t")
    with pytest.raises(CostModelError, match="min_nbytes"):
        BandwidthCurve((0.0, 1.0, 1.0), 1e9, "t", "t", min_nbytes=1e9, max_nbytes=1e6)
    with pytest.raises(CostModelError, match="not positive"):
        BandwidthCurve((0.0, 1.0, -1.0), 1e9, "t", "t")


# ------------------------------------------------------------------------------------------ properties


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=1.0, max_value=1e12))
def test_bandwidth_is_finite_positive_and_capped_at_every_size(nbytes):
    for curve in load_link_curves().curves.values():
        bw = float(curve.bandwidth_bytes_per_s(nbytes))
        assert math.isfinite(bw) and 0 < bw <= curve.max_bytes_per_s
    for link in CATALOG.links.values():
        bw = float(bus_bandwidth_bytes_per_s(link, nbytes))
        assert math.isfinite(bw) and 0 < bw <= link.bandwidth_bytes_per_s
