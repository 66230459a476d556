"""Admission: is a pod acceptable, and what patch completes it? Pure decisions, no I/O.

`admit(pod, facts)` reads a pod (a plain dict, as an AdmissionReview carries it) and the few
cluster facts it needs (`ClusterFacts`: the largest node's cards and per-card memory, the card
models, the known policies) and returns a `Verdict`: the rules the pod breaks (`Refusal`s,
structured like `core.fit.FitFailure`, made into one sentence at the edge by `describe`) and,
when it is allowed, a minimal JSON Patch (RFC 6902) made by the `MUTATORS`.

Every resource value is read by the one parser of the resource table (`core.request`,
`core.resources`): admission adds no second reading of a quantity, only the checks that need the
cluster (largest node, models, policies) and the checks of the annotations the scheduler reads.

Mutators are a list: each gets the pod as the earlier mutators left it and returns JSON Patch
operations; `admit` applies them in turn. A mutator returns nothing for a pod it already
mutated, so the patch is empty under reinvocation (`reinvocationPolicy: IfNeeded`). The MIG
adapter and the budgets add theirs to `MUTATORS` (or pass their own list).

Claims (issue #15): a pod naming ElasticGPUClaims by `egpuc.elasticgpu.io/<container>: <claim>`
is checked against the claims it names (`PodClaims`, looked up by the adapter: they exist in
the pod's namespace, are not being deleted, and the container asks no GPU of its own), and the
first mutator, `claim_resources`, adds each claim's requests to its container, translated to
the names the agent advertises (`claim_container_resources`). Validation applies that mutation
first, so every other check sees the container as it will be stored.

Budgets (issue #17): the last mutator, `budget_priority`, gives a GPU pod of a namespace over
its GPU budget the lower PriorityClass (`core.budget.PriorityDowngrade`, looked up by the
adapter and passed as `admit(..., budget=)`).
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.budget import FINALIZER, PriorityDowngrade
from elastic_gpu.core.claims.model import Claim
from elastic_gpu.core.claims.pods import ClaimAnnotationError, pod_claims
from elastic_gpu.core.mig.rules import MIG_ORIGINAL, MIG_SUBSTITUTION, SubstitutionRule
from elastic_gpu.core.nodefit import NODE_CORE, node_core
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.request import (
    ContainerRequest,
    PodRequest,
    RequestKind,
    container_request,
    parse_model_list,
    pod_request_from_manifest,
)
from elastic_gpu.core.resources import (
    GPU_CORE,
    GPU_MEMORY,
    GPU_WHOLE,
    MIG_RULE,
    MILLI_PER_CARD,
    MILLI_PER_PERCENT,
    Measure,
    ResourceError,
    lookup,
    short_repr,
    to_amount,
)

#: gpu-manager's runtime (vcuda) reads this pod annotation: set, the compute share is a hard
#: limit (the container may not use more than its `tencent.com/vcuda-core`); absent, it may
#: borrow idle compute.
VCUDA_CORE_LIMIT = "tencent.com/vcuda-core-limit"
VCUDA_CORE = "tencent.com/vcuda-core"
#: Memory resources served by a device plugin: a container asking only for one of these gets an
#: Allocate from kubelet. The other memory names are advertised in the Node's status only (see
#: docs/agent.md, `resources.memory`), so kubelet calls no Allocate for them.
DEVICE_PLUGIN_MEMORY = frozenset({"tencent.com/vcuda-memory"})
#: The compute share a memory-only share is given so that kubelet calls the agent's Allocate:
#: one device of `elasticgpu.io/gpu-core`, 1% of the card.
MEMORY_ONLY_COMPUTE = (GPU_CORE, "1")
#: Pod label by which the webhook's registration leaves a pod (or namespace) alone.
OPT_OUT_LABEL = "elasticgpu.io/admission"
OPT_OUT_VALUE = "ignore"
#: Node labels naming the card model (the agent's, NVIDIA's GPU feature discovery's).
MODEL_LABELS = (ann.GPU_MODEL_LABEL, "nvidia.com/gpu.product")


class AdmissionRule(enum.Enum):
    """Which rule a pod breaks. The value is a stable key (metrics, logs, the message)."""

    #: a resource value breaks its row of the resource table (`resource`, `value`, `detail`)
    RESOURCE_VALUE = "resource-value"
    #: a `nvidia.com/mig-*` name that is not a MIG profile
    MIG_PROFILE = "mig-profile"
    #: one container asks for one measure twice, or for kinds that do not combine
    ONE_MEASURE = "one-measure"
    #: an init container asks for a GPU
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


@dataclass(frozen=True)
class ClusterFacts:
    """What admission knows of the cluster. Checks against nodes are skipped while no GPU
    node is known (a cluster scaling up from zero must still admit its GPU pods)."""

    #: the most whole cards one node has, and that node
    largest_cards: int = 0
    largest_cards_node: str = ""
    #: the most memory one card has (MiB), and a node with such a card
    largest_card_memory_mib: int = 0
    largest_memory_node: str = ""
    #: card models some node has
    models: frozenset[str] = frozenset()
    #: MIG resource names some node offers (`nvidia.com/mig-3g.40gb`, ...)
    mig_profiles: frozenset[str] = frozenset()
    #: None: the names are not checked
    node_policies: frozenset[str] | None = None
    card_policies: frozenset[str] | None = None
    #: the MIG adapter's rules (MIGSubstitution objects, as the adapter watches them)
    mig_substitutions: tuple[SubstitutionRule, ...] = ()


@dataclass(frozen=True)
class NodeGpus:
    """What one Node's status says of its GPUs."""

    name: str
    cards: int
    memory_mib_per_card: int
    model: str = ""
    mig_profiles: frozenset[str] = frozenset()


def node_gpus(node: Mapping[str, Any]) -> NodeGpus | None:
    """A Node dict's cards (the most any GPU resource of its capacity stands for: whole-card
    counts, compute shares / 1000 milli), per-card memory and MIG profiles; None for a node
    without GPUs or one whose capacity cannot be read."""
    if not isinstance(node, Mapping):
        return None
    meta = node.get("metadata")
    status = node.get("status")
    if not isinstance(meta, Mapping) or not isinstance(status, Mapping):
        return None
    capacity = status.get("capacity")
    if not isinstance(capacity, Mapping):
        return None
    cards = 0
    memory_total = 0
    migs: set[str] = set()
    for key, raw in capacity.items():
        try:
            spec = lookup(str(key))
            if spec is None or not isinstance(raw, (str, int)):
                continue
            quantity = parse_quantity(raw)
        except (ResourceError, QuantityError):
            continue
        if quantity.denominator != 1 or quantity <= 0:
            continue
        amount = quantity.numerator * spec.scale
        if spec.measure is Measure.CARDS:
            cards = max(cards, amount)
        elif spec.measure is Measure.COMPUTE:
            cards = max(cards, amount // MILLI_PER_CARD)
        elif spec.measure is Measure.MEMORY:
            memory_total = max(memory_total, amount)
        elif spec.measure is Measure.MIG:
            migs.add(spec.name)
    if cards == 0 and not migs:
        return None
    raw_labels = meta.get("labels")
    labels: Mapping[str, Any] = raw_labels if isinstance(raw_labels, Mapping) else {}
    model = next((str(labels[k]) for k in MODEL_LABELS if isinstance(labels.get(k), str)), "")
    return NodeGpus(str(meta.get("name", "")), cards, memory_total // cards if cards else 0, model,
                    frozenset(migs))


def facts_from_nodes(nodes: Iterable[NodeGpus], *,
                     node_policies: Iterable[str] | None = None,
                     card_policies: Iterable[str] | None = None) -> ClusterFacts:
    """The cluster facts from its GPU nodes (ties: the first name in order wins)."""
    ordered = sorted(nodes, key=lambda n: n.name)
    biggest = max(ordered, key=lambda n: n.cards, default=None)
    memory = max(ordered, key=lambda n: n.memory_mib_per_card, default=None)
    return ClusterFacts(
        largest_cards=biggest.cards if biggest else 0,
        largest_cards_node=biggest.name if biggest else "",
        largest_card_memory_mib=memory.memory_mib_per_card if memory else 0,
        largest_memory_node=memory.name if memory else "",
        models=frozenset(n.model for n in ordered if n.model),
        mig_profiles=frozenset(m for n in ordered for m in n.mig_profiles),
        node_policies=frozenset(node_policies) if node_policies is not None else None,
        card_policies=frozenset(card_policies) if card_policies is not None else None,
    )


def default_policies() -> tuple[frozenset[str], frozenset[str]]:
    """The node and card policy names the scheduler knows (its registries)."""
    from elastic_gpu.core.policies import CARD_POLICIES, NODE_POLICIES

    return frozenset(NODE_POLICIES), frozenset(CARD_POLICIES)


# --- validation ---------------------------------------------------------------------------


def _shape(pod: Any) -> list[Refusal]:
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
    return []


def _from_resource_error(err: ResourceError, container: str = "",
                         init: bool = False) -> Refusal:
    if err.rule == MIG_RULE:
        rule = AdmissionRule.MIG_PROFILE
    elif err.value == "":
        rule = AdmissionRule.ONE_MEASURE if container else AdmissionRule.POD_TOTAL
    else:
        rule = AdmissionRule.RESOURCE_VALUE
    value = "" if err.value == "" else short_repr(err.value)
    return Refusal(rule, err.resource, value, err.rule, container, init)


def _containers(pod: Mapping[str, Any], field_name: str) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return list(spec.get(field_name) or [])


def _check_containers(pod: Mapping[str, Any]) -> tuple[list[Refusal], list[ContainerRequest]]:
    refusals: list[Refusal] = []
    requests: list[ContainerRequest] = []
    for field_name, init in (("initContainers", True), ("containers", False)):
        for container in _containers(pod, field_name):
            name = str(container.get("name") or "?")
            try:
                request = container_request(name, container.get("resources") or {})
            except ResourceError as err:
                refusals.append(_from_resource_error(err, name, init))
                continue
            if init and request.wants_gpu:
                refusals.append(Refusal(
                    AdmissionRule.INIT_CONTAINER_GPU, ", ".join(request.resources), "",
                    "GPUs are given to regular containers only; move the GPU request to a "
                    "container of spec.containers", name, True))
            elif not init:
                requests.append(request)
    return refusals, requests


def _check_capacity(requests: Sequence[ContainerRequest], facts: ClusterFacts) -> list[Refusal]:
    refusals: list[Refusal] = []
    if facts.largest_cards > 0:
        largest = (f"no node could ever hold it: the largest node, {facts.largest_cards_node}, "
                   f"has {facts.largest_cards} cards")
        for request in requests:
            if request.kind is RequestKind.WHOLE and request.cards > facts.largest_cards:
                refusals.append(Refusal(AdmissionRule.EXCEEDS_LARGEST_NODE,
                                        ", ".join(request.resources), f"{request.cards} cards",
                                        largest, request.name))
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


def _check_annotations(annotations: Mapping[str, str], facts: ClusterFacts) -> list[Refusal]:
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



def _check_node_name(pod: Mapping[str, Any]) -> list[Refusal]:
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


# --- claims -------------------------------------------------------------------------------

#: The whole-card resource the agent advertises by default (`resources.gpu`, docs/agent.md).
CARD_RESOURCE = "nvidia.com/gpu"
#: What a claim's request becomes in its container: per measure of the resource table, the
#: name the agent advertises by default (device-plugin resources, so that kubelet calls the
#: agent's Allocate, and managed by the extender in kube-scheduler's configuration). A compute
#: request of whole cards (gpu-core: 200) becomes that many cards; MIG names are kept.
CLAIM_RESOURCE_NAMES: Mapping[Measure, str] = {
    Measure.COMPUTE: GPU_CORE,
    Measure.MEMORY: GPU_MEMORY,
    Measure.CARDS: CARD_RESOURCE,
}


def claim_container_resources(requests: Mapping[str, int | str]) -> dict[str, str]:
    """A claim's `spec.resources.requests` as a container's resources under the names the
    agent advertises (`CLAIM_RESOURCE_NAMES`), each value converted through the resource
    table's units (`tencent.com/vcuda-memory: 4` is 1024 MiB of `elasticgpu.io/gpu-memory`).
    Raises `ResourceError` (resource, value, rule) for a value that breaks its row."""
    out: dict[str, str] = {}
    for name in sorted(requests):
        amount = to_amount(name, requests[name])
        measure = amount.spec.measure
        if measure is Measure.MIG:
            target, value = amount.spec.name, amount.value
        elif measure is Measure.COMPUTE and amount.whole_cards:
            target, value = CLAIM_RESOURCE_NAMES[Measure.CARDS], amount.whole_cards
        else:
            target = CLAIM_RESOURCE_NAMES[measure]
            spec = lookup(target)
            assert spec is not None and spec.measure is measure
            if amount.value % spec.scale:
                raise ResourceError(name, requests[name], f"not a whole number of {spec.doc}")
            value = amount.value // spec.scale
        if target in out:
            raise ResourceError(", ".join(sorted(requests)), "",
                                f"the claim asks for {measure.value} twice; use one name")
        out[target] = str(value)
    return out


@dataclass(frozen=True)
class PodClaims:
    """The ElasticGPUClaims a pod names, as the adapter found them in the pod's namespace:
    claim name -> the claim, or None when it does not exist there (a name missing from the
    mapping counts as not existing)."""

    namespace: str = "default"
    claims: Mapping[str, Claim | None] = field(default_factory=dict)


def claim_names(pod: Any) -> frozenset[str]:
    """The claim names a pod's annotations name (what the adapter must look up); empty for a
    pod whose claim annotations cannot be read (admission refuses it, naming why)."""
    try:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if not any(isinstance(k, str) and k.startswith(ann.CLAIM_PREFIX) for k in annotations):
            return frozenset()
        return frozenset(pod_claims(pod).values())
    except (ClaimAnnotationError, AttributeError, TypeError):
        return frozenset()


def _claim_key(annotations: Mapping[str, str], container: str, claim: str) -> str:
    """The annotation that made `container` use `claim` (for messages)."""
    own = f"{ann.CLAIM_PREFIX}{container}"
    if annotations.get(own) == claim:
        return own
    return next((k for k in sorted(annotations) if k.startswith(ann.CLAIM_PREFIX)
                 and annotations[k] == claim), own)


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        return parse_quantity(a) == parse_quantity(b)
    except (QuantityError, TypeError, ValueError):
        return False


def _own_gpu_resources(resources: Mapping[str, Any], wanted: Mapping[str, str]) -> list[str]:
    """The GPU resources of a container that are not the claim's (a name the claim's
    translation lacks, or another value): a container carrying exactly the claim's resources
    (mutated already: a reinvocation) has none."""
    own: set[str] = set()
    for part in ("limits", "requests"):
        for key, value in (resources.get(part) or {}).items():
            try:
                gpu = lookup(key) is not None
            except ResourceError:
                gpu = True
            if gpu and not (key in wanted and _same_quantity(value, wanted[key])):
                own.add(key)
    return sorted(own)


@dataclass(frozen=True)
class _ClaimPlan:
    """What the claims a pod names mean: the refusals, or per container index the resources
    to add (and the claim behind each container, for messages)."""

    refusals: list[Refusal]
    resources: dict[int, dict[str, str]]
    sources: dict[str, str]


def _claim_plan(pod: Mapping[str, Any], claims: PodClaims) -> _ClaimPlan:
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    if not any(k.startswith(ann.CLAIM_PREFIX) for k in annotations):
        return _ClaimPlan([], {}, {})
    try:
        named = pod_claims(pod)
    except ClaimAnnotationError as err:
        return _ClaimPlan([Refusal(AdmissionRule.CLAIM_ANNOTATION, "", "", str(err))], {}, {})
    namespace = claims.namespace
    index = {str(c.get("name")): i for i, c in enumerate(_containers(pod, "containers"))}
    refusals: list[Refusal] = []
    resources: dict[int, dict[str, str]] = {}
    sources: dict[str, str] = {}
    for container, claim_name in sorted(named.items()):
        key = _claim_key(annotations, container, claim_name)
        claim = claims.claims.get(claim_name)
        where = f"ElasticGPUClaim {claim_name}"
        if claim is None:
            refusals.append(Refusal(AdmissionRule.CLAIM_NOT_FOUND, key, claim_name,
                                    f"{where} does not exist in namespace {namespace}; "
                                    "create it first", container))
            continue
        if claim.deleting:
            refusals.append(Refusal(AdmissionRule.CLAIM_DELETING, key, claim_name,
                                    f"{where} in namespace {namespace} is being deleted",
                                    container))
            continue
        try:
            wanted = claim_container_resources(claim.requests)
            gpu = container_request(container, {"limits": wanted}).wants_gpu
        except ResourceError as err:
            refusal = _from_resource_error(err, container)
            refusals.append(replace(refusal, detail=f"{refusal.detail} (in the requests of "
                                                    f"{where})"))
            continue
        if not gpu:
            refusals.append(Refusal(AdmissionRule.CLAIM_REQUEST, key, claim_name,
                                    f"{where} asks for no GPU (all its requests are 0)",
                                    container))
            continue
        spec = _containers(pod, "containers")[index[container]]
        own = _own_gpu_resources(spec.get("resources") or {}, wanted)
        if own:
            refusals.append(Refusal(
                AdmissionRule.CLAIM_CONTAINER_GPU, ", ".join(own), "",
                f"container {container} gets its GPUs from {where} ({key}); remove its own GPU "
                "resources, or the claim annotation", container))
            continue
        resources[index[container]] = wanted
        sources[container] = f"{namespace}/{claim_name}"
    return _ClaimPlan(refusals, resources, sources)


def _claim_ops(pod: Mapping[str, Any], plan: _ClaimPlan) -> list[PatchOp]:
    """Add each claim's resources to its container's limits and requests, where missing."""
    ops: list[PatchOp] = []
    containers = _containers(pod, "containers")
    for index, wanted in sorted(plan.resources.items()):
        resources = containers[index].get("resources")
        if not isinstance(resources, Mapping):
            ops.append({"op": "add", "path": pointer("spec", "containers", index, "resources"),
                        "value": {"limits": dict(wanted), "requests": dict(wanted)}})
            continue
        for part in ("limits", "requests"):
            values = resources.get(part)
            if not isinstance(values, Mapping):
                ops.append({"op": "add", "path": pointer("spec", "containers", index,
                                                         "resources", part),
                            "value": dict(wanted)})
                continue
            for name, value in wanted.items():
                if name not in values:
                    ops.append({"op": "add", "path": pointer("spec", "containers", index,
                                                             "resources", part, name),
                                "value": value})
    return ops


def validate(pod: Any, facts: ClusterFacts, claims: PodClaims | None = None
             ) -> tuple[list[Refusal], PodRequest | None]:
    """Every rule `pod` breaks (empty: none) and, when it breaks none, its `PodRequest`.
    The claims it names are checked first and their resources added to their containers
    (`claim_resources`), so the other checks and the request see the containers as they will
    be stored; a refusal about such a container names its claim."""
    refusals, request, _, _ = _validate(pod, facts, claims)
    return refusals, request


def _validate(pod: Any, facts: ClusterFacts, claims: PodClaims | None
              ) -> tuple[list[Refusal], PodRequest | None, list[PatchOp], Any]:
    """`validate`, plus the claims' operations and the pod they complete (for `admit`)."""
    shape = _shape(pod)
    if shape:
        return shape, None, [], pod
    plan = _claim_plan(pod, claims or PodClaims(_namespace(pod)))
    if plan.refusals:
        return plan.refusals, None, [], pod
    claim_ops: list[PatchOp] = []
    if plan.resources:
        claim_ops = _claim_ops(pod, plan)
        pod = apply_patch(pod, claim_ops)
    refusals, requests = _check_containers(pod)
    meta = pod.get("metadata") or {}
    refusals += _check_annotations(meta.get("annotations") or {}, facts)
    request: PodRequest | None = None
    if not refusals:
        try:
            request = pod_request_from_manifest(pod)
        except ResourceError as err:
            refusals.append(_from_resource_error(err))
        except ValueError as err:  # a container request the core model cannot hold
            refusals.append(Refusal(AdmissionRule.MALFORMED, "spec", "", str(err)))
    refusals += _check_capacity(requests, facts)
    if request is not None and request.wants_gpu:
        refusals += _check_node_name(pod)
    refusals = [replace(r, detail=f"{r.detail} (its GPU resources come from ElasticGPUClaim "
                                  f"{plan.sources[r.container]})")
                if r.container in plan.sources and not r.init_container else r
                for r in refusals]
    return refusals, (request if not refusals else None), claim_ops, pod


def _namespace(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("namespace") or "default")


# --- mutation -----------------------------------------------------------------------------

#: One JSON Patch operation, e.g. {"op": "add", "path": "/metadata/annotations/a", "value": "1"}.
PatchOp = dict[str, Any]


@dataclass(frozen=True)
class MutationInput:
    """What a mutator reads: the pod as the mutators before it left it, its parsed request
    (of the pod as admitted, with the resources of the claims it names), the cluster facts
    and the claims the pod names."""

    pod: Mapping[str, Any]
    request: PodRequest
    facts: ClusterFacts
    claims: PodClaims = field(default_factory=PodClaims)
    #: the lower PriorityClass while the pod's namespace is over its GPU budget (issue #17)
    budget: PriorityDowngrade | None = None
    #: the pod's namespace has a GPU budget (`core.budget.NamespaceBudget.budgeted`)
    budgeted: bool = False


Mutator = Callable[[MutationInput], list[PatchOp]]


def pointer(*parts: str | int) -> str:
    """A JSON Pointer (RFC 6901) from its unescaped parts."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def set_annotation(pod: Mapping[str, Any], key: str, value: str) -> PatchOp:
    """The operation that sets one annotation, whether or not the pod has any."""
    if not isinstance((pod.get("metadata") or {}).get("annotations"), Mapping):
        return {"op": "add", "path": "/metadata/annotations", "value": {key: value}}
    return {"op": "add", "path": pointer("metadata", "annotations", key), "value": value}


def claim_resources(data: MutationInput) -> list[PatchOp]:
    """Each container that names an ElasticGPUClaim gets the claim's requests in its limits
    and requests, under the names the agent advertises (`claim_container_resources`): the
    extender then places the pod (its managed resources) and kubelet calls the agent's
    Allocate for them. Idempotent: a container carrying them already gets nothing."""
    plan = _claim_plan(data.pod, data.claims)
    if plan.refusals:  # validation refused these already
        return []
    return _claim_ops(data.pod, plan)


def whole_cards_as_shares(data: MutationInput) -> list[PatchOp]:
    """`elasticgpu.io/gpu: N` is written as `elasticgpu.io/gpu-core: 100·N`, the same request
    (N exclusive whole cards, `core.request`) under the name every agent's share plugin
    advertises by default. No default node advertises `elasticgpu.io/gpu` (the whole-card
    plugin is the vendor's name, `nvidia.com/gpu`), and kubelet calls Allocate only for a name a
    device plugin registered: written as it is, the pod could never run with its card. Written
    as shares, kubelet calls the agent's share Allocate, which hands over the cards the
    scheduler assigned (docs/architecture.md, "`elasticgpu.io/gpu`: served as shares").
    Idempotent: the rewritten container no longer has the name."""
    ops: list[PatchOp] = []
    for index, container in enumerate(_containers(data.pod, "containers")):
        resources = container.get("resources") if isinstance(container, Mapping) else None
        if not isinstance(resources, Mapping):
            continue
        for part in ("limits", "requests"):
            values = resources.get(part)
            if not isinstance(values, Mapping) or GPU_WHOLE not in values:
                continue
            try:
                cards = to_amount(GPU_WHOLE, values[GPU_WHOLE]).value
            except ResourceError:
                # validation read the limits (they win); requests that differ from them are
                # refused by kube-apiserver itself, in its words
                continue
            ops.append({"op": "remove",
                        "path": pointer("spec", "containers", index, "resources", part,
                                        GPU_WHOLE)})
            ops.append({"op": "add",
                        "path": pointer("spec", "containers", index, "resources", part,
                                        GPU_CORE),
                        "value": str(cards * MILLI_PER_CARD // MILLI_PER_PERCENT)})
    return ops


def memory_only_compute(data: MutationInput) -> list[PatchOp]:
    """A memory-only share written with a memory name kubelet does not Allocate (advertised in
    the Node's status only) also asks for `elasticgpu.io/gpu-core: 1`, one device of the
    agent's share plugin: kubelet then calls the agent's Allocate, which hands over the card
    the scheduler chose. Idempotent: the container then has compute and is not memory-only."""
    ops: list[PatchOp] = []
    name, value = MEMORY_ONLY_COMPUTE
    containers = _containers(data.pod, "containers")
    for index, request in enumerate(data.request.containers):
        if request.kind is not RequestKind.SHARE or request.compute_milli != 0:
            continue
        if index >= len(containers) or DEVICE_PLUGIN_MEMORY & set(request.resources):
            continue
        resources = containers[index].get("resources") or {}
        for part in ("limits", "requests"):
            values = resources.get(part)
            if isinstance(values, Mapping) and name not in values:
                ops.append({"op": "add", "path": pointer("spec", "containers", index,
                                                         "resources", part, name),
                            "value": value})
    return ops


def vcuda_core_limit(data: MutationInput) -> list[PatchOp]:
    """gpu-manager's `tencent.com/vcuda-core-limit` for pods sharing cards by
    `tencent.com/vcuda-core`: the share the containers ask (when they all ask the same one),
    so the vcuda runtime enforces it as a hard limit as the scheduler counted it. A value the
    user set is kept."""
    annotations = (data.pod.get("metadata") or {}).get("annotations") or {}
    if VCUDA_CORE_LIMIT in annotations:
        return []
    shares = {r.compute_milli for r in data.request.containers
              if r.kind is RequestKind.SHARE and VCUDA_CORE in r.resources and r.compute_milli}
    if len(shares) != 1:
        return []
    percent = shares.pop() // 10
    return [set_annotation(data.pod, VCUDA_CORE_LIMIT, str(percent))]


def _owner_uids(pod: Mapping[str, Any]) -> list[str]:
    refs = (pod.get("metadata") or {}).get("ownerReferences")
    if not isinstance(refs, list):
        return []
    return [str(r["uid"]) for r in refs if isinstance(r, Mapping) and isinstance(r.get("uid"), str)]


def mig_substitution(data: MutationInput) -> list[PatchOp]:
    """The MIG adapter's rewrite (docs/mig-adapter.md): a pod a MIGSubstitution selects (its
    owner's uid, or its name, in the rule's namespace; `facts.mig_substitutions`) gets each
    `nvidia.com/mig-<from>` of its containers' limits and requests replaced by
    `nvidia.com/mig-<to>` (the same amount), and the request as written is recorded in
    `elasticgpu.io/mig-original` (`<container>=<profile>`, comma-separated; kept when a pod
    moves twice) and the rule in
    `elasticgpu.io/mig-substitution`. Idempotent: a rewritten pod asks no `<from>` any more.
    Rules are applied in name order; a second rule for the same `<from>` finds nothing left.

    The two annotations are the system's (`ann.SYSTEM_POD_ANNOTATIONS`), written here during
    the CREATE of whoever makes the pod, so this mutator is authoritative over them: a pod
    arriving with them keeps them only when every rule its `mig-substitution` names selects it
    (this mutator's own record, seen again on reinvocation, or a pod the MIG adapter re-creates
    after a second move); any other value is removed, so no pod author can forge where a pod
    came from or which rule moved it."""
    pod = data.pod
    meta = pod.get("metadata") or {}
    rules = sorted((r for r in data.facts.mig_substitutions
                    if r.selects(_namespace(pod), str(meta.get("name") or ""), _owner_uids(pod))),
                   key=lambda r: r.name)
    given = (meta.get("annotations") or {})
    named = [r for r in str(given.get(MIG_SUBSTITUTION, "")).split(",") if r]
    own_record = bool(named) and set(named) <= {r.name for r in rules}
    forged = [key for key in (MIG_ORIGINAL, MIG_SUBSTITUTION) if key in given and not own_record]
    if not rules:
        return [{"op": "remove", "path": pointer("metadata", "annotations", key)}
                for key in forged]
    ops: list[PatchOp] = []
    original: list[str] = []
    applied: list[str] = []
    current: Mapping[str, Any] = pod
    for rule in rules:
        step: list[PatchOp] = []
        source, target = rule.from_profile.resource_name, rule.to_profile.resource_name
        for kind in ("initContainers", "containers"):
            for index, container in enumerate(_containers(current, kind)):
                resources = container.get("resources") or {}
                moved = False
                for part in ("limits", "requests"):
                    values = resources.get(part)
                    # (a container asks one MIG profile at most: validation says so)
                    if not isinstance(values, Mapping) or source not in values \
                            or target in values:
                        continue
                    where = ("spec", kind, index, "resources", part)
                    step.append({"op": "remove", "path": pointer(*where, source)})
                    step.append({"op": "add", "path": pointer(*where, target),
                                 "value": values[source]})
                    moved = True
                if moved:
                    original.append(f"{container.get('name', index)}={rule.from_profile.name}")
        if step:
            current = apply_patch(current, step)
            ops += step
            applied.append(rule.name)
    if not ops:
        return [{"op": "remove", "path": pointer("metadata", "annotations", key)}
                for key in forged]
    annotations = (current.get("metadata") or {}).get("annotations") or {}
    if MIG_ORIGINAL not in annotations or not own_record:
        ops.append(set_annotation(current, MIG_ORIGINAL, ",".join(original)))
        current = apply_patch(current, ops[-1:])
    ops.append(set_annotation(current, MIG_SUBSTITUTION, ",".join(applied)))
    return ops


def budget_priority(data: MutationInput) -> list[PatchOp]:
    """A GPU pod of an over-budget namespace (`data.budget`, looked up by the adapter) gets the
    lower PriorityClass: `priorityClassName`, the matching `priority` (the apiserver's Priority
    plugin resolved the class before the webhooks ran, so both are set) and the class's
    `preemptionPolicy` when it has one. A pod already at or below that priority is left alone
    (a budget never raises a priority), which also makes the patch empty under reinvocation;
    in budget, nothing."""
    lower = data.budget
    if lower is None or not data.request.wants_gpu:
        return []
    spec = data.pod.get("spec") or {}
    current = spec.get("priority")
    if isinstance(current, int) and not isinstance(current, bool) and current <= lower.priority:
        return []
    wanted: list[tuple[str, Any]] = [("priorityClassName", lower.priority_class),
                                     ("priority", lower.priority)]
    if lower.preemption_policy is not None:
        wanted.append(("preemptionPolicy", lower.preemption_policy))
    return [{"op": "replace" if key in spec else "add", "path": pointer("spec", key), "value": value}
            for key, value in wanted if spec.get(key) != value]


def budget_finalizer(data: MutationInput) -> list[PatchOp]:
    """A GPU pod of a namespace with a GPU budget (`data.budgeted`) gets the budget keeper's
    finalizer `elasticgpu.io/budget` (`core.budget.FINALIZER`) at CREATE, so a pod that ends
    (or is deleted) while the keeper is down stays until its usage is settled
    (docs/budgets.md). Only there: a finalizer holds a deleted pod's object until
    `egpu controller` removes it, so a namespace with nothing to settle must not wait for it
    (issue #26). Opt-in: the webhook's `--budget-finalizer` appends it to its mutators."""
    if not data.request.wants_gpu or not data.budgeted:
        return []
    meta = data.pod.get("metadata") or {}
    finalizers = meta.get("finalizers")
    if not isinstance(finalizers, list):
        return [{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]
    if FINALIZER in finalizers:
        return []
    return [{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}]


def node_resources(data: MutationInput) -> list[PatchOp]:
    """Each container gets `node.elasticgpu.io/gpu-core` (`core.nodefit`), the GPU compute
    kube-scheduler counts at node level so that its preemption sees a node short of GPU: in its
    limits, and in its requests when it has them. Read from the containers as the mutators
    before left them (a MIG substitution counts its instance); a container backed by a claim
    counts 0 (its ElasticGPU holds the cards). The webhook owns the name: a value already right
    is kept, any other replaced, and one on a container that counts 0 removed, so a pod can
    neither understate nor inflate it; a pod that never wrote it and asks no GPU is untouched."""
    ops: list[PatchOp] = []
    try:
        claimed = set(pod_claims(data.pod))
    except ClaimAnnotationError:
        claimed = set()
    for index, container in enumerate(_containers(data.pod, "containers")):
        if not isinstance(container, Mapping):
            continue
        resources = container.get("resources") or {}
        if not isinstance(resources, Mapping):
            continue
        name = str(container.get("name", ""))
        try:
            count = 0 if name in claimed else node_core(container_request(name, resources))
        except (ResourceError, ValueError):
            count = 0
        for part in ("limits", "requests"):
            values = resources.get(part)
            if not isinstance(values, Mapping):
                continue
            path = pointer("spec", "containers", index, "resources", part, NODE_CORE)
            if count == 0:
                if NODE_CORE in values:
                    ops.append({"op": "remove", "path": path})
            elif not _quantity_is(values.get(NODE_CORE), count):
                ops.append({"op": "replace" if NODE_CORE in values else "add", "path": path,
                            "value": str(count)})
    return ops


def _quantity_is(raw: Any, value: int) -> bool:
    """Whether `raw` is the quantity `value` in any spelling (the apiserver stores 1000 as
    `1k`: a reinvoked webhook must not see it as another value)."""
    if not isinstance(raw, (str, int)) or isinstance(raw, bool):
        return False
    try:
        return parse_quantity(raw) == value
    except QuantityError:
        return False


#: The mutations, in order. The claims' resources come first: the others read the containers
#: as the claims complete them (a claim of memory only gets its compute device, like a pod
#: asking memory only); then `elasticgpu.io/gpu` is written as the shares it stands for. The
#: MIG adapter's rewrite comes after the claims (a claim's MIG request is rewritten like a
#: container's own); the node-level GPU count reads the containers as all
#: of those left them; the budget's priority comes last.
MUTATORS: tuple[Mutator, ...] = (claim_resources, whole_cards_as_shares, memory_only_compute,
                                 vcuda_core_limit, mig_substitution, node_resources,
                                 budget_priority)


class PatchError(ValueError):
    """A JSON Patch operation that does not apply to the document."""


def _split(path: str) -> list[str]:
    if not path.startswith("/"):
        raise PatchError(f"path {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def apply_patch(document: Any, ops: Iterable[PatchOp]) -> Any:
    """A copy of `document` with the `add`, `replace` and `remove` operations applied (the
    kinds the mutators make), as kube-apiserver applies them."""
    result = copy.deepcopy(document)
    for op in ops:
        parts = _split(str(op["path"]))
        parent: Any = result
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif kind == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[index]
            else:
                raise PatchError(f"unsupported op {kind!r}")
        elif isinstance(parent, dict):
            if kind in ("add", "replace"):
                if kind == "replace" and last not in parent:
                    raise PatchError(f"replace of missing {op['path']}")
                parent[last] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[last]
            else:
                raise PatchError(f"unsupported op {kind!r}")
        else:
            raise PatchError(f"{op['path']}: parent is not a container")
    return result


@dataclass(frozen=True)
class Verdict:
    """Admission's answer: allowed when no rule is broken; `patch` only when allowed."""

    refusals: tuple[Refusal, ...] = ()
    patch: tuple[PatchOp, ...] = field(default_factory=tuple)
    #: the pod asks for a GPU (metrics; a pod without one is allowed unchanged)
    gpu: bool = False

    @property
    def allowed(self) -> bool:
        return not self.refusals

    @property
    def message(self) -> str:
        return describe_all(self.refusals)


def admit(pod: Any, facts: ClusterFacts, *, mutate: bool = False,
          mutators: Sequence[Mutator] = MUTATORS, claims: PodClaims | None = None,
          budget: PriorityDowngrade | None = None, budgeted: bool = False) -> Verdict:
    """The verdict on `pod`; with `mutate`, the patch of an allowed pod too. `claims`: the
    ElasticGPUClaims the pod names (`claim_names`), as found in its namespace; None: none
    found (a pod naming one is refused). `budget`: the lower PriorityClass while the pod's
    namespace is over its GPU budget (None: in budget, or no budget); `budgeted`: the
    namespace has a GPU budget (`budget_finalizer`).

    The mutating call refuses what the validating call would: kube-apiserver validates the
    object between the two (a negative or fractional extended resource is refused there with
    its own words), so only a refusal at the mutating call reaches the user with our rule."""
    refusals, request, claim_ops, completed = _validate(pod, facts, claims)
    if refusals or request is None:
        return Verdict(tuple(refusals))
    claims = claims or PodClaims(_namespace(pod))
    ops: list[PatchOp] = []
    if mutate:
        current: Mapping[str, Any] = pod
        for mutator in mutators:
            if mutator is claim_resources and current is pod:  # validation made them already
                if claim_ops:
                    current = completed
                    ops += claim_ops
                continue
            step = mutator(MutationInput(current, request, facts, claims, budget, budgeted))
            if step:
                current = apply_patch(current, step)
                ops += step
    return Verdict((), tuple(ops), request.wants_gpu)
