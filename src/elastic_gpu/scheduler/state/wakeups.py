"""Waking pending pods: those the filter turned away for GPU reasons (or for an unbound claim),
woken once capacity freed on a node they asked for (`core.wakeup`) or their claim is bound.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from elastic_gpu.core.request import PodRequest
from elastic_gpu.core.wakeup import Waiter, Wake, asked_nodes, plan_wakeups
from elastic_gpu.scheduler.state.handle import StateHandle

log = logging.getLogger(__name__)

#: Pods remembered as waiting for GPU capacity; past this the longest-waiting are forgotten
#: (kube-scheduler's five-minute flush still retries them).
MAX_WAITING = 10_000
#: Pods remembered as waiting for a claim to be bound.
MAX_CLAIM_WAITING = 10_000


class Wakeups:
    """Pods waiting for capacity or a claim, and when to wake them. Calls no other part."""

    def __init__(self, handle: StateHandle) -> None:
        self._h = handle
        #: the pods the filter turned away for GPU reasons, the nodes whose capacity freed
        #: since (node -> epoch of the latest freeing), and the counter that orders the two.
        #: Freeings are recorded only while some pod waits.
        self._waiting: dict[str, Waiter] = {}
        self._freed: dict[str, int] = {}
        self._epoch = 0
        self.counts: Counter[str] = Counter()
        #: pods the filter turned away because a claim they name is not bound (uid -> (pod
        #: namespace, name, the claims it waits for)), and those to wake now that one is
        self._claim_waiting: dict[str, tuple[str, str, frozenset[str]]] = {}
        self._claim_wakes: dict[str, Wake] = {}

    # ---- what the other parts tell it (under the lock) ---------------------------------------

    def mark_freed(self, node: str) -> None:
        """Capacity on `node` may have grown (a hold or reservation released, inventory
        changed). Recorded only while some pod waits: a pod turned away later was turned away
        with this capacity in view."""
        if self._waiting:
            self._epoch += 1
            self._freed[node] = self._epoch

    def note_filtered(self, pod: PodRequest, uid: str, node_names: Sequence[str],
                      feasible: Sequence[str], priority: Callable[[], int]) -> None:
        self._waiting.pop(uid, None)  # re-inserted last below: the dict stays oldest first
        if feasible or not pod.wants_gpu or not node_names:
            return
        self._waiting[uid] = Waiter(uid, pod, asked_nodes(node_names, len(self._h.known)),
                                    self._epoch, priority())
        while len(self._waiting) > MAX_WAITING:
            del self._waiting[next(iter(self._waiting))]
        self.counts["turned_away"] += 1

    def stop_waiting(self, uid: str) -> None:
        """The pod is being bound, or is bound or done: it waits for nothing more."""
        self._waiting.pop(uid, None)
        self._claim_waiting.pop(uid, None)

    def forget(self, uid: str) -> None:
        """The pod is gone: not even a claim's wake-up is sent for it."""
        self.stop_waiting(uid)
        self._claim_wakes.pop(uid, None)

    def keep_only(self, uids: Collection[str]) -> None:
        """A relist of pods: only these exist."""
        for uid in set(self._waiting) - set(uids):
            del self._waiting[uid]

    def stop_waiting_for_capacity(self, uid: str) -> None:
        self._waiting.pop(uid, None)

    def wait_for_claims(self, uid: str, namespace: str, name: str,
                        claims: frozenset[str]) -> None:
        self._claim_waiting.pop(uid, None)
        self._claim_waiting[uid] = (namespace, name, claims)
        while len(self._claim_waiting) > MAX_CLAIM_WAITING:
            del self._claim_waiting[next(iter(self._claim_waiting))]
        self.counts["claim_turned_away"] += 1

    def stop_waiting_for_claims(self, uid: str) -> None:
        self._claim_waiting.pop(uid, None)

    def claim_waiters(self) -> list[tuple[str, tuple[str, str, frozenset[str]]]]:
        """(uid, (namespace, name, the claims it waits for)) of each pod waiting for a claim."""
        return list(self._claim_waiting.items()) if self._claim_waiting else []

    def wake_for_claims(self, wake: Wake) -> None:
        """The claims the pod waits for can now be placed: wake it in the next round."""
        del self._claim_waiting[wake.uid]
        self._claim_wakes[wake.uid] = wake

    # ---- the wake-up rounds -----------------------------------------------------------------

    def wakeups(self, catch_up: Callable[[], None], check_limit: int = 64,
                wake_limit: int = 32,
                reserved_node: Callable[[str], str | None] = lambda uid: None) -> list[Wake]:
        """The pending pods to wake now: turned away by the filter for GPU reasons, and now
        fitting on a node whose capacity freed since (`core.wakeup.plan_wakeups`). Each one is
        marked as having seen every freeing so far, so it is not woken again for the same one.
        `catch_up` brings the engine up to date first (inventory changes, expired
        reservations: each marks what it frees)."""
        with self._h.lock:
            claimed = list(self._claim_wakes.values())
            self._claim_wakes.clear()
            self.counts["woken"] += len(claimed)
            if not self._waiting:
                self._freed.clear()
                return claimed
            if not self._h.ready:
                return claimed
            catch_up()
            if not self._freed:
                return claimed
            reserved = {uid: node for uid in self._waiting
                        if (node := reserved_node(uid)) is not None}
            plan = plan_wakeups(self._h.engine, list(self._waiting.values()), self._freed,
                                check_limit=check_limit, wake_limit=wake_limit,
                                reserved=reserved)
            for uid in plan.checked:
                self._waiting[uid] = replace(self._waiting[uid], since=self._epoch)
            # a freeing every waiter has seen can never wake anyone again
            oldest = min(w.since for w in self._waiting.values())
            self._freed = {n: e for n, e in self._freed.items() if e > oldest}
            self.counts["rounds"] += 1
            self.counts["woken"] += len(plan.wake)
            return claimed + list(plan.wake)

    def pending(self, reservation_ended: Callable[[], bool]) -> bool:
        """Whether a wake-up round may find someone: pods wait and capacity freed (or an
        inventory change not yet in the engine, or a reservation's end, may free some). A
        hint, read without the lock."""
        return bool(self._claim_wakes) or (bool(self._waiting) and bool(
            self._freed or self._h.stale_nodes or reservation_ended()))

    def wakeup_done(self, wake: Wake, sent: bool, definite: bool = True) -> None:
        """A wake-up's outcome in the API. Refused (the pod is gone or was re-created): it
        waits no more. Not known to have landed (a timeout, a 5xx): its node counts as freed
        again, so the next round reconsiders it."""
        with self._h.lock:
            self.counts["sent" if sent else "failed"] += 1
            if sent:
                return
            if definite:
                self._waiting.pop(wake.uid, None)
            elif wake.reason:
                self._claim_wakes[wake.uid] = wake  # a claim's wake-up: send it again
            elif wake.uid in self._waiting:
                self.mark_freed(wake.node)

    def waiting(self) -> dict[str, Waiter]:
        with self._h.lock:
            return dict(self._waiting)

    def wakeup_stats(self) -> tuple[int, dict[str, int]]:
        """(pods waiting for GPU capacity, counters: turned_away, rounds, woken, sent, failed)."""
        with self._h.lock:
            return len(self._waiting), dict(self.counts)
