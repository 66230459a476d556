"""Waking pending pods: those the filter turned away for GPU reasons (or for an unbound claim),
woken once capacity freed on a node they asked for (`core.wakeup`) or their claim is bound.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from elastic_gpu.core.request import PodRequest
from elastic_gpu.core.wakeup import Waiter, Wake, asked_nodes, plan_wakeups
from elastic_gpu.scheduler.state.base import StateBase

log = logging.getLogger(__name__)

#: Pods remembered as waiting for GPU capacity; past this the longest-waiting are forgotten
#: (kube-scheduler's five-minute flush still retries them).
MAX_WAITING = 10_000


class Wakeups(StateBase):
    """Pods waiting for capacity or a claim, and when to wake them."""

    # ---- waking pending pods ---------------------------------------------------------------

    def _mark_freed(self, node: str) -> None:
        """Capacity on `node` may have grown (a hold or reservation released, inventory
        changed). Recorded only while some pod waits: a pod turned away later was turned away
        with this capacity in view."""
        if self._waiting:
            self._epoch += 1
            self._freed[node] = self._epoch

    def _note_filtered(self, pod: PodRequest, uid: str, node_names: Sequence[str],
                       feasible: Sequence[str]) -> None:
        self._waiting.pop(uid, None)  # re-inserted last below: the dict stays oldest first
        if feasible or not pod.wants_gpu or not node_names:
            return
        self._waiting[uid] = Waiter(uid, pod, asked_nodes(node_names, len(self._known)),
                                    self._epoch, self._priority_of(pod, uid))
        while len(self._waiting) > MAX_WAITING:
            del self._waiting[next(iter(self._waiting))]
        self.wakeup_counts["turned_away"] += 1

    def wakeups(self, check_limit: int = 64, wake_limit: int = 32) -> list[Wake]:
        """The pending pods to wake now: turned away by the filter for GPU reasons, and now
        fitting on a node whose capacity freed since (`core.wakeup.plan_wakeups`). Each one is
        marked as having seen every freeing so far, so it is not woken again for the same one.
        """
        with self._lock:
            claimed = list(self._claim_wakes.values())
            self._claim_wakes.clear()
            self.wakeup_counts["woken"] += len(claimed)
            if not self._waiting:
                self._freed.clear()
                return claimed
            if not self.ready:
                return claimed
            self._flush()  # inventory changes are marked freed as they reach the engine
            self.expire()
            if not self._freed:
                return claimed
            plan = plan_wakeups(self.engine, list(self._waiting.values()), self._freed,
                                check_limit=check_limit, wake_limit=wake_limit)
            for uid in plan.checked:
                self._waiting[uid] = replace(self._waiting[uid], since=self._epoch)
            # a freeing every waiter has seen can never wake anyone again
            oldest = min(w.since for w in self._waiting.values())
            self._freed = {n: e for n, e in self._freed.items() if e > oldest}
            self.wakeup_counts["rounds"] += 1
            self.wakeup_counts["woken"] += len(plan.wake)
            return claimed + list(plan.wake)

    def wakeup_pending(self) -> bool:
        """Whether a wake-up round may find someone: pods wait and capacity freed (or an
        inventory change not yet in the engine may free some). A hint, read without the lock."""
        return bool(self._claim_wakes) or (bool(self._waiting) and bool(
            self._freed or self._dirty or self._reservation_ended()))

    def _reservation_ended(self) -> bool:
        """A defragmentation reservation's expiry passed (`expire` will free its cards)."""
        return min(self._reserved_until.values(), default=float("inf")) <= self._wall()

    def wakeup_done(self, wake: Wake, sent: bool, definite: bool = True) -> None:
        """A wake-up's outcome in the API. Refused (the pod is gone or was re-created): it
        waits no more. Not known to have landed (a timeout, a 5xx): its node counts as freed
        again, so the next round reconsiders it."""
        with self._lock:
            self.wakeup_counts["sent" if sent else "failed"] += 1
            if sent:
                return
            if definite:
                self._waiting.pop(wake.uid, None)
            elif wake.reason:
                self._claim_wakes[wake.uid] = wake  # a claim's wake-up: send it again
            elif wake.uid in self._waiting:
                self._mark_freed(wake.node)

    def waiting(self) -> dict[str, Waiter]:
        with self._lock:
            return dict(self._waiting)

    def wakeup_stats(self) -> tuple[int, dict[str, int]]:
        """(pods waiting for GPU capacity, counters: turned_away, rounds, woken, sent, failed)."""
        with self._lock:
            return len(self._waiting), dict(self.wakeup_counts)
