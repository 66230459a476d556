"""All of a pod's ResourceClaims of our card class placed at once by the placement engine, and
the allocations to write for them. Pure, no I/O.

A claim request of class `gpu.elasticgpu.io` becomes one container of a `PodRequest`
(`<claim>/<request>`): `capacity.requests` (`compute` percent and `memory`) a share of one
card (`count: N` of them: a multi-card share, N shares on N distinct cards of one node), no
capacity a whole card (`count` of them). The engine chooses the node with the
extender's node policy (FGD binpack by default) and the cards with its card policy, exactly as
for a device-plugin pod; `allocation` turns the chosen cards back into the claim's
`status.allocation`: one result per card with the `consumedCapacity` kube-scheduler's own
allocator would have written for the same request (KEP-5075: every capacity of the device, the
request or the device's default) and a share id, and the node as `nodeSelector`.

A request of the MIG class (`mig.gpu.elasticgpu.io`) becomes a MIG container: `count`
instances of one profile, its choices (`==`, `||`, `in`, a memory bound, `firstAvailable`
subrequests of the MIG class) read by the one reader of MIG requests (`core.dra.migselect`) in
order of preference; `mig_choices` lists the profile combinations a pod's MIG requests may
take, most preferred first, and the allocator takes the first one the engine places. Which
instance the engine gives is the device-plugin path's own rule (`core.mig.pick`); the result
names the instance's device and, for `firstAvailable`, `<request>/<subrequest>`.

What the engine cannot express is not ours to place (`Unplaceable`): another class, CEL
selectors on the card class (or ones on the MIG class `migselect` cannot read),
`allocationMode: All`, `firstAvailable` of the card class or mixing classes, admin access,
device tolerations, a share asking compute without memory (DRA gives it the whole card's
memory, which depends on the card), a claim already allocated or reserved. The allocator then
lifts the gate and leaves the pod to kube-scheduler's own allocator: never a pod stuck behind
a gate.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.dra.classes import CARD_CLASS, MIG_CLASS
from elastic_gpu.core.dra.devices import COMPUTE, DRIVER, MEMORY, card_device
from elastic_gpu.core.dra.migselect import MigAsk, SelectorError, request_ask
from elastic_gpu.core.fit import FitFailure, describe
from elastic_gpu.core.mig.profiles import mig_model
from elastic_gpu.core.model import Node
from elastic_gpu.core.nodeaffinity import RulesError, Taint, rules_from_manifest
from elastic_gpu.core.nodeaffinity import refusal as placement_refusal
from elastic_gpu.core.placement import Engine
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind
from elastic_gpu.core.resources import MILLI_PER_PERCENT, PERCENT_PER_CARD, MigProfile

MIB = 1024 * 1024
#: The finalizer kube-scheduler's allocator puts on a claim it allocates; kube-controller-
#: manager's resourceclaim controller clears the allocation and removes it when the claim is no
#: longer used. Ours is the same, so our claims live and end exactly as kube-scheduler's.
ALLOCATION_FINALIZER = "resource.kubernetes.io/delete-protection"
#: The most profile combinations of a pod's MIG requests tried (`mig_choices`).
MAX_MIG_CHOICES = 64


class Unplaceable(ValueError):
    """A claim the engine does not place; the message says why (kube-scheduler will)."""


@dataclass(frozen=True)
class DeviceAsk:
    """One request of a claim: `count` whole cards, or `count` shares (`percent`, `memory_mib`)
    on as many distinct cards."""

    request: str
    count: int = 1
    percent: int | None = None
    memory_mib: int | None = None
    #: a request of the MIG class: its profiles in order of preference (`count` instances)
    mig: MigAsk | None = None

    @property
    def share(self) -> bool:
        return self.percent is not None


def _quantity(value: Any, what: str) -> Fraction:
    try:
        return parse_quantity(str(value))
    except QuantityError as err:
        raise Unplaceable(f"{what}: {err}") from None


def claim_asks(claim: Mapping[str, Any]) -> list[DeviceAsk]:
    """The claim's requests as engine asks; raises Unplaceable for anything the engine does
    not place the way kube-scheduler would (the module's docstring)."""
    meta = claim.get("metadata") or {}
    status = claim.get("status") or {}
    if status.get("allocation") or status.get("reservedFor"):
        raise Unplaceable(f"claim {meta.get('name')} is already allocated")
    devices = (claim.get("spec") or {}).get("devices") or {}
    if devices.get("constraints") or devices.get("config"):
        raise Unplaceable("constraints or config")
    asks: list[DeviceAsk] = []
    for request in devices.get("requests") or []:
        name = str(request.get("name", ""))
        mig = _mig_ask(request)
        if mig is not None:
            asks.append(DeviceAsk(name, mig.count, mig=mig))
            continue
        exactly = request.get("exactly")
        if not isinstance(exactly, Mapping):
            raise Unplaceable(f"request {name}: not `exactly` (firstAvailable)")
        if exactly.get("deviceClassName") != CARD_CLASS:
            raise Unplaceable(f"request {name}: class {exactly.get('deviceClassName')}")
        if exactly.get("selectors") or exactly.get("adminAccess") or exactly.get("tolerations"):
            raise Unplaceable(f"request {name}: selectors, admin access or tolerations")
        if exactly.get("allocationMode", "ExactCount") != "ExactCount":
            raise Unplaceable(f"request {name}: allocationMode {exactly.get('allocationMode')}")
        count = exactly.get("count", 1)
        if not isinstance(count, int) or not 1 <= count <= 64:
            raise Unplaceable(f"request {name}: count {count}")
        wanted = (exactly.get("capacity") or {}).get("requests") or {}
        if not wanted:
            asks.append(DeviceAsk(name, count))
            continue
        if set(wanted) - {COMPUTE, MEMORY} or COMPUTE not in wanted or MEMORY not in wanted:
            raise Unplaceable(f"request {name}: capacity {sorted(wanted)} (ask compute and memory)")
        percent = _quantity(wanted[COMPUTE], f"request {name}: compute")
        memory = _quantity(wanted[MEMORY], f"request {name}: memory")
        if percent.denominator != 1 or not 1 <= percent <= PERCENT_PER_CARD:
            raise Unplaceable(f"request {name}: compute {percent} is not a percent in 1..100")
        if memory % MIB or memory < MIB:
            raise Unplaceable(f"request {name}: memory {memory} bytes is not whole MiB")
        # `count: N` with capacity: N devices, each with that capacity; ours are N shares
        # on N distinct cards (a multi-card share), never two shares of one card
        asks.append(DeviceAsk(name, count, int(percent), int(memory // MIB)))
    if not asks:
        raise Unplaceable("no request")
    return asks


def _mig_ask(request: Mapping[str, Any]) -> MigAsk | None:
    """A request of the MIG class as a MIG ask (None: not of the MIG class); Unplaceable for
    one the engine does not place as kube-scheduler would."""
    name = str(request.get("name", ""))
    exactly = request.get("exactly")
    options = [exactly] if isinstance(exactly, Mapping) else list(
        request.get("firstAvailable") or [])
    classes = {o.get("deviceClassName") for o in options if isinstance(o, Mapping)}
    if MIG_CLASS not in classes:
        return None
    if classes != {MIG_CLASS} or not all(isinstance(o, Mapping) for o in options):
        raise Unplaceable(f"request {name}: firstAvailable of several classes")
    if any(o.get("adminAccess") or o.get("tolerations") for o in options):
        raise Unplaceable(f"request {name}: admin access or tolerations")
    try:
        ask = request_ask(request)
    except SelectorError as err:
        raise Unplaceable(str(err)) from None
    assert ask is not None
    return ask


def mig_choices(claims: Sequence[tuple[str, Sequence[DeviceAsk]]]
                ) -> list[dict[str, MigProfile]]:
    """The profiles the pod's MIG requests may take together (container name -> profile), most
    preferred first (each request's first choice before its later ones, the earlier requests'
    choices changing last), at most `MAX_MIG_CHOICES`; one empty choice when none asks MIG."""
    keys = [(container_name(claim, ask.request), ask.mig.profiles)
            for claim, asks in claims for ask in asks if ask.mig is not None]
    combos = itertools.product(*(profiles for _, profiles in keys))
    return [{key: profile for (key, _), profile in zip(keys, combo, strict=True)}
            for combo in itertools.islice(combos, MAX_MIG_CHOICES)]


@dataclass(frozen=True)
class Choice:
    """Where the engine places a pod's claims: the request placed (its MIG profiles chosen;
    the first choice when none is placed), the node (None: none now), whether some choice
    would fit a candidate node with nothing allocated on it, and whether a choice's MIG
    instances could be carved on a candidate node opted in to dynamic MIG (`carvable`)."""

    request: PodRequest
    node: str | None
    fits_empty: bool
    carvable: bool = False


def carvable(request: PodRequest, nodes: Sequence[Node]) -> bool:
    """Whether every MIG profile the request asks is one the model of some card of one of the
    nodes opted in to dynamic MIG (label `elasticgpu.io/mig-dynamic=true`) can be carved into:
    the mig-dynamic controller may then carve it (`core.mig.planner`)."""
    asked = {c.mig_profile for c in request.gpu_containers if c.kind is RequestKind.MIG}
    if not asked:
        return False
    for node in nodes:
        if node.labels.get(MIG_DYNAMIC_LABEL) != "true":
            continue
        offered = {size.profile for card in node.cards
                   if (model := mig_model(card.model)) is not None for size in model.profiles}
        if asked <= offered:
            return True
    return False


def best_choice(engine: Engine, namespace: str, pod: str, uid: str,
                claims: Sequence[tuple[str, Sequence[DeviceAsk]]], candidates: list[str]
                ) -> Choice:
    """The first of `mig_choices` the engine places on one of `candidates` (its node policy
    choosing the node, `core.mig.pick` the instances): a MIG request's later choices only when
    its earlier ones fit nowhere now, as DRA's `firstAvailable` reads."""
    choices = mig_choices(claims)
    requests = [pod_request(namespace, pod, uid, claims, choice) for choice in choices]
    for request in requests:
        node = engine.best(request, candidates)
        if node is not None:
            return Choice(request, node, True)
    nodes = [engine.node(n) for n in candidates]
    empty = Engine(nodes, engine.config)
    fits = any(empty.best(request, candidates) is not None for request in requests)
    return Choice(requests[0], None, fits, any(carvable(r, nodes) for r in requests))


def container_name(claim: str, request: str) -> str:
    return f"{claim}/{request}"


def pod_request(namespace: str, pod: str, uid: str,
                claims: Sequence[tuple[str, Sequence[DeviceAsk]]],
                profiles: Mapping[str, MigProfile] | None = None) -> PodRequest:
    """One `PodRequest` for all of a pod's claims (name, asks): one container per request;
    a MIG request takes its profile in `profiles` (one of `mig_choices`), else its first."""
    containers = []
    for claim, asks in claims:
        for ask in asks:
            name = container_name(claim, ask.request)
            if ask.mig is not None:
                profile = (profiles or {}).get(name, ask.mig.profiles[0])
                containers.append(ContainerRequest(name, RequestKind.MIG, ask.count,
                                                   mig_profile=profile))
            elif ask.percent is None:
                containers.append(ContainerRequest.whole(name, ask.count))
            elif ask.percent == PERCENT_PER_CARD:
                containers.append(ContainerRequest.whole(name, ask.count, ask.memory_mib or 0))
            else:
                containers.append(ContainerRequest.share(name, ask.percent * MILLI_PER_PERCENT,
                                                         ask.memory_mib or 0, cards=ask.count))
    return PodRequest(name=pod, namespace=namespace, uid=uid, containers=tuple(containers))


def claim_assignment(assignment: Assignment, claim: str, asks: Sequence[DeviceAsk]
                     ) -> Assignment:
    """The part of the pod's assignment that is the claim's (one container, `claim`), what
    the ledger holds under the claim's key. Whole cards hold the card's compute and memory:
    DRA gives a request that asks no capacity all of the card."""
    shares: list[CardShare] = []
    for ask in asks:
        shares.extend(assignment.containers.get(container_name(claim, ask.request), ()))
    return Assignment(assignment.node, {"claim": tuple(shares)})


def _consumed(share: CardShare, ask: DeviceAsk, card_memory_mib: int, card_percent: int
              ) -> dict[str, str]:
    if ask.share:
        return {COMPUTE: str(ask.percent), MEMORY: f"{ask.memory_mib}Mi"}
    return {COMPUTE: str(card_percent), MEMORY: f"{card_memory_mib}Mi"}


def node_selector(node: str) -> dict[str, Any]:
    """The allocation's node selector: the node by name, as kube-scheduler's allocator writes."""
    return {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def allocation(assignment: Assignment, claim: str, asks: Sequence[DeviceAsk],
               cards: Mapping[int, tuple[int, int]], share_ids: Sequence[str],
               timestamp: str, mig_devices: Mapping[str, str] | None = None
               ) -> dict[str, Any]:
    """The claim's `status.allocation` for its part of `assignment`. `cards`: card index ->
    (memory MiB, compute percent) of the node's cards; `share_ids`: one fresh UUID per result
    (as many as the claim's devices); `timestamp`: RFC 3339, `allocationTimestamp`;
    `mig_devices`: MIG instance uuid -> its device name on the node. A MIG instance's result
    is the device alone (not shared: no capacity consumed, no share id), as kube-scheduler's
    allocator writes it."""
    results: list[dict[str, Any]] = []
    ids = iter(share_ids)
    for ask in asks:
        for share in assignment.containers.get(container_name(claim, ask.request), ()):
            if ask.mig is not None:
                assert share.mig_uuid is not None and share.mig_profile is not None
                results.append({"request": ask.mig.result_request(
                                    MigProfile.parse(share.mig_profile)),
                                "driver": DRIVER, "pool": assignment.node,
                                "device": (mig_devices or {})[share.mig_uuid]})
                continue
            memory, percent = cards[share.index]
            results.append({"request": ask.request, "driver": DRIVER,
                            "pool": assignment.node, "device": card_device(share.index),
                            "consumedCapacity": _consumed(share, ask, memory, percent),
                            "shareID": next(ids)})
    return {"devices": {"results": results}, "nodeSelector": node_selector(assignment.node),
            "allocationTimestamp": timestamp}


def device_count(asks: Sequence[DeviceAsk]) -> int:
    """How many allocation results (and share ids) the claim's asks make."""
    return sum(ask.count for ask in asks)


@dataclass(frozen=True)
class NodeFacts:
    """What the node filter reads of a Node: its labels and taints."""

    labels: Mapping[str, str]
    taints: tuple[Taint, ...] = ()


def eligible_nodes(pod: Mapping[str, Any], nodes: Mapping[str, NodeFacts],
                   allocated_on: Sequence[str] = ()) -> list[str]:
    """The nodes (in `nodes`' order) kube-scheduler would let the pod onto: its nodeSelector,
    required node affinity and NoSchedule/NoExecute taints it does not tolerate, as
    kube-scheduler's NodeAffinity and TaintToleration filters decide (`core.nodeaffinity`),
    and, when some of its claims are allocated already, only their node. A claim placed where
    the pod may not go would be cleared by kube-scheduler's PostFilter and placed again.
    Raises Unplaceable for placement fields not of the API's shape (kube-scheduler says why)."""
    try:
        rules = rules_from_manifest(pod)
    except RulesError as err:
        raise Unplaceable(f"its placement rules: {err}") from None
    return [name for name, facts in nodes.items()
            if (not allocated_on or name in allocated_on)
            and placement_refusal(rules, name, facts.labels, facts.taints) is None]


#: The Event's reason on a pod that waits gated because no node it may go to has room now.
WAITING_REASON = "WaitingForGPURoom"


def waiting_message(failed: Mapping[str, FitFailure]) -> str:
    """The Event's message for a gated pod no eligible node has room for now: each of the
    engine's fit sentences (`fit.describe`) once, with how many nodes fail that way and one of
    them, most nodes first."""
    groups: dict[str, list[str]] = {}
    for node, failure in sorted(failed.items()):
        groups.setdefault(describe(failure), []).append(node)
    reasons = "; ".join(f"{len(nodes)} × {text} (e.g. node {nodes[0]})"
                        for text, nodes in sorted(groups.items(), key=lambda kv: -len(kv[1])))
    return (f"waiting, gated, for room on a DRA node: 0/{len(failed)} nodes it may go to can "
            f"hold its claims now ({reasons}); it is placed as soon as room frees")
