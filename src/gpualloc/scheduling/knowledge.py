"""What a scheduling policy may know about a job's duration: the information model (issue 36).

A real cluster knows what was submitted (GPUs and type, team, job type, a time limit the user wrote)
and how long each job has run so far; it does not know how long a job will run. The simulator holds
the truth, and hands a policy a :class:`JobsView` of its job table instead of the table itself. The
view's level, one of :data:`KNOWLEDGE`, decides what the duration columns say:

* ``oracle``: the truth (``work_s``, ``remaining_s``, ``expected_finish_s`` as the simulator keeps
  them), for bounds and research;
* ``estimate``: the user's time limit stands in for the work: ``work_s`` is each job's estimate in
  reference seconds, ``remaining_s`` is ``max(estimate - done_s, REMAINING_FLOOR_S)``,
  ``expected_finish_s`` follows from that remaining time;
* ``blind``: reading any of the three raises :class:`InformationError`, naming the field and the level.

Every level shows the submit-time columns, the dynamic state a cluster observes (status, attained
service, run type, start and finish times, queue entry, preemptions), ``done_s`` (reference seconds
of work executed so far: run time x speed, which a cluster knows) and ``finished_work_s`` (the true
work of the jobs that are done, NaN for the others: history, what a predictor learns from).

The derived columns are computed when indexed (``jobs.remaining_s[idx]`` costs a few numpy
operations on ``idx``, never a pass over every job), so they are always current and cost nothing
for a policy that does not read them; the oracle's columns are the simulator's own arrays, seen
read-only, so the oracle path is exactly as fast as handing over the table.

What happens at the limit, and how estimates are made, is in ``docs/knowledge.md`` and
:mod:`gpualloc.workload.estimates`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gpualloc.errors import SchedulingError
from gpualloc.scheduling.base import DONE, JobTable

KNOWLEDGE: tuple[str, ...] = ("oracle", "estimate", "blind")
"""The information levels, from the most a policy may know to the least."""

DEFAULT_KNOWLEDGE = "oracle"
"""The level of :func:`gpualloc.scheduling.simulator.simulate` when none is given (the CLI chooses
its own default, see ``docs/knowledge.md``)."""

DURATION_FIELDS: tuple[str, ...] = ("work_s", "remaining_s", "expected_finish_s")
"""The columns whose meaning depends on the level (the truth, an estimate, or hidden)."""

SUBMIT_FIELDS: tuple[str, ...] = ("arrival_s", "num_gpus", "priority", "type_code", "single_node", "speed",
                                  "team", "team_names", "pref_rank")
"""Columns known when a job is submitted: visible at every level."""

OBSERVED_FIELDS: tuple[str, ...] = ("status", "attained_gpu_s", "run_type", "start_s", "finish_s",
                                    "queued_since_s", "preemptions")
"""Dynamic columns a real cluster observes: visible at every level."""

REMAINING_FLOOR_S = 60.0
"""Under ``estimate``: the remaining work (reference seconds) a job is believed to have once it has
run past its time limit (jobs are extended, not killed: ``docs/knowledge.md``). Positive, so that a
policy dividing by remaining time never divides by zero."""


class InformationError(SchedulingError):
    """A policy read a field its information level hides (``work_s`` under ``blind``, ...)."""


def check_knowledge(level: str, where: str = "knowledge") -> str:
    """``level`` if it is one of :data:`KNOWLEDGE`, else a :class:`~gpualloc.errors.SchedulingError`
    naming ``where`` and the known levels."""
    if level not in KNOWLEDGE:
        raise SchedulingError(f"{where}: unknown information level {level!r} (expected one of {', '.join(KNOWLEDGE)})")
    return level


def read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (the simulator's arrays, as a policy sees them)."""
    view = np.asarray(a).view()
    view.flags.writeable = False
    return view


class _Column:
    """A read-only column computed from the live table on each index: ``col[idx]`` evaluates
    ``fn(idx)`` for those rows only. ``np.asarray(col)`` evaluates every row (a copy)."""

    __slots__ = ("_fn", "_n", "name")

    def __init__(self, name: str, fn: Callable[[Any], Any], n: Callable[[], int]) -> None:
        self.name, self._fn, self._n = name, fn, n

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, list):
            idx = np.asarray(idx, dtype=np.int64)
        return self._fn(idx)

    def __setitem__(self, idx: Any, value: Any) -> None:
        raise ValueError(f"jobs.{self.name} is read-only: a policy must not change the job table")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.asarray(self._fn(slice(None)))
        return out if dtype is None else out.astype(dtype)

    def __len__(self) -> int:
        return self._n()

    def __iter__(self):
        return iter(np.asarray(self))

    @property
    def shape(self) -> tuple[int]:
        return (self._n(),)

    @property
    def size(self) -> int:
        return self._n()

    ndim = 1
    dtype = np.dtype(float)

    def copy(self) -> np.ndarray:
        return np.asarray(self)

    def tolist(self) -> list[float]:
        return np.asarray(self).tolist()

    def __repr__(self) -> str:
        return f"<jobs.{self.name}: {self._n()} rows, computed on access>"


class JobsView:
    """The job table as a policy sees it at one information level (see the module docstring).

    Built once per run over the simulator's live :class:`JobTable` (or the service's); it follows the
    table's changes without being rebuilt, as long as the table's arrays are changed in place.

    Args:
        table: the live table (the truth).
        knowledge: one of :data:`KNOWLEDGE`.
        estimate_s: under ``estimate``, each job's estimated work in reference seconds (the user's time
            limit, :func:`gpualloc.workload.estimates.user_estimates`); ignored otherwise.

    Attributes:
        knowledge: the level.
        (columns): as :class:`JobTable`'s, read-only; ``done_s`` and ``finished_work_s`` besides.
    """

    def __init__(self, table: JobTable, knowledge: str = DEFAULT_KNOWLEDGE,
                 estimate_s: np.ndarray | None = None) -> None:
        check_knowledge(knowledge)
        self.knowledge = knowledge
        self._table = table
        for name in SUBMIT_FIELDS + OBSERVED_FIELDS:
            value = getattr(table, name)
            setattr(self, name, read_only(value) if isinstance(value, np.ndarray) else value)
        # bound methods: no extra call level on the hot path (type_order is read per job by many policies)
        self.best_speed = table.best_speed
        self.type_order = table.type_order
        self.submit_features = table.submit_features  # what a duration predictor learns from (predict.py)
        n = table.__len__
        work, rem = table.work_s, table.remaining_s
        status = table.status
        self.done_s = _Column("done_s", lambda i: work[i] - rem[i], n)
        self.finished_work_s = _Column("finished_work_s",
                                       lambda i: np.where(status[i] == DONE, work[i], np.nan), n)
        if knowledge == "oracle":
            self.work_s = read_only(table.work_s)
            self.remaining_s = read_only(table.remaining_s)
            self.expected_finish_s = read_only(table.expected_finish_s)
        elif knowledge == "estimate":
            if estimate_s is None:
                raise SchedulingError("knowledge 'estimate' needs each job's estimate (estimate_s)")
            est = np.array(estimate_s, dtype=float)
            if est.shape != (len(table),):
                raise SchedulingError(f"estimate_s has shape {est.shape}, expected ({len(table)},)")
            if not (np.isfinite(est).all() and (est > 0).all()):
                raise SchedulingError("estimate_s: every estimate must be finite and > 0")
            est.flags.writeable = False
            self.work_s = est
            self.remaining_s = _Column("remaining_s", self._estimated_remaining, n)
            self.expected_finish_s = _Column("expected_finish_s", self._estimated_finish, n)

    def __len__(self) -> int:
        return len(self._table)

    def __getattr__(self, name: str) -> Any:
        # only called when normal lookup fails: the duration fields at the blind level
        if name in DURATION_FIELDS:
            raise InformationError(
                f"jobs.{name} is hidden at information level {self.knowledge!r}: the policy may read "
                f"submit-time fields, attained service and done_s only (--knowledge oracle or estimate "
                f"shows it)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"JobsView({len(self)} jobs, knowledge={self.knowledge!r})"

    # ------------------------------------------------------------------------------- estimate
    def _estimated_remaining(self, idx: Any) -> Any:
        tb = self._table
        left = np.maximum(self.work_s[idx] - tb.work_s[idx] + tb.remaining_s[idx], REMAINING_FLOOR_S)
        return np.where(tb.status[idx] == DONE, 0.0, left)

    def _estimated_finish(self, idx: Any) -> Any:
        """The true expected finish shifted by the difference between the estimated and the true remaining
        work at the speed the job runs at (both as of the table's last update, so a restart penalty and a
        policy that skips progress updates are handled as for the truth); NaN where not running."""
        tb = self._table
        rt = tb.run_type[idx]
        running = rt >= 0
        speed = np.where(running, tb.speed[idx, np.where(running, rt, 0)], 1.0)
        shift = (self._estimated_remaining(idx) - tb.remaining_s[idx]) / speed
        return np.where(running, tb.expected_finish_s[idx] + shift, np.nan)


# ------------------------------------------------------------------------------------ result rows
ORACLE_ROWS: frozenset[str] = frozenset({"oracle-lb"})
"""Result rows computed from the true durations whatever the run's level (labelled ``oracle``)."""


def parse_levels(text: str, where: str = "--knowledge") -> tuple[str, ...]:
    """Comma-separated levels (``"all"``: every one of :data:`KNOWLEDGE`), in :data:`KNOWLEDGE` order, once each.

    Raises:
        SchedulingError: an unknown level, or none.
    """
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    if "all" in names:
        return KNOWLEDGE
    if not names:
        raise SchedulingError(f"{where}: no information level given (expected {', '.join(KNOWLEDGE)} or all)")
    for name in names:
        check_knowledge(name, where)
    return tuple(k for k in KNOWLEDGE if k in names)


def policies_at(knowledge: str, names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The policies of a default list that can run at ``knowledge``: under ``blind``, each one that needs
    durations gives way to its prediction-driven sibling (``srtf`` -> ``srtf-pred``) where one is
    registered, and is left out otherwise (``easy-backfill``). A list the user wrote is not rewritten:
    it goes through :func:`~gpualloc.scheduling.policies.require_knowledge` instead."""
    from gpualloc.scheduling.policies import POLICIES, needs_durations

    if knowledge != "blind":
        return tuple(names)
    out: list[str] = []
    for name in names:
        alt = f"{name}-pred" if needs_durations(name) else name
        if alt in POLICIES and alt not in out:
            out.append(alt)
    return tuple(out)


def row_labels(policy: str, knowledge: str, base: str | None = None) -> dict[str, Any]:
    """The fields every result row carries about what its policy knew: ``knowledge`` (``oracle`` for
    the rows of :data:`ORACLE_ROWS` whatever the run's level), ``needs_durations`` and ``learned``
    (from the registry tags of ``base``, the registered name behind a table variant such as ``dqn-hd``;
    both false for a policy of one's own)."""
    from gpualloc.scheduling.policies import is_learned, needs_durations

    if policy in ORACLE_ROWS:
        return {"knowledge": "oracle", "needs_durations": True, "learned": False}
    name = base or policy
    return {"knowledge": knowledge, "needs_durations": needs_durations(name), "learned": is_learned(name)}


# ------------------------------------------------------------------------------ agents, up front
def reads_hidden(policy: Any, knowledge: str) -> str | None:
    """What a built agent policy (a registry entry with the ``agent`` option, such as ``dqn``) would read
    of what ``knowledge`` hides, known before it decides; ``None`` when nothing.

    Only ``blind`` hides anything (``estimate`` shows estimates where the truth was). A policy that picks
    an agent per level (``at(knowledge)``, the default ``dqn``) is asked for that level's. An expert-choice
    agent (``experts``, ``teacher``, ``fallback``, ``knowledge``) runs its experts, or its teacher alone
    after a failed gate: each must need no durations, and with a live agent its observation must come from
    a duration predictor (an agent trained below ``oracle``). Any other agent policy is taken to read each
    job's remaining work (the per-slot DQN, retired in issue 37, did).
    """
    if knowledge != "blind":
        return None
    at = getattr(policy, "at", None)
    if callable(at):
        policy = at(knowledge)
    experts = getattr(policy, "experts", None)
    if experts is None:
        return "its agent reads each job's remaining work (not an expert-choice agent)"
    from gpualloc.scheduling.policies import needs_durations

    fallback = bool(getattr(policy, "fallback", False))
    runs = (experts[policy.teacher],) if fallback else tuple(experts)
    need = [name for name in runs if needs_durations(name)]
    if need:
        what = f"its fallback {need[0]}" if fallback else "its experts " + ", ".join(need)
        return f"{what} {'needs' if len(need) == 1 else 'need'} durations"
    if not fallback and getattr(policy, "knowledge", "oracle") == "oracle":
        return "its agent was trained at oracle: its observation reads each job's remaining work"
    return None


def require_policy(name: str, knowledge: str, options: dict[str, Any] | None = None, *,
                   policy: Any = None) -> None:
    """Refuse, before any run, policy ``name`` at level ``knowledge`` when it cannot run there: one that
    needs durations under ``blind`` (:func:`~gpualloc.scheduling.policies.require_knowledge`), or an agent
    policy whose agent (the one ``options["agent"]`` names, else the bundled one of the level) or its
    fallback reads what the level hides (:func:`reads_hidden`). ``policy``: the policy already built
    from ``name`` and ``options`` (else one is built here, its warnings silenced, only for an agent
    policy under ``blind``).

    Raises:
        SchedulingError: the one line, naming ``--knowledge``, the level and the policy.
    """
    from gpualloc.scheduling.policies import make_policy, policy_options, require_knowledge

    require_knowledge(name, knowledge)
    if knowledge != "blind" or "agent" not in policy_options(name):
        return
    allowed = policy_options(name)
    options = {k: v for k, v in (options or {}).items() if v is not None and k in allowed}
    if policy is None:  # a throwaway: its warnings (a failed gate's fallback) come from the run's own
        import warnings

        from gpualloc.errors import GpuallocWarning

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GpuallocWarning)
            why = reads_hidden(make_policy(name, **options), knowledge)
    else:
        why = reads_hidden(policy, knowledge)
    if why is None:
        return
    agent = options.get("agent")
    which = f"agent {agent}" if agent is not None else "its bundled agent"
    instead = "the bundled one (no --agent), " if agent is not None else ""
    raise SchedulingError(f"policy {name!r} ({which}) reads job durations, which --knowledge {knowledge} hides: "
                          f"{why}; use {instead}an agent trained at {knowledge} (train scheduler --experts ... "
                          f"--knowledge {knowledge}) or a policy that needs no durations")
