"""Which pods the extender may bind: those a kube-scheduler that calls it is scheduling.

kube-scheduler sends an extender's bind only for pods of the profiles in the configuration
that names the extender (extenders apply to every profile of that KubeSchedulerConfiguration),
and a pod picks its scheduler with `spec.schedulerName`. A /bind for a pod of another
scheduler (one that never consults this extender, or no scheduler at all: a pod parked for a
custom scheduler) is not kube-scheduler's; binding it would place a pod its own scheduler was
meant to place, with the extender's rights (issue 26, item 11).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

#: What the API server writes into a pod created without `spec.schedulerName`.
DEFAULT_SCHEDULER = "default-scheduler"
#: The peers' schedulers whose pods we schedule (`core.peers`): HAMi's, KAI's, Volcano's. The
#: shipped KubeSchedulerConfiguration has a profile of each name, with the extender, and the
#: extender binds their pods by default (docs/coming-from/).
PEER_SCHEDULERS = ("hami-scheduler", "kai-scheduler", "volcano")


def pod_scheduler_name(pod: Mapping[str, Any]) -> str:
    """The pod's `spec.schedulerName`, defaulted as the API server defaults it."""
    spec = pod.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) and name else DEFAULT_SCHEDULER


def scheduler_refusal(pod: Mapping[str, Any], served: Collection[str]) -> str | None:
    """Why the extender must not bind `pod` (its scheduler does not call the extender), or
    None. `served`: the schedulerNames of the profiles that call it (`schedulerNames`)."""
    name = pod_scheduler_name(pod)
    if name in served:
        return None
    return (f"the pod's schedulerName is {name!r}; this extender binds only pods of the "
            f"schedulers that call it ({', '.join(sorted(served))}; its config's "
            "schedulerNames)")
