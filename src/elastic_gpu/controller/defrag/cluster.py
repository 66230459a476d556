"""The cluster's cards and who holds them, read off the caches into an Engine, as the
extender counts them: nodes from their GPUDevices and Node objects
(`api.gpudevice.nodes_from_objects`), every ElasticGPU under its ledger key
(`core.claims.inventory`), every pod that has not stopped (`core.podlife.stopped`) under
`<namespace>/<name>` with the assignment its Binding wrote (`core.assignment`: only one the
Binding wrote, `distrust`), less its claim-backed containers (`Assignment.unclaimed`).

The Engine checks no CPU or memory, as the extender's does not: kube-scheduler checks them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.api import elasticgpu as egpu_api
from elastic_gpu.api import gpudevice
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, AssignmentError, distrust, pod_assignment
from elastic_gpu.core.claims.inventory import egpu_assignment, ledger_key
from elastic_gpu.core.defrag.movable import PodFacts, pod_facts
from elastic_gpu.core.placement import Engine, PolicyConfig, Unschedulable
from elastic_gpu.core.podlife import stopped
from elastic_gpu.core.policies import DEFAULT_NODE_POLICY
from elastic_gpu.core.request import PodRequest, pod_request_from_manifest
from elastic_gpu.core.resources import ResourceError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placed:
    """A pod holding cards: its object, facts, request and what the Engine counts for it."""

    obj: Mapping[str, Any]
    facts: PodFacts
    request: PodRequest
    held: Assignment
    uses_claim: bool


@dataclass
class Cluster:
    engine: Engine
    #: `<namespace>/<name>` -> the pod, for every pod the Engine counts
    placed: dict[str, Placed] = field(default_factory=dict)


def _notes(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    notes = meta.get("annotations") if isinstance(meta, Mapping) else None
    return notes if isinstance(notes, Mapping) else {}


def read_cluster(devices: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]],
                 pods: Iterable[Mapping[str, Any]], egpus: Iterable[Mapping[str, Any]],
                 policy: str | None = None) -> Cluster:
    good = []
    for obj in devices:
        try:
            gpudevice.card_from_object(obj)
        except gpudevice.GPUDeviceError as err:
            log.debug("GPUDevice skipped: %s", err)
            continue
        good.append(obj)
    engine = Engine(gpudevice.nodes_from_objects(good, nodes),
                    PolicyConfig(node_policy=policy or DEFAULT_NODE_POLICY,
                                 check_host_resources=False))
    known = set(engine.nodes())
    for obj in egpus:  # first: where a claim and a pod name one card, the claim's it is
        try:
            egpu = egpu_api.elasticgpu_from_object(obj)
        except egpu_api.ElasticGPUObjectError:
            continue
        if egpu.node in known and egpu.shares:
            _allocate(engine, ledger_key(egpu.name), egpu_assignment(egpu))
    cluster = Cluster(engine)
    for pod in pods:
        placed = _placed(pod, known)
        if placed is not None and _allocate(engine, placed.facts.key, placed.held):
            cluster.placed[placed.facts.key] = placed
    return cluster


def _placed(pod: Mapping[str, Any], known: set[str]) -> Placed | None:
    facts = pod_facts(pod)
    if not facts.node or facts.node not in known or stopped(pod):
        return None
    try:
        assignment = pod_assignment(pod)
    except AssignmentError:
        return None
    if assignment is None or distrust(facts.node, _notes(pod).get(ann.ASSIGNED_NODE),
                                      assignment) is not None:
        return None
    held = assignment.unclaimed()
    if held is None:
        return None
    try:
        request = pod_request_from_manifest(pod)
    except (ResourceError, ValueError):
        return None
    return Placed(pod, facts, request, held, bool(assignment.claims))


def _allocate(engine: Engine, key: str, assignment: Assignment) -> bool:
    try:
        engine.allocate(key, assignment)
    except Unschedulable as err:  # over a card (a stale cache); the extender's count rules
        log.debug("%s not counted: %s", key, err)
        return False
    except (KeyError, ValueError) as err:
        log.debug("%s not counted: %r", key, err)
        return False
    return True
