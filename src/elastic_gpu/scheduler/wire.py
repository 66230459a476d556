"""The scheduler extender wire format (kube-scheduler -> extender), Go field names exactly.

kube-scheduler marshals its Go structs without json tags, so every field is spelled as the Go
field (`Pod`, `NodeNames`, `FailedNodes`, ...). Requests are validated here, completely, and
nowhere else: every field the extender reads has a type and a bound (msgspec structs), so code
past this module never sees a string where it expects a mapping, an integer beyond 64 bits or
a container name that is not a string. Nesting is bounded before any of it is decoded
(`core.jsondepth`). Anything malformed becomes a `WireError` whose message
names the field (a JSON path), the rule and, for small bodies, the value; the server turns it
into a 400, never a 500.

Decoding costs are bounded per call, so a large body cannot hold the interpreter (GIL) for
long in one piece: the body is first split at the top level with the heavy parts kept as raw
JSON (`msgspec.Raw`, a scan without building objects), sizes are checked, and then each part is
decoded on its own (every Node object or victims entry separately). A pod part larger than the
API server would ever store, or more candidate nodes than `Limits.max_nodes`, is refused
before it is decoded.

Responses are plain dicts (or msgspec structs) built by the helpers at the bottom.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import UNSET, Meta, Raw, Struct, UnsetType

from elastic_gpu.core.jsondepth import nesting_refusal

#: The API server refuses objects above ~1.5 MiB (etcd's request limit), so no real Pod or
#: Node is larger; anything bigger in a request is not from kube-scheduler.
MAX_OBJECT_BYTES = 3 * 2**20
#: Pods per node in one victims entry (kubelet's maxPods tops out at a few hundred).
MAX_VICTIMS_PER_NODE = 5_000


@dataclass(frozen=True)
class Limits:
    """What one request may cost. `max_body_bytes`: nodeCacheCapable requests (only names)
    of 20,000 nodes are under 1 MiB; non-nodeCacheCapable ones carry whole Node objects
    (~4-10 KiB each), so 16 MiB covers ~2,000-4,000 nodes of those (docs/scheduler.md)."""

    max_body_bytes: int = 16 * 2**20
    #: Candidate nodes in one filter, prioritize or preempt (4x the 5,000-node scale
    #: kube-scheduler is tested at).
    max_nodes: int = 20_000


DEFAULT_LIMITS = Limits()

T = TypeVar("T")


class WireError(ValueError):
    """A request body kube-scheduler would never send; the message says what is wrong."""


# ---- bounded scalar types ----------------------------------------------------------------------

Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Int32 = Annotated[int, Meta(ge=-(2**31), le=2**31 - 1)]
#: Node, pod and namespace names: DNS subdomains (<= 253 characters).
Name = Annotated[str, Meta(min_length=1, max_length=253)]
OptName = Annotated[str, Meta(max_length=253)]
Uid = Annotated[str, Meta(min_length=1, max_length=128)]
OptUid = Annotated[str, Meta(max_length=128)]
Version = Annotated[str, Meta(max_length=64)]
#: Label, annotation, resource and taint keys: qualified names (prefix 253 + "/" + 63).
Key = Annotated[str, Meta(max_length=317)]
#: Label values are <= 63 characters in the API; a little slack costs nothing.
LabelValue = Annotated[str, Meta(max_length=1024)]
#: The API caps all annotations of an object at 256 KiB together.
AnnotationValue = Annotated[str, Meta(max_length=256 * 1024)]
Word = Annotated[str, Meta(max_length=64)]
#: Quantities travel as strings ("500m", "4Gi"); JSON numbers (which kube-scheduler never
#: sends, but core's parse_quantity reads) are accepted up to 2**53, where float64 is exact.
Quantity = (Annotated[str, Meta(max_length=64)] | Annotated[int, Meta(ge=-(2**53), le=2**53)]
            | Annotated[float, Meta(ge=-(2.0**53), le=2.0**53)])
ResourceMap = Annotated[dict[Key, Quantity], Meta(max_length=128)]


class _S(Struct, omit_defaults=True):
    """Unknown fields are ignored (newer kube-schedulers may add some); absent ones stay
    UNSET and are left out of `to_builtins`, so the manifest dicts hold only what was sent."""


# ---- the parts of a Pod the extender reads ------------------------------------------------------


class ObjectMeta(_S):
    name: OptName | UnsetType = UNSET
    namespace: OptName | UnsetType = UNSET
    uid: OptUid | UnsetType = UNSET
    resourceVersion: Version | UnsetType = UNSET
    annotations: Annotated[dict[Key, AnnotationValue], Meta(max_length=4096)] | UnsetType | None = UNSET


class Resources(_S):
    requests: ResourceMap | UnsetType | None = UNSET
    limits: ResourceMap | UnsetType | None = UNSET


class Container(_S):
    name: OptName | UnsetType = UNSET
    resources: Resources | UnsetType | None = UNSET
    #: "Always" on an init container: a sidecar, whose requests run beside the containers'
    restartPolicy: Word | UnsetType | None = UNSET


Containers = Annotated[list[Container], Meta(max_length=256)]


class NodeSelectorRequirement(_S):
    key: Key
    operator: Word
    values: Annotated[list[LabelValue], Meta(max_length=1024)] | UnsetType | None = UNSET


Requirements = Annotated[list[NodeSelectorRequirement], Meta(max_length=256)]


class NodeSelectorTerm(_S):
    matchExpressions: Requirements | UnsetType | None = UNSET
    matchFields: Requirements | UnsetType | None = UNSET


class NodeSelector(_S):
    nodeSelectorTerms: Annotated[list[NodeSelectorTerm], Meta(max_length=256)] | UnsetType | None = UNSET


class Weighted(_S):
    """A preferred (soft) term: only its weight is kept. That the pod states one is what
    `filterResult: auto` reads (`narrowing.soft_preference`); kube-scheduler weighs it."""

    weight: Int32 | UnsetType = UNSET


Preferred = Annotated[list[Weighted], Meta(max_length=1024)]


class NodeAffinity(_S):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | UnsetType | None = UNSET
    preferredDuringSchedulingIgnoredDuringExecution: Preferred | UnsetType | None = UNSET


class PodAffinity(_S):
    """podAffinity and podAntiAffinity: only whether soft terms are stated."""

    preferredDuringSchedulingIgnoredDuringExecution: Preferred | UnsetType | None = UNSET


class Affinity(_S):
    nodeAffinity: NodeAffinity | UnsetType | None = UNSET
    podAffinity: PodAffinity | UnsetType | None = UNSET
    podAntiAffinity: PodAffinity | UnsetType | None = UNSET


class SpreadConstraint(_S):
    """Only whether it is soft (`ScheduleAnyway`)."""

    whenUnsatisfiable: Word | UnsetType = UNSET


class Toleration(_S):
    key: Key | UnsetType = UNSET
    operator: Word | UnsetType = UNSET
    value: LabelValue | UnsetType = UNSET
    effect: Word | UnsetType = UNSET
    tolerationSeconds: Int64 | UnsetType | None = UNSET


class PodSpec(_S):
    containers: Containers | UnsetType | None = UNSET
    initContainers: Containers | UnsetType | None = UNSET
    overhead: ResourceMap | UnsetType | None = UNSET
    #: pod-level requests and limits (KEP-2837), which replace the containers' sum
    resources: Resources | UnsetType | None = UNSET
    nodeName: OptName | UnsetType = UNSET
    schedulerName: OptName | UnsetType = UNSET
    priority: Int32 | UnsetType | None = UNSET
    nodeSelector: Annotated[dict[Key, LabelValue], Meta(max_length=256)] | UnsetType | None = UNSET
    affinity: Affinity | UnsetType | None = UNSET
    tolerations: Annotated[list[Toleration], Meta(max_length=256)] | UnsetType | None = UNSET
    topologySpreadConstraints: Annotated[list[SpreadConstraint], Meta(max_length=256)] \
        | UnsetType | None = UNSET


class PodStatus(_S):
    phase: Word | UnsetType = UNSET


class Pod(_S):
    metadata: ObjectMeta | UnsetType | None = UNSET
    spec: PodSpec | UnsetType | None = UNSET
    status: PodStatus | UnsetType | None = UNSET


def pod_manifest(pod: Pod) -> dict[str, Any]:
    """The validated pod as the plain dict core reads (only the fields above, only if sent)."""
    out: dict[str, Any] = msgspec.to_builtins(pod)
    return out


# ---- the top level of each verb's body ----------------------------------------------------------


class _NodeMeta(_S):
    name: Name


class _NodeItem(_S):
    metadata: _NodeMeta


_NULL = Raw(b"null")


class _ArgsTop(_S):
    Pod: Raw
    Nodes: Raw = _NULL
    NodeNames: Raw = _NULL


class _NodeListTop(_S):
    items: Annotated[list[Raw], Meta(max_length=1_000_000)] | None = None


#: A Kubernetes object name (DNS subdomain): lower-case alphanumerics, '-' and '.'.
DnsName = Annotated[str, Meta(min_length=1, max_length=253,
                              pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")]
#: A namespace name (DNS label): no dots, at most 63 characters.
DnsLabel = Annotated[str, Meta(min_length=1, max_length=63,
                               pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]


class ExtenderBindingArgs(_S):
    """Names only the API server could have stored: they go into API paths (and
    `kube.paths.api_path` checks them again there)."""

    PodName: DnsName
    PodNamespace: DnsLabel
    PodUID: Uid
    Node: DnsName


class ProvisionArgs(Struct, forbid_unknown_fields=True):
    """`POST /provision` (called by `egpu controller`, docs/claims.md): the claim to provision.
    Strict: every field required, no other field (the controller is ours: anything else is a
    bug or not from it)."""

    namespace: DnsLabel
    name: DnsName
    uid: Uid


class MetaPod(_S):
    UID: Uid


class MetaVictims(_S):
    Pods: Annotated[list[MetaPod], Meta(max_length=MAX_VICTIMS_PER_NODE)] | None = None
    NumPDBViolations: Int64 = 0


class _VictimMeta(_S):
    uid: Uid


class _VictimPod(_S):
    metadata: _VictimMeta


class _Victims(_S):
    Pods: Annotated[list[_VictimPod], Meta(max_length=MAX_VICTIMS_PER_NODE)] | None = None
    NumPDBViolations: Int64 = 0


class _PreemptionTop(_S):
    Pod: Raw
    NodeNameToVictims: Annotated[dict[Name, Raw], Meta(max_length=1_000_000)] | None = None
    NodeNameToMetaVictims: Annotated[dict[Name, Raw], Meta(max_length=1_000_000)] | None = None


@dataclass(frozen=True)
class ExtenderArgs:
    """Filter and prioritize arguments, validated.

    `Pod`: the validated pod (`pod_manifest`); `NodeNames`: set when kube-scheduler sent names
    (nodeCacheCapable); `node_items`: (name, the Node object's raw JSON) when it sent objects,
    so a filter answers in the same form with the objects exactly as received.
    """

    Pod: dict[str, Any]
    NodeNames: list[str] | None = None
    node_items: list[tuple[str, Raw]] | None = None

    def node_names(self) -> list[str]:
        if self.NodeNames is not None:
            return self.NodeNames
        return [name for name, _ in self.node_items or ()]


@dataclass(frozen=True)
class ExtenderPreemptionArgs:
    Pod: dict[str, Any]
    #: node -> (victim pod UIDs, PDB violations), from whichever map kube-scheduler sent
    candidates: dict[str, tuple[list[str], int]]

    def victims(self) -> dict[str, tuple[list[str], int]]:
        return self.candidates


# ---- decoding ---------------------------------------------------------------------------------

_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}
_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_STEP = re.compile(r"\.([A-Za-z_][\w]*)|\[(\d+)\]|\[('[^']*'|\"[^\"]*\")\]")
#: Below this size a failing part is decoded once more, untyped, to show the offending value.
_SHOW_VALUE_BYTES = 64 * 1024
_OBJECT_START = re.compile(rb"\s*\{")


def _decoder(kind: Any) -> msgspec.json.Decoder[Any]:
    return _DECODERS[kind]


def _value_at(data: bytes | memoryview, path: str) -> str | None:
    """repr (shortened) of the value at a msgspec error path, for small bodies."""
    if len(data) > _SHOW_VALUE_BYTES:
        return None
    try:
        value: Any = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None
    for field, index, key in _STEP.findall(path.split("[...]")[0]):
        try:
            if field:
                value = value[field]
            elif index:
                value = value[int(index)]
            else:
                value = value[key[1:-1]]
        except (KeyError, IndexError, TypeError):
            return None
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _decode(kind: type[T] | Any, data: bytes | memoryview, where: str) -> T:
    """Decode `data` (the JSON at `where`, "" for the body) as `kind`, or raise WireError
    naming the path, the rule, and the value where the part is small."""
    try:
        result: T = _decoder(kind).decode(data)
        return result
    except msgspec.ValidationError as err:
        message = str(err)
        match = _AT.search(message)
        rule = message[:match.start()] if match else message
        path = match["path"] if match else ""
        shown = _value_at(data, path) if path else None
        value = f" (got {shown})" if shown is not None else ""
        raise WireError(f"{'$' + where + path}: {rule}{value}") from None
    except msgspec.DecodeError as err:
        if not where:
            raise WireError(f"request body is not JSON: {err}") from None
        raise WireError(f"${where}: not JSON: {err}") from None


def _object(kind: Any, data: bytes, where: str) -> Any:
    if len(data) > MAX_OBJECT_BYTES:
        raise WireError(f"${where}: {len(data)} bytes, more than the {MAX_OBJECT_BYTES} the API "
                        "server stores for one object")
    return _decode(kind, data, where)


def _top(kind: type[T], body: bytes, limits: Limits) -> T:
    if len(body) > limits.max_body_bytes:
        raise WireError(f"request body of {len(body)} bytes is over the limit of "
                        f"{limits.max_body_bytes} bytes (maxRequestBytes)")
    # Before anything decodes it: every decoder recurses once per level (issue 26, item 8).
    deep = nesting_refusal(body, "request body")
    if deep is not None:
        raise WireError(deep)
    if _OBJECT_START.match(body) is None:
        try:
            msgspec.json.decode(body, type=Raw)
        except msgspec.DecodeError as err:
            raise WireError(f"request body is not JSON: {err}") from None
        raise WireError("request body must be a JSON object")
    return _decode(kind, body, "")


def _too_many(count: int, what: str, limits: Limits) -> WireError:
    return WireError(f"{what}: {count} nodes, more than the limit of {limits.max_nodes} "
                     "(maxNodesPerRequest)")


def _node_names(raw: Raw, limits: Limits) -> list[str]:
    # Node names are DNS subdomains: no commas, so a list of n names has n - 1 of them.
    # Counting is one fast scan, so a body of millions of names is refused before they are
    # decoded (building millions of strings holds the interpreter for a long time).
    data = memoryview(raw)
    if len(data) > 2 * limits.max_nodes:
        separators = bytes(data).count(b",")
        if separators >= limits.max_nodes:
            raise _too_many(separators + 1, "$.NodeNames", limits)
    names: list[str] = _decode(list[Name], data, ".NodeNames")
    if len(names) > limits.max_nodes:
        raise _too_many(len(names), "$.NodeNames", limits)
    return names


def _node_items(raw: Raw, limits: Limits) -> list[tuple[str, Raw]]:
    top: _NodeListTop | None = _decode(_NodeListTop | None, bytes(raw), ".Nodes")
    items = top.items if top is not None and top.items is not None else []
    if len(items) > limits.max_nodes:
        raise _too_many(len(items), "$.Nodes.items", limits)
    out = []
    for i, item in enumerate(items):
        node: _NodeItem = _object(_NodeItem, bytes(item), f".Nodes.items[{i}]")
        out.append((node.metadata.name, item))
    return out


def _pod(raw: Raw) -> dict[str, Any]:
    pod: Pod | None = _object(Pod | None, bytes(raw), ".Pod")
    if pod is None:
        raise WireError("$.Pod: Expected `object`, got `null`")
    return pod_manifest(pod)


def parse_args(body: bytes, limits: Limits = DEFAULT_LIMITS) -> ExtenderArgs:
    """Filter/prioritize arguments: the pod and the candidate nodes, or WireError."""
    top: _ArgsTop = _top(_ArgsTop, body, limits)
    if bytes(top.NodeNames) != b"null":
        return ExtenderArgs(_pod(top.Pod), NodeNames=_node_names(top.NodeNames, limits))
    if bytes(top.Nodes) != b"null":
        return ExtenderArgs(_pod(top.Pod), node_items=_node_items(top.Nodes, limits))
    raise WireError("neither NodeNames nor Nodes is set: no candidate nodes to consider")


def parse_binding(body: bytes, limits: Limits = DEFAULT_LIMITS) -> ExtenderBindingArgs:
    result: ExtenderBindingArgs = _top(ExtenderBindingArgs, body, limits)
    return result


def parse_provision(body: bytes) -> ProvisionArgs:
    return _top(ProvisionArgs, body, Limits(max_body_bytes=PROVISION_BODY_BYTES))


#: A provision request is three names.
PROVISION_BODY_BYTES = 64 * 1024


def parse_preemption(body: bytes, limits: Limits = DEFAULT_LIMITS) -> ExtenderPreemptionArgs:
    top: _PreemptionTop = _top(_PreemptionTop, body, limits)
    pod = _pod(top.Pod)
    out: dict[str, tuple[list[str], int]] = {}
    if top.NodeNameToMetaVictims is not None:
        if len(top.NodeNameToMetaVictims) > limits.max_nodes:
            raise _too_many(len(top.NodeNameToMetaVictims), "$.NodeNameToMetaVictims", limits)
        for node, raw in top.NodeNameToMetaVictims.items():
            meta: MetaVictims | None = _object(
                MetaVictims | None, bytes(raw),
                f".NodeNameToMetaVictims[{node!r}]")
            meta = meta or MetaVictims()
            out[node] = ([p.UID for p in meta.Pods or ()], meta.NumPDBViolations)
        return ExtenderPreemptionArgs(pod, out)
    victims_map = top.NodeNameToVictims or {}
    if len(victims_map) > limits.max_nodes:
        raise _too_many(len(victims_map), "$.NodeNameToVictims", limits)
    for node, raw in victims_map.items():
        victims: _Victims | None = _object(
            _Victims | None, bytes(raw), f".NodeNameToVictims[{node!r}]")
        victims = victims or _Victims()
        out[node] = ([p.metadata.uid for p in victims.Pods or ()], victims.NumPDBViolations)
    return ExtenderPreemptionArgs(pod, out)


# ---- answers ----------------------------------------------------------------------------------


def filter_result(args: ExtenderArgs, feasible: Sequence[str], failed: Mapping[str, str],
                  unresolvable: Mapping[str, str], error: str = "") -> dict[str, Any]:
    """ExtenderFilterResult, answering in the same form (names or node objects) as asked."""
    result: dict[str, Any] = {"FailedNodes": dict(failed),
                              "FailedAndUnresolvableNodes": dict(unresolvable), "Error": error}
    if args.node_items is None:
        result["NodeNames"] = list(feasible)
        result["Nodes"] = None
    else:
        keep = set(feasible)
        result["Nodes"] = {"items": [raw for name, raw in args.node_items if name in keep]}
        result["NodeNames"] = None
    return result


def filter_error(message: str) -> dict[str, Any]:
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {},
            "FailedAndUnresolvableNodes": {}, "Error": message}


class HostPriority(msgspec.Struct, gc=False):
    """One entry of kube-scheduler's HostPriorityList (encodes as {"Host": ..., "Score": ...}).

    Not tracked by the garbage collector (it holds a string and an int, no cycle can pass
    through it): a prioritize answer makes one per node, thousands, and tracked objects
    would start collections that walk the extender's whole state."""

    Host: str
    Score: int


def host_priorities(scores: Mapping[str, int]) -> list[HostPriority]:
    """The answer to prioritize: the nodes whose score is not 0.

    kube-scheduler adds `score x weight` per listed node and nothing for a node left out
    (`prioritizeNodes`), so a 0 changes no node's total: leaving it out spares both sides
    the JSON of it. On empty nodes most scores are 0 (rescaled, the worst node is 0, and
    every empty node scores as the worst): 99 % of a 370-node answer in
    `bench/sched_throughput.py`'s pods. The one difference is in kube-scheduler's tie-break:
    a listed node gets a random tie-breaker (`Randomizer`), an unlisted one none, so among
    nodes of equal total an unlisted one comes after a listed one and unlisted ones keep
    kube-scheduler's own order (as with no extender), where all were random before."""
    return [HostPriority(host, score) for host, score in scores.items() if score]


def preemption_result(victims: Mapping[str, tuple[Sequence[str], int]]) -> dict[str, Any]:
    return {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": pdb}
        for node, (uids, pdb) in victims.items()}}


def _prepare() -> None:
    """Build every decoder, and use each once, at import, in one thread: large requests are
    decoded in worker threads, and msgspec (0.22) has crashed when several threads made
    its first use of a type at once."""
    for kind in (_ArgsTop, _PreemptionTop, ExtenderBindingArgs, _NodeListTop | None, _NodeItem,
                 list[Name], Pod | None, MetaVictims | None, _Victims | None, Raw,
                 ProvisionArgs):
        _DECODERS[kind] = msgspec.json.Decoder(kind)
    pod = (b'{"metadata": {"name": "p", "annotations": {}}, "spec": {"containers": [{"name": "c",'
           b' "resources": {"limits": {"a": "1"}}}], "tolerations": [{"key": "k"}], "affinity": '
           b'{"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {'
           b'"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In"}]}]}}}}, '
           b'"status": {}}')
    parse_args(b'{"Pod": ' + pod + b', "NodeNames": ["a"]}')
    parse_args(b'{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "a"}}]}}')
    parse_preemption(b'{"Pod": {}, "NodeNameToMetaVictims": {"a": {"Pods": [{"UID": "u"}]}}}')
    parse_preemption(b'{"Pod": {}, "NodeNameToVictims": {"a": {"Pods": [{"metadata": '
                     b'{"uid": "u"}}]}}}')
    parse_binding(b'{"PodName": "p", "PodNamespace": "n", "PodUID": "u", "Node": "a"}')
    parse_provision(b'{"namespace": "n", "name": "c", "uid": "u"}')
    msgspec.json.encode([host_priorities({"a": 1}), filter_result(
        ExtenderArgs({}, node_items=[("a", Raw(b"{}"))]), ["a"], {}, {})])


_prepare()
