"""The assignment: which cards, and what share of each, every container of a pod gets.

The scheduler writes it to the pod's `elasticgpu.io/assignment` annotation *before* it creates
the Binding; the agent reads it back in Allocate; a restarted scheduler rebuilds its state by
listing pods and decoding it. It is therefore the one source of truth for allocations, and its
JSON form is versioned and validated strictly: a malformed annotation is an error, never a
guess.

JSON form (v1):
    {"v": 1, "node": "n1",
     "containers": {"main": [{"index": 0, "uuid": "GPU-…", "milli": 300, "memoryMiB": 4096}]}}
A MIG share adds `"mig": "<profile>"` and `"migUuid": "MIG-…"`. A share of time-sliced replicas
adds `"replicas": k` (k replica slots of a card time-sliced for the container's whole-card
resource; its milli is k x the card's compute / replicas, its memory 0). Readers that predate
it ignore the key, and count the milli.

A pod consuming ElasticGPUClaims adds a top-level `"claims": {"<container>": "<ElasticGPU>"}`:
those containers' shares are the ElasticGPU's cards (its `spec.cards`), already held under the
ElasticGPU's own ledger key, so the scheduler's ledger counts only the pod's other containers
(`Assignment.unclaimed`). The agent serves every container its shares, claim-backed or not.
`v` stays 1: older readers ignore the key (and would count the claim containers twice, which
an older scheduler never wrote).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.core.annotations import ASSIGNED_NODE, ASSIGNMENT
from elastic_gpu.core.resources import MILLI_PER_CARD

VERSION = 1


class AssignmentError(ValueError):
    """An assignment annotation that cannot be trusted."""


@dataclass(frozen=True)
class CardShare:
    """A share of one card given to one container."""

    index: int
    uuid: str
    milli: int
    memory_mib: int
    mig_profile: str | None = None
    mig_uuid: str | None = None
    #: Time-sliced replica slots of this card held (0: not a replica share).
    replicas: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "uuid": self.uuid, "milli": self.milli,
                               "memoryMiB": self.memory_mib}
        if self.mig_profile is not None:
            out["mig"] = self.mig_profile
            out["migUuid"] = self.mig_uuid
        if self.replicas:
            out["replicas"] = self.replicas
        return out

    @staticmethod
    def from_dict(data: Any) -> CardShare:
        if not isinstance(data, Mapping):
            raise AssignmentError(f"a card share must be an object, got {data!r}")
        try:
            index, uuid, milli, memory = data["index"], data["uuid"], data["milli"], data["memoryMiB"]
        except KeyError as err:
            raise AssignmentError(f"card share {dict(data)!r} lacks {err.args[0]!r}") from None
        for key, value in (("index", index), ("milli", milli), ("memoryMiB", memory)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise AssignmentError(f"card share {key}={value!r} is not a non-negative integer")
        if not isinstance(uuid, str):
            raise AssignmentError(f"card share uuid={uuid!r} is not a string")
        if milli > MILLI_PER_CARD:
            raise AssignmentError(f"card share milli={milli} exceeds one card ({MILLI_PER_CARD})")
        mig = data.get("mig")
        mig_uuid = data.get("migUuid")
        if mig is not None and not isinstance(mig, str):
            raise AssignmentError(f"card share mig={mig!r} is not a string")
        replicas = data.get("replicas", 0)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or not 0 <= replicas <= 64:
            raise AssignmentError(f"card share replicas={replicas!r} is not an integer 0-64")
        return CardShare(index, uuid, milli, memory, mig, mig_uuid if isinstance(mig_uuid, str) else None,
                         replicas)


@dataclass(frozen=True)
class Assignment:
    """All of a pod's card shares on one node, per container name."""

    node: str
    containers: Mapping[str, tuple[CardShare, ...]]
    #: container -> the ElasticGPU whose cards it uses (a claim-backed container); its shares
    #: are the ElasticGPU's, counted under the ElasticGPU's ledger key, not the pod's
    claims: Mapping[str, str] = field(default_factory=dict)

    def shares(self) -> Iterator[CardShare]:
        for shares in self.containers.values():
            yield from shares

    def unclaimed(self, counted: Callable[[str], bool] = lambda _egpu: True
                  ) -> Assignment | None:
        """What the pod itself holds: its containers less the claim-backed ones whose
        ElasticGPU the ledger counts (`counted(name)`; by default every one), None if nothing
        is left. The ledger counts this under the pod's key. A claim-backed container whose
        ElasticGPU is not counted (deleted while the pod runs) is the pod's to hold: its card
        is in use whatever became of the object."""
        if not self.claims:
            return self
        rest = {name: shares for name, shares in self.containers.items()
                if name not in self.claims or not counted(self.claims[name])}
        if not rest:
            return None
        return Assignment(self.node, rest)

    def to_json(self) -> str:
        body: dict[str, Any] = {"v": VERSION, "node": self.node,
                                "containers": {name: [s.to_dict() for s in shares]
                                               for name, shares in sorted(self.containers.items())}}
        if self.claims:
            body["claims"] = dict(sorted(self.claims.items()))
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Assignment:
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError) as err:
            raise AssignmentError(f"assignment is not JSON: {err}") from None
        if not isinstance(data, Mapping):
            raise AssignmentError("assignment must be a JSON object")
        if data.get("v") != VERSION:
            raise AssignmentError(f"assignment version {data.get('v')!r} is not {VERSION}")
        node = data.get("node")
        containers = data.get("containers")
        if not isinstance(node, str) or not node:
            raise AssignmentError(f"assignment node {node!r} is not a node name")
        if not isinstance(containers, Mapping):
            raise AssignmentError("assignment containers must be an object")
        parsed: dict[str, tuple[CardShare, ...]] = {}
        for name, shares in containers.items():
            if not isinstance(shares, list):
                raise AssignmentError(f"container {name!r}: shares must be a list")
            parsed[str(name)] = tuple(CardShare.from_dict(s) for s in shares)
            indexes = [s.index for s in parsed[str(name)]]
            if len(set(indexes)) != len(indexes) and not any(s.mig_uuid for s in parsed[str(name)]):
                raise AssignmentError(f"container {name!r} lists card {indexes} twice")
        return Assignment(node, parsed, _claims(data.get("claims", {}), parsed))


def _claims(value: Any, containers: Mapping[str, tuple[CardShare, ...]]) -> dict[str, str]:
    """The `claims` mark: an object of container -> ElasticGPU name, every container listed in
    `containers`."""
    if not isinstance(value, Mapping):
        raise AssignmentError(f"assignment claims must be an object of container -> "
                              f"ElasticGPU name, got {value!r}")
    out: dict[str, str] = {}
    for container, egpu in value.items():
        if container not in containers:
            raise AssignmentError(f"assignment claims names container {container!r}, which has "
                                  f"no shares (containers: {', '.join(sorted(containers))})")
        if not isinstance(egpu, str) or not 0 < len(egpu) <= 253:
            raise AssignmentError(f"assignment claims[{container!r}]={egpu!r} is not an "
                                  "ElasticGPU name")
        out[str(container)] = egpu
    return out


def distrust(node_name: str, assigned_node: str | None, assignment: Assignment) -> str | None:
    """Why a pod's assignment is not the system's (None: it is, and its cards are held).

    The scheduler writes an assignment only through the pod's Binding, which sets
    `spec.nodeName`, the assignment and `elasticgpu.io/assigned-node` in one write; an
    admission policy keeps everyone else from writing them (docs/architecture.md, "Who writes
    the ledger"). So an assignment is the scheduler's only on a pod bound to the node that both
    the annotation and the assignment name: one on a pod not bound (never scheduled) or bound
    elsewhere was not written by that Binding, and holds nothing."""
    if not node_name:
        return ("the pod is not bound to a node; the scheduler's Binding sets the node and the "
                "assignment together")
    if assigned_node != node_name:
        return (f"elasticgpu.io/assigned-node is {assigned_node!r}, but the pod is bound to "
                f"{node_name!r}")
    if assignment.node != node_name:
        return f"the assignment is for node {assignment.node!r}, but the pod is bound to {node_name!r}"
    return None


def pod_assignment(pod: Mapping[str, Any]) -> Assignment | None:
    """The assignment a pod object carries (`elasticgpu.io/assignment`), the one reader of it:
    None when the pod has no such annotation; `AssignmentError` when it cannot be read (an
    empty value included). Whether to trust it is `distrust`'s question."""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    notes = meta.get("annotations") if isinstance(meta, Mapping) else None
    raw = notes.get(ASSIGNMENT) if isinstance(notes, Mapping) else None
    if raw is None:
        return None
    return Assignment.from_json(str(raw))


def trusted_assignment(pod: Mapping[str, Any]) -> Assignment | None:
    """The pod's assignment when it is the system's (`distrust`: the Binding's, for the node the
    pod is bound to); None when it has none, it cannot be read (its readers that report a bad
    one call `pod_assignment`), or it is not trusted. Whether the pod still holds its cards is
    `core.podlife.holds_cards`'s question."""
    try:
        assignment = pod_assignment(pod)
    except AssignmentError:
        return None
    if assignment is None:
        return None
    meta = pod.get("metadata") or {}
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    if distrust(node, (meta.get("annotations") or {}).get(ASSIGNED_NODE), assignment) is not None:
        return None
    return assignment
