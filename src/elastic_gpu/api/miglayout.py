"""The wanted MIG layout of one card: MigLayout (group elasticgpu.io, v1alpha, cluster-scoped).

The mig-dynamic controller writes one per card it carves; the card's node agent carries it out
step by step (`core.mig.apply.next_step`) and says in the status how far it got. The wanted
layout is an API object, never only a process's memory, so an agent or controller killed
mid-change resumes from it and from the card's real layout (docs/mig-apply.md):

    apiVersion: elasticgpu.io/v1alpha
    kind: MigLayout
    metadata: {name: gpu-node-1.gpu-0a0a}      # <node>.<card uuid, lower case>
    spec:
      nodeName: gpu-node-1
      cardUUID: GPU-0a0a
      instances:                                # [] : the whole card, no instance
        - {profile: 3g.40gb, start: 0}          # start: the first memory slice (NVML's)
        - {profile: 1g.10gb, start: 4}
    status:
      phase: Applied                            # Pending Fencing Applying PendingReset Applied
                                                # Blocked Refused
      observedGeneration: 1
      reason: ""                                # why PendingReset, Blocked or Refused
      instances: [{profile: 3g.40gb, start: 0, uuid: MIG-...}]   # the card's real instances

The schema refuses what it can say alone (a malformed profile name, a start beyond 7, more
than 7 instances); a layout the card's model does not allow (unknown profile, a start NVIDIA
does not allow, overlapping slices) is refused by the agent alone, with `phase: Refused` and
the reason, and the other cards go on. This module is the one source of the CRD
(`crd_manifest()`; deploy/crds/miglayouts.yaml is its YAML form, written by
`python -m elastic_gpu.api.miglayout --write deploy/crds`) and reads the served objects
(`layout_from_object`). No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_gpu.api.crd import column, crd, to_yaml, write_main
from elastic_gpu.api.group import ELASTICGPU_VERSION as VERSION
from elastic_gpu.api.group import GROUP
from elastic_gpu.api.migsubstitution import PROFILE_PATTERN
from elastic_gpu.core.mig.apply import Placed
from elastic_gpu.core.model import MigInstance
from elastic_gpu.core.resources import MigProfile, ResourceError


class MigLayoutError(ValueError):
    """A MigLayout that cannot be read; the message names the object and the field."""


KIND, PLURAL, SHORT = "MigLayout", "miglayouts", "miglayout"
#: the label naming the card's node (the agent lists its node's layouts by it), as GPUDevices'
NODE_LABEL = f"{GROUP}/node"
CRD_FILE = "miglayouts.yaml"
#: the phases of `status.phase` (`core.mig.apply`'s steps' `phase`, and Pending before any)
PHASES = ("Pending", "Fencing", "Applying", "PendingReset", "Applied", "Blocked", "Refused")
#: a card holds at most 7 instances (NVIDIA's MIG user guide)
MAX_INSTANCES = 7


@dataclass(frozen=True)
class MigLayout:
    """A served MigLayout as the agent and the controller read it."""

    name: str
    node: str
    card_uuid: str
    instances: tuple[Placed, ...]
    generation: int
    phase: str = "Pending"
    observed_generation: int = 0
    #: metadata.uid ("" where not read from the API): an Event's involved object
    uid: str = ""

    def reference(self) -> dict[str, Any]:
        """The object as an Event's involved object (`kube.events.involved_object`)."""
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                "metadata": {"name": self.name, "uid": self.uid}}


def object_name(node: str, card_uuid: str) -> str:
    """The one name of a card's MigLayout (`<node>.<uuid>`, lower case: a DNS subdomain)."""
    return f"{node}.{card_uuid}".lower()


def _instance_schema(with_uuid: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "profile": {"type": "string", "maxLength": 32, "pattern": PROFILE_PATTERN,
                    "description": "the MIG profile, e.g. 3g.40gb"},
        "start": {"type": "integer", "minimum": 0, "maximum": 7,
                  "description": "the first memory slice it occupies (NVML's placement start)"},
    }
    if with_uuid:
        properties["uuid"] = {"type": "string", "maxLength": 128}
    return {"type": "object", "required": ["profile", "start"], "properties": properties}


def crd_manifest() -> dict[str, Any]:
    """The MigLayout CustomResourceDefinition (apiextensions.k8s.io/v1)."""
    spec = {
        "type": "object",
        "required": ["nodeName", "cardUUID", "instances"],
        "x-kubernetes-validations": [
            {"rule": "self.nodeName == oldSelf.nodeName && self.cardUUID == oldSelf.cardUUID",
             "message": "nodeName and cardUUID are immutable (a layout is one card's)"}],
        "properties": {
            "nodeName": {"type": "string", "minLength": 1, "maxLength": 253},
            "cardUUID": {"type": "string", "minLength": 1, "maxLength": 128},
            "instances": {"type": "array", "maxItems": MAX_INSTANCES,
                          "description": "the instances the card should have; [] is the whole "
                                         "card",
                          "items": _instance_schema(False)},
        },
    }
    status = {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": list(PHASES)},
            "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            "reason": {"type": "string", "maxLength": 4096},
            "instances": {"type": "array", "maxItems": MAX_INSTANCES,
                          "items": _instance_schema(True)},
        },
    }
    schema = {
        "type": "object",
        "description": "The wanted MIG layout of one card, written by the mig-dynamic "
                       "controller and carried out by the card's node agent.",
        "required": ["spec"],
        "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                       "metadata": {"type": "object"}, "spec": spec, "status": status},
    }
    columns = [
        column("Node", "string", ".spec.nodeName", "the card's node"),
        column("Card", "string", ".spec.cardUUID", "the card"),
        column("Phase", "string", ".status.phase", "how far the agent got"),
        column("Reason", "string", ".status.reason", "why Blocked or Refused", priority=1),
        column("Age", "date", ".metadata.creationTimestamp", "age"),
    ]
    return crd(KIND, PLURAL, SHORT, "Cluster", schema, columns, status=True, version=VERSION)


def crd_yaml() -> str:
    header = (f"# {KIND} ({GROUP}/{VERSION}): see docs/mig-apply.md.\n"
              "# Generated by `python -m elastic_gpu.api.miglayout --write deploy/crds` from\n"
              "# elastic_gpu.api.miglayout.crd_manifest() (a unit test keeps them equal).\n")
    return header + to_yaml(crd_manifest())


def layout_from_object(obj: Mapping[str, Any]) -> MigLayout:
    """A served MigLayout; `MigLayoutError` names the object and the field it cannot read."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    where = f"{KIND} {meta.get('name', '?')}"
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    if not isinstance(spec, Mapping):
        raise MigLayoutError(f"{where}: spec is missing")
    node, card = spec.get("nodeName"), spec.get("cardUUID")
    if not isinstance(node, str) or not node or not isinstance(card, str) or not card:
        raise MigLayoutError(f"{where}: spec.nodeName and spec.cardUUID are required")
    raw = spec.get("instances")
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise MigLayoutError(f"{where}: spec.instances is not a list")
    instances = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise MigLayoutError(f"{where}: spec.instances[{i}] is not an object")
        start = item.get("start")
        if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start <= 7:
            raise MigLayoutError(f"{where}: spec.instances[{i}].start={start!r}: 0-7")
        try:
            profile = MigProfile.parse(item.get("profile"))  # type: ignore[arg-type]
        except ResourceError as err:
            raise MigLayoutError(f"{where}: spec.instances[{i}].profile: {err}") from None
        instances.append(Placed(start, profile))
    status = obj.get("status")
    status = status if isinstance(status, Mapping) else {}
    generation = meta.get("generation")
    observed = status.get("observedGeneration")
    phase = status.get("phase")
    return MigLayout(str(meta.get("name", "")), node, card, tuple(instances),
                     generation if isinstance(generation, int) else 0,
                     phase if phase in PHASES else "Pending",
                     observed if isinstance(observed, int) else 0,
                     str(meta.get("uid") or ""))


def layout_spec(node: str, card_uuid: str, instances: Sequence[Placed]) -> dict[str, Any]:
    """A MigLayout object to create or replace (the controller's write)."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": object_name(node, card_uuid),
                         "labels": {NODE_LABEL: node}},
            "spec": {"nodeName": node, "cardUUID": card_uuid,
                     "instances": [{"profile": p.profile.name, "start": p.start}
                                   for p in sorted(instances)]}}


def status_body(phase: str, generation: int, reason: str,
                real: Sequence[MigInstance]) -> dict[str, Any]:
    """The status the agent writes after a step."""
    return {"status": {"phase": phase, "observedGeneration": generation,
                       "reason": reason[:4096],
                       "instances": [{"profile": m.profile.name, "start": m.start,
                                      "uuid": m.uuid}
                                     for m in sorted(real, key=lambda m: (m.start, m.uuid))]}}


def _main(argv: list[str] | None = None) -> int:
    return write_main("Write the MigLayout CRD as YAML.", {CRD_FILE: crd_yaml}, argv)


if __name__ == "__main__":
    raise SystemExit(_main())
