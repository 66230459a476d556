"""Why a pod does not fit: structured fit failures, and the one place they become sentences.

The engine decides fit and says why not as a `FitFailure`: a kind, the resource, what was
requested, what is free, the capacity and the unit, like kube-scheduler's fit plugin
(`InsufficientResource{ResourceName, Requested, Used, Capacity}`). Code that acts on a failure
(the simulator's failure counts, the extender's choice between FailedNodes and
FailedAndUnresolvableNodes) reads `kind` and `category`, never the text; the text is made once,
at the edge, by `describe` (the extender's HTTP answers, the simulator's output, the CLI).

The engine is one check among three, as kube-scheduler's `framework.Status` carries the name
of the plugin that refused: the pod's ElasticGPUClaims ("claims") and the node's GPU mode
("dra-mode", `core.nodemode`) refuse with fit failures of their own kinds, and `FitKind.check`
names which check a failure comes from (`FitKind.unresolvable`: whether preemption could help).

`describe` never names the node: kube-scheduler counts identical FailedNodes reasons
("3 <reason>"), and a node name in each would make every reason distinct. Where a node must be
named (a log line, a bind error), `describe_on` puts it in front. The DRA kinds too: one
sentence for every DRA-mode node (the node is the key of the answer's map).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from elastic_gpu.core.claims.blocks import ClaimBlock, describe_blocks
from elastic_gpu.core.resources import MIG_PREFIX, MILLI_PER_PERCENT


class FitKind(enum.Enum):
    """What kind of check failed. The value is a stable key (logs, metrics, JSON)."""

    #: the node is not in the GPU scheduler's inventory
    UNKNOWN_NODE = "unknown-node"
    #: the cluster has no nodes at all
    NO_NODES = "no-nodes"
    #: host CPU: `requested` milli-CPU, `free`, `capacity`
    HOST_CPU = "host-cpu"
    #: host memory: `requested` MiB, `free`, `capacity`
    HOST_MEMORY = "host-memory"
    #: the node does not offer the resource the pod names (vendor, resource name, model behind
    #: it): `resource` is the name asked for, `offered` what the node has
    RESOURCE_NOT_OFFERED = "resource-not-offered"
    #: no healthy card (and no MIG card) on the node; `capacity` cards in all
    NO_HEALTHY_GPU = "no-healthy-gpu"
    #: no healthy card is free of a fence: `requested` the fenced cards (their MIG layout is
    #: being changed, docs/mig-apply.md), `capacity` cards in all
    CARD_FENCED = "card-fenced"
    #: no card of a model the pod accepts: `offered` the node's models, `allowed`/`denied` the
    #: pod's lists
    MODEL_NOT_ACCEPTED = "model-not-accepted"
    #: the pod names its cards by UUID (`elasticgpu.io/gpu-uuid`, `gpu-uuid-deny`) and no
    #: card of the node is one it accepts: `capacity` the node's cards
    CARD_NOT_PINNED = "card-not-pinned"
    #: too few cards have a share's compute and memory free: `requested` the cards the share
    #: asks (1, or N for a multi-card share), `free` cards that have room, `capacity` cards;
    #: `per_card_milli` / `per_card_mib` the share asked of each card
    INSUFFICIENT_SHARE = "insufficient-share"
    #: too few entirely free cards: `requested`, `free`, `capacity` in cards
    INSUFFICIENT_CARDS = "insufficient-cards"
    #: a card that would have room by the ledger is held back by out-of-band memory (memory
    #: its node observes in use by processes no holder of the card accounts for): `card`, its
    #: `out_of_band_mib`, `capacity` its memory in MiB, `free` what the ledger and the
    #: out-of-band memory leave; a share: `requested` MiB (unit MIB); whole cards:
    #: `requested` cards (unit CARDS: a card with foreign memory on it is not whole)
    OUT_OF_BAND_MEMORY = "out-of-band-memory"
    #: a share asked in TFLOPS (`requested`), and no card of the node (among the accepted
    #: models) is of a model the TFLOPS table knows: `offered` the node's models
    TFLOPS_UNKNOWN_MODEL = "tflops-unknown-model"
    #: a share asked in TFLOPS (`requested`) is more than one whole card of every known model
    #: of the node gives: `capacity` the largest card's TFLOPS, `offered` the models
    TFLOPS_ABOVE_CARD = "tflops-above-card"
    #: too few free time-sliced replicas of a whole-card name (`resource`) on cards that are
    #: time-sliced for it: `requested`, `free`, `capacity` in replicas
    INSUFFICIENT_REPLICAS = "insufficient-replicas"
    #: too few free MIG instances of a profile (`resource`): `requested`, `free`, `capacity`
    INSUFFICIENT_MIG = "insufficient-mig"
    #: a MIG request on distinct cards (`ContainerRequest.distinct`): too few cards with a free
    #: instance of the profile (`resource`): `requested`, `free`, `capacity` in cards
    MIG_DISTINCT_CARDS = "mig-distinct-cards"
    #: ledger: one card's compute would be exceeded (`card`; milli-cards)
    CARD_COMPUTE = "card-compute"
    #: ledger: one card's memory would be exceeded (`card`; MiB)
    CARD_MEMORY = "card-memory"
    #: ledger: one time-sliced card's replica slots would be exceeded (`card`; replicas)
    CARD_REPLICAS = "card-replicas"
    #: ledger: the assignment names a card the node does not have (`card`)
    NO_SUCH_CARD = "no-such-card"
    #: ledger: the assignment names a MIG instance the card does not have (`card`, `instance`)
    NO_SUCH_MIG_INSTANCE = "no-such-mig-instance"
    #: ledger: the MIG instance is held by another pod (`instance`, `holder`)
    MIG_INSTANCE_HELD = "mig-instance-held"
    #: ledger: a share or whole card asked on a MIG-enabled card (`card`)
    MIG_ENABLED_CARD = "mig-enabled-card"
    #: the node does not fit and was not explained one by one (the extender explains only the
    #: first failed nodes of a large request)
    UNDETAILED = "undetailed"
    #: the ElasticGPUClaims the pod names cannot be placed on any node now (one missing,
    #: Pending, being deleted, bound on different nodes): `detail` says which and why, as
    #: `core.claims.pods.resolve_pod_claims` found it
    CLAIM_BLOCKED = "claim-blocked"
    #: the pod's claim (`claim`, namespace/name; its `container`) is bound to ElasticGPU
    #: `elastic_gpu` on another node (`node`)
    CLAIM_ON_OTHER_NODE = "claim-on-other-node"
    #: a DRA-mode node and a pod naming ElasticGPUClaims (cards of our ledger, which has none
    #: there); `device_class` is the DeviceClass to ask with instead
    DRA_NAMES_CLAIMS = "dra-names-claims"
    #: a DRA-mode node serves none of the GPU names in `asked` (only those in
    #: `offered`, through a DeviceClass's extended-resource mapping); `device_class` as above
    DRA_NOT_SERVED = "dra-not-served"

    @property
    def category(self) -> str:
        """The short key failures are counted by: cpu, memory, model, resource, mig, node, gpu,
        claim, dra (the `reason` of the extender's unschedulable metric)."""
        return _CATEGORY.get(self, "gpu")

    @property
    def check(self) -> str:
        """The check that refused, as kube-scheduler's `framework.Status` names its plugin:
        "engine" (our card state), "claims" (the pod's ElasticGPUClaims) or "dra-mode" (the
        node's mode: kube-scheduler allocates there)."""
        return _CHECK.get(self, "engine")

    @property
    def unresolvable(self) -> bool:
        """No preemption can lift it (kube-scheduler's UnschedulableAndUnresolvable): the node
        is unknown, or a claim or the node's mode rules it out whatever runs there."""
        return self is FitKind.UNKNOWN_NODE or self in _CHECK


_CATEGORY: dict[FitKind, str] = {
    FitKind.UNKNOWN_NODE: "node",
    FitKind.NO_NODES: "node",
    FitKind.HOST_CPU: "cpu",
    FitKind.HOST_MEMORY: "memory",
    FitKind.MODEL_NOT_ACCEPTED: "model",
    FitKind.CARD_NOT_PINNED: "model",
    FitKind.TFLOPS_UNKNOWN_MODEL: "model",
    FitKind.RESOURCE_NOT_OFFERED: "resource",
    FitKind.INSUFFICIENT_MIG: "mig",
    FitKind.MIG_DISTINCT_CARDS: "mig",
    FitKind.NO_SUCH_MIG_INSTANCE: "mig",
    FitKind.MIG_INSTANCE_HELD: "mig",
    FitKind.MIG_ENABLED_CARD: "mig",
    FitKind.CARD_FENCED: "mig",
    FitKind.CLAIM_BLOCKED: "claim",
    FitKind.CLAIM_ON_OTHER_NODE: "claim",
    FitKind.DRA_NAMES_CLAIMS: "dra",
    FitKind.DRA_NOT_SERVED: "dra",
}

#: The kinds not decided by the engine, by the check that decides them (`FitKind.check`).
_CHECK: dict[FitKind, str] = {
    FitKind.CLAIM_BLOCKED: "claims",
    FitKind.CLAIM_ON_OTHER_NODE: "claims",
    FitKind.DRA_NAMES_CLAIMS: "dra-mode",
    FitKind.DRA_NOT_SERVED: "dra-mode",
}


class Unit(enum.Enum):
    MILLI_CPU = "milli-CPU"
    MIB = "MiB"
    MILLI_CARDS = "milli-cards"  # 1000 = one card; people read it as percent (1% = 10)
    CARDS = "cards"
    INSTANCES = "instances"
    REPLICAS = "replicas"
    TFLOPS = "TFLOPS"


@dataclass(frozen=True)
class FitFailure:
    """Why one node cannot host a pod (or why an assignment cannot be counted on it).

    Fields a kind does not use keep their defaults; `FitKind` says which ones each uses."""

    kind: FitKind
    #: the resource that is short or missing: "cpu", "memory", a GPU resource name as the user
    #: wrote it (empty for requests built without names, as in the simulator)
    resource: str = ""
    requested: int = 0
    free: int = 0
    capacity: int = 0
    unit: Unit | None = None
    #: the container whose request failed
    container: str = ""
    #: the card counts are among the models the pod accepts
    among_accepted_models: bool = False
    #: INSUFFICIENT_SHARE: the share asked of one card
    per_card_milli: int = 0
    per_card_mib: int = 0
    #: MODEL_NOT_ACCEPTED: the node's models; RESOURCE_NOT_OFFERED: what the node offers;
    #: DRA_NOT_SERVED: the GPU names the DRA-mode node serves
    offered: tuple[str, ...] = ()
    #: MODEL_NOT_ACCEPTED: the pod's accepted models (None: any) and refused ones
    allowed: tuple[str, ...] | None = None
    denied: tuple[str, ...] = ()
    #: ledger kinds: the card index, the MIG instance, the pod holding it
    card: int | None = None
    instance: str = ""
    holder: str = ""
    #: OUT_OF_BAND_MEMORY: the card's observed out-of-band memory, MiB
    out_of_band_mib: int = 0
    #: CLAIM_BLOCKED: why the pod's claims cannot be placed (`core.claims.blocks`)
    claim_blocks: tuple[ClaimBlock, ...] = ()
    #: CLAIM_ON_OTHER_NODE: the claim (namespace/name) and its ElasticGPU
    claim: str = ""
    elastic_gpu: str = ""
    #: CLAIM_ON_OTHER_NODE: the ElasticGPU's node
    node: str = ""
    #: DRA_NOT_SERVED: the GPU names the pod asks that the node does not serve
    asked: tuple[str, ...] = ()
    #: DRA kinds: the DeviceClass a pod asks a share of the node's cards with
    device_class: str = ""
    #: RESOURCE_NOT_OFFERED of a MIG profile: no node of the cluster is opted in to dynamic
    #: MIG (none would carve the profile on demand)
    no_mig_dynamic: bool = False

    @property
    def check(self) -> str:
        return self.kind.check

    @property
    def category(self) -> str:
        return self.kind.category


@dataclass(frozen=True)
class NoNodeFits:
    """Why no node of the cluster can host a pod: nodes counted by the category of their first
    failing check, and one example node of the most common category.

    `category` is that most common one (what a message shows an example of); `first_failing`
    is the pod's own first failing check: the checks run in order (CPU, memory, healthy GPU,
    model, offered resource, cards or MIG) over the whole cluster, each keeping the nodes that
    pass it, and it is the check that leaves none. A pod asking for a model whose nodes are all
    full is "gpu" there, though most nodes fail it on "model"."""

    pod: str
    nodes: int
    #: (category, nodes), most nodes first
    counts: tuple[tuple[str, int], ...]
    category: str
    example_node: str | None = None
    example: FitFailure | None = None
    first_failing: str = ""


class Unschedulable(Exception):
    """No node (or not this node) can host the pod, or an assignment cannot be counted.

    `failure` is the structured reason (for a whole-cluster failure: the example node's);
    `category` is the short key failures are counted by; `reason` the sentence, formatted once
    here from the structure."""

    def __init__(self, failure: FitFailure, node: str | None = None,
                 summary: NoNodeFits | None = None) -> None:
        self.failure = failure
        self.node = node
        self.summary = summary
        self.reason = describe_no_fit(summary) if summary is not None else describe_on(node, failure)
        super().__init__(self.reason)

    def __reduce__(self) -> tuple[type[Unschedulable], tuple[FitFailure, str | None, NoNodeFits | None]]:
        # an exception pickles its args by default: keep the structure across processes
        return (Unschedulable, (self.failure, self.node, self.summary))

    @property
    def category(self) -> str:
        return self.summary.category if self.summary is not None else self.failure.category

    @property
    def kind(self) -> FitKind:
        return self.failure.kind


def compute_text(milli: int | Any) -> str:
    """Compute as people write it: 500 milli-cards is "50% compute" (1% = 10 milli)."""
    return f"{int(milli) / MILLI_PER_PERCENT:g}% compute"


def _among(failure: FitFailure) -> str:
    return " among the accepted models" if failure.among_accepted_models else ""


def _accepted_text(failure: FitFailure) -> str:
    if failure.allowed is not None:
        text = " or ".join(sorted(failure.allowed))
        if failure.denied:
            text += " but not " + ", ".join(sorted(failure.denied))
        return text
    return "anything but " + ", ".join(sorted(failure.denied))


def _container(failure: FitFailure) -> str:
    return f"container {failure.container}" if failure.container else "the pod"


#: what a MIG profile no node offers and no node would carve adds (docs/mig-apply.md)
_MIG_DYNAMIC_HINT = ("; no node is opted in to dynamic MIG, which would carve it on demand "
                     "(label a node elasticgpu.io/mig-dynamic=true with the controller's "
                     "mig.dynamic.enabled, the chart's controller.migDynamic; in the sandbox, "
                     "a node group's migDynamic: true)")


def _how_to_ask(failure: FitFailure) -> str:
    asks_mig = bool(failure.asked) and all(n.startswith(MIG_PREFIX) for n in failure.asked)
    what = "a MIG instance" if asks_mig else "a share"
    return (f"the node serves GPUs through DRA; ask for {what} with a ResourceClaim of class "
            f"{failure.device_class}")


def category_counts(failures: Collection[FitFailure]) -> Counter[str]:
    """How many of `failures` are of each category, the category looked up once per distinct
    failure object: most of a filter's failed nodes share one (the summary past the detailed
    ones, or a failure made once for nodes that fail alike), and a filter of thousands of
    nodes tallies them for its metric."""
    listed = list(failures)
    first = dict(zip(map(id, listed), listed, strict=True))
    counts: Counter[str] = Counter()
    for key, times in Counter(map(id, listed)).items():
        counts[first[key].category] += times
    return counts


def describe(failure: FitFailure) -> str:
    """The failure as a sentence a person can act on. Never names the node it is about (see
    module doc)."""
    f = failure
    kind = f.kind
    if kind is FitKind.UNKNOWN_NODE:
        return "node unknown to the GPU scheduler"
    if kind is FitKind.NO_NODES:
        return "there are no nodes"
    if kind is FitKind.HOST_CPU:
        return f"{f.free} milli-CPU free, {f.requested} asked"
    if kind is FitKind.HOST_MEMORY:
        return f"{f.free} MiB of memory free, {f.requested} asked"
    if kind is FitKind.RESOURCE_NOT_OFFERED:
        offered = ", ".join(f.offered) if f.offered else "no GPU resource"
        asker = f", {_container(f)} asks for it" if f.container else ""
        text = f"the node does not offer {f.resource} (it offers {offered}){asker}"
        return text + _MIG_DYNAMIC_HINT if f.no_mig_dynamic else text
    if kind is FitKind.NO_HEALTHY_GPU:
        return f"no healthy GPU (0 of {f.capacity} cards)"
    if kind is FitKind.CARD_FENCED:
        return (f"no GPU free of a fence ({f.requested} of {f.capacity} cards fenced while "
                "their MIG layout changes)")
    if kind is FitKind.MODEL_NOT_ACCEPTED:
        return (f"the node has {', '.join(f.offered) or 'no'} cards; the pod accepts "
                f"{_accepted_text(f)}")
    if kind is FitKind.CARD_NOT_PINNED:
        return (f"none of the node's {f.capacity} cards is one the pod names by UUID "
                "(elasticgpu.io/gpu-uuid, gpu-uuid-deny)")
    if kind is FitKind.INSUFFICIENT_SHARE:
        if f.requested > 1:  # a multi-card share: N distinct cards with room each
            return (f"{f.free}/{f.capacity} cards have {compute_text(f.per_card_milli)} and "
                    f"{f.per_card_mib} MiB free{_among(f)}, {_container(f)} needs "
                    f"{f.requested} such cards")
        return (f"{f.free}/{f.capacity} cards have {compute_text(f.per_card_milli)} and "
                f"{f.per_card_mib} MiB free{_among(f)} ({_container(f)})")
    if kind is FitKind.INSUFFICIENT_CARDS:
        return (f"{f.free} of {f.capacity} cards are entirely free{_among(f)}, "
                f"{_container(f)} needs {f.requested}")
    if kind is FitKind.OUT_OF_BAND_MEMORY:
        held = (f"card {f.card} has {f.out_of_band_mib} MiB of its {f.capacity} MiB used "
                "out of band (by processes no pod holding the card accounts for)")
        if f.unit is Unit.CARDS:
            return f"{held}, so it is not entirely free; {_container(f)} needs whole cards"
        return f"{held}, leaving {f.free} MiB; {_container(f)} asks {f.requested} MiB"
    if kind is FitKind.TFLOPS_UNKNOWN_MODEL:
        return (f"{_container(f)} asks {f.requested} TFLOPS and the node's cards "
                f"({', '.join(f.offered) or 'none'}) are of no model in the TFLOPS table"
                f"{_among(f)}")
    if kind is FitKind.TFLOPS_ABOVE_CARD:
        return (f"{_container(f)} asks {f.requested} TFLOPS, more than one whole card has: "
                f"at most {f.capacity} TFLOPS ({', '.join(f.offered)}){_among(f)}; a TFLOPS "
                "request is a share of one card")
    if kind is FitKind.INSUFFICIENT_REPLICAS:
        return (f"{f.free} of {f.capacity} {f.resource} time-sliced replicas are free"
                f"{_among(f)}, {_container(f)} needs {f.requested}")
    if kind is FitKind.INSUFFICIENT_MIG:
        profile = f.resource.removeprefix("nvidia.com/mig-")
        return (f"{f.free} of {f.capacity} MIG {profile} instances free, "
                f"{_container(f)} needs {f.requested}")
    if kind is FitKind.MIG_DISTINCT_CARDS:
        profile = f.resource.removeprefix("nvidia.com/mig-")
        return (f"{f.free} of {f.capacity} cards with MIG {profile} instances have one free, "
                f"{_container(f)} needs one on each of {f.requested} distinct cards")
    if kind is FitKind.CARD_COMPUTE:
        return (f"card {f.card} has {compute_text(f.free)} free, {compute_text(f.requested)} "
                "asked")
    if kind is FitKind.CARD_REPLICAS:
        return f"card {f.card} has {f.free} time-sliced replicas free, {f.requested} asked"
    if kind is FitKind.CARD_MEMORY:
        return f"card {f.card} has {f.free} MiB free, {f.requested} asked"
    if kind is FitKind.NO_SUCH_CARD:
        return f"no card {f.card}"
    if kind is FitKind.NO_SUCH_MIG_INSTANCE:
        return f"card {f.card} has no MIG instance {f.instance}"
    if kind is FitKind.MIG_INSTANCE_HELD:
        return f"MIG instance {f.instance} is held by {f.holder}"
    if kind is FitKind.MIG_ENABLED_CARD:
        return f"card {f.card} is MIG-enabled; only its MIG instances can be given out"
    if kind is FitKind.CLAIM_BLOCKED:
        return describe_blocks(f.claim_blocks)
    if kind is FitKind.CLAIM_ON_OTHER_NODE:
        return f"ElasticGPUClaim {f.claim} is bound to ElasticGPU {f.elastic_gpu} on node {f.node}"
    if kind is FitKind.DRA_NAMES_CLAIMS:
        return f"{_how_to_ask(f)} (ElasticGPUClaims are served on device-plugin nodes only)"
    if kind is FitKind.DRA_NOT_SERVED:
        verb = "is" if len(f.asked) == 1 else "are"
        return (f"{_how_to_ask(f)} ({', '.join(f.asked)} {verb} not served there; whole cards "
                f"as {', '.join(f.offered)} are)")
    assert kind is FitKind.UNDETAILED
    return "no card has room for this GPU request (see the other nodes' reasons for detail)"


def describe_on(node: str | None, failure: FitFailure) -> str:
    """`describe`, with the node named in front when there is one (logs, bind errors)."""
    if not node:
        return describe(failure)
    if failure.kind is FitKind.UNKNOWN_NODE:
        return f"node {node} is unknown to the GPU scheduler"
    return f"node {node}: {describe(failure)}"


def describe_no_fit(summary: NoNodeFits) -> str:
    counts = ", ".join(f"{n} {category}" for category, n in summary.counts)
    text = f"0/{summary.nodes} nodes can host pod {summary.pod}"
    if counts:
        text += f" ({counts})"
    if summary.example is not None:
        text += f"; e.g. {describe_on(summary.example_node, summary.example)}"
    return text
