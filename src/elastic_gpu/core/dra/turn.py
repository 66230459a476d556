"""kube-scheduler's turn: whether kube-scheduler may be allocating one of our cards right now,
so that our allocator lifts no gate until it is done (docs/dra.md, "Claims placed by our
engine", step 3). Pure, no I/O.

Our gate keeps kube-scheduler away from the pods our allocator places (only the system removes
it: the policy `elastic-gpu-dra-gate`), but kube-scheduler's own allocator still allocates our
card class for two kinds of pods our allocator cannot place:

- a pod asking `nvidia.com/gpu`, the class's `extendedResourceName` (KEP-5004): kube-scheduler
  makes its claim (`<pod>-extended-resources-<random>`) in the binding cycle and allocates it
  there, so no one can allocate it beforehand (a claim already made with requests is deleted
  by its PostFilter and made again), and the pod may as well go to a device-plugin node; it is
  not gated;
- a pod whose card-class claims ours hands over (a CEL selector, `allocationMode: All`, ...), or
  whose allocation kube-scheduler's PostFilter cleared after our gate was lifted.

Such a pod is in kube-scheduler's hands from when it is ungated and unbound (created so, or
ungated by our allocator) until it is bound, its claim is allocated, or kube-scheduler has found
it unschedulable. Its allocation, if one comes, is written before it is bound: the allocator
checks its own claims for a card given twice only once no such pod is left (or `TURN_S` has
passed since it was seen), and takes them back if so, instead of only `settle_s` after they
were seen back.

A pod kube-scheduler found unschedulable is tried again by its queue on a change that may give
it room, and shows no sign of the new attempt. So such a pod is in kube-scheduler's hands again
for `TURN_S` after each change that may give it our devices (`retries_on_slice`,
`retries_on_claim`: a slice of our driver added or changed, a claim holding our devices
deallocated or deleted), until it is bound, its claims allocated, or it is gone; only pods
asking one of our DeviceClasses (or `nvidia.com/gpu`) count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.core.dra.classes import CARD_CLASS, EXTENDED_RESOURCE, MIG_CLASS
from elastic_gpu.core.dra.devices import DRIVER
from elastic_gpu.core.dra.podclaims import request_classes
from elastic_gpu.core.dra.pods import claim_names
from elastic_gpu.core.quantity import QuantityError, parse_quantity

#: How long one answer of `Turn.busy` serves (every lift waiting polls it).
ANSWER_S = 0.02
#: How long a pod counts as in kube-scheduler's hands after it was seen entering them at most
#: (a scheduler that never answers, a pod of another scheduler): our allocator's lifts wait
#: no longer than this for it.
TURN_S = 5.0
#: The DeviceClasses whose devices our allocator places too (cards, MIG instances).
OUR_CLASSES = frozenset({CARD_CLASS, MIG_CLASS})


def asks_extended(pod: Mapping[str, Any]) -> bool:
    """Whether a container of the pod asks the card class's extended resource."""
    spec = pod.get("spec") or {}
    for container in (*(spec.get("initContainers") or []), *(spec.get("containers") or [])):
        resources = container.get("resources") if isinstance(container, Mapping) else None
        for kind in ("limits", "requests"):
            value = ((resources or {}).get(kind) or {}).get(EXTENDED_RESOURCE)
            try:
                if value is not None and parse_quantity(str(value)) > 0:
                    return True
            except QuantityError:
                continue
    return False


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    return any(isinstance(c, Mapping) and c.get("type") == "PodScheduled"
               and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or [])


def may_enter(pod: Mapping[str, Any]) -> bool:
    """Whether the pod may be one kube-scheduler allocates a card for, by the pod alone (its
    claims not read): unbound, not deleted, ungated, asking the extended resource or naming
    ResourceClaims. The allocator tracks these from its pod watch."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if spec.get("nodeName") or meta.get("deletionTimestamp") or spec.get("schedulingGates"):
        return False
    return bool(spec.get("resourceClaims")) or asks_extended(pod)


def in_kube_schedulers_hands(pod: Mapping[str, Any],
                             claim: Callable[[str], Mapping[str, Any] | None]) -> bool:
    """Whether kube-scheduler may now be allocating one of our devices for `pod` (`claim`
    reads a claim by `namespace/name`): `may_enter`, not found unschedulable, and
    `asks_our_devices`."""
    return may_enter(pod) and not _unschedulable(pod) and asks_our_devices(pod, claim)


def asks_our_devices(pod: Mapping[str, Any],
                     claim: Callable[[str], Mapping[str, Any] | None]) -> bool:
    """Whether the pod still asks one of our devices of kube-scheduler: `nvidia.com/gpu` with
    no claim made for it yet, or a claim of one of our DeviceClasses not allocated."""
    if asks_extended(pod) and not (pod.get("status") or {}).get("extendedResourceClaimStatus"):
        return True
    namespace = (pod.get("metadata") or {}).get("namespace")
    for name in claim_names(pod).values():
        found = claim(f"{namespace}/{name}")
        if (found is not None and not (found.get("status") or {}).get("allocation")
                and OUR_CLASSES & request_classes(found.get("spec") or {})):
            return True
    return False


def retries_on_slice(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether a ResourceSlice added (`old` None) or updated may make kube-scheduler retry a
    pod it found unschedulable with our devices: a slice of our driver whose spec changed (a
    device appeared, a fence or taint lifted)."""
    spec = new.get("spec") or {}
    return spec.get("driver") == DRIVER and (old is None or (old.get("spec") or {}) != spec)


def _holds_ours(claim: Mapping[str, Any] | None) -> bool:
    allocation = ((claim or {}).get("status") or {}).get("allocation") or {}
    return any(isinstance(r, Mapping) and r.get("driver") == DRIVER
               for r in (allocation.get("devices") or {}).get("results") or [])


def retries_on_claim(old: Mapping[str, Any], new: Mapping[str, Any] | None) -> bool:
    """Whether a claim updated (or deleted: `new` None) frees our devices, so kube-scheduler
    retries the pods it found unschedulable: it held one of our driver's devices and holds
    none now."""
    return _holds_ours(old) and not _holds_ours(new)


Reader = Callable[[str], Mapping[str, Any] | None]


@dataclass
class Turn:
    """The pods that may be in kube-scheduler's hands, by `namespace/name`, since when (on the
    caller's monotonic clock): the allocator's pod watch reports each (`seen`, `gone`); and
    those it found unschedulable, in its hands again for `turn_s` after each change that
    makes it retry them (`changed`, fed by the allocator's slice and claim watches)."""

    turn_s: float = TURN_S
    since: dict[str, float] = field(default_factory=dict)
    #: unbound pods kube-scheduler found unschedulable (it retries them on `changed`)
    unschedulable: set[str] = field(default_factory=set)
    #: when a change that makes kube-scheduler retry those last came
    changed_at: float = float("-inf")
    #: (when, what) `busy` answered last
    answer: tuple[float, bool] = (float("-inf"), False)

    def seen(self, key: str, pod: Mapping[str, Any], now: float) -> None:
        if may_enter(pod):
            self.since.setdefault(key, now)
        else:
            self.since.pop(key, None)
        if may_enter(pod) and _unschedulable(pod):
            self.unschedulable.add(key)
        else:
            self.unschedulable.discard(key)

    def gone(self, key: str) -> None:
        self.since.pop(key, None)
        self.unschedulable.discard(key)

    def changed(self, now: float) -> None:
        """A change that makes kube-scheduler retry the pods it found unschedulable
        (`retries_on_slice`, `retries_on_claim`): they are in its hands again for `turn_s`."""
        self.changed_at = now
        self.answer = (float("-inf"), False)

    def busy(self, now: float, pod: Reader, claim: Reader) -> bool:
        """Whether a pod seen less than `turn_s` ago is in kube-scheduler's hands, or one it
        found unschedulable still asks our devices less than `turn_s` after a change that
        makes it retry (`pod` and `claim` read the caches by `namespace/name`). Pods gone,
        seen too long ago or served for good (every claim allocated, no `nvidia.com/gpu`
        asked) are forgotten."""
        if now - self.answer[0] < ANSWER_S:
            return self.answer[1]
        busy = False
        for key, since in list(self.since.items()):
            found = pod(key)
            if found is None or now - since >= self.turn_s or _served(found, claim):
                del self.since[key]
            elif in_kube_schedulers_hands(found, claim):
                busy = True
                break
        if not busy and now - self.changed_at < self.turn_s:
            busy = self._retrying(pod, claim)
        self.answer = (now, busy)
        return busy


    def _retrying(self, pod: Reader, claim: Reader) -> bool:
        for key in list(self.unschedulable):
            found = pod(key)
            if found is None or not may_enter(found):
                self.unschedulable.discard(key)
            elif asks_our_devices(found, claim):
                return True
        return False


def _served(pod: Mapping[str, Any], claim: Reader) -> bool:
    namespace = (pod.get("metadata") or {}).get("namespace")
    names = claim_names(pod)
    return (not asks_extended(pod) and len(names) == len((pod.get("spec") or {}).get(
        "resourceClaims") or [])
        and all(((claim(f"{namespace}/{n}") or {}).get("status") or {}).get("allocation")
                for n in names.values()))
