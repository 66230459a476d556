"""Many claims and the pods that consume them, and the independent checks after a burst.

Used by the claims restart test (tests/integration/claims/test_claims_restart.py) and the
claims benchmark. The checks read claims, ElasticGPUs and pods back from the API and use none
of the controller's or the extender's code but the assignment decoder:

- no card carries more than it has, counting every ElasticGPU's cards (any phase: Released
  ones hold theirs too) plus the pods' own shares (a container whose cards come from a claim
  is counted once, under its ElasticGPU: it must name exactly that ElasticGPU's cards);
- no claim is bound twice: at most one ElasticGPU points at a claim uid, and no two claims
  name one ElasticGPU;
- nothing is lost: every ElasticGPU that names a claim points at a live claim bound to it
  (an orphan would hold cards forever), every Bound claim's ElasticGPU exists and points back,
  every pod naming a Bound claim runs on its ElasticGPU's node with its cards;
- every claim still Pending could not fit anywhere (an Immediate claim that fits is bound).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from egpu_testing.workbench import CardUse, card_use_from_pods, overcommitted, pod_manifest
from elastic_gpu.api import elasticgpu as api
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.annotations import CLAIM_PREFIX
from elastic_gpu.core.model import Node

SHARE = "gpushare.provisioner.elasticgpu.io"
PERCENTS = (10, 20, 25, 30, 40, 50)


def register_kinds() -> None:
    """Make lightkube (`codecs.from_dict`, `client.create`) know the claim kinds, so that
    `scenario.create_pods` creates claims and pods alike."""
    from lightkube.generic_resource import create_global_resource, create_namespaced_resource

    create_namespaced_resource(api.GROUP, api.VERSION, api.CLAIM_KIND, api.CLAIM_PLURAL)
    create_global_resource(api.GROUP, api.VERSION, api.CLASS_KIND, api.CLASS_PLURAL)
    create_global_resource(api.GROUP, api.VERSION, api.EGPU_KIND, api.EGPU_PLURAL)


def claim_manifests(count: int, namespace: str, class_names: Sequence[str], seed: int = 0,
                    prefix: str = "claim") -> list[dict[str, Any]]:
    """Share claims of 10-50% of a card and 1-16 GiB, cycling through `class_names`."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        out.append({
            "apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND,
            "metadata": {"name": f"{prefix}-{i:04d}", "namespace": namespace},
            "spec": {"egpuClassName": class_names[i % len(class_names)],
                     "resources": {"requests": {
                         f"{SHARE}/gpu-core": rng.choice(PERCENTS),
                         f"{SHARE}/gpu-memory": rng.randrange(1, 17) * 1024}}}})
    return out


def consumer_pod(claim: Mapping[str, Any], scheduler_name: str, container: str = "main"
                 ) -> dict[str, Any]:
    """A pod naming `claim`, its container carrying the claim's resources in canonical names
    (what the admission webhook adds; this test exercises the controller and the extender)."""
    requests = claim["spec"]["resources"]["requests"]
    limits = {"elasticgpu.io/gpu-core": str(requests[f"{SHARE}/gpu-core"]),
              "elasticgpu.io/gpu-memory": str(requests[f"{SHARE}/gpu-memory"])}
    meta = claim["metadata"]
    return pod_manifest(f"{meta['name']}-pod", meta["namespace"],
                        containers={container: limits},
                        annotations={f"{CLAIM_PREFIX}{container}": meta["name"]},
                        scheduler_name=scheduler_name)


@dataclass
class ClaimsReport:
    claims: int
    bound: int
    egpus: int
    pods_bound: int
    overcommitted: list[str] = field(default_factory=list)
    bound_twice: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    pending_but_fit: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.overcommitted or self.bound_twice or self.lost or self.pending_but_fit)

    def summary(self) -> str:
        return (f"{self.bound}/{self.claims} claims Bound, {self.egpus} ElasticGPUs, "
                f"{self.pods_bound} pods bound; overcommitted={self.overcommitted[:3]} "
                f"bound_twice={self.bound_twice[:3]} lost={self.lost[:5]} "
                f"pending_but_fit={self.pending_but_fit[:3]}")


def _shares(entries: Iterable[Mapping[str, Any]]) -> list[tuple[int, str, int, int]]:
    return sorted((int(s["index"]), str(s.get("uuid")), int(s["milli"]), int(s["memoryMiB"]))
                  for s in entries)


def card_use_with_elasticgpus(pods: Sequence[Mapping[str, Any]],
                              egpus: Sequence[Mapping[str, Any]]
                              ) -> dict[tuple[str, int], CardUse]:
    """What each card carries: the pods' own shares and every ElasticGPU's cards."""
    # Pods first, without their claim-backed containers (checked against the ElasticGPU below).
    stripped = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(ann.ASSIGNMENT)
        if text:
            body = json.loads(text)
            claimed = body.get("claims") or {}
            body["containers"] = {c: s for c, s in (body.get("containers") or {}).items()
                                  if c not in claimed}
            body.pop("claims", None)
            pod = {**pod, "metadata": {**meta, "annotations": {
                **(meta.get("annotations") or {}), ann.ASSIGNMENT: json.dumps(body)}}}
        stripped.append(pod)
    use = card_use_from_pods(stripped)
    for egpu in egpus:
        spec = egpu.get("spec") or {}
        node = spec.get("node")
        for share in spec.get("cards") or []:
            key = (str(node), int(share["index"]))
            old = use.get(key, CardUse())
            use[key] = CardUse(old.milli + int(share["milli"]),
                               old.memory_mib + int(share["memoryMiB"]),
                               (*old.pods, f"elasticgpu:{egpu['metadata']['name']}"))
    return use


def check_claims(claims: Sequence[Mapping[str, Any]], egpus: Sequence[Mapping[str, Any]],
                 pods: Sequence[Mapping[str, Any]], nodes: Sequence[Node]) -> ClaimsReport:
    use = card_use_with_elasticgpus(pods, egpus)
    by_name = {e["metadata"]["name"]: e for e in egpus}
    claim_by_key = {f"{c['metadata']['namespace']}/{c['metadata']['name']}": c for c in claims}
    report = ClaimsReport(len(claims), 0, len(egpus), 0, overcommitted(use, nodes))

    refs = Counter(str(((e.get("spec") or {}).get("claimRef") or {}).get("uid") or "")
                   for e in egpus)
    report.bound_twice += [f"claim uid {uid} is named by {n} ElasticGPUs"
                           for uid, n in refs.items() if uid and n > 1]
    named = Counter(str((c.get("spec") or {}).get("elasticGPUName") or "") for c in claims)
    report.bound_twice += [f"ElasticGPU {name} is named by {n} claims"
                           for name, n in named.items() if name and n > 1]

    for egpu in egpus:
        ref = (egpu.get("spec") or {}).get("claimRef") or {}
        if not ref.get("uid"):
            continue
        claim = claim_by_key.get(f"{ref.get('namespace')}/{ref.get('name')}")
        if claim is None or claim["metadata"]["uid"] != ref["uid"]:
            if (egpu.get("status") or {}).get("phase") != "Released":
                report.lost.append(f"ElasticGPU {egpu['metadata']['name']} holds cards for a "
                                   f"claim that is gone ({ref})")
        elif (claim.get("status") or {}).get("phase") != "Bound":
            report.lost.append(f"ElasticGPU {egpu['metadata']['name']} names claim "
                               f"{ref['name']}, which is {(claim.get('status') or {}).get('phase')}")

    pending_requests: list[tuple[str, int, int]] = []
    for claim in claims:
        key = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
        status = claim.get("status") or {}
        if status.get("phase") == "Bound":
            report.bound += 1
            egpu = by_name.get(str((claim.get("spec") or {}).get("elasticGPUName")))
            ref = ((egpu or {}).get("spec") or {}).get("claimRef") or {}
            if egpu is None or ref.get("uid") != claim["metadata"]["uid"]:
                report.lost.append(f"claim {key} is Bound but its ElasticGPU does not point back")
        else:
            requests = claim["spec"]["resources"]["requests"]
            pending_requests.append((key, int(requests[f"{SHARE}/gpu-core"]) * 10,
                                     int(requests[f"{SHARE}/gpu-memory"])))

    for pod in pods:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        names = {k[len(CLAIM_PREFIX):]: v for k, v in (meta.get("annotations") or {}).items()
                 if k.startswith(CLAIM_PREFIX)}
        node = (pod.get("spec") or {}).get("nodeName")
        for container, claim_name in names.items():
            claim = claim_by_key.get(f"{meta.get('namespace')}/{claim_name}")
            bound = claim is not None and (claim.get("status") or {}).get("phase") == "Bound"
            if not node:
                continue
            if not bound:
                report.lost.append(f"pod {key} is bound but its claim {claim_name} is not")
                continue
            assert claim is not None
            egpu = by_name[str(claim["spec"]["elasticGPUName"])]
            body = json.loads((meta.get("annotations") or {}).get(ann.ASSIGNMENT) or "{}")
            if node != egpu["spec"]["node"]:
                report.lost.append(f"pod {key} runs on {node}, its ElasticGPU on "
                                   f"{egpu['spec']['node']}")
            elif (body.get("claims") or {}).get(container) != egpu["metadata"]["name"] or \
                    _shares((body.get("containers") or {}).get(container) or []) != \
                    _shares(egpu["spec"].get("cards") or []):
                report.lost.append(f"pod {key} container {container} does not hold exactly its "
                                   f"ElasticGPU {egpu['metadata']['name']}'s cards")
        if node:
            report.pods_bound += 1

    cards = [(n.name, c) for n in nodes for c in n.cards]
    for key, milli, memory in pending_requests:
        for node_name, card in cards:
            u = use.get((node_name, card.index), CardUse())
            if card.compute_milli - u.milli >= milli and card.memory_mib - u.memory_mib >= memory:
                report.pending_but_fit.append(f"claim {key} ({milli} milli, {memory} MiB) is "
                                              f"pending but fits {node_name} card {card.index}")
                break
    return report
