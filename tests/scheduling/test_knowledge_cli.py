"""``--knowledge`` on the command line (issue 36): the row fields scripts rely on, levels side by side, and
one line with exit status 2 for a policy that reads or needs what its level hides."""

from __future__ import annotations

import json

import pytest

from gpualloc.cli.main import app
from gpualloc.errors import SchedulingError
from tests.cli.test_cli import invoke, run_main, runner

INTERFACE = {"knowledge", "policy", "avg_jct_s", "trace", "load", "cluster", "needs_durations", "learned"}
SMALL = ("--generate", "16", "-c", "4xA100+4xV100", "--seed", "2")


def test_compare_blind_json_rows_carry_the_interface_fields():
    doc = json.loads(invoke("simulate", "compare", *SMALL, "--knowledge", "blind", "--json",
                            "--policies", "fcfs,static-affinity").stdout)
    rows = doc["results"]
    assert [r["policy"] for r in rows] == ["fcfs", "static-affinity", "oracle-lb"]
    for r in rows:
        assert INTERFACE <= set(r)
        assert (r["trace"], r["load"], r["cluster"]) == ("synthetic", 0.8, "4xA100+4xV100")
    assert [r["knowledge"] for r in rows] == ["blind", "blind", "oracle"]  # the bound is oracle at any level
    assert [(r["needs_durations"], r["learned"]) for r in rows] == [(False, False), (False, False), (True, False)]


def test_compare_levels_side_by_side():
    doc = json.loads(invoke("simulate", "compare", *SMALL, "--knowledge", "estimate,oracle", "--json",
                            "--policies", "fcfs,sjf").stdout)
    got = [(r["knowledge"], r["policy"]) for r in doc["results"]]
    assert got == [("oracle", "fcfs"), ("oracle", "sjf"), ("oracle", "oracle-lb"),
                   ("estimate", "fcfs"), ("estimate", "sjf")]
    assert doc["knowledge"] == ["oracle", "estimate"]
    by = {(r["knowledge"], r["policy"]): r["avg_jct_s"] for r in doc["results"]}
    assert by["oracle", "fcfs"] == by["estimate", "fcfs"]  # FCFS reads no durations


def test_compare_default_list_adapts_to_blind():
    """Not asked for by name, a policy that needs durations gives way to its -pred version under blind."""
    from gpualloc.scheduling.knowledge import policies_at
    from gpualloc.scheduling.policies import POLICIES

    names = policies_at("blind", ("fcfs", "sjf", "easy-backfill", "srtf", "gavel-srtf", "tiresias"))
    assert "sjf" not in names and "easy-backfill" not in names and "srtf" not in names
    assert ("srtf-pred" in names) == ("srtf-pred" in POLICIES)
    assert policies_at("estimate", ("sjf", "srtf")) == ("sjf", "srtf")


def test_run_json_row_and_text_title():
    row = json.loads(invoke("simulate", *SMALL, "--policy", "srtf", "--knowledge", "estimate", "--json").stdout)
    assert INTERFACE <= set(row) and row["knowledge"] == "estimate" and row["needs_durations"] is True
    assert "knowledge estimate" in invoke("simulate", *SMALL, "--policy", "srtf", "--knowledge", "estimate").stdout


def test_a_blind_policy_reading_work_is_one_line_and_exit_2():
    proc = run_main("simulate", "--knowledge", "blind", "--policy", "tests.scheduling.test_knowledge:reads_work",
                    *SMALL)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: policy reads-work: jobs.work_s is hidden at information level 'blind'")


@pytest.mark.parametrize("args, error, message", [
    (("simulate", "compare", "--knowledge", "blind", "--policies", "fcfs,srtf"), SchedulingError,
     "policy 'srtf' needs job durations, which --knowledge blind hides"),
    (("simulate", "--knowledge", "blind", "--policy", "easy-backfill"), SchedulingError,
     "policy 'easy-backfill' needs job durations"),
    (("simulate", "compare", "--knowledge", "psychic"), SchedulingError,
     "--knowledge: unknown information level 'psychic'"),
    (("reproduce", "scheduling", "--knowledge", "oracle,psychic"), SchedulingError,
     "--knowledge: unknown information level 'psychic'"),
])
def test_refused_before_any_run(args, error, message):
    result = runner.invoke(app, [*args, *SMALL[:2]] if args[0] == "simulate" else list(args))
    assert isinstance(result.exception, error) and message in str(result.exception), result.output


def test_train_scheduler_takes_the_level_in_its_training_config():
    """``train scheduler --knowledge`` is TrainConfig's field (the CLI passes it: tests/rl/test_train_options.py)."""
    from gpualloc.options import OptionsError
    from gpualloc.rl.train_config import TrainConfig

    assert TrainConfig(knowledge="blind", experts=("las", "fcfs")).knowledge == "blind"
    with pytest.raises(OptionsError, match="knowledge: unknown information level 'psychic'"):
        TrainConfig(knowledge="psychic")
