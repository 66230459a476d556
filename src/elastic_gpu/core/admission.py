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
mutated, so the patch is empty under reinvocation (`reinvocationPolicy: IfNeeded`). The claims
API, the MIG adapter and the budgets add theirs to `MUTATORS` (or pass their own list).
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.core import annotations as ann
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
    MIG_RULE,
    MILLI_PER_CARD,
    Measure,
    ResourceError,
    lookup,
    short_repr,
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


def validate(pod: Any, facts: ClusterFacts) -> tuple[list[Refusal], PodRequest | None]:
    """Every rule `pod` breaks (empty: none) and, when it breaks none, its `PodRequest`."""
    shape = _shape(pod)
    if shape:
        return shape, None
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
    return refusals, (request if not refusals else None)


# --- mutation -----------------------------------------------------------------------------

#: One JSON Patch operation, e.g. {"op": "add", "path": "/metadata/annotations/a", "value": "1"}.
PatchOp = dict[str, Any]


@dataclass(frozen=True)
class MutationInput:
    """What a mutator reads: the pod as the mutators before it left it, its parsed request
    (of the pod as admitted, before any mutation), and the cluster facts."""

    pod: Mapping[str, Any]
    request: PodRequest
    facts: ClusterFacts


Mutator = Callable[[MutationInput], list[PatchOp]]


def pointer(*parts: str | int) -> str:
    """A JSON Pointer (RFC 6901) from its unescaped parts."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def set_annotation(pod: Mapping[str, Any], key: str, value: str) -> PatchOp:
    """The operation that sets one annotation, whether or not the pod has any."""
    if not isinstance((pod.get("metadata") or {}).get("annotations"), Mapping):
        return {"op": "add", "path": "/metadata/annotations", "value": {key: value}}
    return {"op": "add", "path": pointer("metadata", "annotations", key), "value": value}


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


#: The mutations, in order. Later mutations (claims, MIG adapter, budgets) are appended here.
MUTATORS: tuple[Mutator, ...] = (memory_only_compute, vcuda_core_limit)


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
          mutators: Sequence[Mutator] = MUTATORS) -> Verdict:
    """The verdict on `pod`; with `mutate`, the patch of an allowed pod too.

    The mutating call refuses what the validating call would: kube-apiserver validates the
    object between the two (a negative or fractional extended resource is refused there with
    its own words), so only a refusal at the mutating call reaches the user with our rule."""
    refusals, request = validate(pod, facts)
    if refusals or request is None:
        return Verdict(tuple(refusals))
    ops: list[PatchOp] = []
    if mutate:
        current: Mapping[str, Any] = pod
        for mutator in mutators:
            step = mutator(MutationInput(current, request, facts))
            if step:
                current = apply_patch(current, step)
                ops += step
    return Verdict((), tuple(ops), request.wants_gpu)
