"""The mig-dynamic controller (issue 42): carve cards for the MIG demand that waits, merge them
back for whole-card demand, never under a holder. Writes MigLayouts; the agents apply them.

One level-triggered round at a time (one work-queue key), on every change of pods, Nodes,
GPUDevices, ElasticGPUs, MigLayouts, ResourceSlices and ResourceClaims, and every `RESYNC_S`
(a cool-down ends by time):

1. the waiting pods (kube-scheduler found no node: `core.defrag.movable.waiting_for_capacity`;
   or our DRA allocator holds them gated: `core.dra.migdemand.gated_for_placement`)
   become demand (`core.mig.cardstate.pod_demand`: one `MigDemand` per instance asked, one
   `WholeDemand` for whole cards), each allowed the opted-in device-plugin nodes its selector,
   affinity and tolerations accept; their unallocated claims of the MIG class
   (`core.dra.migdemand`: by profile, `||`, memory bound or `firstAvailable`) are demand on
   the opted-in DRA nodes they accept, and a claim it cannot read is logged and an Event
   (`MigClaimUnreadable`) put on the pod, once per claim and problem;
2. the cards, as the planner sees them (`core.mig.dynamic.card_states`): GPUDevices' cards, and
   DRA nodes' cards read back from their slices (`core.dra.sliceview.node_cards`); held
   instances and cards from the ledger (pods' trusted assignments, ElasticGPUs, allocated
   ResourceClaims), opted in only on Nodes labelled `elasticgpu.io/mig-dynamic=true`, and a
   card whose MigLayout is still being applied shown as its target and left alone;
3. `core.mig.planner.plan`, and one MigLayout written (created, or its spec replaced) per card
   plan. The node's agent fences the card, applies the layout step by step and says how far it
   got in the MigLayout's status (`agent.miglayout`).

Nothing is kept between rounds that a restarted controller needs: what is in flight is in the
MigLayouts; only the cool-down clock (`changed_at`, from this process's writes and the last
time a card was seen held) starts again, which lets a card be merged back sooner, never under a
holder.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from elastic_gpu.api import elasticgpu as egpu_api
from elastic_gpu.api import gpudevice
from elastic_gpu.api import miglayout as ml
from elastic_gpu.controller.config import MigDynamicConfig
from elastic_gpu.controller.manager import Context
from elastic_gpu.controller.worker import Done, Outcome, run_rounds
from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.core.assignment import Assignment, trusted_assignment
from elastic_gpu.core.claims.inventory import egpu_assignment, ledger_key
from elastic_gpu.core.defrag.movable import waiting_for_capacity
from elastic_gpu.core.dra.inventory import claim_key
from elastic_gpu.core.dra.migdemand import Unread, gated_for_placement, pod_claim_demand
from elastic_gpu.core.dra.nodemode import is_dra_node
from elastic_gpu.core.dra.sliceview import claim_holds, node_cards
from elastic_gpu.core.mig.apply import Placed
from elastic_gpu.core.mig.cardstate import MigDemand, Plan, PlannerConfig, WholeDemand, pod_demand
from elastic_gpu.core.mig.dynamic import (
    card_states,
    found_blocked,
    in_flight,
    layout_of,
    ledger_holds,
    withdrawals,
)
from elastic_gpu.core.mig.planner import plan
from elastic_gpu.core.model import Node
from elastic_gpu.core.nodeaffinity import RulesError, refusal, rules_from_manifest, taints_from_node
from elastic_gpu.core.podlife import holds_cards
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.core.resources import ResourceError
from elastic_gpu.kube.errors import Conflict, NotFound
from elastic_gpu.kube.events import WARNING
from elastic_gpu.kube.informer import on_any_change
from elastic_gpu.kube.resources import (
    ELASTICGPUS,
    GPUDEVICES,
    MIG_LAYOUTS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from elastic_gpu.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)

ROUND = "round"
#: the Event's reason on a waiting pod whose MIG claim the controller cannot read
UNREAD_REASON = "MigClaimUnreadable"
#: how often a round runs with nothing changing (cool-downs end by time)
RESYNC_S = 2.0


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def held_in_ledger(pods: Sequence[Mapping[str, Any]], egpus: Sequence[Mapping[str, Any]]
                   ) -> list[tuple[str, Assignment]]:
    """Every trusted holding: bound pods holding their cards with the Binding's assignment
    (`core.assignment.distrust`), and every ElasticGPU."""
    held = []
    for pod in pods:
        assignment = trusted_assignment(pod) if holds_cards(pod) else None
        if assignment is not None:
            meta = _meta(pod)
            held.append((f"{meta.get('namespace')}/{meta.get('name')}", assignment))
    for obj in egpus:
        try:
            egpu = egpu_api.elasticgpu_from_object(obj)
        except egpu_api.ElasticGPUObjectError:
            continue
        held.append((ledger_key(egpu.name), egpu_assignment(egpu)))
    return held


class MigDynamicController:
    name = "mig-dynamic"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.client = ctx.client
        self.config: MigDynamicConfig = ctx.config.mig.dynamic
        self.queue: WorkQueue[str] = WorkQueue(ctx.new_backoff())
        f = ctx.informers
        self.pods = f.informer(PODS.path(), "pods")
        self.nodes = f.informer(NODES.path(), "nodes")
        self.devices = f.informer(GPUDEVICES.path(), "gpudevices", missing_ok=True)
        self.egpus = f.informer(ELASTICGPUS.path(), "elasticgpus", missing_ok=True)
        self.layouts = f.informer(MIG_LAYOUTS.path(), "miglayouts", missing_ok=True)
        self.slices = f.informer(RESOURCE_SLICES.path(), "resourceslices", missing_ok=True)
        self.claims = f.informer(RESOURCE_CLAIMS.path(), "resourceclaims", missing_ok=True)
        #: card uuid -> when (monotonic) its layout was last written or it was last seen held
        self.changed_at: dict[str, float] = {}
        #: claim (`<namespace>/<name>`) -> the problem last reported for it (`_report_unread`)
        self.unread: dict[str, str] = {}
        self.clock = time.monotonic
        if self.config.enabled:  # off: not even woken up
            changed = on_any_change(self.kick)
            for informer in (self.pods, self.nodes, self.devices, self.egpus, self.layouts,
                             self.slices, self.claims):
                informer.add_handler(changed)

    def kick(self) -> None:
        self.queue.add(ROUND)

    async def run(self, workers: int) -> None:
        del workers  # one round at a time
        await run_rounds(self.queue, self.name, self.ctx.metrics, self._round_key, self.kick,
                         describe="mig-dynamic round", expected=(Conflict, NotFound),
                         off=None if self.config.enabled else
                         "mig-dynamic: off (mig.dynamic.enabled is false in --config)")

    async def _round_key(self, key: str) -> Outcome:
        del key
        await self.round(self.clock())
        return Done(after=RESYNC_S)

    # ------------------------------------------------------------------ reading the caches

    def _dra_nodes(self, dra: Mapping[str, Mapping[str, Any]]) -> list[Node]:
        """The DRA nodes' cards, read back from their ResourceSlices (MIG-carved ones too)."""
        cards = node_cards(self.slices.items())
        return [Node(name, 0, 0, tuple(cards[name])) for name in sorted(dra) if name in cards]

    def _claims_held(self, dra_nodes: Sequence[Node]) -> list[tuple[str, Assignment]]:
        """What allocated ResourceClaims hold on the DRA nodes, as ledger holdings."""
        holds, _ = claim_holds(self.claims.items(), {n.name: list(n.cards) for n in dra_nodes})
        return [(claim_key(h.namespace, h.name), Assignment(h.node, {"claim": h.shares}))
                for h in holds]

    def _nodes(self) -> list[Node]:
        return gpudevice.nodes_from_readable_objects(
            self.devices.items(), self.nodes.items(),
            lambda err: log.debug("GPUDevice skipped: %s", err))

    def _layouts(self) -> dict[str, ml.MigLayout]:
        out = {}
        for obj in self.layouts.items():
            try:
                layout = ml.layout_from_object(obj)
            except ml.MigLayoutError as err:
                log.debug("MigLayout skipped: %s", err)
                continue
            out[layout.card_uuid] = layout
        return out

    def _demand(self, pods: Sequence[Mapping[str, Any]], opted: Mapping[str, Mapping[str, Any]]
                ) -> tuple[list[MigDemand], list[WholeDemand]]:
        """Device-plugin pods' demand on the opted-in device-plugin nodes, and their MIG
        claims' demand on the opted-in DRA nodes (a node serves one of the two)."""
        mig: list[MigDemand] = []
        whole: list[WholeDemand] = []
        claims = {f"{_meta(c).get('namespace')}/{_meta(c).get('name')}": c
                  for c in self.claims.items()}
        for gone in [k for k in self.unread if k not in claims]:  # reported, since deleted
            del self.unread[gone]
        seen: set[str] = set()
        for pod in pods:
            gated = gated_for_placement(pod)  # our DRA allocator waits for an instance
            if not gated and not waiting_for_capacity(pod):
                continue
            try:
                request = pod_request_from_manifest(pod)
                rules = rules_from_manifest(pod)
            except (ResourceError, RulesError, ValueError):
                continue
            allowed = {
                name for name, node in opted.items()
                if refusal(rules, name, _meta(node).get("labels") or {},
                           taints_from_node(node)) is None}
            dra = frozenset(n for n in allowed if is_dra_node(_meta(opted[n]).get("labels") or {}))
            if dra:  # a claim shared by waiting pods is one demand
                demand, unread = pod_claim_demand(pod, claims, dra)
                for one in demand:
                    if one.key not in seen:
                        seen.add(one.key)
                        mig.append(one)
                for item in unread:
                    self._report_unread(pod, item)
            if not request.wants_gpu or gated or not allowed - dra:
                continue
            m, w = pod_demand(request, frozenset(allowed - dra))
            mig += m
            whole += w
        return mig, whole

    def _report_unread(self, pod: Mapping[str, Any], item: Unread) -> None:
        """A claim whose MIG requests could not be read: logged and an Event on the waiting
        pod, once per claim and problem (it is no demand: nothing is carved for it)."""
        if self.unread.get(item.claim) == item.problem:
            return
        self.unread[item.claim] = item.problem
        message = (f"ResourceClaim {item.claim}: {item.problem}; dynamic MIG carves nothing "
                   f"for it (docs/mig-apply.md, \"DRA nodes\")")
        log.warning("mig-dynamic: %s", message)
        self.ctx.recorder.record({**pod, "apiVersion": "v1", "kind": "Pod"}, WARNING,
                                 UNREAD_REASON, message)

    # ------------------------------------------------------------------ the round

    async def round(self, now: float) -> Plan | None:
        """One round (module doc); returns the plan it carried out (None: nothing waits)."""
        if not self.config.enabled:
            return None
        opted = {str(_meta(n).get("name")): n for n in self.nodes.items()
                 if (_meta(n).get("labels") or {}).get(MIG_DYNAMIC_LABEL) == "true"}
        dra = {str(_meta(n).get("name")): n for n in self.nodes.items()
               if is_dra_node(_meta(n).get("labels") or {})}
        pods = self.pods.items()
        dra_nodes = self._dra_nodes(dra)
        held_instances, held_cards = ledger_holds(
            held_in_ledger(pods, self.egpus.items()) + self._claims_held(dra_nodes))
        layouts = self._layouts()
        nodes = [n for n in self._nodes() if n.name not in dra] + dra_nodes
        for node in nodes:  # the cool-down counts from the last release
            for card in node.cards:
                if card.uuid in held_cards or any(m.uuid in held_instances for m in card.mig):
                    self.changed_at[card.uuid] = now
        blocked = {uuid: layout.instances for uuid, layout in layouts.items()
                   if found_blocked(layout.generation, layout.observed_generation, layout.phase)}
        for node_name, card_uuid, real in withdrawals(nodes, blocked):
            log.info("MigLayout for %s card %s: found Blocked, put back to the card as it is "
                     "(what waits is decided afresh)", node_name, card_uuid)
            await self._write(node_name, card_uuid, real, layouts[card_uuid])
        demand, whole = self._demand(pods, opted)
        if not demand and not whole:
            return None
        changing = {uuid: layout.instances for uuid, layout in layouts.items()
                    if in_flight(layout.generation, layout.observed_generation, layout.phase)}
        cards = card_states(nodes, opted, held_instances, held_cards, changing, self.changed_at)
        decided = plan(demand, cards, whole, now=now, config=PlannerConfig(
            self.config.merge_cooldown_s, self.config.max_cards_per_round))
        for card_plan in decided.cards:
            log.info("MigLayout for %s card %s: %s", card_plan.node, card_plan.card,
                     card_plan.reason)
            await self._write(card_plan.node, card_plan.card, layout_of(card_plan),
                              layouts.get(card_plan.card))
            self.changed_at[card_plan.card] = now
        return decided

    async def _write(self, node: str, card: str, instances: Sequence[Placed],
                     existing: ml.MigLayout | None) -> None:
        body = ml.layout_spec(node, card, instances)
        if existing is None:
            try:
                await self.client.create(MIG_LAYOUTS.path(), body)
                return
            except Conflict:
                pass  # there already (our cache is behind): replace its spec
        await self.client.patch(MIG_LAYOUTS.path(name=body["metadata"]["name"]),
                                {"metadata": {"labels": body["metadata"]["labels"]},
                                 "spec": body["spec"]})
