"""The learned scheduler below oracle (issue 36): train the bundled agents of ``estimate`` and
``blind``, and measure ``dqn`` against the best non-clairvoyant heuristic and the best
prediction-driven policy, with the gap to the oracle ``gavel-srtf``.

Training (``--train LEVEL``): the expert-choice recipe of ``docs/scheduling-agent.md`` at ``LEVEL``:
generated traces on the three training clusters plus 150-job windows of Gavel's msr trace and of
Philly past their first 300 jobs (``TRAIN_WINDOWS`` / ``VAL_WINDOWS`` of
``gpualloc.experiments.scheduling_table``, never the evaluation windows), cloning each training
trace's best expert (``--guide best``), gated on the validation traces. **Alibaba is held out of every
choice: none of its windows is trained or validated on.** Writes ``src/gpualloc/rl/data/
sched-experts-LEVEL.pt`` only when ``--install`` and the gate passes.

Evaluation (default): on ``adlro16`` at loads 0.5, 0.8 and 1.0 (``--seeds`` trace seeds 10,000+,
``--jobs`` jobs), on the unseen cluster ``16xV100+8xT4+8xA100`` at load 0.8, and on the first
``--real-jobs`` jobs of the msr, Philly and Alibaba traces scaled to load 0.8 on ``adlro16`` (Alibaba
reported apart: held out). Policies that read no duration (the heuristics, the ``-pred`` ones) decide
identically at ``estimate`` and ``blind`` and run once at ``blind``; SRTF, SJF and ``gavel-srtf`` run
on the users' estimates at ``estimate``; ``dqn`` runs at each level with that level's bundled agent;
``gavel-srtf`` at ``oracle`` is the reference. Writes ``benchmarks/results/learned_blind.json`` and
prints a table.

Run: ``python benchmarks/learned_blind.py --data /work/shared/data``
     ``python benchmarks/learned_blind.py --train blind --data /work/shared/data [--install]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpualloc.experiments.scheduling_table import REAL_TRACES, scale_to_load, training_windows
from gpualloc.hardware.cluster import load_cluster
from gpualloc.scheduling.knowledge import row_labels
from gpualloc.scheduling.metrics import avg_jct_s
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.simulator import prepare, simulate
from gpualloc.workload.jobs import Trace
from gpualloc.workload.traces import generate, read_trace

RESULTS = Path(__file__).resolve().parent / "results"
HELD_OUT = "alibaba"
UNSEEN = "16xV100+8xT4+8xA100"
HEURISTICS = ("fcfs", "las", "tiresias", "tiresias-gittins", "gavel")
"""Need no duration: the same decisions at estimate and blind."""
PREDICTED = ("srtf-pred", "sjf-pred", "gavel-srtf-pred")
"""Learned (the duration predictor), need no duration column."""
ON_ESTIMATE = ("srtf", "sjf", "gavel-srtf")
"""Heuristics on the users' estimates (estimate only)."""

# the panels the bundled agents were trained with: chosen on the training windows (sjf-pred gave FCFS's
# JCT on msr 300 and Philly 3500, tiresias was the slowest and worst there), never on Alibaba
PANELS = {"blind": ("fcfs", "las", "tiresias-gittins", "gavel", "srtf-pred", "gavel-srtf-pred"),
          "estimate": ("fcfs", "las", "tiresias-gittins", "gavel", "srtf-pred", "gavel-srtf-pred", "srtf",
                       "gavel-srtf")}
TRAIN_STARTS = {"gavel-msr": (300,), "philly": (1500, 3500, 7000, 30000, 60000)}
VAL_STARTS = {"gavel-msr": (450,), "philly": (2500, 70000, 80000)}


def train(args) -> dict[str, Any]:
    from gpualloc.rl.sched_policy import bundled_agent_path
    from gpualloc.rl.train_scheduler import TRAIN_CLUSTERS, train_expert_scheduler

    level = args.train
    t0 = time.perf_counter()
    train_w = training_windows(args.data, TRAIN_CLUSTERS, starts=TRAIN_STARTS)
    val_w = training_windows(args.data, TRAIN_CLUSTERS, starts=VAL_STARTS)
    out = Path(args.out or f"/tmp/F/sched-experts-{level}.pt")
    report = train_expert_scheduler(out, knowledge=level, experts=PANELS[level], guide="best", steps=0,
                                    seed=args.seed, train_traces=args.train_traces, bc_rounds=2,
                                    extra_problems=tuple(train_w), val_problems=tuple(val_w),
                                    progress=lambda m: print(m, file=sys.stderr, flush=True))
    wall = time.perf_counter() - t0
    installed = None
    if args.install and report.gate.passed:
        installed = str(bundled_agent_path(knowledge=level))
        shutil.copyfile(out, installed)
    doc = {"knowledge": level, "experts": list(PANELS[level]), "teacher": report.teacher,
           "gate": report.gate.to_dict(), "note": report.gate.note(), "scores": report.scores,
           "expert_jct_h": {k: v / 3600 for k, v in report.expert_jct_s.items()}, "kept": report.kept,
           "agreement": list(report.agreement), "wall_s": wall, "out": str(out), "installed": installed,
           "train_windows": {k: list(v) for k, v in TRAIN_STARTS.items()},
           "val_windows": {k: list(v) for k, v in VAL_STARTS.items()}, "train_traces": args.train_traces,
           "seed": args.seed}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"learned_blind_train_{level}.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))
    return doc
