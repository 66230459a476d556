"""What the MIG adapter remembers between rounds, and what the steps of one round share.

Kept in memory only: a restarted adapter starts with none, which is safe (a reservation ends
at its deadline anyway, a repair count restarts, an Event is told once more).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.controller.mig.objects import metadata_of

#: a reservation of a free instance by a move in flight ends when its pod is placed, or then
RESERVATION_TTL_S = 30.0


@dataclass
class Reservation:
    """A free instance promised to a move in flight, until a pod of `selector` is placed with
    a uid other than `old_uid`, or the deadline."""

    uuid: str
    node: str
    namespace: str
    owner_uid: str | None
    pod_name: str | None
    old_uid: str
    deadline: float
    source_node: str = ""

    def fulfilled_by(self, pod: Mapping[str, Any]) -> bool:
        meta = metadata_of(pod)
        if meta.get("namespace") != self.namespace or meta.get("uid") == self.old_uid:
            return False
        if not (pod.get("spec") or {}).get("nodeName"):
            return False
        if self.owner_uid is not None:
            return any(isinstance(r, Mapping) and r.get("uid") == self.owner_uid
                       for r in meta.get("ownerReferences") or [])
        return meta.get("name") == self.pod_name

    @staticmethod
    def deadline_from_now() -> float:
        return time.monotonic() + RESERVATION_TTL_S


@dataclass
class RoundState:
    """Shared by the round's steps: each reads and updates the same instance."""

    reservations: list[Reservation] = field(default_factory=list)
    #: bare rule name -> times its pod was deleted again because it came un-rewritten
    repairs: dict[str, int] = field(default_factory=dict)
    #: pod uid -> the reason last told in an Event (told again only when it changes)
    told: dict[str, str] = field(default_factory=dict)
    #: rules and pods of this round whose API calls failed (each alone; see bare.py)
    item_failures: int = 0
    #: rule uid -> why it is not carried out, as last told (told again only on a change)
    refused: dict[str, str] = field(default_factory=dict)
