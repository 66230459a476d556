"""Whether a pod can still use what it was given. Pure.

Every component that frees something when a pod is done asks the same question the same way:
the extender (its cards), the claims controller (a claim's protection, an ElasticGPU's
release). Kubernetes answers it for volumes with `volumeutil.IsPodTerminated` (the PV
controller's pvc-protection): the phase is terminal, or the pod is being deleted and none of
its containers runs. We ask one thing more of a deleted pod: each of its containers must be
*reported terminated*. A container whose status is missing or `waiting` may be starting on
kubelet right now (statuses lag kubelet), and a card freed on a lagging status could be
handed to another pod while the first one's process still has it.

A pod being deleted whose containers have all terminated no longer needs its cards, whatever
finalizer (the budget keeper's) holds its object: that is what lets a controller outage
freeze no card (issue #26, item 3).

`holds_cards` is the one answer to "does this bound pod still hold its cards?": every view of
who holds a card (the extender's ledger, the node agent's allocation columns and its Allocate
over-commit check, `egpu top`, the MIG controller's free instances, defragmentation) counts a
pod being deleted as holding until it has `stopped`, so a card never shows free while a process
may still use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Phases after which no container of the pod runs again: the one spelling (budget ledger,
#: MIG controller, watches and lists all read it).
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

#: The field selector of the pods not in a terminal phase (`status.phase notin (...)`, which
#: field selectors spell as one `!=` per phase): the lists and watches of pods that may hold
#: cards.
NOT_TERMINAL_SELECTOR = ",".join(f"status.phase!={phase}" for phase in sorted(TERMINAL_PHASES))


def finished(pod: Mapping[str, Any]) -> bool:
    """The pod's phase is terminal (Succeeded or Failed)."""
    status = pod.get("status")
    return isinstance(status, Mapping) and status.get("phase") in TERMINAL_PHASES


def _terminated(status: Any) -> bool:
    state = status.get("state") if isinstance(status, Mapping) else None
    return isinstance(state, Mapping) and isinstance(state.get("terminated"), Mapping)


def _running(status: Any) -> bool:
    state = status.get("state") if isinstance(status, Mapping) else None
    return isinstance(state, Mapping) and "running" in state


def stopped(pod: Mapping[str, Any]) -> bool:
    """No process of the pod runs or will run again: `finished`, or being deleted
    (`deletionTimestamp`) with every container of its spec reported terminated and no init
    or ephemeral container running (kubelet starts nothing for a pod being deleted)."""
    if finished(pod):
        return True
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("deletionTimestamp"):
        return False
    spec = pod.get("spec")
    status = pod.get("status")
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        return False
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return False
    reported = status.get("containerStatuses")
    by_name = {s.get("name"): s for s in reported if isinstance(s, Mapping)} \
        if isinstance(reported, list) else {}
    for container in containers:
        name = container.get("name") if isinstance(container, Mapping) else None
        if not _terminated(by_name.get(name)):
            return False
    for key in ("initContainerStatuses", "ephemeralContainerStatuses"):
        others = status.get(key)
        if isinstance(others, list) and any(_running(s) for s in others):
            return False
    return True


def holds_cards(pod: Mapping[str, Any]) -> bool:
    """Whether a pod holds the cards it was given: bound to a node (`spec.nodeName`) and not
    `stopped` (a pod being deleted holds them until its containers are reported terminated)."""
    spec = pod.get("spec")
    return isinstance(spec, Mapping) and bool(spec.get("nodeName")) and not stopped(pod)
