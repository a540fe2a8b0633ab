"""DQN decision latency on CPU: one ``agent.act(obs, mask, explore=False)`` call, end to end.

Agents with the default 256x256 head and 64 actions: the placement-style MLP on a 200-long
observation, and the scheduling-style CNN (3x3 convs with 16 and 32 channels, strides 1 and 2 by
default; strides 1 and 1 for comparison) over a 16x32 utilisation grid plus 32 features. Each call
converts the numpy observation, runs the network under ``torch.inference_mode`` and takes the masked
argmax; half the actions are masked. Timed with ``time.perf_counter_ns`` per call, after a warm-up,
at each torch thread count asked for (default one: a single decision is a short chain of small
matrix products, and extra threads only add synchronisation and contention). One gradient step
(batch 32) is timed too, as a guide to training throughput. The target is a median decision under
1 ms. The 1-minute load average is recorded: other processes inflate the tail percentiles.

    python benchmarks/dqn_latency.py [--calls 5000] [--threads 1] [--seed 0]

Writes benchmarks/results/dqn_latency.json and prints a table.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from gymnasium import spaces

import _args

if TYPE_CHECKING:
    from gpualloc.rl.dqn import DQNConfig

OUT = Path(__file__).resolve().parent / "results" / "dqn_latency.json"
TARGET_MS = 1.0
N_ACTIONS = 64


def cases() -> dict[str, tuple[spaces.Space, DQNConfig]]:
    from gpualloc.rl.dqn import DQNConfig

    grid = spaces.Dict({"grid": spaces.Box(0.0, 1.0, (16, 32), np.float32),
                        "features": spaces.Box(-1.0, 1.0, (32,), np.float32)})
    return {
        "mlp obs 200": (spaces.Box(-1.0, 1.0, (200,), np.float32), DQNConfig(hidden=(256, 256))),
        "cnn grid 16x32 + 32": (grid, DQNConfig(backbone="cnn", cnn_channels=(16, 32), cnn_strides=(1, 2),
                                                hidden=(256, 256))),
        "cnn, strides 1,1": (grid, DQNConfig(backbone="cnn", cnn_channels=(16, 32), cnn_strides=(1, 1),
                                             hidden=(256, 256))),
    }


def _percentiles_us(ns: np.ndarray) -> dict[str, float]:

    us = ns / 1e3
    return {"median_us": float(np.median(us)), "p90_us": float(np.percentile(us, 90)),
            "p99_us": float(np.percentile(us, 99)), "mean_us": float(us.mean())}


def run(name: str, space: spaces.Space, cfg: DQNConfig, calls: int, seed: int) -> dict:
    import torch
    from gpualloc.rl.dqn import DQNAgent
    from gpualloc.rl.dqn.replay import ReplayBuffer

    rng = np.random.default_rng(seed)
    agent = DQNAgent(space, spaces.Discrete(N_ACTIONS), cfg)
    observations = [space.sample() for _ in range(64)]
    masks = rng.random((64, N_ACTIONS)) < 0.5
    masks[:, 0] = True
    for i in range(200):  # warm-up: allocator, kernels, branch caches
        agent.act(observations[i % 64], masks[i % 64], explore=False)
    ns = np.empty(calls, np.int64)
    for i in range(calls):
        obs, mask = observations[i % 64], masks[i % 64]
        t = time.perf_counter_ns()
        agent.act(obs, mask, explore=False)
        ns[i] = time.perf_counter_ns() - t

    buffer = ReplayBuffer(1_000, space, N_ACTIONS, seed=rng)
    for i in range(1_000):
        buffer.add(observations[i % 64], int(rng.integers(N_ACTIONS)), 1.0, observations[(i + 1) % 64], False,
                   masks[(i + 1) % 64])
    batches = [buffer.sample(cfg.batch_size) for _ in range(60)]
    for b in batches[:10]:
        agent.update(b)
    update_ns = np.empty(50, np.int64)
    for i, b in enumerate(batches[10:]):
        t = time.perf_counter_ns()
        agent.update(b)
        update_ns[i] = time.perf_counter_ns() - t

    params = sum(p.numel() for p in agent.qnet.parameters())
    return {"case": name, "threads": torch.get_num_threads(), "calls": calls, "params": params,
            **_percentiles_us(ns), "update_median_ms": float(np.median(update_ns)) / 1e6,
            "meets_target": bool(np.median(ns) / 1e6 <= TARGET_MS)}


def main() -> None:
    ap = _args.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=_args.at_least(1), default=5_000)
    ap.add_argument("--threads", type=_args.at_least(1), nargs="+", default=[1])
    ap.add_argument("--seed", type=_args.seed, default=0)
    args = ap.parse_args()
    # imported once the arguments are checked: a bad one fails before torch loads
    import torch
    from gpualloc.cost.microbench import host_cpu_model

    before = torch.get_num_threads()
    load_before = os.getloadavg()[0]  # other processes on the machine inflate the tail percentiles
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name, (space, cfg) in cases().items():
            rows.append(run(name, space, cfg, args.calls, args.seed))
    torch.set_num_threads(before)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    machine = {"cpu": host_cpu_model(), "logical_cpus": os.cpu_count() or 0, "python": platform.python_version(),
               "torch": torch.__version__, "numpy": np.__version__,
               "loadavg_1min_before": load_before, "loadavg_1min_after": os.getloadavg()[0]}
    OUT.write_text(json.dumps({"benchmark": "dqn_latency", "target_ms": TARGET_MS, "n_actions": N_ACTIONS,
                               "seed": args.seed, "machine": machine, "rows": rows}, indent=2))
    print(f"{machine['cpu']} ({machine['logical_cpus']} logical CPUs), torch {machine['torch']}, "
          f"1-min load average {load_before:.2f} before, {machine['loadavg_1min_after']:.2f} after")
    print(f"{'case':<20} {'threads':>7} {'params':>9} | {'median us':>9} {'p90 us':>8} {'p99 us':>8} "
          f"{'mean us':>8} | {'update ms':>9} | {'<= 1 ms':>7}")
    for r in rows:
        print(f"{r['case']:<20} {r['threads']:>7d} {r['params']:>9d} | {r['median_us']:9.1f} {r['p90_us']:8.1f} "
              f"{r['p99_us']:8.1f} {r['mean_us']:8.1f} | {r['update_median_ms']:9.2f} | "
              f"{'yes' if r['meets_target'] else 'NO':>7}")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    _args.guarded(main)
