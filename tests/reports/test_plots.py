"""Every PNG gpualloc writes: titled, axes labelled with units, named rows; checked on the Figure objects."""

from __future__ import annotations

import pytest

from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.simulate import Event
from gpualloc.placement.simulate import simulate_step
from gpualloc.reports.gantt import gantt_figure, plot_gantt, row_label
from gpualloc.reports.sched_plots import plot_runs, run_figures
from gpualloc.reports.tables import bars_figure, plot_bars
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.simulator import simulate
from gpualloc.workload.traces import generate

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def runs():
    cluster = load_cluster("adlro16")
    trace = generate(40, cluster, 0.8, seed=0)
    return [simulate(trace, cluster, make_policy(name)) for name in ("fcfs", "sjf", "srtf", "gavel", "tiresias")]


def _close(figs):
    import matplotlib.pyplot as plt

    for f in figs:
        plt.close(f)


def test_utilisation_and_queue_are_small_multiples_one_panel_per_policy(runs):
    figs = run_figures(runs, title="(adlro16)")
    try:
        for name, ylabel in (("utilization.png", "busy GPUs (fraction)"), ("queue.png", "queued jobs")):
            fig = figs[name]
            panels = [ax for ax in fig.axes if ax.get_visible()]
            assert [ax.get_title() for ax in panels] == [r.policy for r in runs]
            assert all(len(ax.lines) == 1 for ax in panels)  # one run per panel, nothing overlaps
            assert len({ax.get_ylim() for ax in panels}) == 1 and len({ax.get_xlim() for ax in panels}) == 1
            assert ylabel in fig._suptitle.get_text() and "(adlro16)" in fig._suptitle.get_text()
            assert {ax.get_xlabel() for ax in panels if ax.get_xlabel()} == {"time (h)"}
            assert {ax.get_ylabel() for ax in panels if ax.get_ylabel()} == {ylabel}
        cdf = figs["jct_cdf.png"].axes[0]
        assert cdf.get_title() == "JCT CDF (adlro16)" and "(h" in cdf.get_xlabel() and cdf.get_ylabel()
        assert [t.get_text() for t in cdf.get_legend().get_texts()] == [r.policy for r in runs]
    finally:
        _close(figs.values())


def test_plot_runs_writes_the_three_pngs(runs, tmp_path):
    paths = plot_runs(runs, tmp_path / "plots")
    assert [p.name for p in paths] == ["jct_cdf.png", "utilization.png", "queue.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_gantt_rows_are_named_by_the_cluster(tmp_path, diamond_graph):
    cluster = load_cluster("2xA100+2xV100")
    graph = diamond_graph
    problem = PlacementProblem(graph, cluster, microbatches=2)
    plan = [i % len(cluster) for i in range(len(graph))]
    events = simulate_step(problem, plan, record_events=True).events
    names = [d.label for d in cluster.devices]
    fig = gantt_figure(events, title="diamond: round-robin", device_names=names)
    try:
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels and not any(lab.startswith(("dev:", "link:")) for lab in labels)
        assert set(labels) & set(names)
        assert any(" → " in lab for lab in labels)  # links name both ends
        assert ax.get_title() == "diamond: round-robin" and ax.get_xlabel().startswith("time within the step (")
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == ["forward", "backward", "transfer", "optimizer step"]
    finally:
        _close([fig])
    assert plot_gantt(events, tmp_path / "g.png", device_names=names).is_file()


def test_row_labels_fall_back_to_the_resource_without_names():
    assert row_label("dev:1") == "dev:1"
    assert row_label("dev:1", ["a", "b"]) == "b"
    assert row_label("link:0->1", ["a", "b"]) == "a → b"


def test_bars_use_the_tables_unit_and_have_a_title(tmp_path):
    rows = [{"model": "m", "cluster": "c", "method": "static", "energy_j": 2.5e6, "energy_j_std": 1e5},
            {"model": "m", "cluster": "c", "method": "replan", "energy_j": 2.0e6}]
    fig = bars_figure(rows, ("model", "cluster"), "method", "energy_j", ylabel="energy (MJ)", title="energy",
                      scale=1e-6)
    try:
        ax = fig.axes[0]
        assert ax.get_title() == "energy" and ax.get_ylabel() == "energy (MJ)"
        heights = sorted(round(p.get_height(), 6) for p in ax.patches)
        assert heights == [2.0, 2.5]  # MJ, as in the table, not J
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["static", "replan"]
    finally:
        _close([fig])
    assert plot_bars(rows, ("model",), "method", "energy_j", tmp_path / "e.png", ylabel="energy (MJ)",
                     scale=1e-6).is_file()


def test_bars_on_a_log_axis_for_values_orders_of_magnitude_apart():
    """The real-trace plot: FCFS at thousands of hours beside the best policies at tens."""
    rows = [{"trace": "t", "policy": "fcfs", "avg_jct_s": 3.6e6}, {"trace": "t", "policy": "srtf", "avg_jct_s": 3.6e4}]
    for log, scale in ((False, "linear"), (True, "log")):
        fig = bars_figure(rows, ("trace",), "policy", "avg_jct_s", ylabel="h", title="t", scale=1 / 3600, log=log)
        try:
            assert fig.axes[0].get_yscale() == scale
            assert sorted(round(p.get_height(), 6) for p in fig.axes[0].patches) == [10.0, 1000.0]
        finally:
            _close([fig])


def test_gantt_legend_lists_the_phases_drawn():
    """A hybrid step has all-reduce and optimizer bars and may have no transfers: the legend follows."""
    events = [Event(0.0, 1.0, "dev:0", "F s0 mb0"), Event(1.0, 3.0, "dev:0", "B s0 mb0"),
              Event(3.0, 3.5, "dev:0", "A s0"), Event(3.5, 3.6, "dev:0", "O s0")]
    fig = gantt_figure(events)
    try:
        assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [
            "forward", "backward", "gradient all-reduce (exposed)", "optimizer step"]
    finally:
        _close([fig])
