"""The GPUDevice custom resource: one cluster-scoped object per card, <-> core `Card`/`Node`.

Pure functions (no I/O): the agent writes these objects, the scheduler reads them back, and
both convert through here so they cannot disagree. The CRD itself is `crd_manifest()`;
deploy/crds/gpudevices.yaml is its YAML form (a unit test keeps the two identical).

    apiVersion: elasticgpu.io/v1alpha1
    kind: GPUDevice
    metadata: {name: <node>-gpu<index>, labels: {elasticgpu.io/node: <node>}}
    spec: {node, index, uuid, model, memoryMiB, computeMilli, numaNode, board,
           links: [{peer, kind, count}], mig: [{profile, uuid, start}],
           resources: {<resource name>: <devices of it on this card>}}
    status: {health: Healthy|Unhealthy, reason, allocatedMilli, allocatedMemoryMiB,
             allocatedPercent, pods: ["<namespace>/<pod> (<container>)", ...], podCount,
             lastHeartbeat, fence,
             usage: {usedMemoryMiB, outOfBandMemoryMiB, smUtilizationPercent, observedAt,
                     containers: [{namespace, pod, container, usedMemoryMiB,
                                   smUtilizationPercent}]}}

`status.usage` is what the node's agent observed on the card (core `CardUsage`); absent when
nothing was observed. `status.fence` (set by the agent while it changes the card's MIG layout,
docs/mig-apply.md) makes a healthy card `Health.FENCED`: nothing new is placed on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from elastic_gpu.api.crd import column, to_yaml, write_main
from elastic_gpu.api.group import GROUP as GROUP
from elastic_gpu.api.group import INVENTORY_VERSION
from elastic_gpu.core import nodestatus
from elastic_gpu.core.model import Card, Health, Link, LinkKind, MigInstance, MigMode, Node
from elastic_gpu.core.resources import MILLI_PER_CARD, MigProfile, ResourceError
from elastic_gpu.core.usage import MAX_PERCENT, CardUsage, ContainerUsage

VERSION = INVENTORY_VERSION
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GPUDevice"
PLURAL = "gpudevices"
SINGULAR = "gpudevice"
SHORT_NAMES = ("gpud",)
CRD_NAME = f"{PLURAL}.{GROUP}"
NODE_LABEL = f"{GROUP}/node"


class GPUDeviceError(ValueError):
    """A GPUDevice object that does not describe a card; the message names object and field."""


def object_name(node: str, index: int) -> str:
    return f"{node}-gpu{index}"


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def card_spec(node: str, card: Card) -> dict[str, Any]:
    """The spec of a card's GPUDevice. `resources` (what the card backs, `Card.offers`) is
    written only when known: an object without it is read back as "offers unknown"."""
    spec = {
        "node": node,
        "index": card.index,
        "uuid": card.uuid,
        "model": card.model,
        "memoryMiB": card.memory_mib,
        "computeMilli": card.compute_milli,
        "numaNode": card.numa_node,
        "board": card.board,
        "links": [{"peer": link.peer, "kind": link.kind.value, "count": link.count}
                  for link in card.links],
        "mig": [{"profile": inst.profile.name, "uuid": inst.uuid, "start": inst.start}
                for inst in card.mig],
    }
    if card.offers is not None:
        spec["resources"] = dict(card.offers)
    if card.mig_mode is not None:
        spec["migMode"] = {"current": card.mig_mode.current, "pending": card.mig_mode.pending}
    return spec


#: At most this many holders are listed in `status.pods` (`status.podCount` has them all):
#: an object read by every `kubectl get` stays small on a card shared by a hundred pods.
MAX_LISTED_PODS = 8


def allocation_status(compute_milli: int, allocated_milli: int, allocated_memory_mib: int,
                      holders: Sequence[str] = ()) -> dict[str, Any]:
    """The allocation part of a card's status: compute (milli and percent of the card),
    memory, and who holds it (`<namespace>/<pod> (<container>)`, the first MAX_LISTED_PODS
    in order, then `+N more`; `podCount` counts them all)."""
    listed = list(holders[:MAX_LISTED_PODS])
    if len(holders) > MAX_LISTED_PODS:
        listed.append(f"+{len(holders) - MAX_LISTED_PODS} more")
    return {
        "allocatedMilli": allocated_milli,
        "allocatedMemoryMiB": allocated_memory_mib,
        "allocatedPercent": allocated_milli * 100 // max(compute_milli, 1),
        "pods": listed,
        "podCount": len(holders),
    }


def card_status(card: Card, reason: str = "", allocated_milli: int = 0,
                allocated_memory_mib: int = 0, heartbeat: str | None = None,
                holders: Sequence[str] = ()) -> dict[str, Any]:
    status = {
        "health": card.health.value,
        "reason": reason,
        **allocation_status(card.compute_milli, allocated_milli, allocated_memory_mib, holders),
        "lastHeartbeat": heartbeat or now_rfc3339(),
    }
    if card.usage is not None:
        status["usage"] = usage_status(card.usage)
    return status


#: At most this many holders are listed in `status.usage.containers`: the object stays small
#: on a card shared by a hundred pods (the largest users first; metrics have them all).
MAX_LISTED_CONTAINERS = 16


def usage_status(usage: CardUsage) -> dict[str, Any]:
    """`status.usage` for an observed card (the largest users first, at most
    MAX_LISTED_CONTAINERS of them)."""
    listed = sorted(usage.containers, key=lambda c: (-c.memory_mib, c.namespace, c.pod,
                                                      c.container))[:MAX_LISTED_CONTAINERS]
    out: dict[str, Any] = {
        "usedMemoryMiB": usage.used_mib,
        "outOfBandMemoryMiB": usage.out_of_band_mib,
        "smUtilizationPercent": usage.sm_percent,
        "containers": [_container_status(c) for c in listed],
    }
    if usage.observed_at:
        out["observedAt"] = usage.observed_at
    return out


def _container_status(use: ContainerUsage) -> dict[str, Any]:
    out: dict[str, Any] = {"namespace": use.namespace, "pod": use.pod,
                           "container": use.container, "usedMemoryMiB": use.memory_mib}
    if use.sm_percent is not None:
        out["smUtilizationPercent"] = use.sm_percent
    return out


def usage_from_status(raw: Any, where: str) -> CardUsage | None:
    """`status.usage` as core `CardUsage`; absent is None. Malformed raises GPUDeviceError."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise GPUDeviceError(f"{where}={raw!r} is not an object")
    containers = []
    for i, item in enumerate(raw.get("containers") or []):
        at = f"{where}.containers[{i}]"
        if not isinstance(item, Mapping):
            raise GPUDeviceError(f"{at}={item!r} is not an object")
        sm = item.get("smUtilizationPercent")
        try:
            containers.append(ContainerUsage(
                namespace=_field(item, at, "namespace", str), pod=_field(item, at, "pod", str),
                container=_field(item, at, "container", str),
                memory_mib=_field(item, at, "usedMemoryMiB", int),
                sm_percent=None if sm is None else _field(item, at, "smUtilizationPercent",
                                                          int)))
        except ValueError as err:
            if isinstance(err, GPUDeviceError):
                raise
            raise GPUDeviceError(f"{at}: {err}") from None
    observed = raw.get("observedAt", "")
    try:
        return CardUsage(used_mib=_field(raw, where, "usedMemoryMiB", int),
                         out_of_band_mib=_field(raw, where, "outOfBandMemoryMiB", int),
                         sm_percent=_field(raw, where, "smUtilizationPercent", int),
                         observed_at=observed if isinstance(observed, str) else "",
                         containers=tuple(containers))
    except ValueError as err:
        if isinstance(err, GPUDeviceError):
            raise
        raise GPUDeviceError(f"{where}: {err}") from None


def card_to_object(node: str, card: Card, reason: str = "") -> dict[str, Any]:
    """The full object for one card (status included, for a first create)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": object_name(node, card.index), "labels": {NODE_LABEL: node}},
        "spec": card_spec(node, card),
        "status": card_status(card, reason),
    }


def owned_by_node(obj: Mapping[str, Any], node: str, node_uid: str | None) -> dict[str, Any]:
    """`obj` owned by the Node `node` whose uid is `node_uid` (the garbage collector removes it
    with that Node); without a uid, `obj` unchanged."""
    out = dict(obj)
    if node_uid:
        out["metadata"] = {**obj["metadata"], "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]}
    return out


def update_patch(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that makes an existing GPUDevice what `obj` (a `card_to_object`,
    perhaps `owned_by_node`) says, status aside (its own subresource). The owner is part of it:
    a GPUDevice left by an earlier Node object of the same name still names that Node's uid,
    and the garbage collector deletes it unless the current Node is made its owner."""
    metadata = {"labels": obj["metadata"]["labels"]}
    if "ownerReferences" in obj["metadata"]:
        metadata["ownerReferences"] = obj["metadata"]["ownerReferences"]
    return {"metadata": metadata, "spec": obj["spec"]}


def _field(obj: Mapping[str, Any], where: str, key: str, kind: type | tuple[type, ...]) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise GPUDeviceError(f"{where}.{key}={value!r} is not a {getattr(kind, '__name__', kind)}")
    return value


def card_from_object(obj: Mapping[str, Any]) -> tuple[str, Card]:
    """(node name, Card) from a GPUDevice object as the API serves it."""
    name = (obj.get("metadata") or {}).get("name", "?")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise GPUDeviceError(f"GPUDevice {name}: no spec")
    where = f"GPUDevice {name}: spec"
    node = _field(spec, where, "node", str)
    status = obj.get("status") or {}
    try:
        health = Health(status.get("health", Health.HEALTHY.value))
    except ValueError:
        raise GPUDeviceError(f"GPUDevice {name}: status.health={status.get('health')!r} is not "
                             "Healthy or Unhealthy") from None
    if health is Health.HEALTHY and status.get("fence"):
        health = Health.FENCED
    links = []
    for i, link in enumerate(spec.get("links") or []):
        try:
            links.append(Link(int(link["peer"]), LinkKind(link["kind"]), int(link.get("count", 1))))
        except (KeyError, TypeError, ValueError) as err:
            raise GPUDeviceError(f"{where}.links[{i}]={link!r}: {err}") from None
    mig = []
    for i, inst in enumerate(spec.get("mig") or []):
        try:
            mig.append(MigInstance(MigProfile.parse(str(inst["profile"])), str(inst["uuid"]),
                                   int(inst.get("start", 0)), health))
        except (KeyError, TypeError, ValueError, ResourceError) as err:
            raise GPUDeviceError(f"{where}.mig[{i}]={inst!r}: {err}") from None
    numa = spec.get("numaNode")
    board = spec.get("board")
    offers = _offers(spec.get("resources"), f"{where}.resources")
    mode = spec.get("migMode")
    mig_mode = (MigMode(bool(mode.get("current")), bool(mode.get("pending")))
                if isinstance(mode, Mapping) else None)
    try:
        card = Card(
            index=_field(spec, where, "index", int),
            uuid=_field(spec, where, "uuid", str),
            model=_field(spec, where, "model", str),
            memory_mib=_field(spec, where, "memoryMiB", int),
            compute_milli=int(spec.get("computeMilli", MILLI_PER_CARD)),
            health=health,
            links=tuple(links),
            mig=tuple(mig),
            numa_node=numa if isinstance(numa, int) else None,
            board=board if isinstance(board, str) else None,
            offers=offers,
            usage=usage_from_status(status.get("usage"), f"GPUDevice {name}: status.usage"),
            mig_mode=mig_mode,
        )
    except (TypeError, ValueError) as err:
        if isinstance(err, GPUDeviceError):
            raise
        raise GPUDeviceError(f"GPUDevice {name}: {err}") from None
    return node, card


def _offers(raw: Any, where: str) -> dict[str, int] | None:
    """spec.resources: absent (an older agent) is None, "offers unknown"."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise GPUDeviceError(f"{where}={raw!r} is not an object of resource name: count")
    out: dict[str, int] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, int) or isinstance(value, bool) \
                or value < 0:
            raise GPUDeviceError(f"{where}.{key}={value!r} is not a whole number >= 0")
        out[key] = value
    return out


#: The name the scheduler helper reads with (same function).
card_from_gpudevice = card_from_object


def nodes_from_objects(devices: Iterable[Mapping[str, Any]],
                       k8s_nodes: Iterable[Mapping[str, Any]] = ()) -> list[Node]:
    """Group GPUDevices by node into core Nodes; CPU and memory come from the Node objects
    (allocatable), labels too; a GPUDevice whose Node is missing still yields a Node (0 CPU)."""
    cards: dict[str, list[Card]] = {}
    for obj in devices:
        node, card = card_from_object(obj)
        cards.setdefault(node, []).append(card)
    by_name = {str((n.get("metadata") or {}).get("name")): n for n in k8s_nodes}
    result = []
    for name in sorted(cards):
        node_obj = by_name.get(name, {})
        labels = dict((node_obj.get("metadata") or {}).get("labels") or {})
        result.append(Node(name=name,
                           cpu_milli=nodestatus.allocatable(node_obj, "cpu", 1000),
                           memory_mib=nodestatus.allocatable(node_obj, "memory") // (1 << 20),
                           cards=tuple(sorted(cards[name], key=lambda c: c.index)),
                           labels=labels))
    return result


def nodes_from_readable_objects(devices: Iterable[Mapping[str, Any]],
                                k8s_nodes: Iterable[Mapping[str, Any]],
                                skipped: Callable[[GPUDeviceError], None]) -> list[Node]:
    """`nodes_from_objects` over the GPUDevices that read as cards; each one that does not is
    passed to `skipped` (the caller logs it) instead of failing the whole view."""
    readable = []
    for obj in devices:
        try:
            card_from_object(obj)
        except GPUDeviceError as err:
            skipped(err)
            continue
        readable.append(obj)
    return nodes_from_objects(readable, k8s_nodes)


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition of GPUDevice (apiextensions.k8s.io/v1)."""
    int_ = {"type": "integer"}
    str_ = {"type": "string"}
    spec_schema = {
        "type": "object",
        "required": ["node", "index", "uuid", "model", "memoryMiB"],
        "properties": {
            "node": str_, "index": {"type": "integer", "minimum": 0}, "uuid": str_, "model": str_,
            "memoryMiB": {"type": "integer", "minimum": 1},
            "computeMilli": {"type": "integer", "minimum": 1, "maximum": MILLI_PER_CARD},
            "numaNode": {"type": "integer", "nullable": True},
            "board": {"type": "string", "nullable": True},
            "links": {"type": "array", "items": {
                "type": "object", "required": ["peer", "kind"],
                "properties": {"peer": int_, "count": int_, "kind": {
                    "type": "string", "enum": [k.value for k in LinkKind]}}}},
            "mig": {"type": "array", "items": {
                "type": "object", "required": ["profile", "uuid"],
                "properties": {"profile": str_, "uuid": str_, "start": int_}}},
            "migMode": {
                "type": "object",
                "description": "The card's MIG mode as its driver reports it (absent where the "
                               "backend reads none): current, and pending after the next GPU "
                               "reset. In MIG mode with no instance the card backs nothing.",
                "required": ["current", "pending"],
                "properties": {"current": {"type": "boolean"}, "pending": {"type": "boolean"}}},
            "resources": {
                "type": "object",
                "description": "What the card backs: resource name -> devices of it on this "
                               "card (time-sliced replicas, percent shares, memory units, MIG "
                               "instances), as the node's agent advertises them.",
                "additionalProperties": {"type": "integer", "minimum": 0}},
        },
    }
    mib = {"type": "integer", "minimum": 0}
    percent = {"type": "integer", "minimum": 0, "maximum": MAX_PERCENT}
    usage_schema = {
        "type": "object",
        "description": "What the node's agent last observed on the card.",
        "required": ["usedMemoryMiB", "outOfBandMemoryMiB", "smUtilizationPercent"],
        "properties": {
            "usedMemoryMiB": {**mib, "description": "Memory in use by every process, MiB"},
            "outOfBandMemoryMiB": {**mib, "description": "Memory in use that no holder of "
                                   "the card accounts for (other processes, leaked contexts)"},
            "smUtilizationPercent": {**percent, "description": "SM utilisation, percent"},
            "observedAt": {"type": "string", "format": "date-time"},
            "containers": {
                "type": "array", "maxItems": MAX_LISTED_CONTAINERS,
                "description": "Holders' observed use, the largest first",
                "items": {"type": "object",
                          "required": ["namespace", "pod", "container", "usedMemoryMiB"],
                          "properties": {"namespace": str_, "pod": str_, "container": str_,
                                         "usedMemoryMiB": mib,
                                         "smUtilizationPercent": percent}}},
        },
    }
    status_schema = {
        "type": "object",
        "properties": {
            "health": {"type": "string",
                       "enum": [Health.HEALTHY.value, Health.UNHEALTHY.value]},
            "reason": str_,
            "fence": {"type": "string", "maxLength": 1024, "nullable": True,
                      "description": "Set while the agent changes the card's MIG layout (why, "
                                     "and which MigLayout): nothing new is placed on it"},
            "allocatedMilli": int_, "allocatedMemoryMiB": int_,
            "allocatedPercent": int_,
            "pods": {"type": "array", "maxItems": MAX_LISTED_PODS + 1, "items": str_,
                     "description": "Containers holding the card, <namespace>/<pod> "
                                    "(<container>); the first few, then '+N more'"},
            "podCount": int_,
            "lastHeartbeat": {"type": "string", "format": "date-time"},
            "usage": usage_schema,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {"kind": KIND, "plural": PLURAL, "singular": SINGULAR,
                      "shortNames": list(SHORT_NAMES), "listKind": f"{KIND}List"},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "One GPU (or board chip) of a node, published by the "
                                   "Elastic GPU agent.",
                    "properties": {"spec": spec_schema, "status": status_schema}}},
                "additionalPrinterColumns": [
                    column("Node", "string", ".spec.node", "Node the card is in"),
                    column("Index", "integer", ".spec.index", "Card index on its node"),
                    column("Model", "string", ".spec.model", "Card model"),
                    column("Memory", "integer", ".spec.memoryMiB", "Card memory in MiB"),
                    column("Health", "string", ".status.health", "Healthy or Unhealthy"),
                    column("Allocated%", "integer", ".status.allocatedPercent",
                            "Compute assigned to pods, percent of the card (a MIG instance "
                            "counts its slices, a whole card 100)"),
                    column("MemoryUsed", "integer", ".status.allocatedMemoryMiB",
                            "Memory assigned to pods, MiB"),
                    column("Pods", "string", ".status.pods",
                            "Containers holding the card: <namespace>/<pod> (<container>)"),
                    column("Observed", "integer", ".status.usage.usedMemoryMiB",
                            "Memory the agent observed in use, MiB"),
                    column("OutOfBand", "integer", ".status.usage.outOfBandMemoryMiB",
                            "Observed memory no holder accounts for, MiB"),
                    column("Util%", "integer", ".status.usage.smUtilizationPercent",
                            "Observed SM utilisation, percent"),
                    column("Fence", "string", ".status.fence",
                           "Why the card is fenced (its MIG layout changes)", priority=1),
                    column("Age", "date", ".metadata.creationTimestamp", "Age"),
                ],
            }],
        },
    }


CRD_FILE = "gpudevices.yaml"


def crd_yaml() -> str:
    """deploy/crds/gpudevices.yaml: the manifest under a header saying where it comes from."""
    return ("# GPUDevice: one object per GPU card, published by the Elastic GPU node agent.\n"
            "# Generated by `python -m elastic_gpu.api.gpudevice --write deploy/crds` from\n"
            "# elastic_gpu.api.gpudevice.crd_manifest() (a unit test keeps them equal).\n"
            + to_yaml(crd_manifest()))


def _main(argv: list[str] | None = None) -> int:
    return write_main("Write the GPUDevice CRD as YAML.", {CRD_FILE: crd_yaml}, argv)


if __name__ == "__main__":
    raise SystemExit(_main())
