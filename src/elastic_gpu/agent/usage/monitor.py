"""The sampling loop: every `usage.sampleSeconds`, sample the cards, map processes to holders,
keep the newest usage for `/metrics`, write `status.usage` as `core.usage.plan_writes` allows,
and report (or evict) containers above their memory share.

Every effect goes through `UsageSinks` (the agent binds them to the API in `api_sinks`;
tests record them), so `tick` is the whole behaviour and runs without a cluster.

Where the kubelet serves its PodResources API (`kubelet`: the `List` call), each sample also
reads which container kubelet gave which of this agent's devices: the containers holding a
time-sliced replica are holders of its card (kubelet chose the replica; no assignment says
which), and every container whose processes run on a card kubelet never gave it is reported
(`core.usage.kubelet_mismatches`, a log line while it lasts).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_gpu.agent.backends.base import Backend, BackendError
from elastic_gpu.agent.config import DriftPolicy, UsageConfig
from elastic_gpu.agent.devices import LogicalCard, ResourcePlan
from elastic_gpu.agent.podresources import KubeletDevices, PodResourcesError, kubelet_cards
from elastic_gpu.agent.usage.observe import (
    holders,
    ledger,
    memoized,
    mig_holdings,
    observe,
    observe_migs,
    proc_resolver,
    seen_on_cards,
)
from elastic_gpu.api.gpudevice import now_rfc3339
from elastic_gpu.core.usage import (
    CardUsage,
    ContainerRef,
    KubeletMismatch,
    MigUsage,
    OverShare,
    WritePolicy,
    Written,
    kubelet_mismatches,
    over_shares,
    plan_writes,
)

log = logging.getLogger(__name__)

OVER_SHARE = "GPUMemoryOverShare"
EVICTED = "GPUMemoryOverShareEvicted"


def write_policy(config: UsageConfig) -> WritePolicy:
    return WritePolicy(period_s=config.writeSeconds,
                       out_of_band_threshold_mib=config.outOfBandThresholdMiB,
                       memory_quantum_mib=config.memoryQuantumMiB,
                       percent_quantum=config.percentQuantum, refresh_s=config.refreshSeconds)


@dataclass
class UsageSinks:
    """Where a tick's effects go: a card's `status.usage` (None: an agent without the API
    publishes nothing, only metrics), an Event on a pod, a pod evicted."""

    write: Callable[[int, CardUsage], None] | None
    event: Callable[[Mapping[str, Any], str, str, str], None]
    delete_pod: Callable[[Mapping[str, Any]], None]


@dataclass
class UsageView:
    """The newest sample, for `/metrics`."""

    cards: dict[int, CardUsage] = field(default_factory=dict)
    over: list[OverShare] = field(default_factory=list)
    #: the cross-check against the kubelet's device accounting (empty without PodResources)
    mismatches: list[KubeletMismatch] = field(default_factory=list)
    #: MIG instances, by UUID (memory only: NVML has no utilisation per instance)
    mig: dict[str, MigUsage] = field(default_factory=dict)


class UsageMonitor:
    def __init__(self, node: str, cards: Sequence[LogicalCard], backend: Backend,
                 config: UsageConfig, pods: Callable[[], Sequence[Mapping[str, Any]]],
                 sinks: UsageSinks, *, proc: Path = Path("/proc"),
                 clock: Callable[[], float] = time.monotonic,
                 stamp: Callable[[], str] | None = None,
                 kubelet: Callable[[], Sequence[KubeletDevices]] | None = None,
                 plans: Sequence[ResourcePlan] = ()) -> None:
        """`kubelet`: the PodResources `List` (None: not read); `plans`: this agent's device
        plugins, to read kubelet's device IDs as cards."""
        self.node = node
        self.cards = tuple(cards)
        self.backend = backend
        self.config = config
        self.policy = write_policy(config)
        self.pods = pods
        self.sinks = sinks
        self.proc = proc
        self.clock = clock
        self.stamp = stamp or now_rfc3339
        self.written: dict[int, Written] = {}
        self.last_round: float | None = None
        self.writes = 0
        self._events: dict[tuple[ContainerRef, int], float] = {}
        self.kubelet = kubelet
        self.plans = tuple(plans)
        #: mismatches already logged, while they last
        self._mismatched: set[tuple[ContainerRef, int]] = set()
        self._kubelet_failing = False
        self._lock = threading.Lock()
        self._view = UsageView()

    def view(self) -> UsageView:
        with self._lock:
            return self._view

    def tick(self) -> UsageView:
        """One sample, and what follows from it."""
        pods = list(self.pods())
        assigned = ledger(pods, self.node, self.cards)
        devices = self._kubelet_devices()
        held = assigned
        if devices is not None:
            # A time-sliced replica's card is kubelet's choice: its holders are kubelet's.
            chosen = kubelet_cards(devices, [p for p in self.plans if p.kubelet_chooses])
            held = {index: dict(refs) for index, refs in assigned.items()}
            for index, refs in chosen.items():
                for ref in refs:
                    held.setdefault(index, {}).setdefault(ref, 0)  # promises no memory
        resolve = memoized(proc_resolver(pods, self.proc))
        samples = self.backend.sample(holders(pods, self.cards, held,
                                              mig_holdings(pods, self.node)))
        usage = observe(samples, self.cards, held, resolve, self.stamp())
        over = [o for index, use in sorted(usage.items())
                for o in over_shares(index, use, held.get(index, {}))]
        mismatches = [] if devices is None else kubelet_mismatches(
            seen_on_cards(samples, self.cards, resolve), kubelet_cards(devices, self.plans),
            {index: refs.keys() for index, refs in assigned.items()})
        self._report(mismatches)
        migs = observe_migs(samples, self.cards, resolve)
        with self._lock:
            self._view = UsageView(usage, over, mismatches, migs)
        self._publish(usage)
        self._drift(over, pods)
        return self._view

    def _kubelet_devices(self) -> list[KubeletDevices] | None:
        """kubelet's device accounting now; None when it cannot be read (said once, until it
        can again)."""
        if self.kubelet is None:
            return None
        try:
            devices = list(self.kubelet())
        except PodResourcesError as err:
            if not self._kubelet_failing:
                log.info("usage sampling goes on without the kubelet's PodResources: %s", err)
            self._kubelet_failing = True
            return None
        self._kubelet_failing = False
        return devices

    def _report(self, mismatches: Sequence[KubeletMismatch]) -> None:
        current = {(m.ref, m.card) for m in mismatches}
        for item in mismatches:
            if (item.ref, item.card) not in self._mismatched:
                log.warning("%s", item.message())
        self._mismatched = current

    def _publish(self, usage: Mapping[int, CardUsage]) -> None:
        if self.sinks.write is None:
            return
        now = self.clock()
        plan = plan_writes(usage, self.written, self.last_round, now, self.policy)
        if plan.periodic:
            self.last_round = now
        for index in plan.cards:
            try:
                self.sinks.write(index, usage[index])
            except Exception as err:  # the next round tries again; sampling goes on
                log.warning("status.usage of card %d not written: %s", index, err)
                continue
            self.written[index] = Written(usage[index], now)
            self.writes += 1

    def _drift(self, over: Sequence[OverShare], pods: Sequence[Mapping[str, Any]]) -> None:
        now = self.clock()
        by_name = {(str((p.get("metadata") or {}).get("namespace")),
                    str((p.get("metadata") or {}).get("name"))): p for p in pods}
        uuids = {lc.index: lc.card.uuid for lc in self.cards}
        drift = self.config.drift
        for item in over:
            key = (item.ref, item.card)
            last = self._events.get(key)
            if last is not None and now - last < drift.eventSeconds:
                continue
            pod = by_name.get((item.ref.namespace, item.ref.pod))
            if pod is None:
                continue
            self._events[key] = now
            message = item.message(uuids.get(item.card, ""))
            if drift.policy is DriftPolicy.EVICT:
                owned = bool((pod.get("metadata") or {}).get("ownerReferences"))
                if owned or drift.evictUnownedPods:
                    self.sinks.event(pod, "Warning", EVICTED,
                                     f"{message}; the pod is deleted (drift policy evict)")
                    try:
                        self.sinks.delete_pod(pod)
                    except Exception as err:
                        log.warning("evicting %s: %s", item.ref, err)
                    continue
                message += ("; not evicted: no controller owns the pod (drift.evictUnownedPods "
                            "is false)")
            self.sinks.event(pod, "Warning", OVER_SHARE, message)
        # Forget what is over and quiet for a whole period (a container that goes back and
        # forth across its share still gets one Event per period, not one per crossing).
        current = {(o.ref, o.card) for o in over}
        for key in [k for k, at in self._events.items()
                    if k not in current and now - at >= drift.eventSeconds]:
            del self._events[key]

    def run(self, stop: threading.Event) -> None:
        while True:
            try:
                self.tick()
            except BackendError as err:
                log.error("usage sampling: %s", err)
            except Exception:
                log.exception("usage sampling")
            if stop.wait(self.config.sampleSeconds):
                return
