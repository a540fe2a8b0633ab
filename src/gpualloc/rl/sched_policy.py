"""``dqn``: a trained DQN agent as a scheduling policy.

At each decision point the policy builds the observation of
:mod:`gpualloc.rl.envs.scheduling_env` from the view (:class:`~gpualloc.rl.features.DecisionPoint`,
the code the environment uses) and takes the agent's greedy masked action, again and again, until it
picks wait or no start is left; the starts form the :class:`Decision`. It is non-preemptive.

The agent file is a :class:`gpualloc.rl.dqn.DQNAgent` checkpoint whose ``extra`` holds the feature
layout, the normalisation statistics and the environment settings it was trained with
(:func:`gpualloc.rl.train_scheduler.train_scheduler` writes it). Without ``agent``, the agent bundled
for the ``adlro16`` cluster is used (``docs/scheduling-agent.md``).

It lives in the learning layer and is registered lazily in the scheduling layer's policy registry
(``"gpualloc.rl.sched_policy:DQNPolicy"``), so the scheduling layer never imports it; it imports
:mod:`gpualloc.rl.dqn` (and so torch) only when a policy is created.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from gpualloc.errors import AgentError
from gpualloc.scheduling.base import ClusterView, Decision
from gpualloc.rl.features import (SLOT_ORDERS, DecisionPoint, FeatureLayout, FeatureScaler, GridHistory,
                                          JobRequests, MetricsSource, simulated_metrics)

if TYPE_CHECKING:
    from gpualloc.rl.dqn import DQNAgent

BUNDLED_AGENT = "sched-adlro16.pt"
"""The default agent, in ``gpualloc/rl/data``."""

EXTRA_FORMAT = "gpualloc.scheduler"
"""``extra["format"]`` of a scheduling agent's checkpoint."""


def bundled_agent_path() -> Path:
    """Path of the bundled ``adlro16`` agent."""
    return Path(str(resources.files("gpualloc.rl") / "data" / BUNDLED_AGENT))


def scheduler_extra(layout: FeatureLayout, scaler: FeatureScaler, *, slot_order: str, work_conserving: bool,
                    idle_weight: float, cluster: str, **more) -> dict:
    """The ``extra`` a scheduling agent's checkpoint carries (plain values)."""
    return {"format": EXTRA_FORMAT, "layout": layout.to_dict(), "scaler": scaler.to_dict(),
            "slot_order": slot_order, "work_conserving": bool(work_conserving), "idle_weight": float(idle_weight),
            "cluster": cluster, **more}


def read_extra(extra: dict, where: str) -> tuple[FeatureLayout, FeatureScaler, str, bool]:
    """``(layout, scaler, slot_order, work_conserving)`` from a checkpoint's ``extra``.

    Raises:
        AgentError: not a scheduling agent, or bad fields (the message starts with ``where``).
    """
    if not isinstance(extra, dict) or extra.get("format") != EXTRA_FORMAT:
        raise AgentError(f"{where}: not a scheduling agent (its metadata lacks format {EXTRA_FORMAT!r})")
    try:
        layout = FeatureLayout.from_dict(extra["layout"])
        scaler = FeatureScaler.from_dict(extra["scaler"])
        slot_order = str(extra["slot_order"])
        work_conserving = bool(extra["work_conserving"])
    except (KeyError, TypeError, ValueError, AgentError) as err:
        raise AgentError(f"{where}: bad scheduling-agent metadata: {err}") from err
    if slot_order not in SLOT_ORDERS:
        raise AgentError(f"{where}: bad scheduling-agent metadata: slot_order {slot_order!r}")
    return layout, scaler, slot_order, work_conserving


class DQNPolicy:
    """Schedule with a trained DQN agent (greedy, masked).

    Args:
        agent: checkpoint path, a loaded ``DQNAgent`` (its ``extra`` must hold the scheduling
            metadata), or None for the bundled ``adlro16`` agent.
        requests: CPU and memory requests of the run's jobs, where the caller has them (the
            :class:`~gpualloc.scheduling.base.ClusterView` does not carry them).
        metrics: source of live GPU metrics; the simulator's by default.

    Raises:
        AgentError: the file is missing or is not a scheduling agent.
    """

    name = "dqn"
    preemptive = False
    round_s: float | None = None

    def __init__(self, agent: str | Path | DQNAgent | None = None, *, requests: JobRequests | None = None,
                 metrics: MetricsSource = simulated_metrics) -> None:
        from gpualloc.rl.dqn import DQNAgent

        if isinstance(agent, DQNAgent):
            self.agent, where = agent, "agent"
        else:
            path = bundled_agent_path() if agent is None else Path(agent)
            self.agent, where = DQNAgent.load(path, device="cpu"), str(path)
        self.layout, self.scaler, self.slot_order, self.work_conserving = read_extra(self.agent.extra, where)
        if self.agent.n_actions != self.layout.n_actions:
            raise AgentError(f"{where}: agent has {self.agent.n_actions} actions, layout expects "
                             f"{self.layout.n_actions}")
        self.requests = requests
        self.metrics = metrics
        self._history: GridHistory | None = None

    def decide(self, view: ClusterView) -> Decision:
        history = self._history
        if history is None or not history.matches(view):
            history = self._history = GridHistory(view, self.layout)
        # Waiting on an idle cluster could stall the run for good (the policy cannot see whether
        # arrivals are still due), so the idle rule always holds here.
        point = DecisionPoint(view, history, self.scaler, self.metrics(view), self.requests,
                              slot_order=self.slot_order, work_conserving=True)
        wait = self.layout.wait_action
        act = self.agent.act
        while True:
            mask = point.action_mask()
            if not mask[:wait].any():
                break
            action = act(point.observe(), mask, explore=False)
            if action == wait:
                break
            point.start(action)
        point.commit()
        return point.decision()
