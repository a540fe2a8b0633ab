"""Decision latency of the learned scheduler (``dqn``, the bundled expert-choice agent) on CPU.

Runs ``--jobs`` generated jobs at ``--load`` on ``--cluster`` with the bundled agent deciding, even
where its gate failed and ``dqn`` runs its teacher instead (torch on one thread), and times every
``ExpertChoicePolicy.decide`` call with ``time.perf_counter_ns``: the whole decision, and the part
spent in the experts' proposals (``ExpertPanel.propose``, timed by wrapping it). The agent's own
share (observation, mask, MLP, the validity check) is the difference, reported over the decision
points where the agent chose (more than one distinct proposal). Issue 18's target
is a median decision under 1 ms. The 1-minute load average is recorded: other processes inflate the
figures. Writes ``benchmarks/results/sched_decision_latency.json`` and prints a table.

    python benchmarks/sched_decision_latency.py [--jobs 150] [--load 1.0] [--cluster adlro16] [--seed 10000]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import _args

OUT = Path(__file__).resolve().parent / "results" / "sched_decision_latency.json"
TARGET_MS = 1.0


def measure(jobs: int, load: float, cluster: str, seed: int) -> dict:
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.rl.expert_choice import ExpertPanel
    from gpualloc.rl.sched_policy import ExpertChoicePolicy
    from gpualloc.scheduling.policies import make_policy
    from gpualloc.scheduling.simulator import simulate
    from gpualloc.workload.traces import generate

    spec = load_cluster(cluster)
    trace = generate(jobs, spec, load, seed=seed)
    bundled = make_policy("dqn")
    # The agent decides here even where its gate failed and ``dqn`` runs the teacher: this measures
    # what the agent's decision costs.
    policy = ExpertChoicePolicy(bundled.learned, bundled.experts, bundled.teacher, encoder=bundled.encoder)
    whole: list[int] = []
    proposing: list[int] = []
    asked: list[bool] = []
    propose = ExpertPanel.propose

    def timed_propose(self, view):
        t0 = time.perf_counter_ns()
        out = propose(self, view)
        proposing.append(time.perf_counter_ns() - t0)
        return out

    decide = policy.decide

    def timed_decide(view):
        before = int(policy.choices.sum())
        t0 = time.perf_counter_ns()
        out = decide(view)
        whole.append(time.perf_counter_ns() - t0)
        asked.append(int(policy.choices.sum()) > before)
        return out

    policy.decide = timed_decide
    ExpertPanel.propose = timed_propose
    try:
        simulate(trace, spec, policy, drop_unplaceable=True, timeline=False)
    finally:
        ExpertPanel.propose = propose
    w, p, a = np.array(whole) / 1e6, np.array(proposing) / 1e6, np.array(asked)
    choice = (w - p)[a]

    def stats(x: np.ndarray) -> dict:
        return {"n": int(x.size), "median_ms": float(np.median(x)), "p99_ms": float(np.percentile(x, 99))}

    return {"decision": stats(w), "decision_when_asked": stats(w[a]), "experts": stats(p),
            "agent_choice": stats(choice), "choices": dict(zip(policy.experts, policy.choices.tolist(), strict=True)),
            "bundled_gate": bundled.note}


def main() -> None:
    parser = _args.Parser(description=__doc__)
    parser.add_argument("--jobs", type=_args.at_least(1), default=150)
    parser.add_argument("--load", type=_args.positive, default=1.0)
    parser.add_argument("--cluster", type=_args.cluster, default="adlro16")
    parser.add_argument("--seed", type=_args.at_least(0), default=10_000)
    args = parser.parse_args()
    # imported once the arguments are checked: a bad one fails before torch loads
    import torch

    torch.set_num_threads(1)
    res = measure(args.jobs, args.load, args.cluster, args.seed)
    print(f"{'part':22} {'calls':>7} {'median ms':>10} {'p99 ms':>8}")
    for key in ("agent_choice", "experts", "decision", "decision_when_asked"):
        r = res[key]
        print(f"{key:22} {r['n']:>7} {r['median_ms']:>10.3f} {r['p99_ms']:>8.3f}")
    print(f"choices: {res['choices']}; target: median decision < {TARGET_MS} ms")
    print(f"measured with the agent deciding; the bundled gate: {res['bundled_gate']}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"command": "python benchmarks/sched_decision_latency.py " + " ".join(sys.argv[1:]),
                               "load_average_1min": os.getloadavg()[0], "target_ms": TARGET_MS, **vars(args),
                               **res}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    _args.guarded(main)
