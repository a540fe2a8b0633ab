"""Refused before anything runs (issue 36): a ``dqn`` whose agent (given with ``--agent`` or bundled)
or its fallback reads durations, under ``--knowledge blind``, in ``simulate``, ``simulate compare``,
``reproduce scheduling`` and the service; one line naming ``--knowledge``, the level and the policy."""

from __future__ import annotations

import pytest

from gpualloc.cli.main import app
from gpualloc.errors import SchedulingError
from tests.cli.test_cli import run_main, runner


def _oracle_agent() -> str:
    """The bundled oracle expert-choice agent: its fallback (gavel-srtf) reads remaining work."""
    from gpualloc.service.app import bundled_agents_dir

    return str(bundled_agents_dir() / "sched-experts.pt")


class _Panel:
    """An expert-choice policy as :func:`reads_hidden` reads one (no checkpoint, no torch)."""

    def __init__(self, experts, teacher=0, fallback=False, knowledge="blind"):
        self.experts, self.teacher, self.fallback, self.knowledge = tuple(experts), teacher, fallback, knowledge


class _ByLevel:
    def __init__(self, **by):
        self.by = by

    def at(self, knowledge):
        return self.by[knowledge]


@pytest.mark.parametrize("policy, level, why", [
    (_Panel(("fcfs", "srtf"), teacher=1, fallback=True), "blind", "its fallback srtf needs durations"),
    (_Panel(("fcfs", "srtf-pred"), teacher=0, fallback=True, knowledge="oracle"), "blind", None),  # fcfs alone
    (_Panel(("fcfs", "srtf", "sjf")), "blind", "its experts srtf, sjf need durations"),
    (_Panel(("fcfs", "gavel-srtf-pred"), knowledge="oracle"), "blind", "trained at oracle"),
    (_Panel(("fcfs", "gavel-srtf-pred")), "blind", None),
    (_Panel(("fcfs", "srtf")), "estimate", None),  # estimates stand in for the truth: nothing hidden
    (object(), "blind", "not an expert-choice agent"),
    (_ByLevel(blind=_Panel(("las", "srtf-pred")), oracle=_Panel(("srtf",))), "blind", None),
    (_ByLevel(blind=_Panel(("las", "srtf")), oracle=_Panel(("las",))), "blind", "its experts srtf need"),
])
def test_reads_hidden_knows_what_an_agent_would_read(policy, level, why):
    from gpualloc.scheduling.knowledge import reads_hidden

    got = reads_hidden(policy, level)
    assert (got is None) if why is None else (got is not None and why in got), got


def test_dqn_whose_agent_reads_durations_is_one_line_before_the_trace_is_read():
    proc = run_main("simulate", "--trace", "/nonexistent/trace.csv", "--knowledge", "blind", "--policy", "dqn",
                    "--agent", _oracle_agent())
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: policy 'dqn' (agent ") and "which --knowledge blind hides: its fallback " \
        "gavel-srtf needs durations" in lines[0], lines[0]


@pytest.mark.parametrize("args", [
    ("simulate", "compare", "--trace", "/nonexistent/trace.csv", "--knowledge", "oracle,blind",
     "--policies", "fcfs,dqn"),  # the oracle runs come first: refused before them
    ("simulate", "compare", "--trace", "/nonexistent/trace.csv", "--knowledge", "all"),  # the default list
    ("reproduce", "scheduling", "--quick", "--no-real-traces", "--knowledge", "estimate,blind"),
])
def test_compare_and_reproduce_refuse_such_a_dqn_before_any_run(args, tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(app, [*args, "--agent", _oracle_agent(),
                                 *(("--out", str(out)) if args[0] == "reproduce" else ())])
    assert isinstance(result.exception, SchedulingError), result.output
    assert "policy 'dqn' (agent" in str(result.exception) and "--knowledge blind hides" in str(result.exception)
    assert not out.exists() or not any(out.iterdir())  # nothing written


def test_the_default_dqn_at_blind_runs_its_blind_agent():
    """The bundled dqn has an agent for blind whose fallback reads no duration: not refused."""
    from gpualloc.cli.simulate import require_runnable

    require_runnable({"blind": ["dqn", "fcfs", "srtf-pred"], "estimate": ["dqn", "srtf"]}, None)


def test_the_service_refuses_such_a_dqn_before_making_anything_and_when_switched_to(tmp_path):
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.service.app import Service
    from gpualloc.service.config import ServiceConfig
    from gpualloc.service.scheduler import Scheduler
    from gpualloc.service.store import Store
    from tests.service.test_quota_agreement import InstantBackend

    store = tmp_path / "st" / "state.db"
    config = ServiceConfig(store=str(store), cluster="1xT4", policy="dqn", knowledge="blind",
                           policy_options={"agent": "sched-experts.pt"})
    with pytest.raises(SchedulingError, match=r"policy 'dqn' \(agent .*sched-experts.pt\) reads job durations, "
                                              "which --knowledge blind hides"):
        Service(config)
    assert not store.parent.exists()  # no store, no token
    sched = Scheduler(Store(tmp_path / "s.db"), InstantBackend(), load_cluster("1xT4"), knowledge="blind")
    with pytest.raises(SchedulingError, match="--knowledge blind hides: its fallback gavel-srtf needs durations"):
        sched.set_policy("dqn", {"agent": _oracle_agent()})
    sched.set_policy("dqn")  # the bundled blind agent: its fallback (gavel-srtf-pred) needs none
    assert sched.policy_name == "dqn"


def test_train_scheduler_refuses_an_expert_that_needs_durations_at_blind_before_training(tmp_path):
    out = tmp_path / "agent.pt"
    proc = run_main("train", "scheduler", "--experts", "fcfs,srtf", "--knowledge", "blind", "-o", str(out),
                    "--train-windows", str(tmp_path / "no-such-folder"))  # the windows would be read first
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'srtf' needs durations, which knowledge 'blind' hides (use srtf-pred)" in lines[0], \
        proc.stderr
    assert not out.exists()
