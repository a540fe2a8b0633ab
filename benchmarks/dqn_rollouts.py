"""Parallel experience collection on ``gpualloc/Scheduling-v0``: how throughput scales with rollout actors.

Two measurements on ``adlro16`` with the hyper-parameters of the retired per-slot agent (``CONFIG``, the
design's CNN; that agent was retired in issue 37, its environment and the distributed loop stay):

* **collection only**: ``--steps`` environment steps collected by 1 actor in this process, then by
  ``--actors`` actors as local processes and as Ray tasks (``learning_starts`` above the step count,
  so no gradient step is taken). This is what more simulator processes buy.
* **end to end**: the same number of steps with learning from step 2,000 on (one gradient step every
  two environment steps, batch 64), single-process (:func:`gpualloc.rl.dqn.train`) against
  ``--actors`` process actors (:func:`gpualloc.rl.dqn.distributed.train_distributed`). The learner's
  gradient steps stay in one process, so they bound the end-to-end speed-up (Amdahl).

Pool and Ray start-up are excluded (both are warmed with a tiny round first). The 1-minute load
average is recorded: other processes on the machine slow every row.

    python benchmarks/dqn_rollouts.py [--steps 6000] [--actors 2] [--seed 0]

Writes benchmarks/results/dqn_rollouts.json and prints a table.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

import _args
from gpualloc.parallel import ProcessExecutor, RayExecutor
from gpualloc.rl.dqn import DQNAgent, DQNConfig, train
from gpualloc.rl.dqn.distributed import train_distributed
from gpualloc.rl.envs.scheduling_env import SchedulingEnv

OUT = Path(__file__).resolve().parent / "results" / "dqn_rollouts.json"

CONFIG = DQNConfig(
    backbone="cnn", lr=1e-4, gamma=0.99, batch_size=64, buffer_size=50_000, learning_starts=2_000,
    train_freq=2, gradient_steps=1, target_update_interval=250, eps_start=1.0, eps_end=0.05,
    eps_decay_steps=20_000, hidden=(128, 128), cnn_channels=(16, 16), cnn_strides=(1, 2), seed=0,
)
"""The design's CNN over the utilisation grid plus two fully connected layers (the per-slot agent's)."""


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = _args.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=_args.at_least(1), default=6_000)
    ap.add_argument("--actors", type=_args.at_least(1), default=2)
    ap.add_argument("--round-steps", type=_args.at_least(1), default=1_000, help="at least --actors")
    ap.add_argument("--seed", type=_args.seed, default=0)
    args = ap.parse_args()
    if args.round_steps < args.actors:  # each actor collects a share of a round
        ap.error(f"argument --round-steps: {args.round_steps} is below --actors ({args.actors})")
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    env_fn = partial(SchedulingEnv, "adlro16")
    space_env = env_fn()

    def agent(cfg):
        return DQNAgent(space_env.observation_space, space_env.action_space, cfg)

    collect_cfg = replace(CONFIG, learning_starts=10 * args.steps, seed=args.seed)
    learn_cfg = replace(CONFIG, seed=args.seed)
    rows = []

    def row(mode: str, actors: int, where: str, seconds: float, log) -> None:
        rows.append({"mode": mode, "actors": actors, "where": where, "steps": log.steps,
                     "gradient_steps": len(log.losses), "seconds": seconds, "steps_per_s": log.steps / seconds})

    def distributed(cfg, ex):
        return train_distributed(env_fn, agent(cfg), args.steps, seed=args.seed, executor=ex, actors=args.actors,
                                 round_steps=args.round_steps)

    def warm(ex) -> None:  # start the workers outside the timings
        train_distributed(env_fn, agent(collect_cfg), args.actors, seed=0, executor=ex, actors=args.actors,
                          round_steps=args.actors)

    with ProcessExecutor(args.actors) as procs:
        warm(procs)
        for mode, cfg in (("collection only", collect_cfg), ("end to end", learn_cfg)):
            s, log = timed(lambda cfg=cfg: train(env_fn(), agent(cfg), args.steps, seed=args.seed))
            row(mode, 1, "this process (train)", s, log)
            s, log = timed(lambda cfg=cfg: distributed(cfg, procs))
            row(mode, args.actors, "processes", s, log)
    # Ray last: its daemons use CPU while it is up, which would slow the other rows
    temp = tempfile.mkdtemp(prefix="r", dir="/tmp")
    with RayExecutor(num_cpus=args.actors, temp_dir=temp) as ray_ex:
        warm(ray_ex)
        s, log = timed(lambda: distributed(collect_cfg, ray_ex))
        row("collection only", args.actors, "ray tasks", s, log)
    shutil.rmtree(temp, ignore_errors=True)
    for r in rows:
        base = next(b for b in rows if b["mode"] == r["mode"] and b["actors"] == 1)
        r["speedup"] = r["steps_per_s"] / base["steps_per_s"]
    machine = {"logical_cpus": os.cpu_count() or 0, "torch": torch.__version__,
               "loadavg_1min_before": load_before, "loadavg_1min_after": os.getloadavg()[0]}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    command = f"python benchmarks/dqn_rollouts.py --steps {args.steps} --actors {args.actors} --seed {args.seed}"
    OUT.write_text(json.dumps({"benchmark": "dqn_rollouts", "cluster": "adlro16", "command": command,
                               "machine": machine, "rows": rows}, indent=2))
    print(f"{machine['logical_cpus']} logical CPUs, 1-min load average {load_before:.2f} before, "
          f"{machine['loadavg_1min_after']:.2f} after")
    print(f"{'mode':<16} {'actors':>6} {'where':<22} | {'steps':>6} {'grad steps':>10} {'s':>7} {'steps/s':>8} "
          f"{'speed-up':>8}")
    for r in rows:
        print(f"{r['mode']:<16} {r['actors']:>6d} {r['where']:<22} | {r['steps']:6d} {r['gradient_steps']:10d} "
              f"{r['seconds']:7.1f} {r['steps_per_s']:8.0f} {r['speedup']:7.2f}x")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    _args.guarded(main)
