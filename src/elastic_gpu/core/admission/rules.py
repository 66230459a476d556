"""Admission's rules: what a pod must be to be admitted, each broken rule a `Refusal`.

Every resource value is read by the one parser of the resource table (`core.request`,
`core.resources`): the rules add no second reading of a quantity, only the checks that need the
cluster (largest node, models, policies: `facts.ClusterFacts`) and the checks of the
annotations the scheduler reads. A refusal is structured like `core.fit.FitFailure` and made
into one sentence at the edge by `describe`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.request import (
    INIT_CONTAINER_GPU_REASON,
    ContainerRequest,
    RequestKind,
    classic_init_containers,
    container_request,
    is_sidecar,
    lifetime_containers,
    parse_model_list,
)
from elastic_gpu.core.resources import MIG_RULE, Measure, ResourceError, lookup, short_repr

#: gpu-manager's runtime (vcuda) reads this pod annotation: set, the compute share is a hard
#: limit (the container may not use more than its `tencent.com/vcuda-core`); absent, it may
#: borrow idle compute.
VCUDA_CORE_LIMIT = "tencent.com/vcuda-core-limit"
VCUDA_CORE = "tencent.com/vcuda-core"

#: Pod label by which the webhook's registration leaves a pod (or namespace) alone.
OPT_OUT_LABEL = "elasticgpu.io/admission"
OPT_OUT_VALUE = "ignore"


class AdmissionRule(enum.Enum):
    """Which rule a pod breaks. The value is a stable key (metrics, logs, the message)."""

    #: a resource value breaks its row of the resource table (`resource`, `value`, `detail`)
    RESOURCE_VALUE = "resource-value"
    #: a `nvidia.com/mig-*` name that is not a MIG profile
    MIG_PROFILE = "mig-profile"
    #: one container asks for one measure twice, or for kinds that do not combine
    ONE_MEASURE = "one-measure"
    #: a classic init container (not a sidecar) asks for a GPU
    INIT_CONTAINER_GPU = "init-container-gpu"
    #: the pod's totals are out of bounds
    POD_TOTAL = "pod-total"
    #: more whole cards than the largest node has (`value` asked, `detail` the largest)
    EXCEEDS_LARGEST_NODE = "exceeds-largest-node"
    #: more memory per card than the largest card has
    EXCEEDS_CARD_MEMORY = "exceeds-card-memory"
    #: `elasticgpu.io/node-policy` / `card-policy` names no known policy
    UNKNOWN_POLICY = "unknown-policy"
    #: `elasticgpu.io/gpu-model` names only models no node has
    UNKNOWN_MODEL = "unknown-model"
    #: a MIG profile no node offers (while some node offers MIG profiles)
    UNKNOWN_MIG_PROFILE = "unknown-mig-profile"
    #: another annotation the scheduler or a runtime reads has a value it cannot read
    BAD_ANNOTATION = "bad-annotation"
    #: the object is not a pod of the expected shape (`resource` the field)
    MALFORMED = "malformed"
    #: an `egpuc.elasticgpu.io/*` annotation that names no container or claim properly
    CLAIM_ANNOTATION = "claim-annotation"
    #: the named ElasticGPUClaim does not exist in the pod's namespace
    CLAIM_NOT_FOUND = "claim-not-found"
    #: the named ElasticGPUClaim is being deleted
    CLAIM_DELETING = "claim-deleting"
    #: the container that names a claim also asks for GPU resources of its own
    CLAIM_CONTAINER_GPU = "claim-container-gpu"
    #: the claim's requests stand for no GPU
    CLAIM_REQUEST = "claim-request"
    #: a GPU pod created with `spec.nodeName`, which would skip the scheduler's Binding
    NODE_NAME = "node-name"
    #: a GPU asked both through a ResourceClaim of our DeviceClasses and device-plugin names
    DRA_AND_DEVICE_PLUGIN = "dra-and-device-plugin"
    #: a ResourceClaim or ResourceClaimTemplate the pod names does not exist
    DRA_CLAIM_NOT_FOUND = "dra-claim-not-found"
    #: a peer's field (HAMi, Volcano, KAI, Koordinator) with a value we cannot honour
    #: (`core.peers`; `resource` the peer's field)
    PEER_FIELD = "peer-field"


@dataclass(frozen=True)
class Refusal:
    """One broken rule. `container` "" means the pod as a whole."""

    rule: AdmissionRule
    #: the resource name, annotation key or field the rule is about
    resource: str = ""
    #: the value as written (already shortened), "" for rules about names
    value: str = ""
    #: the rule, in words a user can act on
    detail: str = ""
    container: str = ""
    init_container: bool = False


def describe(refusal: Refusal) -> str:
    """One refusal as a sentence: where, what, the value and the rule (with its key)."""
    where = ""
    if refusal.container:
        where = f"{'init container' if refusal.init_container else 'container'} {refusal.container}: "
    what = refusal.resource
    if refusal.value:
        what = f"{what}={refusal.value}" if what else refusal.value
    body = f"{what}: {refusal.detail}" if what else refusal.detail
    return f"{where}{body} (rule {refusal.rule.value})"


def describe_all(refusals: Sequence[Refusal]) -> str:
    return "; ".join(describe(r) for r in refusals)


# --- validation ---------------------------------------------------------------------------


def shape(pod: Any) -> list[Refusal]:
    """The parts of a pod admission reads have the types the API gives them."""
    def bad(path: str, what: str) -> list[Refusal]:
        return [Refusal(AdmissionRule.MALFORMED, path, "", f"must be {what}")]

    if not isinstance(pod, Mapping):
        return bad("object", "a pod (a JSON object)")
    meta = pod.get("metadata", {})
    if not isinstance(meta, Mapping):
        return bad("metadata", "an object")
    annotations = meta.get("annotations")
    if annotations is not None and not (isinstance(annotations, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in annotations.items())):
        return bad("metadata.annotations", "an object of strings")
    spec = pod.get("spec", {})
    if not isinstance(spec, Mapping):
        return bad("spec", "an object")
    for field_name in ("containers", "initContainers"):
        containers = spec.get(field_name)
        if containers is None:
            continue
        if not isinstance(containers, list):
            return bad(f"spec.{field_name}", "a list")
        for i, container in enumerate(containers):
            path = f"spec.{field_name}[{i}]"
            if not isinstance(container, Mapping):
                return bad(path, "an object")
            if not isinstance(container.get("name", ""), str):
                return bad(f"{path}.name", "a string")
            resources = container.get("resources")
            if resources is None:
                continue
            if not isinstance(resources, Mapping):
                return bad(f"{path}.resources", "an object")
            for part in ("requests", "limits"):
                values = resources.get(part)
                if values is not None and not (isinstance(values, Mapping) and all(
                        isinstance(k, str) for k in values)):
                    return bad(f"{path}.resources.{part}", "an object")
    overhead = spec.get("overhead")
    if overhead is not None and not isinstance(overhead, Mapping):
        return bad("spec.overhead", "an object")
    pod_level = spec.get("resources")
    if pod_level is not None and not (isinstance(pod_level, Mapping) and all(
            isinstance(pod_level.get(part) or {}, Mapping) for part in ("requests", "limits"))):
        return bad("spec.resources", "an object of requests and limits")
    return []


def from_resource_error(err: ResourceError, container: str = "",
                         init: bool = False) -> Refusal:
    if err.rule == MIG_RULE:
        rule = AdmissionRule.MIG_PROFILE
    elif err.value == "":
        rule = AdmissionRule.ONE_MEASURE if container else AdmissionRule.POD_TOTAL
    else:
        rule = AdmissionRule.RESOURCE_VALUE
    value = "" if err.value == "" else short_repr(err.value)
    return Refusal(rule, err.resource, value, err.rule, container, init)


def check_containers(pod: Mapping[str, Any]) -> tuple[list[Refusal], list[ContainerRequest]]:
    """Each container's request read (a refusal for each that cannot be), and the requests of
    the containers that may hold a GPU (`lifetime_containers`: sidecars and regular
    containers); a classic init container asking a GPU is refused with the reason."""
    refusals: list[Refusal] = []
    requests: list[ContainerRequest] = []
    for item in classic_init_containers(pod) + lifetime_containers(pod):
        init = item.field == "initContainers"
        try:
            request = container_request(item.name, item.resources)
        except ResourceError as err:
            refusals.append(from_resource_error(err, item.name, init))
            continue
        if init and not is_sidecar(item.container):
            if request.wants_gpu:
                refusals.append(Refusal(
                    AdmissionRule.INIT_CONTAINER_GPU, ", ".join(request.resources), "",
                    INIT_CONTAINER_GPU_REASON, item.name, True))
        else:
            requests.append(request)
    return refusals, requests


def check_capacity(requests: Sequence[ContainerRequest], facts: ClusterFacts) -> list[Refusal]:
    refusals: list[Refusal] = []
    if facts.largest_cards > 0:
        largest = (f"no node could ever hold it: the largest node, {facts.largest_cards_node}, "
                   f"has {facts.largest_cards} cards")
        for request in requests:
            if request.kind is RequestKind.WHOLE and request.cards > facts.largest_cards:
                refusals.append(Refusal(AdmissionRule.EXCEEDS_LARGEST_NODE,
                                        ", ".join(request.resources), f"{request.cards} cards",
                                        largest, request.name))
            elif request.multi_share and request.cards > facts.largest_cards:
                refusals.append(Refusal(
                    AdmissionRule.EXCEEDS_LARGEST_NODE, ", ".join(request.resources),
                    f"{request.cards} shares",
                    f"a share on each of {request.cards} distinct cards of one node; {largest}",
                    request.name))
        total = sum(r.cards for r in requests if r.kind is RequestKind.WHOLE)
        if not refusals and total > facts.largest_cards:
            names = ", ".join(sorted({n for r in requests for n in r.resources}))
            refusals.append(Refusal(AdmissionRule.EXCEEDS_LARGEST_NODE, names,
                                    f"{total} cards in all containers", largest))
    if facts.largest_card_memory_mib > 0:
        for request in requests:
            if request.kind in (RequestKind.SHARE, RequestKind.WHOLE) and \
                    request.memory_mib > facts.largest_card_memory_mib:
                memory = [n for n in request.resources if (s := lookup(n)) and
                          s.measure is Measure.MEMORY]
                refusals.append(Refusal(
                    AdmissionRule.EXCEEDS_CARD_MEMORY, ", ".join(memory),
                    f"{request.memory_mib} MiB per card",
                    f"no card could ever hold it: the largest card ({facts.largest_memory_node}) "
                    f"has {facts.largest_card_memory_mib} MiB", request.name))
    if facts.mig_profiles:
        for request in requests:
            if request.kind is RequestKind.MIG and request.mig_profile is not None and \
                    request.mig_profile.resource_name not in facts.mig_profiles:
                refusals.append(Refusal(
                    AdmissionRule.UNKNOWN_MIG_PROFILE, request.mig_profile.resource_name, "",
                    f"no node offers this MIG profile; the cluster's: "
                    f"{', '.join(sorted(facts.mig_profiles))}", request.name))
    return refusals


def check_annotations(annotations: Mapping[str, str], facts: ClusterFacts) -> list[Refusal]:
    refusals: list[Refusal] = []
    for key, known in ((ann.NODE_POLICY, facts.node_policies),
                       (ann.CARD_POLICY, facts.card_policies)):
        value = annotations.get(key)
        if value is not None and known is not None and value not in known:
            refusals.append(Refusal(AdmissionRule.UNKNOWN_POLICY, key, short_repr(value),
                                    f"not a known policy; known: {', '.join(sorted(known))}"))
    for key in (ann.GPU_MODEL_ALLOW, ann.GPU_MODEL_DENY):
        value = annotations.get(key)
        if value is not None and value.strip() and not parse_model_list(value):
            refusals.append(Refusal(AdmissionRule.BAD_ANNOTATION, key, short_repr(value),
                                    "a list of card models separated by | or , (e.g. A100|H100)"))
    allowed = parse_model_list(annotations.get(ann.GPU_MODEL_ALLOW))
    if allowed and facts.models and not allowed & facts.models:
        refusals.append(Refusal(
            AdmissionRule.UNKNOWN_MODEL, ann.GPU_MODEL_ALLOW,
            short_repr(annotations[ann.GPU_MODEL_ALLOW]),
            f"no node has a card of these models; the cluster's models: "
            f"{', '.join(sorted(facts.models))}"))
    limit = annotations.get(VCUDA_CORE_LIMIT)
    if limit is not None and not (limit.isascii() and limit.isdigit() and 1 <= int(limit) <= 100):
        refusals.append(Refusal(AdmissionRule.BAD_ANNOTATION, VCUDA_CORE_LIMIT, short_repr(limit),
                                "gpu-manager's hard compute limit: an integer 1-100 (percent)"))
    return refusals



def check_node_name(pod: Mapping[str, Any]) -> list[Refusal]:
    """A GPU pod is placed by the scheduler, whose Binding writes its cards: one created with
    `spec.nodeName` would go to its node without any, and the cards it used there would be in
    no ledger (docs/architecture.md, "Who writes the ledger"). kube-scheduler honours a
    nodeSelector on the node's hostname label and then asks the extender as for any pod."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return []
    return [Refusal(
        AdmissionRule.NODE_NAME, "spec.nodeName", short_repr(node),
        "a GPU pod may not be created bound to a node: its cards are chosen and recorded by "
        "the Elastic GPU scheduler when it binds the pod; to pin it to that node, use "
        f"spec.nodeSelector: {{kubernetes.io/hostname: {short_repr(node)}}} instead")]
