"""Parsers of Slurm's output and the sbatch command line: pure functions, no Slurm needed."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.errors import ClusterError
from gpualloc.hardware.catalog import default_catalog
from gpualloc.hardware.cluster import cluster_from_nodes, load_cluster
from gpualloc.hardware.slurm import SlurmNode, gres_device_type, parse_gres, parse_sinfo, slurm_cluster_arg
from gpualloc.service.errors import BackendError
from gpualloc.service.slurm import (batch_script, exit_status, merge_components, parse_scontrol_record, parse_squeue,
                                    sbatch_argv)

CAT = default_catalog()


def test_parse_gres_reads_typed_gpus_and_skips_other_gres():
    assert parse_gres("gpu:v100:4,gpu:t4:2", "n0") == (("v100", 4), ("t4", 2))
    assert parse_gres("gpu:a100:8(S:0-1),mps:400,gpu:t4:1(S:0,1)", "n0") == (("a100", 8), ("t4", 1))
    assert parse_gres("(null)", "n0") == () and parse_gres("", "n0") == ()
    assert parse_gres("gpu:nvidia_a100-sxm4-40gb:4", "n0") == (("nvidia_a100-sxm4-40gb", 4),)


@pytest.mark.parametrize("text,fragment", [("gpu:4", "no GPU type"), ("gpu", "no GPU type"),
                                           ("gpu:v100:0", "count 0"), ("gpu:v100:99999999", "not in 1.."),
                                           ("gpu::", "cannot read")])
def test_parse_gres_refuses_untyped_or_absurd_items_naming_the_node(text, fragment):
    with pytest.raises(ClusterError, match=fragment) as err:
        parse_gres(text, "slurm node n7: Gres")
    assert str(err.value).startswith("slurm node n7: Gres") and "\n" not in str(err.value)


def test_parse_sinfo_merges_partitions_and_keeps_state():
    text = "n0|gpu:v100:4,gpu:t4:2|idle|gpu*\nn0|gpu:v100:4,gpu:t4:2|idle|all\nn1|gpu:a100:8|drained|gpu*\n\n"
    nodes = parse_sinfo(text)
    assert nodes == (SlurmNode("n0", (("v100", 4), ("t4", 2)), "idle", ("gpu", "all")),
                     SlurmNode("n1", (("a100", 8),), "drained", ("gpu",)))
    assert nodes[0].usable and not nodes[1].usable
    assert not SlurmNode("n2", (), "idle*", ()).usable and SlurmNode("n3", (), "mixed", ()).usable


def test_parse_sinfo_names_the_bad_line():
    with pytest.raises(ClusterError, match="sinfo line 2"):
        parse_sinfo("n0|gpu:v100:1|idle|gpu\nnot a sinfo line\n")
    with pytest.raises(ClusterError, match="slurm node n9: Gres"):
        parse_sinfo("n9|gpu:2|idle|gpu\n")


@pytest.mark.parametrize("gres,name", [("v100", "V100-16GB"), ("V100", "V100-16GB"), ("tesla_t4", "T4"),
                                       ("nvidia_a100-sxm4-40gb", "A100-40GB"), ("a100-pcie-80gb", "A100-80GB"),
                                       ("NVIDIA_H100_80GB_HBM3", "H100-SXM"), ("mi50", "MI50"),
                                       ("geforce_rtx_2080_ti", "RTX-2080Ti"), ("l4", "L4")])
def test_gres_types_map_to_catalog_types_case_insensitively(gres, name):
    assert gres_device_type(gres, CAT, "n0").name == name


def test_unknown_gres_type_is_one_line_naming_node_and_field():
    with pytest.raises(ClusterError) as err:
        cluster_from_nodes([SlurmNode("gpu-17", (("zx81", 2),), "idle", ("gpu",))])
    msg = str(err.value)
    assert msg.startswith("slurm node gpu-17: Gres: unknown GPU type 'zx81'") and "\n" not in msg


def test_cluster_from_nodes_keeps_slurm_names_and_gres_order():
    nodes = parse_sinfo("a|gpu:v100:2,gpu:t4:1|idle|p1\nb|(null)|idle|p1\nc|gpu:a100:4|mixed|p2\n")
    spec = cluster_from_nodes(nodes, name="slurm")
    assert [n.name for n in spec.nodes] == ["a", "c"]  # b has no GPUs
    assert [d.type.name for d in spec.devices] == ["V100-16GB", "V100-16GB", "T4", "A100-40GB", "A100-40GB",
                                                   "A100-40GB", "A100-40GB"]
    only = cluster_from_nodes(nodes, partition="p2")
    assert [n.name for n in only.nodes] == ["c"]
    with pytest.raises(ClusterError, match="no Slurm node in partition 'p3'"):
        cluster_from_nodes(nodes, partition="p3")


def test_slurm_spec_strings():
    assert slurm_cluster_arg("slurm") is None and slurm_cluster_arg("slurm:") is None
    assert slurm_cluster_arg("slurm:gpu") == "gpu" and slurm_cluster_arg("4xV100") is False


def test_slurm_spec_without_slurm_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo anywhere
    with pytest.raises(ClusterError, match=r"^sinfo: not found \(is Slurm installed"):
        load_cluster("slurm:")


_word = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=20)


@given(st.lists(st.tuples(st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True),
                          st.lists(st.tuples(st.sampled_from(["v100", "t4", "a100", "mi50", "Tesla_T4"]),
                                             st.integers(1, 16)), max_size=3),
                          st.sampled_from(["idle", "mixed", "allocated", "down*", "drained"]),
                          st.from_regex(r"[a-z]{1,6}\*?", fullmatch=True)), max_size=8))
@settings(max_examples=60, deadline=None)
def test_parse_sinfo_round_trips_what_sinfo_prints(rows):
    text = "\n".join(f"{n}|{','.join(f'gpu:{t}:{c}(S:0-1)' for t, c in g) or '(null)'}|{s}|{p}" for n, g, s, p in rows)
    nodes = parse_sinfo(text)
    first = {}
    for n, g, s, _p in rows:
        first.setdefault(n, (tuple(g), s))
    assert [x.name for x in nodes] == list(first)
    for x in nodes:
        assert x.gpus == first[x.name][0] and x.state == first[x.name][1]


@given(st.text(max_size=200))
@settings(max_examples=100, deadline=None)
def test_parsers_never_raise_anything_but_their_error(text):
    for parse, err in ((parse_sinfo, ClusterError), (parse_squeue, BackendError)):
        try:
            parse(text)
        except err:
            pass
    parse_scontrol_record(text)
    exit_status(text)


def test_parse_squeue_keeps_a_pipe_in_a_job_name():
    jobs = parse_squeue("12|gpualloc-ab-3-1|RUNNING|None|gres:gpu:t4:2|n0\n13|a|b|PENDING|Resources|gres:gpu:2|\n")
    assert (jobs[0].job_id, jobs[0].name, jobs[0].state, jobs[0].gres, jobs[0].nodes) == \
        ("12", "gpualloc-ab-3-1", "RUNNING", "gres:gpu:t4:2", "n0")
    assert jobs[0].active and jobs[1].name == "a|b" and jobs[1].reason == "Resources"
    with pytest.raises(BackendError, match="squeue line 1"):
        parse_squeue("12|x|RUNNING\n")


def test_parse_scontrol_record_values_with_spaces():
    rec = parse_scontrol_record("JobId=7 JobName=a b JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0 "
                                "Command=/x/job.sh OS=Linux 5.15 #1 SMP TresPerNode=gres:gpu:t4:2\n")
    assert rec["JobName"] == "a b" and rec["ExitCode"] == "3:0" and rec["OS"] == "Linux 5.15 #1 SMP"
    assert rec["TresPerNode"] == "gres:gpu:t4:2"


def test_exit_status():
    assert exit_status("0:0") == (0, None)
    assert exit_status("3:0") == (3, "exited with status 3")
    assert exit_status("0:9") == (-9, "killed by signal 9")
    assert exit_status("junk") == (None, None)


def test_sbatch_argv_single_node_equal_and_unequal_gangs():
    one = sbatch_argv("gpualloc-x-1-1", [("n0", "t4", 2)], chdir="/w", output="/r/slurm.out")
    assert one[0] == "sbatch" and "--nodes=1" in one and "--nodelist=n0" in one and "--gres=gpu:t4:2" in one
    assert "--job-name=gpualloc-x-1-1" in one and "--chdir=/w" in one and ":" not in one
    equal = sbatch_argv("j", [("a", "v100", 4), ("b", "v100", 4)], chdir="/w", output="/o", partition="gpu")
    assert "--nodes=2" in equal and "--nodelist=a,b" in equal and "--gres=gpu:v100:4" in equal
    assert "--partition=gpu" in equal
    het = sbatch_argv("j", [("a", "v100", 4), ("b", "v100", 2)], chdir="/w", output="/o")
    assert het.count(":") == 1
    first, second = het[1:het.index(":")], het[het.index(":") + 1:]
    assert "--nodelist=a" in first and "--gres=gpu:v100:4" in first
    assert "--nodelist=b" in second and "--gres=gpu:v100:2" in second and "--nodes=1" in second


@given(_word)
@settings(max_examples=50, deadline=None)
def test_batch_script_quotes_any_run_folder(name):
    script = batch_script("/opt/py thon/bin/python", f"/runs/{name}", 3, 1)
    assert script.startswith("#!/bin/sh\n") and script.count("\nexec ") == 1
    words = shlex.split(script[script.index("\nexec ") + len("\nexec "):])
    assert words == ["/opt/py thon/bin/python", "-m", "gpualloc.service.runner", f"/runs/{name}"]


def test_batch_script_runs_under_sh_without_interpreting_the_folder(tmp_path):
    odd = tmp_path / "a b;$(touch pwned)'\""
    script = tmp_path / "job.sh"
    script.write_text(batch_script("/bin/echo", odd, 1, 1))
    out = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=10)
    assert out.stdout.strip() == f"-m gpualloc.service.runner {odd}"
    assert not (tmp_path / "pwned").exists()


def test_merge_components_of_a_heterogeneous_job():
    lead, second = parse_squeue("7+0|h|COMPLETED|None|gres:gpu:v100:4|n0\n7+1|h|RUNNING|None|gres:gpu:v100:2|n1\n")
    merged = merge_components([lead, second])
    assert (merged.job_id, merged.name, merged.state) == ("7", "h", "RUNNING")  # active while any part is
    assert (merged.gres, merged.nodes) == ("gres:gpu:v100:4;gres:gpu:v100:2", "n0;n1")
    done = merge_components(parse_squeue("7+0|h|COMPLETED|None|a|n0\n7+1|h|COMPLETED|None|b|n1\n"))
    assert done.state == "COMPLETED" and not done.active
    assert merge_components([parse_squeue("8|x|PENDING|Resources|g|\n")[0]]).job_id == "8"
