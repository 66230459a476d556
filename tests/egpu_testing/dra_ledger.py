"""The independent ledger check across both GPU paths: the device-plugin pods' assignment
annotations (`workbench.card_use_from_pods`) plus the ResourceClaims' allocation results of
the driver `gpu.elasticgpu.io` (`core.dra.allocation.allocated_devices`, the reading the
kubelet plugin prepares from), summed per card against the cards the nodes really have.

The agents' side is checked apart (`prepared_over_capacity`): what each node's kubelet plugin
has prepared, read from its checkpoint file's JSON, summed per card the same way.

The cards of a DRA-mode node come from the caller's inventory (what the sandbox was asked to
build), not from the slices under test; a device a claim holds that the inventory does not
have is itself a problem.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from egpu_testing.workbench import CardUse, card_use_from_pods, mig_overheld, overcommitted
from elastic_gpu.core.dra.allocation import AllocationError, allocated_devices
from elastic_gpu.core.dra.devices import DRIVER, device_table
from elastic_gpu.core.dra.nodemode import is_dra_node
from elastic_gpu.core.model import Node
from elastic_gpu.devcluster.dra_nodes import FAKE_INVENTORY_ANNOTATION, cards_from_json


def claim_card_use(claims: Iterable[Mapping[str, Any]], nodes: Sequence[Node]
                   ) -> tuple[dict[tuple[str, int], CardUse], list[str]]:
    """(card -> what the claims' allocations of our driver consume there, problems: a device
    no node of `nodes` has, a MIG instance allocated to two claims)."""
    tables = {n.name: device_table(n.cards) for n in nodes}
    use: dict[tuple[str, int], CardUse] = {}
    problems: list[str] = []
    mig_holders: dict[tuple[str, str], list[str]] = {}
    for claim in claims:
        meta = claim.get("metadata") or {}
        who = f"claim {meta.get('namespace')}/{meta.get('name')}"
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        pools = {r.get("pool") for r in results.get("results") or []
                 if r.get("driver") == DRIVER}
        for pool in sorted(str(p) for p in pools):
            if pool not in tables:
                problems.append(f"{who} holds devices of pool {pool}, no node of ours")
                continue
            try:
                devices = allocated_devices(claim, pool, tables[pool])
            except AllocationError as err:
                problems.append(f"{who} on {pool}: {err}")
                continue
            for device in devices:
                share = device.share
                if share.mig_uuid is not None:
                    mig_holders.setdefault((pool, share.mig_uuid), []).append(who)
                    continue  # an instance is its own: counted by who holds it
                key = (pool, share.index)
                old = use.get(key, CardUse())
                use[key] = CardUse(old.milli + share.milli, old.memory_mib + share.memory_mib,
                                   (*old.pods, who))
    for (pool, uuid), holders in sorted(mig_holders.items()):
        if len(holders) > 1:
            problems.append(f"{pool} MIG instance {uuid} allocated to {holders}")
    return use, problems


def both_paths_use(pods: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]],
                   nodes: Sequence[Node]) -> tuple[dict[tuple[str, int], CardUse], list[str]]:
    """Each card's use summed over pods' assignments and claims' allocations, and the claims'
    own problems."""
    use = dict(card_use_from_pods(pods))
    dra, problems = claim_card_use(claims, nodes)
    for key, u in dra.items():
        old = use.get(key, CardUse())
        use[key] = CardUse(old.milli + u.milli, old.memory_mib + u.memory_mib,
                           (*old.pods, *u.pods))
    return use, problems


def dra_inventories(k8s_nodes: Iterable[Mapping[str, Any]]) -> list[Node]:
    """The DRA-mode kwok nodes' cards as the sandbox was asked to build them (the fake
    inventory their Node carries, `devcluster.dra_nodes`), not as their slices say."""
    out = []
    for node in k8s_nodes:
        meta = node.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(FAKE_INVENTORY_ANNOTATION)
        if text and is_dra_node(meta.get("labels")):
            out.append(Node(str(meta["name"]), 0, 0, cards_from_json(text)))
    return out


def over_capacity(pods: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, Any]],
                  nodes: Sequence[Node]) -> list[str]:
    """Every card over capacity across DRA claims and device-plugin pods, every MIG instance
    held twice (by pods or by claims), every device held that no node has: [] when sound."""
    use, problems = both_paths_use(pods, claims, nodes)
    return overcommitted(use, nodes) + mig_overheld(pods, nodes) + problems


def prepared_over_capacity(checkpoints: Mapping[str, Mapping[str, Any]],
                           nodes: Sequence[Node]) -> list[str]:
    """The agents' side: every card over capacity, or MIG instance held twice, across the
    claims each node's kubelet plugin has prepared, read straight from its checkpoint file's
    JSON (`{"claims": {uid: {"namespace", "name", "devices": [{"pool", "device", "share":
    {"index", "milli", "memoryMiB", "migUuid"?}}]}}}`), node name -> that JSON; a device
    without its share (an older agent's entry) is a problem of its own."""
    cards = {(n.name, c.index): c for n in nodes for c in n.cards}
    use: dict[tuple[str, int], CardUse] = {}
    migs: dict[tuple[str, str], list[str]] = {}
    problems: list[str] = []
    for node, data in sorted(checkpoints.items()):
        for uid, entry in sorted((data.get("claims") or {}).items()):
            who = f"prepared claim {entry.get('namespace')}/{entry.get('name')} ({uid})"
            for device in entry.get("devices") or []:
                share = device.get("share")
                if device.get("pool") != node or not isinstance(share, Mapping):
                    problems.append(f"{node}: {who} device {device.get('device')} has no share "
                                    f"of this node")
                    continue
                if share.get("migUuid"):
                    migs.setdefault((node, str(share["migUuid"])), []).append(who)
                    continue
                key = (node, int(share["index"]))
                old = use.get(key, CardUse())
                use[key] = CardUse(old.milli + int(share["milli"]),
                                   old.memory_mib + int(share["memoryMiB"]), (*old.pods, who))
    for key, u in sorted(use.items()):
        card = cards.get(key)
        if card is None:
            problems.append(f"{key[0]} card {key[1]} does not exist but is prepared for {u.pods}")
        elif u.milli > card.compute_milli or u.memory_mib > card.memory_mib:
            problems.append(f"{key[0]} card {key[1]} prepared past capacity: {u.milli} milli, "
                            f"{u.memory_mib} MiB for {u.pods}")
    problems += [f"{node} MIG instance {uuid} prepared for {holders}"
                 for (node, uuid), holders in sorted(migs.items()) if len(holders) > 1]
    return problems
