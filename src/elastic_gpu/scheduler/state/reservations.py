"""Binds in flight: cards (and CPU, memory) reserved before the Binding is sent, until its
outcome is known (bound, failed) or its TTL runs out (unknown).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.placement import (
    Unschedulable,
)
from elastic_gpu.core.request import PodRequest
from elastic_gpu.scheduler.state.base import EGPU_KEY, StateBase
from elastic_gpu.scheduler.state.records import PodInfo, Reservation

log = logging.getLogger(__name__)


class Reservations(StateBase):
    """Reservations of binds and ElasticGPU creations in flight."""

    def _reservation_key(self, uid: str, token: int) -> str:
        return f"{uid}#bind{token}"

    def _allocate_reservation(self, uid: str, token: int, assignment: Assignment) -> None:
        self._version += 1
        try:
            self.engine.allocate(self._reservation_key(uid, token), assignment)
        except (Unschedulable, KeyError, ValueError) as err:
            log.warning("reservation of pod uid %s on %s cannot be counted: %s", uid,
                        assignment.node, getattr(err, "reason", err))

    def _drop_reservations(self, uid: str, token: int | None = None) -> None:
        self._version += 1
        reservations = self._inflight.get(uid)
        if not reservations:
            return
        for t in [token] if token is not None else list(reservations):
            dropped = reservations.pop(t, None)
            if dropped is not None:
                self.engine.release(self._reservation_key(uid, t))
                self._mark_freed(dropped.assignment.node)
            held = self._host_reserved.pop((uid, t), None)
            if held is not None:
                self._add_host(*held, sign=-1)
        if not reservations:
            del self._inflight[uid]
            if uid.startswith(EGPU_KEY):  # if the ElasticGPU was never made, pods naming it
                self._sync_consumers(uid[len(EGPU_KEY):])  # hold its cards themselves
            else:  # a pod whose bind did not land holds its defragmentation reservation again
                self._sync(uid)

    @contextmanager
    def _defrag_hold_released(self, uid: str) -> Iterator[None]:
        """Binding a pod that holds a defragmentation reservation: its cards are the pod's to
        choose, so the reservation stops counting while the bind's own reservation is made
        (which then holds them); if choosing fails, it counts again."""
        if uid not in self._reserved_until:
            yield
            return
        self._set_hold(uid, None)
        try:
            yield
        finally:
            self._sync(uid)

    def reserve(self, pod: PodRequest, uid: str, node: str) -> tuple[int, Assignment]:
        """Choose cards on `node` and hold them now, before anything is written to the API.

        Returns a token for `settle`. Earlier reservations and holds of the same pod stay
        counted: until their outcome is known, any one of them may be the one that lands.
        """
        with self._lock:
            self._prepare()
            with self._defrag_hold_released(uid):
                assignment = self.engine.assign(pod, node)
                return self._reserve_assignment(pod, uid, node, assignment), assignment

    def _reserve_assignment(self, pod: PodRequest, uid: str, node: str,
                            assignment: Assignment) -> int:
        self._tokens += 1
        token = self._tokens
        self.engine.allocate(self._reservation_key(uid, token), assignment)
        self._version += 1
        self._inflight.setdefault(uid, {})[token] = Reservation(assignment)
        self._waiting.pop(uid, None)  # being bound: it waits no more
        self._claim_waiting.pop(uid, None)
        if pod.cpu_milli or pod.memory_mib:
            # its CPU and memory count from now, like its cards, until the bind's outcome
            self._host_reserved[(uid, token)] = (node, pod.cpu_milli, pod.memory_mib)
            self._add_host(node, pod.cpu_milli, pod.memory_mib, sign=+1)
        return token

    def settle(self, uid: str, token: int, outcome: str,
               pod: Mapping[str, Any] | None = None) -> None:
        """End a bind: `bound` (pass the bound pod, or it is taken from the reservation),
        `failed` (the API refused: nothing was written) or `unknown` (keep for the TTL)."""
        with self._lock:
            reservation = (self._inflight.get(uid) or {}).get(token)
            if outcome == "unknown":
                if reservation is not None:
                    reservation.deadline = self._clock() + self.config.reservation_ttl_s
                return
            if outcome == "bound":
                # `pod` is what we know the API holds now (bound, annotated), possibly before
                # the watch says so; a later watch event replaces it, an equal one is ignored.
                # A pod deleted right after its Binding landed can be seen gone before this
                # settles (the worker's reply and the watch event race): it stays gone.
                if pod is not None and uid not in self._gone:
                    info = PodInfo.from_manifest(pod)
                    current = self._pods.get(uid)
                    if current is None or not current.node_name:
                        if current is not None and current.resource_version is not None:
                            info = replace(info, resource_version=max(
                                current.resource_version, info.resource_version or 0))
                        self._index_consumer(uid, current, info)
                        self._pods[uid] = info
                self._drop_reservations(uid)
                self._sync(uid)
                self._count_host(uid)  # from the reservation to the bound pod, not the watch
                return
            self._drop_reservations(uid, token)

    def expire(self) -> int:
        """End reservations whose bind outcome stayed unknown past the TTL."""
        with self._lock:
            now = self._clock()
            late = [(uid, token) for uid, reservations in self._inflight.items()
                    for token, r in reservations.items() if r.deadline <= now]
            for uid, token in late:
                log.warning("reservation of pod uid %s expired; its bind never showed up", uid)
                self._drop_reservations(uid, token)
            wall = self._wall()
            ended = [uid for uid, until in self._reserved_until.items() if until <= wall]
            for uid in ended:
                log.info("defragmentation reservation of pod uid %s expired", uid)
                self._sync(uid)
            return len(late)
