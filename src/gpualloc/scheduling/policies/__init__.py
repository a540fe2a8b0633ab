"""Scheduling policies behind one protocol (:class:`gpualloc.scheduling.base.Policy`).

:data:`POLICIES` is a :class:`~gpualloc.registry.Registry` of lazy ``"module:factory"`` entries;
factories take keyword options only. The learned ``dqn`` policy lives in the learning layer
(:mod:`gpualloc.rl.sched_policy`) and is listed here by name only, so this layer never imports it.
"""

from __future__ import annotations

from typing import Any

from gpualloc.errors import SchedulingError
from gpualloc.registry import Registry, import_user_module
from gpualloc.scheduling.base import Policy

POLICIES: Registry[Any] = Registry("policy", SchedulingError)
"""Policy factories by name; an entry's ``options`` are the keyword options callers may forward."""

NEEDS_DURATIONS = "needs_durations"
"""The tag of a policy that reads job durations (``work_s``, ``remaining_s``, ``expected_finish_s``): it runs
on the truth under ``--knowledge oracle``, on users' estimates under ``estimate``, and is refused under
``blind`` (:func:`require_knowledge`)."""

for _name, _target in (("fcfs", "simple:FCFS"), ("static-affinity", "simple:StaticAffinity"), ("sjf", "simple:SJF"),
                       ("srtf", "simple:SRTF"), ("easy-backfill", "simple:EasyBackfill"),
                       ("tiresias", "las:Tiresias"), ("gavel", "hetero:Gavel"),
                       ("gavel-srtf", "hetero:GavelShortestFirst")):
    _reads = _name in ("sjf", "srtf", "easy-backfill", "gavel-srtf")
    _tags = ("heuristic", NEEDS_DURATIONS) if _reads else ("heuristic",)
    POLICIES.register(_name, f"gpualloc.scheduling.policies.{_target}", tags=_tags)
for _name, _target in (("las", "las:LAS"), ("tiresias-gittins", "las:TiresiasGittins")):  # non-clairvoyant (issue 36)
    POLICIES.register(_name, f"gpualloc.scheduling.policies.{_target}", tags=("heuristic",))
POLICIES.register("dqn", "gpualloc.rl.sched_policy:learned_policy", tags=("learned",), options=("agent", "cache"))
for _name, _target in (("srtf-pred", "srtf_pred"), ("sjf-pred", "sjf_pred"), ("gavel-srtf-pred", "gavel_srtf_pred")):
    # the inner policy ranks by the duration predictor's remaining work (issue 36): needs no durations
    POLICIES.register(_name, f"gpualloc.scheduling.policies.predicted:{_target}", tags=("learned",),
                      options=("seed", "predictor", "quantile", "history"))


_PROTOCOL = ("name", "preemptive", "round_s", "decide")  # what the simulator reads of a policy


def make_policy(name: str, **options: Any) -> Policy:
    """Instantiate the policy registered as ``name`` with keyword ``options``.

    ``name`` may also be ``"package.module:factory"``, a policy of one's own: the module is imported (the
    current folder on the import path, :func:`~gpualloc.registry.import_user_module`) and ``factory(**options)``
    must return an object with the :class:`~gpualloc.scheduling.base.Policy` protocol's attributes. The
    simulator checks its every decision like any policy's.

    Raises:
        SchedulingError: an unknown name (the message lists the known ones), a module or factory that
            cannot be imported or called, or an object without the protocol.
    """
    if name in POLICIES or ":" not in name:
        return POLICIES.create(name, **options)
    module, attr = import_user_module(name, SchedulingError)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise SchedulingError(f"policy {name!r}: {module.__name__} has no callable {attr!r}")
    try:
        policy = factory(**options)
    except Exception as err:  # noqa: BLE001 - the user's factory failed: one line, not a traceback
        raise SchedulingError(f"policy {name!r}: {attr}() failed: {type(err).__name__}: {err}") from err
    missing = [a for a in _PROTOCOL if not hasattr(policy, a)]
    if missing or not callable(policy.decide):
        raise SchedulingError(f"policy {name!r}: {type(policy).__name__} lacks {', '.join(missing) or 'decide()'}; "
                              f"a policy has name, preemptive, round_s and decide(view) -> Decision")
    return policy


def needs_durations(name: str) -> bool:
    """Whether policy ``name`` reads job durations (tag ``needs_durations``; False for a policy of one's
    own, which the information level checks as it runs)."""
    return name in POLICIES and NEEDS_DURATIONS in POLICIES.entry(name).tags


def is_learned(name: str) -> bool:
    """Whether policy ``name`` uses a learned model (tag ``learned``: ``dqn``, the prediction-driven ones)."""
    return name in POLICIES and "learned" in POLICIES.entry(name).tags


def require_knowledge(name: str, knowledge: str) -> None:
    """Refuse up front a policy that needs durations at the ``blind`` level, naming what runs there.

    Raises:
        SchedulingError: ``name`` is tagged ``needs_durations`` and ``knowledge`` is ``"blind"``.
    """
    if knowledge != "blind" or not needs_durations(name):
        return
    pred = f"{name}-pred"
    blind_ok = [n for n in POLICIES.names() if not needs_durations(n) and n != "dqn" and not n.endswith("-pred")]
    instead = (f"use {pred} (the same policy on a duration predictor learned from finished jobs)"
               if pred in POLICIES else "use a prediction-driven policy (" + ", ".join(POLICIES.names("learned")) + ")")
    raise SchedulingError(f"policy {name!r} needs job durations, which --knowledge blind hides: {instead}, "
                          f"or one that needs none ({', '.join(blind_ok)})")


def policy_options(name: str) -> frozenset[str]:
    """The keyword options ``name``'s factory takes beyond the protocol (none for a policy of one's own)."""
    return POLICIES.entry(name).options if name in POLICIES else frozenset()
