"""What a DRA node's pods hold, for the readers the two node modes share (the held metrics,
observed usage's attribution and drift Events: `agent.accounting`, `agent.usage`). Pure.

Those readers count a pod's cards from its assignment (`elasticgpu.io/assignment`, the
scheduler's Binding writes it), which a DRA pod does not have: its cards are its claims'. The
plugin's checkpoint knows every claim prepared on this node and each device's share
(`prepare.PreparedDevice.share`), so `with_holdings` gives each pod that uses prepared claims
the assignment they amount to, in memory only (never written to the API), and the shared
readers count DRA pods as they count device-plugin pods:

- a container holds the shares of the claims it names (`core.dra.pods.container_claims`; a
  template's claim through the pod's `status.resourceClaimStatuses`);
- a claim is held once: by its first container in the pod, and, shared by several pods, by
  the first of them by namespace and name (the others' processes on its cards then read as
  out-of-band memory, not as a second holder);
- only pods bound here and holding their cards (`core.podlife.holds_cards`) count, and a pod
  that already has an assignment keeps it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from elastic_gpu.agent.dra.prepare import PreparedClaim
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.dra.pods import container_claims
from elastic_gpu.core.podlife import holds_cards


def with_holdings(pods: Sequence[Mapping[str, Any]], node: str,
                  prepared: Iterable[PreparedClaim]) -> list[Mapping[str, Any]]:
    """`pods`, those holding prepared claims on `node` with the assignment they amount to."""
    shares: dict[tuple[str, str], tuple[CardShare, ...]] = {}
    for claim in prepared:
        held = tuple(d.share for d in claim.devices if d.share is not None and d.pool == node)
        if held:
            shares[(claim.ref.namespace, claim.ref.name)] = held
    if not shares:
        return list(pods)
    taken: set[tuple[str, str]] = set()
    out: list[Mapping[str, Any]] = []
    order = sorted(range(len(pods)), key=lambda i: (
        str((pods[i].get("metadata") or {}).get("namespace")),
        str((pods[i].get("metadata") or {}).get("name"))))
    decorated: dict[int, Mapping[str, Any]] = {}
    for i in order:
        pod = pods[i]
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if ((pod.get("spec") or {}).get("nodeName") != node or not holds_cards(pod)
                or ann.ASSIGNMENT in annotations):
            continue
        namespace = str(meta.get("namespace"))
        containers: dict[str, tuple[CardShare, ...]] = {}
        for container, refs in container_claims(pod).items():
            for name, _request in refs:
                key = (namespace, name)
                if key in shares and key not in taken:
                    taken.add(key)
                    containers[container] = (*containers.get(container, ()), *shares[key])
        if containers:
            assignment = Assignment(node, containers)
            decorated[i] = {**pod, "metadata": {**meta, "annotations": {
                **annotations, ann.ASSIGNMENT: assignment.to_json(), ann.ASSIGNED_NODE: node}}}
    for i, pod in enumerate(pods):
        out.append(decorated.get(i, pod))
    return out
