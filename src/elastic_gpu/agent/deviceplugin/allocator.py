"""Allocate: device IDs from kubelet -> the cards the container gets (see matching.py)."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from elastic_gpu.agent.accounting import overcommit
from elastic_gpu.agent.backends.isolation import Isolation
from elastic_gpu.agent.config import AgentConfig
from elastic_gpu.agent.devices import LogicalCard, PluginKind, ResourcePlan
from elastic_gpu.agent.grant import (
    ISOLATION_ANNOTATION,
    DeviceFiles,
    Grant,
    GrantError,
    build_grant,
    whole_shares,
)
from elastic_gpu.agent.matching import AllocateError, Candidate, candidates, choose
from elastic_gpu.agent.pods import PodSource
from elastic_gpu.agent.state import NodeState
from elastic_gpu.core.tflops import short_share

log = logging.getLogger(__name__)


class Allocator:
    def __init__(self, node: str, config: AgentConfig, state: NodeState, visible_env: str,
                 files: DeviceFiles, isolation: Isolation | None, pods: PodSource | None
                 ) -> None:
        self.node = node
        self.config = config
        self.state = state
        self.visible_env = visible_env
        self.files = files
        #: the backend's enforcement of shares (None: accounting only)
        self.isolation = isolation
        self.pods = pods
        # kubelet calls Allocate one container at a time, but several plugins share this
        # object: one lock keeps list -> choose -> remember atomic across them.
        self._lock = threading.Lock()
        #: (pod uid, container, resource) served, for pods still Pending (see `_forget`).
        self._done: set[tuple[str, str, str]] = set()
        #: Allocate calls answered, by (resource, "served" | "refused") (the agent's metrics).
        self.outcomes: Counter[tuple[str, str]] = Counter()

    def allocate(self, plan: ResourcePlan, device_ids: Sequence[str]) -> Grant:
        try:
            grant = self._allocate(plan, device_ids)
        except AllocateError:
            self.outcomes[plan.resource, "refused"] += 1
            raise
        self.outcomes[plan.resource, "served"] += 1
        return grant

    def _allocate(self, plan: ResourcePlan, device_ids: Sequence[str]) -> Grant:
        units = plan.by_id()
        unknown = [d for d in device_ids if d not in units]
        if unknown:
            raise AllocateError(f"{plan.resource}: unknown device IDs {unknown}")
        if not device_ids:
            raise AllocateError(f"{plan.resource}: Allocate without devices")
        try:
            if plan.kubelet_chooses:
                return self._kubelet_choice(plan, device_ids)
            return self._assigned(plan, len(device_ids))
        except GrantError as err:
            raise AllocateError(f"{plan.resource}: {err}") from None

    def assigned_devices(self, plan: ResourcePlan, available: Sequence[str],
                         size: int) -> list[str] | None:
        """For GetPreferredAllocation: the available device IDs on the cards the scheduler
        assigned to the one container waiting for `size` of this resource, or None when that
        is not clear. Read-only (nothing is marked). Steering kubelet's choice this way keeps
        its device accounting (the PodResources API that monitoring reads) equal to what the
        container really gets; Allocate does not depend on it."""
        if plan.kubelet_chooses or self.pods is None:
            return None
        # The watch cache first: a stale answer only steers kubelet's device choice, which
        # Allocate does not depend on. When the cache has no single answer yet (the pod was
        # bound a moment ago), the live list of Pending pods, as Allocate reads it.
        chosen = None
        for read in (self.pods.on_node, self.pods.pending_on_node):
            try:
                pods = read(self.node)
            except Exception:
                continue
            with self._lock:
                found, problems = candidates(pods, self.node, plan.resource, size, self._done)
                try:
                    chosen = choose(found, problems, self.node, plan.resource, size)
                    break
                except AllocateError:
                    continue
        if chosen is None:
            return None
        units = plan.by_id()
        migs = {s.mig_uuid for s in chosen.shares if s.mig_uuid}
        cards = {s.index for s in chosen.shares}
        picked = [d for d in available if d in units and
                  (units[d].mig_uuid in migs if migs else units[d].card in cards)]
        return picked[:size] if len(picked) >= size else None

    def _node_pods(self, uid: str, resource: str) -> list[dict[str, Any]]:
        """The node's pods for its own ledger check: the watch cache when it holds the pod being
        served, else a live list. A watch delivers events in resourceVersion order, and the
        scheduler gives a card again only after it has seen the pod that held it end or go,
        which happened before that pod's Binding: a cache that shows the pod being served bound
        has seen the end of every pod whose card it got, so it counts no freed card."""
        assert self.pods is not None  # _assigned checked it
        try:
            cached = self.pods.on_node(self.node)
        except Exception:
            cached = []
        if any((p.get("metadata") or {}).get("uid") == uid for p in cached):
            return cached
        try:
            return list(self.pods.live_on_node(self.node))
        except Exception as err:
            raise AllocateError(f"{resource}: cannot list this node's pods: {err}") from None

    def _forget(self, pending: Sequence[Mapping[str, Any]]) -> None:
        """Drop what was served to pods no longer Pending: a pod never returns to Pending,
        so they can never be a candidate again, and the set stays as small as the list."""
        uids = {str((pod.get("metadata") or {}).get("uid", "")) for pod in pending}
        self._done = {key for key in self._done if key[0] in uids}

    @staticmethod
    def _check_tflops(chosen: Candidate, cards: Mapping[int, LogicalCard], resource: str,
                      count: int) -> None:
        """A TFLOPS request is a share of a card (of each of N cards for a multi-card share),
        sized by the scheduler for that card's model: refuse an assignment that would give
        less than the TFLOPS asked on any of its cards."""
        for share in chosen.shares:
            lc = cards.get(share.index)
            if lc is None:  # build_grant says so, naming the card
                continue
            problem = short_share(lc.card.model, count, share.milli)
            if problem is not None:
                raise AllocateError(f"{chosen.describe()}: card {share.index}: {problem}")

    def _kubelet_choice(self, plan: ResourcePlan, device_ids: Sequence[str]) -> Grant:
        units = plan.by_id()
        chosen = [units[d] for d in device_ids]
        # Two replicas of one card are one card to the container; two MIG instances of one
        # card are two devices: de-duplicate on (card, instance), keeping kubelet's order.
        targets = list(dict.fromkeys((u.card, u.mig_uuid) for u in chosen))
        if self.config.timeSlicing.failRequestsGreaterThanOne and len(device_ids) > 1:
            raise AllocateError(f"{plan.resource}: time-sliced devices are given one at a time "
                                f"(timeSlicing.failRequestsGreaterThanOne); asked {len(device_ids)}")
        cards = self.state.cards()
        shares = whole_shares([card for card, _ in targets], cards,
                              [mig for _, mig in targets])
        grant = build_grant(shares, cards, self.config, self.visible_env, self.files,
                            self.isolation)
        grant.envs["EGPU_ISOLATION"] = "time-sliced"
        grant.annotations[ISOLATION_ANNOTATION] = "time-sliced"
        return grant

    def _assigned(self, plan: ResourcePlan, count: int) -> Grant:
        if self.pods is None:
            raise AllocateError(f"{plan.resource}: no API access to find the pod's assignment")
        with self._lock:
            try:
                pods = self.pods.pending_on_node(self.node)
            except Exception as err:
                raise AllocateError(f"{plan.resource}: cannot list this node's pending pods: "
                                    f"{err}") from None
            self._forget(pods)
            found, problems = candidates(pods, self.node, plan.resource, count, self._done)
            chosen = choose(found, problems, self.node, plan.resource, count)
            if plan.kind in (PluginKind.WHOLE, PluginKind.MIG) and len(chosen.shares) != count:
                raise AllocateError(f"{chosen.describe()}: assigned {len(chosen.shares)} cards "
                                    f"but asks for {count} {plan.resource}")
            if (plan.kind in (PluginKind.SHARE, PluginKind.TFLOPS) and chosen.share_cards
                    and len(chosen.shares) != chosen.share_cards
                    and chosen.claim is None):
                # a share is on 1 card, a multi-card share on N distinct ones: the assignment
                # must say as much
                raise AllocateError(f"{chosen.describe()}: asks for a share on "
                                    f"{chosen.share_cards} card(s) but is assigned "
                                    f"{len(chosen.shares)} cards")
            if plan.kind is PluginKind.MIG and any(s.mig_uuid is None for s in chosen.shares):
                raise AllocateError(f"{chosen.describe()}: asks for {plan.resource} but its "
                                    "assignment names no MIG instance")
            cards = self.state.cards()
            if plan.kind is PluginKind.TFLOPS:
                self._check_tflops(chosen, cards, plan.resource, count)
            problem = overcommit(chosen, self._node_pods(chosen.uid, plan.resource), self.node,
                                 {i: lc.card.memory_mib for i, lc in cards.items()})
            if problem is not None:
                raise AllocateError(f"refusing rather than handing out a held card: {problem}")
            grant = build_grant(chosen.shares, cards, self.config, self.visible_env,
                                self.files, self.isolation, chosen.limits_compute)
            self._done.add((chosen.uid, chosen.container, plan.resource))
            log.info("Allocate %s x%d -> %s", plan.resource, count, chosen.describe())
            return grant
