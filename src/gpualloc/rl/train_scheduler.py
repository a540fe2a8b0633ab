"""Train the expert-choice scheduling agent: the entry point behind ``gpualloc train scheduler``.

:func:`train_expert_scheduler` picks the teacher among the expert heuristics on validation traces, clones
it (DAgger), optionally improves the clone with rollout labels and DQN fine-tuning, and gates the result
against the teacher; the checkpoint carries the verdict (``docs/scheduling-agent.md``). The agent is the
shared DQN (:mod:`gpualloc.rl.dqn`) with a small MLP over :func:`gpualloc.rl.expert_choice.observe`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpualloc.errors import AgentError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.options import options_dict, with_overrides
from gpualloc.rl.dqn import DQNAgent, train
from gpualloc.rl.train_config import EXPERT_CONFIG, LEVEL_ROUND_S, TRAIN_CLUSTERS, TrainConfig
from gpualloc.scheduling import metrics
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.simulator import simulate
from gpualloc.seeding import seeded
from gpualloc.workload.traces import generate

__all__ = ["EXPERT_CONFIG", "LEVEL_ROUND_S", "TRAIN_CLUSTERS", "ExpertTrainReport", "TrainConfig", "agent_jcts",
           "expert_jcts", "train_expert_scheduler"]


# ------------------------------------------------------------------------------ expert-choice agent

@dataclass(frozen=True)
class ExpertTrainReport:
    """What :func:`train_expert_scheduler` did (JCTs are means over the validation traces)."""

    out_path: Path
    teacher: str
    expert_jct_s: dict[str, float]
    """Each expert's mean average JCT on the validation traces."""
    scores: dict[str, float]
    """Mean per-validation-trace ratio of average JCT to the best expert's on that trace, for each
    expert and for ``cloned``, ``rollout``, ``fine-tuned`` when run (1.0 = the per-trace best)."""
    kept: str
    gate: Any
    wall_s: float
    agreement: tuple[float, ...]


def _problems(run: TrainConfig, extra_problems: Sequence, val_problems: Sequence) -> tuple[list, list]:
    """Training and validation ``(cluster, trace)`` pairs (validation seeds never used in training)."""
    specs = [load_cluster(c) for c in run.clusters]
    rng = np.random.default_rng(run.seed)
    train_p = []
    for k in range(run.train_traces):
        spec = specs[k % len(specs)]
        n = int(rng.integers(run.num_jobs[0], run.num_jobs[1] + 1))
        train_p.append((spec, generate(n, spec, float(rng.uniform(*run.loads)), seed=int(rng.integers(10_000)))))
    val = [(spec, generate(80, spec, load, seed=20_000 + i)) for i, (spec, load) in
           enumerate((s, ld) for s in specs for ld in run.val_loads)]
    return train_p + list(extra_problems), val + list(val_problems)


def _jct(problem, policy, knowledge: str = "oracle") -> float:
    spec, trace = problem
    return metrics.avg_jct_s(simulate(trace, spec, policy, drop_unplaceable=True, timeline=False,
                                      knowledge=knowledge))


def expert_jcts(problems: Sequence, experts: Sequence[str], knowledge: str = "oracle") -> dict[str, list[float]]:
    """Average JCT of each expert heuristic alone on each problem, deciding at ``knowledge``."""
    return {name: [_jct(p, make_policy(name), knowledge) for p in problems] for name in experts}


@seeded(error=AgentError)
def agent_jcts(agent: DQNAgent, problems: Sequence, experts: Sequence[str], teacher: int, encoder=None,
               knowledge: str = "oracle", round_s: float | None = None, seed: int = 0) -> list[float]:
    """Average JCT of the greedy expert-choice agent (no gate) on each problem."""
    from gpualloc.rl.sched_policy import ExpertChoicePolicy

    return [_jct(p, ExpertChoicePolicy(agent, experts, teacher, encoder=encoder, knowledge=knowledge,
                                       round_s=round_s, seed=seed), knowledge) for p in problems]


def _guide(jcts: np.ndarray, teacher: int, min_gain: float) -> int:
    """The expert to imitate on one trace: the one with the lowest average JCT there, or the teacher
    unless that one is better by more than ``min_gain`` of the teacher's JCT."""
    best = int(np.argmin(jcts))
    return best if jcts[teacher] - jcts[best] > min_gain * jcts[teacher] else teacher


def train_expert_scheduler(out_path: str | Path, config: TrainConfig | None = None, *,
                           extra_problems: Sequence = (), val_problems: Sequence = (),
                           progress: Callable[[str], None] | None = None, **overrides: Any) -> ExpertTrainReport:
    """Train the expert-choice agent: pick the teacher, clone it (DAgger), fine-tune with DQN, gate.

    1. Teacher: the expert with the lowest mean ratio of average JCT to the per-trace best expert's
       on the validation traces (:func:`~gpualloc.rl.expert_choice.mean_ratio`); it replaces invalid
       choices and is the fallback of a failed gate.
    2. Behaviour cloning (:func:`gpualloc.rl.imitation.clone_teacher`) of the teacher, or with
       ``guide="best"`` of each training trace's best expert (so the agent learns which expert
       suits which workload).
    3. Optionally, rollout labels (:mod:`gpualloc.rl.rollouts`, ``rollout_points > 0``) and DQN
       fine-tuning (double DQN, target network, ``steps > 0``); each result is kept only when it
       scores better on the validation traces than what it started from.
    4. Gate (:func:`gpualloc.rl.expert_choice.gate`): agent vs teacher on the validation traces; the
       verdict is saved with the agent, and a failed gate makes the ``dqn`` policy run the teacher.

    Args:
        out_path: the checkpoint to write; its ``extra["config"]`` is the whole :class:`TrainConfig`.
        config: the settings (default :class:`TrainConfig`'s defaults).
        extra_problems: more ``(cluster spec, trace)`` training problems (real-trace windows).
        val_problems: more ``(cluster spec, trace)`` validation problems (held-out real-trace windows).
        progress: called with one line per stage.
        **overrides: fields of :class:`TrainConfig` replacing those of ``config``.

    Raises:
        OptionsError: an unknown setting or a bad value (one line naming the field).
    """
    from gpualloc.rl.envs.expert_env import ExpertChoiceEnv
    from gpualloc.rl.expert_choice import gate, mean_ratio
    from gpualloc.rl.imitation import clone_teacher
    from gpualloc.rl.sched_policy import expert_extra

    t0 = time.perf_counter()
    run = with_overrides(config or TrainConfig(), **overrides)
    level = {"knowledge": run.knowledge, "round_s": None if run.knowledge == "oracle" else LEVEL_ROUND_S,
             "seed": run.seed}
    say = progress or (lambda _msg: None)
    out_path = Path(out_path)
    train_p, val = _problems(run, extra_problems, val_problems)
    say(f"{len(train_p)} training and {len(val)} validation traces; running the experts on validation")
    per_expert = expert_jcts(val, run.experts, run.knowledge)
    oracle = np.min(np.array([per_expert[e] for e in run.experts]), axis=0)

    def score(jcts: Sequence[float]) -> float:
        return mean_ratio(jcts, oracle)

    scores = {e: score(per_expert[e]) for e in run.experts}
    means = {k: float(np.mean(v)) for k, v in per_expert.items()}
    teacher = min(range(len(run.experts)), key=lambda i: (scores[run.experts[i]], i))
    say(f"teacher: {run.experts[teacher]} ({scores[run.experts[teacher]]:.3f} x the per-trace best expert)")
    guides = None
    if run.guide == "best":
        on_train = np.array([v for v in expert_jcts(train_p, run.experts, run.knowledge).values()])
        guides = [_guide(col, teacher, run.rollout_min_gain) for col in on_train.T]
        say("guides: " + ", ".join(f"{run.experts[g]} {guides.count(g)}" for g in sorted(set(guides))))
    encoder, hd = None, None
    if run.hd_dim:
        from gpualloc.rl.expert_choice import HDFeatures

        encoder = HDFeatures(out_dim=run.hd_dim, seed=run.seed)
        hd = encoder.to_dict()
    env = ExpertChoiceEnv(train_p, experts=run.experts, teacher=teacher, guides=guides, encoder=encoder,
                          encoder_dim=run.hd_dim, **level)
    env.reset(seed=run.seed)
    agent = DQNAgent(env.observation_space, env.action_space, replace(run.dqn, seed=run.seed))
    clone = clone_teacher(agent, env, rounds=run.bc_rounds, episodes=run.bc_episodes, epochs=run.bc_epochs,
                          td_weight=run.bc_td_weight, seed=run.seed)
    bc = agent_jcts(agent, val, run.experts, teacher, encoder, **level)
    scores["cloned"] = score(bc)
    say(f"cloned: agreement {clone.agreement[-1]:.1%}, validation {scores['cloned']:.3f} x the per-trace best")
    kept, mine, tuned = "cloned", bc, None
    rolled = None
    if run.rollout_points:
        from gpualloc.rl.rollouts import RolloutLabels, improve_agent, label_points

        base = None if run.rollout_base is None else run.experts.index(run.rollout_base)
        by_guide = guides or [teacher] * len(train_p)
        labels = RolloutLabels.concat([
            label_points([p for p, g in zip(train_p, by_guide, strict=True) if g == guide], run.experts, teacher=guide,
                         points=run.rollout_points, base=base, horizon_s=run.rollout_horizon_s or None,
                         min_gain=run.rollout_min_gain, seed=run.seed, follow_s=run.rollout_follow_s,
                         encoder=encoder)
            for guide in sorted(set(by_guide))])
        changed = float(np.mean(labels.label != labels.teacher_action))
        cloned_state = {k: v.clone() for k, v in agent.qnet.state_dict().items()}
        fit = improve_agent(agent, labels, seed=run.seed)
        rolled = agent_jcts(agent, val, run.experts, teacher, encoder, **level)
        scores["rollout"] = score(rolled)
        say(f"rollout labels: {len(labels)} points, {changed:.1%} not the guide's; fit {fit:.1%}; "
            f"validation {scores['rollout']:.3f}")
        if score(rolled) < score(mine):
            kept, mine = "rollout", rolled
        else:
            agent.qnet.load_state_dict(cloned_state)
            agent.sync_target()
    if run.steps:
        cloned_state = {k: v.clone() for k, v in agent.qnet.state_dict().items()}
        agent.sync_target()
        train(env, agent, run.steps, seed=run.seed)
        tuned = agent_jcts(agent, val, run.experts, teacher, encoder, **level)
        scores["fine-tuned"] = score(tuned)
        say(f"fine-tuned: validation {scores['fine-tuned']:.3f}")
        if score(tuned) < score(mine):
            kept, mine = "fine-tuned", tuned
        else:
            agent.qnet.load_state_dict(cloned_state)
            agent.sync_target()
    verdict = gate(mine, per_expert[run.experts[teacher]], run.experts[teacher])
    say(verdict.note())
    wall = time.perf_counter() - t0
    agent.extra = expert_extra(run.experts, teacher, verdict, hd=hd, kept=kept, seed=run.seed,
                               knowledge=run.knowledge, round_s=level["round_s"], config=options_dict(run),
                               problems={"train": [_source(p) for p in train_p[run.train_traces:]],
                                         "validation": [_source(p) for p in val[len(val) - len(val_problems):]]},
                               train_problems=len(train_p), wall_s=round(wall, 1),
                               guides=None if guides is None else
                               {e: guides.count(i) for i, e in enumerate(run.experts)},
                               validation={"experts_h": {k: v / 3600 for k, v in means.items()},
                                           "traces": len(val), "scores": scores,
                                           "cloned_h": float(np.mean(bc)) / 3600,
                                           "tuned_h": None if tuned is None else float(np.mean(tuned)) / 3600,
                                           "rollout_h": None if rolled is None else float(np.mean(rolled)) / 3600})
    agent.save(out_path)
    return ExpertTrainReport(out_path, run.experts[teacher], means, scores, kept, verdict, wall, tuple(clone.agreement))


def _source(problem) -> str:
    """``trace on cluster`` of a ``(cluster spec, trace)`` problem, as a checkpoint records it."""
    spec, trace = problem
    return f"{trace.source or '(unnamed)'} on {spec.name}"
