"""Fake (kwok) GPU nodes in DRA mode: their ResourceSlices, the DeviceClasses.

A DRA-mode node (`core.dra.nodemode`: the Node label `elasticgpu.io/gpu-mode: dra`) has no
GPUDevice objects and advertises no device-plugin GPU name; its only GPU capacity is the
node-level `node.elasticgpu.io/gpu-core` (`agent.dra.node.dra_capacity`, what the DRA agent
advertises; its Node is made by `devcluster.nodes.node_manifest`, as every kwok node's), and
its cards are the driver `gpu.elasticgpu.io`'s ResourceSlices, written by the agent's own
publisher (`agent.dra.slices_api.publish_node_slices`) from the same fake inventory the
device-plugin kwok nodes publish as GPUDevices, shaped as a DRA agent with the node's config
shapes it (`dra_agent_cards`: a multi-chip board is one card unless `splitBoard`). A kwok node
has no agent: registration publishes its slices once, and the sandbox's allocation-sync,
standing in for the agents, keeps them published (`DraSliceSync`) from the cards the Node
carries in `FAKE_INVENTORY_ANNOTATION` (those the agent publishes, in GPUDevice spec form,
`inventory_json`: the config is applied once, when the Node is made).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from elastic_gpu.agent.config import AgentConfig
from elastic_gpu.api.gpudevice import card_from_object, card_spec
from elastic_gpu.core.dra.classes import device_classes
from elastic_gpu.core.dra.nodemode import (
    DRA_NODE_SELECTOR,
    GPU_MODE_DRA,
    GPU_MODE_LABEL,
    is_dra_node,
    node_object_labels,
)
from elastic_gpu.core.mig.layout import layout_starts
from elastic_gpu.core.model import Card, MigInstance, Node
from elastic_gpu.core.quota import with_accounting
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.kube.client import STRATEGIC_PATCH
from elastic_gpu.kube.errors import Conflict
from elastic_gpu.kube.resources import NODES
from elastic_gpu.kube.sync import SyncKubeClient

#: The cards of a DRA-mode kwok node, as JSON: what its stand-in agent publishes.
FAKE_INVENTORY_ANNOTATION = "elasticgpu.io/fake-inventory"
#: The cards of a DRA-mode kwok node fenced while their MIG layout changes (a JSON list of card
#: uuids; dynamic MIG's stand-in agent, `devcluster.mig_agent`): published tainted.
FAKE_FENCE_ANNOTATION = "elasticgpu.io/fake-fence"
#: How the first DRA node of `egpu sandbox up --dra-nodes` carves its last card (7 slices of
#: an 80 GB card), so a MIG partition can be allocated through DRA.
SANDBOX_MIG_LAYOUT = ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")


def as_dra(inventory: Node) -> Node:
    """The same node in DRA mode (its label)."""
    return replace(inventory, labels={**inventory.labels, GPU_MODE_LABEL: GPU_MODE_DRA})


def carve(inventory: Node, card: int, profiles: Sequence[str]) -> Node:
    """`inventory` with card `card` carved into MIG instances of `profiles`, in order."""
    cards = list(inventory.cards)
    parsed = [MigProfile.parse(text) for text in profiles]
    starts = layout_starts(cards[card].model, parsed)
    instances = [MigInstance(profile, f"MIG-fake-{inventory.name}-{card}-{k}", start)
                 for k, (profile, start) in enumerate(zip(parsed, starts, strict=True))]
    cards[card] = replace(cards[card], mig=tuple(instances))
    return replace(inventory, cards=tuple(cards))


def with_dra_nodes(inventories: Sequence[Node], count: int) -> list[Node]:
    """The last `count` of `inventories` in DRA mode; the first of those with its last card
    carved (`SANDBOX_MIG_LAYOUT`) when it has two or more 80 GB cards."""
    if not 0 <= count <= len(inventories):
        raise ValueError(f"--dra-nodes {count}: there are {len(inventories)} GPU nodes")
    keep = list(inventories[:len(inventories) - count])
    dra = [as_dra(inv) for inv in inventories[len(inventories) - count:]]
    if dra and len(dra[0].cards) >= 2 and dra[0].cards[-1].memory_mib == 81920:
        dra[0] = carve(dra[0], len(dra[0].cards) - 1, SANDBOX_MIG_LAYOUT)
    return keep + dra


def dra_agent_cards(inventory: Node, config: AgentConfig) -> tuple[Card, ...]:
    """The cards a DRA agent with `config` publishes for the node's chips, by the agent's own
    rule (`agent.devices.logical_cards`): a multi-chip board is one card unless `splitBoard`."""
    from elastic_gpu.agent.devices import logical_cards

    return tuple(lc.card for lc in logical_cards(inventory.cards, config.splitBoard))


def inventory_json(node: str, cards: Iterable[Card]) -> str:
    """The cards in the form of their GPUDevices' spec (`api.gpudevice.card_spec`): the one
    card format, which a DRA node's stand-in agent reads back with `cards_from_json`."""
    return json.dumps([card_spec(node, card) for card in cards], separators=(",", ":"))


def cards_from_json(text: str) -> tuple[Card, ...]:
    """The cards `inventory_json` wrote, read as GPUDevice specs (`card_from_object`); the
    older form, written before it (index, uuid, model, memoryMiB, computeMilli, mig: the same
    keys without `node`), reads the same. ValueError, KeyError or TypeError if it is neither."""
    raw = json.loads(text)
    if not isinstance(raw, list):
        raise TypeError(f"a list of cards, not {type(raw).__name__}")
    return tuple(card_from_object({"metadata": {"name": f"card {k}"},
                                   "spec": {"node": "", **item}})[1]
                 for k, item in enumerate(raw))


def fake_node_cards(annotations: Mapping[str, Any]) -> tuple[Card, ...]:
    """A DRA-mode kwok node's cards as its stand-in agent publishes them: the fake inventory,
    with the fenced ones `Health.FENCED` (`agent.dra.miglayout.with_fences`). ValueError,
    KeyError or TypeError when the inventory is not one."""
    from elastic_gpu.agent.dra.miglayout import with_fences

    cards = cards_from_json(annotations[FAKE_INVENTORY_ANNOTATION])
    fenced = json.loads(annotations.get(FAKE_FENCE_ANNOTATION) or "[]")
    if not isinstance(fenced, list):
        raise TypeError(f"{FAKE_FENCE_ANNOTATION}: a list of card uuids")
    return tuple(with_fences(cards, {str(u) for u in fenced}))


def register_dra_node(client: SyncKubeClient, inventory: Node, manifest: Mapping[str, Any],
                      config: AgentConfig, new: bool = False) -> None:
    """Create (or bring up to date) a DRA-mode node from its `manifest`
    (`devcluster.nodes.node_manifest` with `config`) and publish the cards it carries as
    slices, as its agent would. An existing Node's GPU names are brought up to date by the
    agent's own rule (`agent.node_status.status_patch`: the names no longer offered removed,
    names not ours left alone); its CPU, memory and pods become the manifest's."""
    from elastic_gpu.agent.dra.node import dra_capacity
    from elastic_gpu.agent.dra.slices_api import publish_node_slices
    from elastic_gpu.agent.node_status import status_patch

    cards = cards_from_json(manifest["metadata"]["annotations"][FAKE_INVENTORY_ANNOTATION])
    try:
        created = client.create(NODES.path(), dict(manifest))
    except Conflict:
        if new:
            raise
        path = NODES.path(name=inventory.name)
        current = client.get(path)
        gpu = dra_capacity(cards)
        patch = (status_patch(current.get("status") or {}, gpu, gpu, config)
                 or {"status": {}})["status"]
        ours = with_accounting(gpu)  # what status_patch decides; the rest is the host's
        host = {field: {k: v for k, v in manifest["status"][field].items() if k not in ours}
                for field in ("capacity", "allocatable")}
        client.patch(path, {"metadata": manifest["metadata"]}, STRATEGIC_PATCH)
        client.patch(NODES.path(name=inventory.name, subresource="status"),
                     {"status": {field: {**host[field], **patch.get(field, {})}
                                 for field in host}})
        created = current
    publish_node_slices(client, inventory.name, cards, str(created["metadata"]["uid"]))


class DraSliceSync:
    """allocation-sync's part for DRA-mode kwok nodes: each pass, publish the slices of every
    such node whose inventory or uid changed since the last pass, and of all of them every
    `full_every` passes (a pool deleted by hand comes back)."""

    def __init__(self, client: SyncKubeClient, full_every: int = 30) -> None:
        self.client = client
        self.full_every = full_every
        self._seen: dict[str, tuple[str, str]] = {}
        self._passes = 0

    def sync(self) -> int:
        """Publish what changed; the nodes whose slices were written."""
        from elastic_gpu.agent.dra.slices_api import publish_node_slices

        full = self._passes % self.full_every == 0
        self._passes += 1
        nodes, _ = self.client.list(NODES.path(), {"labelSelector": DRA_NODE_SELECTOR})
        written = 0
        seen: dict[str, tuple[str, str]] = {}
        for node in nodes:
            meta = node.get("metadata") or {}
            text = (meta.get("annotations") or {}).get(FAKE_INVENTORY_ANNOTATION)
            if not text or not is_dra_node(node_object_labels(node)):
                continue  # a real node: its own agent publishes it
            annotations = meta.get("annotations") or {}
            key = (str(meta.get("uid")), text + str(annotations.get(FAKE_FENCE_ANNOTATION)))
            seen[str(meta["name"])] = key
            if not full and self._seen.get(str(meta["name"])) == key:
                continue
            try:
                cards = fake_node_cards(annotations)
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"node {meta['name']}: annotation {FAKE_INVENTORY_ANNOTATION}"
                                 f" is not a fake inventory: {err}") from None
            written += publish_node_slices(self.client, str(meta["name"]), list(cards), key[0])
        self._seen = seen
        return written


def install_device_classes(client: SyncKubeClient) -> None:
    """The driver's DeviceClasses (`core.dra.classes`), as the chart ships them."""
    from elastic_gpu.kube.apply import create_or_update

    create_or_update(client, device_classes())


def enable_dra(client: SyncKubeClient, inventories: Sequence[Node]) -> bool:
    """When some of `inventories` are DRA-mode nodes: the DeviceClasses. Every GPU node
    already advertises the quota's accounting names, which a class mapping `nvidia.com/gpu`
    needs on every node (`core.quota.with_accounting`: the kwok nodes' manifests and the
    agent's capacity patch). False (nothing done) when none is."""
    if not any(is_dra_node(inv.labels) for inv in inventories):
        return False
    install_device_classes(client)
    return True
