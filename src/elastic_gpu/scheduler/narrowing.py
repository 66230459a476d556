"""`filterResult: auto`: answer a filter with the engine's one node, or with every node that fits?

With one feasible node left after the extenders' filters, kube-scheduler's `schedulePod`
(k8s.io/kubernetes pkg/scheduler/schedule_one.go, "When only one node after predicate, just
use it") returns at once: no score plugin runs and the extender's prioritize is not called. So
a narrowed answer costs one round trip per pod instead of two, and the pod goes where the engine
says. That is only right when kube-scheduler's scores would not have had anything the pod asked
for to weigh: a pod that states a soft preference, or that a candidate node's
`PreferNoSchedule` taint would score down, gets every node that fits (`all`), and kube-scheduler
weighs its own soft scores with ours as before (docs/scheduler.md, "One round trip per pod").

Pure functions over the pod as the wire delivered it (`wire.Pod`) and the taints of the
candidate nodes; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from elastic_gpu.core.nodeaffinity import (
    RulesError,
    Taint,
    Toleration,
    rules_from_manifest,
    untolerated_taint,
)

PREFER_NO_SCHEDULE = "PreferNoSchedule"
#: topologySpreadConstraints' soft kind (the hard one is `DoNotSchedule`, a filter)
SCHEDULE_ANYWAY = "ScheduleAnyway"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def soft_preference(pod: Mapping[str, Any]) -> str | None:
    """The soft preference the pod's spec states, named, or None: a preferred node affinity,
    a preferred pod affinity or anti-affinity term, or a topology spread constraint with
    `whenUnsatisfiable: ScheduleAnyway` (what kube-scheduler's NodeAffinity, InterPodAffinity
    and PodTopologySpread score plugins read of the pod itself)."""
    spec = _mapping(pod.get("spec"))
    affinity = _mapping(spec.get("affinity"))
    for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
        if _mapping(affinity.get(kind)).get(_PREFERRED):
            return f"{kind}.{_PREFERRED}"
    for constraint in spec.get("topologySpreadConstraints") or ():
        if _mapping(constraint).get("whenUnsatisfiable") == SCHEDULE_ANYWAY:
            return "topologySpreadConstraints (whenUnsatisfiable: ScheduleAnyway)"
    return None


def tolerations(pod: Mapping[str, Any]) -> tuple[Toleration, ...]:
    """The pod's tolerations, read by the one reader of a pod's placement rules
    (`core.nodeaffinity.rules_from_manifest`). A pod whose rules are not of the API's shape
    (kube-apiserver refuses such a pod: only a hand-made request carries one) tolerates nothing
    here, so a soft taint among its candidates leaves the weighing to kube-scheduler."""
    try:
        return rules_from_manifest(pod).tolerations
    except RulesError:
        return ()


#: Why a filter answered as it did, for `elasticgpu_scheduler_filter_answers_total`: `auto`
#: answered the engine's one node (`none`) or every fitting node for one of two reasons; any
#: other `filterResult` answers as configured.
BECAUSE_NONE = "none"
BECAUSE_SOFT_PREFERENCE = "soft_preference"
BECAUSE_PREFER_NO_SCHEDULE = "prefer_no_schedule_taint"
BECAUSE_CONFIGURED = "configured"
_TAINT_REASON = "a candidate node's taint"


def wants_every_node(pod: Mapping[str, Any], node_names: Sequence[str],
                     prefer_no_schedule: Mapping[str, Sequence[Taint]]) -> str | None:
    """Why the filter should answer with every node that fits (`all`) for this pod, or None
    to answer with the engine's one node (`best`). `prefer_no_schedule`: the known nodes that
    carry a `PreferNoSchedule` taint, and those taints (usually none: then this is a few
    dict lookups)."""
    stated = soft_preference(pod)
    if stated is not None:
        return stated
    if not prefer_no_schedule:
        return None
    tolerated: tuple[Toleration, ...] | None = None
    if len(prefer_no_schedule) < len(node_names):
        asked = set(node_names)
        candidates: Iterable[str] = (n for n in prefer_no_schedule if n in asked)
    else:
        candidates = (n for n in node_names if n in prefer_no_schedule)
    for name in candidates:
        if tolerated is None:
            tolerated = tolerations(pod)
        # kube-scheduler's TaintToleration score counts these per node
        taint = untolerated_taint(tolerated, prefer_no_schedule[name], (PREFER_NO_SCHEDULE,))
        if taint is not None:
            return f"{_TAINT_REASON} {taint} the pod does not tolerate"
    return None


def because(why: str | None) -> str:
    """The metric's label for `wants_every_node`'s answer."""
    if why is None:
        return BECAUSE_NONE
    return BECAUSE_PREFER_NO_SCHEDULE if why.startswith(_TAINT_REASON) \
        else BECAUSE_SOFT_PREFERENCE
