"""The learned scheduler's action space: at each decision point, choose one expert's decision.

At every decision point (arrivals, completions, failures and the experts' rounds) each expert
heuristic of an :class:`ExpertPanel` (Gavel, SRTF, Tiresias, SJF by default) proposes a whole
:class:`~gpualloc.scheduling.base.Decision`: starts on chosen GPU types, preemptions, migrations (a
preempted job restarting elsewhere pays the restart penalty). The agent picks one proposal; the panel
checks it with :func:`gpualloc.scheduling.rules.validate_decision` (the one feasibility check) and
applies it, or the teacher's proposal when it breaks a rule. So every allocation the agent makes is
one a strong heuristic would make at that moment, it can switch heuristic by regime, and picking the
teacher at every point reproduces the teacher exactly.

Every expert is asked at every decision point, chosen or not, so stateful ones (Gavel's received
service, Tiresias' queues) follow the real run. The observation (:func:`observe`) is
cluster-agnostic: global load figures, per-GPU-type blocks (types ordered by size, padded to
``MAX_TYPES``) and one block per expert describing its proposal, all normalised by the cluster's
GPU count; its length depends only on the number of experts, never on the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpualloc.errors import AgentError
from gpualloc.scheduling.base import ClusterView, Decision
from gpualloc.scheduling.policies import make_policy
from gpualloc.rl.train_config import DEFAULT_EXPERTS
from gpualloc.scheduling.rules import validate_decision
from gpualloc.seeding import seeded

__all__ = ["BLIND_EXPERTS", "DEFAULT_EXPERTS", "ESTIMATE_EXPERTS", "EXPERTS_AT", "EXPERT_FEATURES", "GLOBAL_FEATURES",
           "KNOWLEDGE_FEATURES", "MAX_TYPES", "TYPE_FEATURES", "ExpertPanel", "GateResult", "HDFeatures",
           "PredictedWork", "action_of", "distinct", "gate", "mean_ratio", "obs_dim", "observe"]

BLIND_EXPERTS: tuple[str, ...] = ("fcfs", "las", "tiresias", "tiresias-gittins", "gavel",
                                  "srtf-pred", "sjf-pred", "gavel-srtf-pred")
"""Under ``blind``: the non-clairvoyant heuristics and the prediction-driven policies (issue 36)."""

ESTIMATE_EXPERTS: tuple[str, ...] = (*BLIND_EXPERTS, "srtf", "sjf", "gavel-srtf")
"""Under ``estimate``: those of ``blind`` and SRTF, SJF, ``gavel-srtf`` on the users' time limits."""

EXPERTS_AT: dict[str, tuple[str, ...]] = {"oracle": DEFAULT_EXPERTS, "estimate": ESTIMATE_EXPERTS,
                                          "blind": BLIND_EXPERTS}
"""The default panel of each information level."""

MAX_TYPES = 4
"""Per-type feature blocks; a cluster with more types folds the smallest ones into the last block."""

GLOBAL_FEATURES = 12
TYPE_FEATURES = 4
EXPERT_FEATURES = 7
KNOWLEDGE_FEATURES = 4
"""Added below ``oracle``: the predictor's mean log interval width (queued, running) and the mean log
hours of work done (queued, running)."""

_HOUR = 3600.0


def obs_dim(n_experts: int, hd_dim: int = 0, knowledge: str = "oracle") -> int:
    """Length of the observation for ``n_experts`` experts (plus an optional HD encoding) at ``knowledge``."""
    extra = 0 if knowledge == "oracle" else KNOWLEDGE_FEATURES
    return GLOBAL_FEATURES + MAX_TYPES * TYPE_FEATURES + n_experts * EXPERT_FEATURES + extra + hd_dim


class ExpertPanel:
    """The experts of one run and the safe application of a chosen proposal.

    Args:
        experts: registry names; each gets a fresh instance (their state belongs to one run).
        teacher: index of the expert whose proposal replaces an invalid one (and that behaviour
            cloning imitates).

    Attributes:
        round_s: the teacher's round (so always choosing the teacher replays it exactly), else the
            shortest round of the others, or None.
        preemptive: some expert may preempt.
    """

    def __init__(self, experts: Sequence[str] = DEFAULT_EXPERTS, teacher: int = 0,
                 round_s: float | None = None) -> None:
        if not experts:
            raise AgentError("ExpertPanel: no experts")
        if not 0 <= teacher < len(experts):
            raise AgentError(f"ExpertPanel: teacher index {teacher} out of range for {len(experts)} experts")
        self.names = tuple(experts)
        self.policies = [make_policy(name) for name in self.names]
        self.teacher = int(teacher)
        rounds = [p.round_s for p in self.policies if p.round_s is not None]
        own = self.policies[self.teacher].round_s
        self.round_s: float | None = own if own is not None else (min(rounds) if rounds else None)
        if round_s is not None:  # a fixed round (the agents below oracle: docs/scheduling-agent.md)
            self.round_s = float(round_s)
        self.preemptive = any(p.preemptive for p in self.policies)
        self.invalid = 0

    def propose(self, view: ClusterView) -> list[Decision]:
        """Every expert's decision on ``view`` (every expert is asked, so its state follows the run)."""
        return [p.decide(view) for p in self.policies]

    def apply(self, choice: int, proposals: Sequence[Decision], view: ClusterView) -> Decision:
        """The chosen proposal when it passes :func:`validate_decision`, else the teacher's."""
        decision = proposals[choice]
        if choice != self.teacher and validate_decision(decision, view):
            self.invalid += 1
            return proposals[self.teacher]
        return decision


def _same(a: Decision, b: Decision) -> bool:
    return a.preempt == b.preempt and a.starts == b.starts


def distinct(proposals: Sequence[Decision]) -> np.ndarray:
    """Mask of the proposals that differ from every earlier one (choosing among equals is no choice)."""
    keep = np.ones(len(proposals), dtype=bool)
    for i in range(1, len(proposals)):
        keep[i] = not any(_same(proposals[i], proposals[k]) for k in range(i) if keep[k])
    return keep


def action_of(proposals: Sequence[Decision], mask: np.ndarray, k: int) -> int:
    """The action that applies expert ``k``'s proposal: the first proposal of ``mask`` (:func:`distinct`)
    equal to it."""
    return next(i for i, d in enumerate(proposals) if mask[i] and _same(d, proposals[k]))


def _type_blocks(view: ClusterView, q: np.ndarray, total: np.ndarray, free: np.ndarray, n_gpus: float) -> np.ndarray:
    """Per type (largest first, padded to ``MAX_TYPES``): share of GPUs, free share, queued demand whose
    fastest type it is (GPUs / cluster), queued jobs' mean speed there relative to their best."""
    jobs = view.jobs
    n_types = len(total)
    order = np.argsort(-total, kind="stable")
    out = np.zeros((MAX_TYPES, TYPE_FEATURES), dtype=np.float32)
    if q.size:
        sp = jobs.speed[q]
        best = sp.max(axis=1)
        fastest = np.argmax(sp, axis=1)
        demand = np.bincount(fastest, weights=jobs.num_gpus[q], minlength=n_types)
        rel = (sp / np.where(best > 0, best, 1.0)[:, None]).mean(axis=0)
    else:
        demand, rel = np.zeros(n_types), np.zeros(n_types)
    for rank, t in enumerate(order.tolist()):
        k = min(rank, MAX_TYPES - 1)  # more types than blocks: the smallest share the last one
        out[k, 0] += total[t] / n_gpus
        out[k, 1] += free[t] / n_gpus
        out[k, 2] += demand[t] / n_gpus
        out[k, 3] = max(out[k, 3], rel[t])
    return out.ravel()


def _expert_block(view: ClusterView, d: Decision, busy: float, n_gpus: float, teacher: Decision,
                  left: dict[int, float] | None = None) -> np.ndarray:
    """One proposal: GPUs started and preempted (per cluster GPU), starts and preemptions (per
    GPU), busy share after it, share of started jobs on their fastest type, log mean run hours
    (remaining work from the view under ``oracle``, else the predicted median ``left`` by job)."""
    jobs = view.jobs
    gpus_started = sum(len(g) for _, g in d.starts)
    gpus_stopped = float(jobs.num_gpus[d.preempt].sum()) if d.preempt else 0.0
    on_best, run_h = 0.0, 0.0
    if d.starts:
        j = np.fromiter((s[0] for s in d.starts), np.int64, len(d.starts))
        t = view.gpu_type[np.fromiter((s[1][0] for s in d.starts), np.int64, len(d.starts))]
        sp = jobs.speed[j, t]
        on_best = float(np.mean(sp >= jobs.speed[j].max(axis=1)))
        rem = jobs.remaining_s[j] if left is None else np.array([left.get(k, 0.0) for k in j.tolist()])
        run_h = float(np.log1p(np.mean(rem / sp) / _HOUR))
    return np.array([gpus_started / n_gpus, gpus_stopped / n_gpus, len(d.starts) / n_gpus, len(d.preempt) / n_gpus,
                     busy + (gpus_started - gpus_stopped) / n_gpus, on_best, run_h], dtype=np.float32)


class PredictedWork:
    """What the agent believes of the remaining work below ``oracle``: a duration predictor's median
    and the width of its interval, learned online from the run's finished jobs only
    (:class:`~gpualloc.scheduling.predict.DurationPredictor`); it reads ``done_s``, ``finished_work_s``
    and submit-time fields, never ``work_s`` or ``remaining_s``, so it runs under ``blind``.

    Args:
        panel: the experts; the predictor of the first prediction-driven one (``srtf-pred``, ...) is
            read (it was brought up to date when the expert decided at this point), so the run fits
            one predictor, not two.
        seed: the own predictor's seed when no expert has one.
    """

    @seeded(error=AgentError)
    def __init__(self, panel: ExpertPanel | None = None, seed: int = 0) -> None:
        from gpualloc.scheduling.predict import DurationPredictor

        shared = [p.predictor for p in (panel.policies if panel is not None else ()) if hasattr(p, "predictor")]
        self.own = not shared
        self.predictor = DurationPredictor(seed=seed) if self.own else shared[0]
        self._source = None

    def __call__(self, view: ClusterView, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(median, log interval width)`` of the remaining work of jobs ``idx`` (reference seconds;
        the width is ``ln((hi + 60) / (lo + 60))``)."""
        jobs = view.jobs
        if self.own:
            if jobs is not self._source:  # a new run: nothing learnt before it
                self._source = jobs
                self.predictor.reset()
            self.predictor.update(jobs, view.now_s)
        if not idx.size:
            return np.zeros(0), np.zeros(0)
        p = self.predictor.predict(idx, jobs)
        return p.median_s, np.log((p.hi_s + 60.0) / (p.lo_s + 60.0))


def observe(view: ClusterView, proposals: Sequence[Decision], teacher: int = 0,
            work: PredictedWork | None = None, encoder=None) -> np.ndarray:
    """The cluster-agnostic observation of one decision point (length :func:`obs_dim`).

    ``work`` None: remaining work read from the view (``oracle``: the truth). Otherwise it comes from
    ``work`` (a predictor's median; no duration column is read, so this runs under ``blind``), and
    :data:`KNOWLEDGE_FEATURES` more numbers say how uncertain it is and how much work jobs have done.
    ``encoder``: optional ``(view) -> features`` appended (the HD block, :class:`HDFeatures`).
    """
    jobs = view.jobs
    n_gpus = float(len(view.gpu_type))
    total = view.total_by_type().astype(float)
    free = view.free_by_type().astype(float)
    q = np.fromiter(view.queue, np.int64, len(view.queue))
    r = np.fromiter(view.running, np.int64, len(view.running))
    busy = 1.0 - float(free.sum()) / n_gpus
    left = extra = None
    if work is None:
        q_rem = jobs.remaining_s[q] if q.size else None
        r_rem = jobs.remaining_s[r] if r.size else None
    else:
        both_idx = np.concatenate([q, r])
        med, width = work(view, both_idx)
        left = dict(zip(both_idx.tolist(), med.tolist(), strict=True))
        q_rem, r_rem = med[:q.size], med[q.size:]
        done = np.asarray(jobs.done_s[both_idx], dtype=float) if both_idx.size else np.zeros(0)

        def _mean(x: np.ndarray) -> float:
            return float(np.mean(x)) if x.size else 0.0

        extra = np.array([_mean(width[:q.size]), _mean(width[q.size:]),
                          np.log1p(_mean(done[:q.size]) / _HOUR), np.log1p(_mean(done[q.size:]) / _HOUR)],
                         dtype=np.float32)
    q_left = q_rem / jobs.speed[q].max(axis=1) if q.size else np.zeros(1)
    r_left = r_rem / jobs.speed[r].max(axis=1) if r.size else np.zeros(1)
    wait = view.now_s - jobs.queued_since_s[q] if q.size else np.zeros(1)
    both = np.concatenate([q_left, r_left])
    glob = np.array([
        busy, float(jobs.num_gpus[q].sum()) / n_gpus, q.size / n_gpus, r.size / n_gpus,
        np.log1p(np.mean(q_left) / _HOUR), np.log1p(np.max(q_left) / _HOUR), np.log1p(np.mean(r_left) / _HOUR),
        np.log1p(np.nanmean(wait) / _HOUR) if q.size else 0.0,
        float(np.mean(jobs.num_gpus[q] > 1)) if q.size else 0.0,
        float(np.mean(jobs.preemptions[r] > 0)) if r.size else 0.0,
        # how heavy-tailed the work in the system is (where shortest-first beats fair sharing)
        np.log1p(np.std(q_left) / np.mean(q_left)) if np.mean(q_left) > 0 else 0.0,
        np.log1p(np.max(both) / np.median(both)) if np.median(both) > 0 else 0.0,
    ], dtype=np.float32)
    blocks = [_expert_block(view, d, busy, n_gpus, proposals[teacher], left) for d in proposals]
    parts = [glob, _type_blocks(view, q, total, free, n_gpus), *blocks]
    if extra is not None:
        parts.append(extra)
    out = np.nan_to_num(np.concatenate(parts), nan=0.0, posinf=0.0, neginf=0.0)
    if encoder is not None:
        out = np.concatenate([out, np.asarray(encoder(view), dtype=np.float32)])
    return out


@dataclass(frozen=True)
class GateResult:
    """The gate's verdict: the agent ships only when it is at least as good as its teacher.

    Attributes:
        passed: the mean over the validation traces of the agent's average JCT divided by the
            teacher's (``ratio``) is at most 1. A ratio, not a difference of sums, so a real-trace
            window with JCTs of hundreds of hours does not outweigh the synthetic traces.
        agent_jct_s, teacher_jct_s: mean average JCT over the validation traces.
        teacher: the teacher's name.
        traces: how many validation traces.
        ratio: the mean paired ratio (None in checkpoints written before it existed: the means decide).
    """

    passed: bool
    agent_jct_s: float
    teacher_jct_s: float
    teacher: str
    traces: int
    ratio: float | None = None

    def note(self) -> str:
        """One line saying which policy runs and why."""
        ratio = self.ratio if self.ratio is not None else (
            self.agent_jct_s / self.teacher_jct_s if self.teacher_jct_s > 0 else 1.0)
        if self.passed:
            return (f"learned agent: average JCT {1.0 - ratio:.2%} below its teacher {self.teacher}'s on "
                    f"{self.traces} validation traces (mean per-trace ratio {ratio:.4f})")
        return (f"learned agent worse than its teacher {self.teacher} on {self.traces} validation traces "
                f"(mean per-trace average JCT ratio {ratio:.4f}, at most 1 passes); falling back to {self.teacher}")

    def to_dict(self) -> dict:
        return {"passed": self.passed, "agent_jct_s": self.agent_jct_s, "teacher_jct_s": self.teacher_jct_s,
                "teacher": self.teacher, "traces": self.traces, "ratio": self.ratio}

    @classmethod
    def from_dict(cls, data: dict) -> GateResult:
        ratio = data.get("ratio")
        return cls(bool(data["passed"]), float(data["agent_jct_s"]), float(data["teacher_jct_s"]),
                   str(data["teacher"]), int(data["traces"]), None if ratio is None else float(ratio))


def mean_ratio(jcts: Sequence[float], reference: Sequence[float]) -> float:
    """Mean over paired traces of ``jcts / reference`` (a trace where the reference is 0 counts 1
    when both are 0): the one score of a policy over traces of very different scales."""
    a, b = np.asarray(jcts, dtype=float), np.asarray(reference, dtype=float)
    if a.shape != b.shape or not a.size:
        raise AgentError(f"mean_ratio: {a.size} and {b.size} traces; need the same positive number")
    return float(np.mean(np.where(b > 0, a / np.where(b > 0, b, 1.0), np.where(a > 0, np.inf, 1.0))))


def gate(agent_jcts: Sequence[float], teacher_jcts: Sequence[float], teacher: str) -> GateResult:
    """The one gate: pass when the agent's average JCT over the validation traces, divided by the
    teacher's on the same trace and averaged (:func:`mean_ratio`), is at most 1."""
    ratio = mean_ratio(agent_jcts, teacher_jcts)
    return GateResult(bool(ratio <= 1.0), float(np.mean(agent_jcts)), float(np.mean(teacher_jcts)), teacher,
                      len(agent_jcts), ratio)


class HDFeatures:
    """The optional hyperdimensional block of the observation: :func:`gpualloc.rl.hdc.hd_features` of
    the view (per-type utilisation and the queued jobs, bound and bundled, projected to ``out_dim``).

    Args:
        out_dim: features appended to the observation.
        dim: hypervector dimension.
        seed: the encoder's seed (the same seed gives the same features).
    """

    @seeded(error=AgentError)
    def __init__(self, out_dim: int = 32, dim: int = 4096, seed: int = 0) -> None:
        from gpualloc.rl.hdc import HDEncoder

        self.encoder = HDEncoder(dim=dim, out_dim=out_dim, seed=seed)
        self.out_dim = int(out_dim)

    def __call__(self, view: ClusterView) -> np.ndarray:
        from gpualloc.rl.hdc import hd_features

        return hd_features(view, self.encoder)

    def to_dict(self) -> dict:
        return self.encoder.to_dict()

    @classmethod
    def from_dict(cls, data: dict) -> HDFeatures:
        from gpualloc.rl.hdc import HDEncoder

        self = cls.__new__(cls)
        self.encoder = HDEncoder.from_dict(dict(data))
        self.out_dim = self.encoder.out_dim
        return self
