"""``dqn``: the expert-choice agent as a scheduling policy (the design's DQN scheduler).

At each decision point :class:`ExpertChoicePolicy` applies the proposal of the expert heuristic the agent
chooses (:mod:`gpualloc.rl.expert_choice`); preemptive, cluster-agnostic. Its checkpoint (a
:class:`gpualloc.rl.dqn.DQNAgent` file whose ``extra["format"]`` is :data:`EXPERT_FORMAT`, written by
:func:`gpualloc.rl.train_scheduler.train_expert_scheduler`) carries the gate's verdict from training: when
the agent was worse than its teacher on the validation traces, the policy runs the teacher instead and says
so (a warning and :attr:`ExpertChoicePolicy.note`). Without ``agent``, the bundled agent of the run's
information level is used (:class:`ByLevel`, ``docs/scheduling-agent.md``).

The earlier per-GPU-slot agent (``extra["format"] == "gpualloc.scheduler"``) was retired in issue 37: its
files are refused in one line (:data:`RETIRED_FORMAT`).

It lives in the learning layer and is registered lazily in the scheduling layer's policy registry
(``"gpualloc.rl.sched_policy:learned_policy"``), so the scheduling layer never imports it; it imports
:mod:`gpualloc.rl.dqn` (and so torch) only when an agent is loaded.
"""

from __future__ import annotations

import warnings
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gpualloc.cache import DiskCache, code_key, file_hash
from gpualloc.errors import AgentError, GpuallocWarning
from gpualloc.rl.expert_choice import ExpertPanel, GateResult, HDFeatures, PredictedWork, distinct, observe
from gpualloc.scheduling.base import ClusterView, Decision, JobTable
from gpualloc.seeding import seeded

if TYPE_CHECKING:
    from gpualloc.rl.dqn import DQNAgent

BUNDLED_EXPERT_AGENT = "sched-experts.pt"
"""The default agent (expert choice, any cluster), in ``gpualloc/rl/data``."""

BUNDLED_LEVEL_AGENTS = {"oracle": BUNDLED_EXPERT_AGENT, "estimate": "sched-experts-estimate.pt",
                        "blind": "sched-experts-blind.pt"}
"""The bundled expert-choice agent of each information level (issue 36), in ``gpualloc/rl/data``."""

EXPERT_FORMAT = "gpualloc.expert-choice"
"""``extra["format"]`` of an expert-choice agent's checkpoint."""

RETIRED_FORMAT = "gpualloc.scheduler"
"""``extra["format"]`` of the per-slot agent's checkpoints, retired in issue 37."""


def bundled_agent_path(name: str | None = None, *, knowledge: str | None = None) -> Path:
    """Path of a bundled agent: ``name``, or the expert-choice agent of information level ``knowledge``
    (:data:`BUNDLED_LEVEL_AGENTS`), default the expert-choice agent (:data:`BUNDLED_EXPERT_AGENT`)."""
    if knowledge is not None:
        if name is not None:
            raise AgentError("bundled_agent_path: give a name or a knowledge level, not both")
        if knowledge not in BUNDLED_LEVEL_AGENTS:
            raise AgentError(f"bundled_agent_path: unknown information level {knowledge!r} "
                             f"(expected one of {', '.join(BUNDLED_LEVEL_AGENTS)})")
        name = BUNDLED_LEVEL_AGENTS[knowledge]
    return Path(str(resources.files("gpualloc.rl") / "data" / (name or BUNDLED_EXPERT_AGENT)))


class AgentFallbackWarning(GpuallocWarning):
    """The learned agent failed its gate; its teacher heuristic schedules instead."""


def expert_extra(experts: tuple[str, ...] | list[str], teacher: int, gate: GateResult | None, **more) -> dict:
    """The ``extra`` an expert-choice agent's checkpoint carries (plain values)."""
    return {"format": EXPERT_FORMAT, "experts": list(experts), "teacher": int(teacher),
            "gate": None if gate is None else gate.to_dict(), **more}


class ExpertChoicePolicy:
    """Schedule by applying, at each decision point, the proposal of the expert the agent picks.

    Args:
        agent: the Q-network over :func:`~gpualloc.rl.expert_choice.observe`; None runs the teacher.
        experts: registry names of the experts (the agent's actions, in order).
        teacher: index of the teacher expert.
        gate: the training gate's verdict; a failed gate runs the teacher (and warns).
        encoder: optional extra features of a view (the agent was trained with them).
        knowledge: the information level the agent was trained at: below ``oracle`` its observation
            reads remaining work from a duration predictor (:class:`PredictedWork`), never the view's
            duration columns.
        round_s: the panel's round (default the teacher's); the agents below ``oracle`` fix it.
        seed: seed of the observation's own predictor (when no expert has one).
    """

    name = "dqn"
    preemptive = True

    @seeded(error=AgentError)
    def __init__(self, agent: DQNAgent | None, experts: tuple[str, ...] | list[str], teacher: int = 0, *,
                 gate: GateResult | None = None, encoder=None, agent_path: str | Path | None = None,
                 knowledge: str = "oracle", round_s: float | None = None, seed: int = 0) -> None:
        self.experts, self.teacher = tuple(experts), int(teacher)
        self.knowledge, self._round, self.seed = knowledge, round_s, int(seed)
        self.gate = gate
        self.fallback = agent is None or (gate is not None and not gate.passed)
        self._learned = agent
        self._agent_path = agent_path  # a failed gate's agent, loaded only if asked for (see learned)
        self.agent = None if self.fallback else agent
        self.encoder = encoder
        if agent is not None and agent.n_actions != len(self.experts):
            raise AgentError(f"agent has {agent.n_actions} actions for {len(self.experts)} experts")
        self.note = gate.note() if gate is not None else (
            f"no agent: {self.experts[self.teacher]}" if agent is None else "learned agent (no gate recorded)")
        if self.fallback and gate is not None:
            warnings.warn(self.note, AgentFallbackWarning, stacklevel=2)
        self._panel = self._new_panel()
        self.round_s: float | None = self._panel.round_s
        self._table: JobTable | None = None
        self.choices = np.zeros(len(self.experts), dtype=np.int64)

    @property
    def learned(self) -> DQNAgent | None:
        """The learned agent, also when its gate failed (to measure it: benchmarks/sched_decision_latency.py);
        an agent whose cached verdict let the policy skip it is loaded now."""
        if self._learned is None and self._agent_path is not None:
            from gpualloc.rl.dqn import DQNAgent

            self._learned = DQNAgent.load(self._agent_path, device="cpu")
        return self._learned

    def _new_panel(self) -> ExpertPanel:
        if self.fallback:  # the teacher alone: exactly the teacher heuristic
            self._work = None
            return ExpertPanel((self.experts[self.teacher],), 0)
        panel = ExpertPanel(self.experts, self.teacher, self._round)
        self._work = None if self.knowledge == "oracle" else PredictedWork(panel, self.seed)
        return panel

    def decide(self, view: ClusterView) -> Decision:
        if self._table is not view.jobs:  # a new run: fresh expert state
            if self._table is not None:
                self._panel = self._new_panel()
            self._table = view.jobs
        panel = self._panel
        proposals = panel.propose(view)
        if self.agent is None:
            return proposals[0]
        mask = distinct(proposals)
        if mask.sum() == 1:
            return proposals[0]
        obs = observe(view, proposals, self.teacher, self._work, self.encoder)
        choice = self.agent.act(obs, mask, explore=False)
        self.choices[choice] += 1
        return panel.apply(choice, proposals, view)


VERDICT_KIND = "dqn-gate"
"""The cache's sub-folder for gate verdicts."""

VERDICT_SOURCES = ("rl/sched_policy.py", "rl/expert_choice.py", "rl/dqn/agent.py", "rl/dqn/checkpoint.py")
"""The code that reads a checkpoint's verdict (package-relative): a change invalidates cached verdicts."""


def verdict_key(path: str | Path) -> dict:
    """The cache key of an agent file's gate verdict: its content hash and the code that reads it."""
    return {"checkpoint_sha256": file_hash(path), **code_key(VERDICT_SOURCES)}


def learned_policy(agent: str | Path | DQNAgent | None = None, *, cache: DiskCache | None = None):
    """The registry's ``dqn`` factory.

    Args:
        agent: checkpoint path, a loaded agent, or None for the bundled expert-choice agent.
        cache: where the gate verdicts of agent files are kept (keyed by the file's content hash and
            the reading code): an expert-choice agent whose cached verdict failed becomes its teacher
            heuristic without loading the checkpoint or torch (seconds saved on every call).

    Raises:
        AgentError: missing file, not a scheduling agent, or a retired per-slot agent.
    """
    if agent is None:
        oracle = _learned_policy(None, cache=cache)
        levels = {k: bundled_agent_path(knowledge=k) for k in BUNDLED_LEVEL_AGENTS if k != "oracle"}
        levels = {k: p for k, p in levels.items() if p.is_file()}
        return ByLevel(oracle, levels, cache) if levels else oracle
    return _learned_policy(agent, cache=cache)


class ByLevel:
    """The default ``dqn``: the bundled agent of the run's information level (``view.jobs.knowledge``),
    loaded at the first decision of a run at that level; the oracle agent under ``oracle`` (and where no
    agent of the level is bundled). Every other attribute (``note``, ``gate``, ``choices``, ...) is the
    policy of the last level it decided at, the oracle one before any decision.

    The simulator reads ``round_s`` before the first decision, so it is the oracle agent's; the agents
    below oracle are trained with that round (:data:`~gpualloc.rl.train_scheduler.LEVEL_ROUND_S`).
    """

    name = "dqn"
    preemptive = True

    def __init__(self, oracle, levels: dict[str, Path], cache: DiskCache | None = None) -> None:
        self._by: dict[str, object] = {"oracle": oracle}
        self._paths, self._cache = dict(levels), cache
        self._current = oracle
        self.round_s = oracle.round_s

    def at(self, knowledge: str):
        """The policy that decides at ``knowledge`` (loaded now if needed)."""
        policy = self._by.get(knowledge)
        if policy is None:
            path = self._paths.get(knowledge)
            policy = self._by["oracle"] if path is None else _learned_policy(path, cache=self._cache)
            if getattr(policy, "round_s", None) != self.round_s:
                raise AgentError(f"{path}: its round ({policy.round_s} s) is not the default dqn's "
                                 f"({self.round_s} s); bundled agents below oracle must share it")
            self._by[knowledge] = policy
        return policy

    def decide(self, view: ClusterView) -> Decision:
        self._current = policy = self.at(getattr(view.jobs, "knowledge", "oracle"))
        return policy.decide(view)

    def __getattr__(self, name: str):
        current = self.__dict__.get("_current")
        if current is None:  # not yet built (unpickling)
            raise AttributeError(name)
        return getattr(current, name)


def _learned_policy(agent, *, cache: DiskCache | None = None):
    key = None
    if agent is None or isinstance(agent, (str, Path)):  # a path: its cached verdict is read without torch
        path = bundled_agent_path(BUNDLED_EXPERT_AGENT) if agent is None else Path(agent)
        if cache is not None and path.is_file():
            key = verdict_key(path)
            policy = _from_verdict(cache.get(VERDICT_KIND, key), path)
            if policy is not None:
                return policy
    from gpualloc.rl.dqn import DQNAgent

    if isinstance(agent, DQNAgent):
        loaded, where = agent, "agent"
    else:
        loaded, where = DQNAgent.load(path, device="cpu"), str(path)
    extra = loaded.extra if isinstance(loaded.extra, dict) else {}
    if extra.get("format") == RETIRED_FORMAT:
        raise AgentError(f"{where}: a per-slot scheduling agent; the per-slot agent was retired in issue 37: "
                         "train the expert-choice agent (gpualloc train scheduler) or use the bundled one")
    if extra.get("format") != EXPERT_FORMAT:
        raise AgentError(f"{where}: not a scheduling agent (its metadata lacks format {EXPERT_FORMAT!r})")
    try:
        experts = [str(x) for x in extra["experts"]]
        teacher = int(extra["teacher"])
        gate = None if extra.get("gate") is None else GateResult.from_dict(extra["gate"])
    except (KeyError, TypeError, ValueError) as err:
        raise AgentError(f"{where}: bad expert-choice metadata: {err}") from err
    encoder = None
    if extra.get("hd"):
        encoder = HDFeatures.from_dict(extra["hd"])
    if key is not None:
        cache.put(VERDICT_KIND, key, expert_extra(experts, teacher, gate))
    return ExpertChoicePolicy(loaded, experts, teacher, gate=gate, encoder=encoder, **_level_options(extra))


def _level_options(extra: dict) -> dict:
    """The information level, round and seed an expert-choice checkpoint was trained with (oracle's
    agents, written before issue 36, carry none)."""
    rs = extra.get("round_s")
    return {"knowledge": str(extra.get("knowledge", "oracle")), "round_s": None if rs is None else float(rs),
            "seed": int(extra.get("seed", 0) or 0)}


def _from_verdict(verdict, path: Path) -> ExpertChoicePolicy | None:
    """The teacher-run policy of a cached failed verdict; None for anything else (no entry, a passed gate:
    the agent must be loaded, or an entry that does not parse: read the checkpoint again)."""
    if not isinstance(verdict, dict) or verdict.get("format") != EXPERT_FORMAT or verdict.get("gate") is None:
        return None
    try:
        gate = GateResult.from_dict(verdict["gate"])
        experts, teacher = [str(x) for x in verdict["experts"]], int(verdict["teacher"])
    except (KeyError, TypeError, ValueError):
        return None
    if gate.passed or not 0 <= teacher < len(experts):
        return None
    return ExpertChoicePolicy(None, experts, teacher, gate=gate, agent_path=path)
