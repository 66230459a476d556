"""NodePrepareResources' last word on capacity (issue 41, the ledger stays exact whoever
allocates): a claim whose devices, beside the claims already prepared on this node, would put
a card past its compute or memory, or give a MIG instance a second holder, is refused with its
own error (kubelet then fails the pod's start and tries again) and a Warning Event on the pods
it is reserved for. The decision is `core.dra.capacity_guard`; this module gathers its inputs.

What is already prepared is the plugin's checkpoint: each entry keeps its devices' shares
(`prepare.PreparedDevice.share`); an entry an older agent wrote without them is read from the
API. Before a refusal, the claims in the way are read from the API: one deleted or deallocated
meanwhile (kubelet has not unprepared it yet) no longer counts, so a stale entry never blocks
the node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from elastic_gpu.agent.dra.prepare import ClaimRef, PreparedClaim
from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.dra.allocation import AllocationError, allocated_devices
from elastic_gpu.core.dra.capacity_guard import Holding, overflows, refusal
from elastic_gpu.core.dra.devices import device_table
from elastic_gpu.core.model import Card
from elastic_gpu.kube.errors import NotFound

log = logging.getLogger(__name__)

ClaimReader = Callable[[ClaimRef], Mapping[str, Any]]


def _name(ref: ClaimRef) -> str:
    return f"{ref.namespace}/{ref.name}"


class CapacityGuard:
    def __init__(self, node: str, read_claim: ClaimReader) -> None:
        self.node = node
        self.read_claim = read_claim

    def _shares(self, claim: PreparedClaim, cards: Sequence[Card]
                ) -> list[tuple[str, CardShare]]:
        held = [(d.device, d.share) for d in claim.devices
                if d.pool == self.node and d.share is not None]
        if len(held) == len([d for d in claim.devices if d.pool == self.node]):
            return held
        # an older agent's entry: its shares from the API (not counted when it cannot be read)
        try:
            live = self.read_claim(claim.ref)
            if (live.get("metadata") or {}).get("uid") != claim.ref.uid:
                return []
            return [(a.device, a.share)
                    for a in allocated_devices(live, self.node, device_table(cards))]
        except (NotFound, AllocationError):
            return []
        except Exception as err:
            log.warning("%s: not read (%s); its devices not counted", claim.ref.describe(), err)
            return []

    def _gone(self, claim: PreparedClaim) -> bool:
        """Whether the API no longer has this claim allocated (deleted, created again under
        its name, or deallocated) though it is still prepared here; a read that fails cannot
        tell, and the claim counts (never give a card twice)."""
        try:
            live = self.read_claim(claim.ref)
        except NotFound:
            return True
        except Exception as err:
            log.warning("%s: not read (%s); counted as prepared", claim.ref.describe(), err)
            return False
        meta, status = live.get("metadata") or {}, live.get("status") or {}
        return meta.get("uid") != claim.ref.uid or not status.get("allocation")

    def refusal(self, prepared: PreparedClaim, others: Iterable[PreparedClaim],
                cards: Sequence[Card]) -> str | None:
        """Why `prepared` (decided, not yet written) must not be given; None: it fits."""
        mine = [Holding(_name(prepared.ref), d.device, d.share) for d in prepared.devices
                if d.share is not None and d.pool == self.node]
        if not mine:
            return None
        rest = [c for c in others if c.ref.uid != prepared.ref.uid]
        holdings = {c.ref.uid: [Holding(_name(c.ref), dev, share)
                                for dev, share in self._shares(c, cards)] for c in rest}
        found = overflows(cards, [h for hs in holdings.values() for h in hs], mine)
        if not found:
            return None
        # the claims in the way, read again: one gone meanwhile no longer counts
        names = {h.claim for o in found for h in o.holders}
        gone = {c.ref.uid for c in rest if _name(c.ref) in names and self._gone(c)}
        if gone:
            found = overflows(cards, [h for uid, hs in holdings.items() if uid not in gone
                                      for h in hs], mine)
        return refusal(prepared.ref.describe(), found)


def pods_to_tell(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods the claim is reserved for, as Event targets."""
    meta = claim.get("metadata") or {}
    return [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"namespace": meta.get("namespace"), "name": r.get("name"),
                          "uid": r.get("uid")}}
            for r in (claim.get("status") or {}).get("reservedFor") or []
            if isinstance(r, Mapping) and r.get("resource", "pods") == "pods"]


__all__ = ["CapacityGuard", "pods_to_tell"]
