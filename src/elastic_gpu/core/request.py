"""What a pod asks for, in internal units, whichever resource names it was written with.

`pod_request_from_manifest` reads a Kubernetes pod (a plain dict, as the API returns it) and
returns a `PodRequest` or raises `ResourceError` with a message a person can act on. It is the
only place that interprets container resources, so the webhook, the scheduler, the agent and
the simulator cannot disagree about what a pod wants.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import lru_cache
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.model import Card
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.resources import (
    GPU_CORE,
    GPU_WHOLE,
    MAX_RESOURCE_VALUE,
    MILLI_PER_CARD,
    MILLI_PER_PERCENT,
    Amount,
    Measure,
    MigProfile,
    ResourceError,
    lookup,
    to_amount,
)
from elastic_gpu.core.tflops import most_milli, share_milli


class RequestKind(enum.Enum):
    NONE = "none"  # no GPU
    SHARE = "share"  # a fraction of a card (compute and/or memory), on `cards` distinct cards
    WHOLE = "whole"  # N whole cards, exclusively
    MIG = "mig"  # N MIG instances of one profile


@dataclass(frozen=True)
class ContainerRequest:
    """One container's GPU request. Compute and memory are per card.

    A SHARE is `cards` shares of one shape (compute and/or memory of one card each) on that
    many distinct cards of one node: 1 for the usual share; N for a multi-card share, written
    `elasticgpu.io/gpu: N` beside a one-card share (`container_request`)."""

    name: str
    kind: RequestKind = RequestKind.NONE
    cards: int = 0
    compute_milli: int = 0
    memory_mib: int = 0
    mig_profile: MigProfile | None = None
    #: The resource names the user wrote, for messages and for the agent's Allocate.
    resources: tuple[str, ...] = ()
    #: A share asked in TFLOPS (`core.tflops`): its compute depends on the card, so
    #: `compute_milli` is 0 and placement asks `milli_on` per candidate card.
    tflops: int = 0
    #: MIG only: the `cards` instances go on that many distinct cards (HAMi's meaning of
    #: `nvidia.com/gpu: N`, `ann.MIG_DISTINCT_CARDS`); False: any cards.
    distinct: bool = False

    def __post_init__(self) -> None:
        if self.kind is RequestKind.SHARE:
            if self.cards < 1 or not 0 <= self.compute_milli < MILLI_PER_CARD:
                raise ValueError(f"container {self.name}: a share is below 1000 milli on each "
                                 "of one or more cards")
            if self.compute_milli == 0 and self.memory_mib == 0 and self.tflops == 0:
                raise ValueError(f"container {self.name}: a share needs compute or memory")
            if self.tflops and self.compute_milli:
                raise ValueError(f"container {self.name}: a share is asked in TFLOPS or in "
                                 "milli-cards, not both")
        elif self.tflops:
            raise ValueError(f"container {self.name}: TFLOPS are a share of a card")
        elif self.kind is RequestKind.WHOLE:
            if self.cards < 1 or self.compute_milli != MILLI_PER_CARD:
                raise ValueError(f"container {self.name}: whole cards need cards >= 1 at 1000 milli")
        elif self.kind is RequestKind.MIG and (self.mig_profile is None or self.cards < 1):
            raise ValueError(f"container {self.name}: a MIG request needs a profile and count")
        if self.distinct and self.kind is not RequestKind.MIG:
            raise ValueError(f"container {self.name}: only MIG instances are asked on distinct "
                             "cards this way")

    @property
    def wants_gpu(self) -> bool:
        return self.kind is not RequestKind.NONE

    @property
    def multi_share(self) -> bool:
        """Whether this is a share on several distinct cards (N shares of one shape)."""
        return self.kind is RequestKind.SHARE and self.cards > 1

    @property
    def served_names(self) -> tuple[str, ...]:
        """The names a card must serve to take this container (`model.offered`): the ones it
        wrote, less a multi-card share's `elasticgpu.io/gpu`, which counts its shares there
        and names no device (its cards serve the share's compute and memory names)."""
        if self.multi_share:
            return tuple(name for name in self.resources if name != GPU_WHOLE)
        return self.resources

    @property
    def total_milli(self) -> int:
        """Compute in milli-cards over all of this container's cards."""
        if self.kind is RequestKind.MIG:
            return 0
        return self.cards * self.compute_milli

    @property
    def most_milli(self) -> int:
        """Compute over all of this container's cards, at most: `total_milli`, and for a
        TFLOPS share the most it can become on any card (`tflops.most_milli`; `total_milli`
        is 0 for it, a lower bound). Accounting that must never undercount reads this."""
        return self.cards * most_milli(self.tflops) if self.tflops else self.total_milli

    def milli_on(self, model: str) -> int | None:
        """The compute (milli-cards) this container needs of one card of `model`: its
        `compute_milli`, or for a TFLOPS share what gives its TFLOPS there (`tflops.share_milli`;
        None: that model cannot take it)."""
        if not self.tflops:
            return self.compute_milli
        return share_milli(model, self.tflops)

    @staticmethod
    def share(name: str, compute_milli: int, memory_mib: int = 0, cards: int = 1
              ) -> ContainerRequest:
        """A share of `compute_milli` and `memory_mib` on each of `cards` distinct cards."""
        return ContainerRequest(name, RequestKind.SHARE, cards, compute_milli, memory_mib)

    @staticmethod
    def whole(name: str, cards: int, memory_mib: int = 0) -> ContainerRequest:
        return ContainerRequest(name, RequestKind.WHOLE, cards, MILLI_PER_CARD, memory_mib)


@dataclass(frozen=True)
class PodRequest:
    """Everything placement needs to know about one pod."""

    name: str
    namespace: str = "default"
    uid: str = ""
    #: The pod's lifetime containers (`lifetime_containers`: sidecars, then regular ones).
    containers: tuple[ContainerRequest, ...] = ()
    #: What the pod asks of its node (`pod_host_requests`).
    cpu_milli: int = 0
    memory_mib: int = 0
    #: None: any model; otherwise the card's model must be one of these.
    allowed_models: frozenset[str] | None = None
    denied_models: frozenset[str] = field(default_factory=frozenset)
    node_policy: str | None = None
    card_policy: str | None = None
    #: None: any card; otherwise the card's UUID must be one of these (HAMi's use-gpuuuid,
    #: written as `elasticgpu.io/gpu-uuid` by the webhook); never the ones of `denied_cards`
    allowed_cards: frozenset[str] | None = None
    denied_cards: frozenset[str] = field(default_factory=frozenset)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def gpu_containers(self) -> tuple[ContainerRequest, ...]:
        return tuple(c for c in self.containers if c.wants_gpu)

    @property
    def wants_gpu(self) -> bool:
        return any(c.wants_gpu for c in self.containers)

    @property
    def total_milli(self) -> int:
        return sum(c.total_milli for c in self.containers)

    def accepts_model(self, model: str) -> bool:
        if model in self.denied_models:
            return False
        return self.allowed_models is None or model in self.allowed_models

    @property
    def pins_cards(self) -> bool:
        """Whether the pod names the cards it may (or may not) have, by UUID."""
        return self.allowed_cards is not None or bool(self.denied_cards)

    def accepts_uuid(self, uuid: str) -> bool:
        if uuid in self.denied_cards:
            return False
        return self.allowed_cards is None or uuid in self.allowed_cards

    def accepts_card(self, card: Card) -> bool:
        """Whether the pod may have this card: its model and its UUID."""
        return self.accepts_model(card.model) and self.accepts_uuid(card.uuid)


def parse_model_list(text: str | None) -> frozenset[str] | None:
    """`"A100|H100"` (the trace's gpu_spec form; commas work too) -> {"A100", "H100"}."""
    if text is None or not text.strip():
        return None
    parts = (p.strip() for chunk in text.split(",") for p in chunk.split("|"))
    return frozenset(p for p in parts if p)


def parse_uuid_list(text: str | None) -> frozenset[str] | None:
    """`"GPU-1,GPU-2"` -> {"GPU-1", "GPU-2"} (None: no list)."""
    if text is None or not text.strip():
        return None
    return frozenset(p.strip() for p in text.split(",") if p.strip())


def container_request(name: str, resources: Mapping[str, Any]) -> ContainerRequest:
    """One container's GPU request from its `resources` (limits win over requests)."""
    merged: dict[str, Any] = dict(resources.get("requests") or {})
    merged.update(resources.get("limits") or {})
    amounts: list[Amount] = [to_amount(key, value) for key, value in merged.items() if lookup(key)]
    if not amounts:
        return ContainerRequest(name)
    written = tuple(sorted(a.spec.name for a in amounts))
    by_measure: dict[Measure, list[Amount]] = {}
    for amount in amounts:
        by_measure.setdefault(amount.spec.measure, []).append(amount)
    for measure, group in by_measure.items():
        if len(group) > 1:
            names = ", ".join(sorted(a.spec.name for a in group))
            raise ResourceError(names, "", f"container {name} asks for {measure.value} twice; use one name")
    mig = by_measure.get(Measure.MIG)
    cards = by_measure.get(Measure.CARDS)
    compute = by_measure.get(Measure.COMPUTE)
    memory_amount = by_measure.get(Measure.MEMORY)
    memory = memory_amount[0].value if memory_amount else 0
    tflops = by_measure.get(Measure.TFLOPS)
    if mig:
        if cards or compute or memory_amount or tflops:
            raise ResourceError(", ".join(written), "", f"container {name}: a MIG profile cannot be "
                                "combined with other GPU resources")
        profile = MigProfile.parse(mig[0].spec.name)
        return ContainerRequest(name, RequestKind.MIG, mig[0].value, 0, 0, profile, written)
    # `elasticgpu.io/gpu: N` beside a one-card share: N such shares on N distinct cards
    share_cards = _share_cards(cards, compute, tflops)
    if share_cards:
        cards = None
    if tflops:
        if cards or compute:
            raise ResourceError(", ".join(written), "", f"container {name}: ask for compute in "
                                "TFLOPS, in percent or in whole cards, one of them")
        return ContainerRequest(name, RequestKind.SHARE, share_cards or 1, 0, memory, None,
                                written, tflops[0].value)
    if cards and compute:
        raise ResourceError(", ".join(written), "", f"container {name}: ask for whole cards or "
                            "a compute share, not both")
    if cards:
        return ContainerRequest(name, RequestKind.WHOLE, cards[0].value, MILLI_PER_CARD, memory, None,
                                written)
    if compute:
        whole = compute[0].whole_cards
        if whole:
            return ContainerRequest(name, RequestKind.WHOLE, whole, MILLI_PER_CARD, memory, None,
                                    written)
        return ContainerRequest(name, RequestKind.SHARE, share_cards or 1, compute[0].value,
                                memory, None, written)
    # Memory alone: a memory-only share of one card (gpushare style).
    if memory == 0:
        return ContainerRequest(name)
    return ContainerRequest(name, RequestKind.SHARE, 1, 0, memory, None, written)


def _share_cards(cards: list[Amount] | None, compute: list[Amount] | None,
                 tflops: list[Amount] | None) -> int:
    """N when the container writes `elasticgpu.io/gpu: N` (the whole-card count of our own
    names, `GPU_WHOLE`) beside a one-card share (a compute share below one card, or TFLOPS):
    N shares of that shape on N distinct cards of one node. 0 otherwise (whole cards stay whole
    cards; a vendor's whole-card name beside a share stays an error)."""
    if not cards or cards[0].spec.name != GPU_WHOLE:
        return 0
    if tflops:
        return cards[0].value
    if compute and not compute[0].whole_cards:
        return cards[0].value
    return 0  # whole cards beside whole cards: refused below, as before


#: Memory resources served by a device plugin: a container asking only for one of these gets
#: an Allocate from kubelet. The other memory names are advertised in the Node's status only
#: (docs/agent.md, `resources.memory`), so kubelet calls no Allocate for them.
DEVICE_PLUGIN_MEMORY = frozenset({"tencent.com/vcuda-memory"})
#: The compute the webhook gives a memory-only share written with one of those other names
#: (`core.admission.mutators.resources.memory_only_compute`): one device of the agent's share
#: plugin, 1 % of the card, so that kubelet calls the agent's Allocate. The ledger bills it;
#: the container's isolation limit does not follow it (`limits_compute`).
MEMORY_ONLY_COMPUTE = (GPU_CORE, "1")


def limits_compute(request: ContainerRequest) -> bool:
    """Whether the isolation provider limits this share's compute: whether the container asked
    compute. A share of memory alone asked none, and neither did one whose only compute is the
    device the webhook gives a memory-only share (`MEMORY_ONLY_COMPUTE` beside a memory name
    kubelet does not Allocate): its container gets no compute limit (HAMi-core's
    `CUDA_DEVICE_SM_LIMIT=0`, HAMi's own meaning of a missing `gpucores`), while the ledger
    keeps billing the 1 %. Read from the container's resources, which are immutable after
    create and passed the webhook, so no annotation a tenant writes decides it; a container
    could only ever gain by it what asking memory alone gives. `elasticgpu.io/gpu-core: 1`
    written by hand beside such a memory name is the same request, and is read the same.
    Whole cards, MIG instances and TFLOPS shares (compute sized per card) are limited as
    before (True)."""
    if request.kind is not RequestKind.SHARE or request.tflops or request.memory_mib == 0:
        return True
    if request.compute_milli == 0:
        return False
    name, value = MEMORY_ONLY_COMPUTE
    return not (request.compute_milli == int(value) * MILLI_PER_PERCENT
                and name in request.resources
                and not DEVICE_PLUGIN_MEMORY & set(request.resources))


#: The `restartPolicy` that makes an init container a sidecar (KEP-753, GA in Kubernetes 1.33):
#: it starts in init order and then keeps running beside the regular containers.
SIDECAR_RESTART_POLICY = "Always"

#: Why a classic init container may not ask a GPU, and what to do instead. kubelet hands the
#: devices a classic init container had to the pod's later containers once it ends (its
#: device manager's `devicesToReuse`), so a card assigned to it would end up in another
#: container than the one the scheduler assigned it to; a sidecar keeps its devices, as a
#: regular container does.
INIT_CONTAINER_GPU_REASON = ("GPUs are given to regular containers and sidecars (init "
                             "containers with restartPolicy: Always) only; move the GPU request "
                             "to a container of spec.containers, or make this init container a "
                             "sidecar")


def is_sidecar(init_container: Mapping[str, Any]) -> bool:
    """Whether an init container is a sidecar (`restartPolicy: Always`)."""
    return init_container.get("restartPolicy") == SIDECAR_RESTART_POLICY


@dataclass(frozen=True)
class SpecContainer:
    """One container of a pod spec and where it is written there (`field` and `index`: the
    JSON pointer `/spec/<field>/<index>` a webhook patches)."""

    field: str  # "containers" or "initContainers"
    index: int
    container: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.container.get("name", "?"))

    @property
    def resources(self) -> Mapping[str, Any]:
        resources = self.container.get("resources")
        return resources if isinstance(resources, Mapping) else {}


def _spec_containers(pod: Mapping[str, Any], field_name: str) -> list[SpecContainer]:
    items = (pod.get("spec") or {}).get(field_name)
    if not isinstance(items, list):
        return []
    return [SpecContainer(field_name, i, c) for i, c in enumerate(items) if isinstance(c, Mapping)]


def lifetime_containers(pod: Mapping[str, Any]) -> list[SpecContainer]:
    """The containers that run for the pod's life, the ones that may hold a GPU: its sidecars,
    then its regular containers, each in spec order (the order kubelet starts them and calls
    Allocate for them). Container names are unique across both lists (kube-apiserver checks
    it), so a name is a container's key in an assignment."""
    sidecars = [c for c in _spec_containers(pod, "initContainers") if is_sidecar(c.container)]
    return sidecars + _spec_containers(pod, "containers")


def classic_init_containers(pod: Mapping[str, Any]) -> list[SpecContainer]:
    """The init containers that run to completion before the next starts (not sidecars)."""
    return [c for c in _spec_containers(pod, "initContainers") if not is_sidecar(c.container)]


def _cpu_milli(resources: Mapping[str, Any]) -> int:
    value = (resources.get("requests") or {}).get("cpu", (resources.get("limits") or {}).get("cpu"))
    if value is None:
        return 0
    return _cpu_milli_of(value) if isinstance(value, str) else _parse_cpu_milli(value)


def _memory_mib(resources: Mapping[str, Any]) -> int:
    value = (resources.get("requests") or {}).get(
        "memory", (resources.get("limits") or {}).get("memory"))
    if value is None:
        return 0
    return _memory_mib_of(value) if isinstance(value, str) else _parse_memory_mib(value)


#: The most CPU (milli) or memory (MiB) one pod may ask of its node, per container and in all:
#: a million times the largest machines, and small enough that no sum of them overflows the
#: engine's 64-bit arrays.
MAX_HOST_REQUEST = 2**53


def _host_amount(resource: str, value: Any, scale: Fraction, unit: str) -> int:
    """A CPU (scale 1000 milli per core) or memory (scale 1/2**20 MiB per byte) quantity in
    internal units, rounded up (never under-reserve), non-negative and bounded."""
    try:
        quantity = parse_quantity(value)
    except QuantityError as err:
        raise ResourceError(resource, value, str(err), show_value=True) from None
    if quantity < 0:
        raise ResourceError(resource, value, "a quantity must not be negative")
    amount = quantity * scale
    whole = -(-amount.numerator // amount.denominator)  # ceiling
    if whole > MAX_HOST_REQUEST:
        raise ResourceError(resource, value, f"at most {MAX_HOST_REQUEST} {unit}")
    return whole


def _parse_cpu_milli(value: Any) -> int:
    milli = _plain_amount(value, "m")
    if milli is not None:
        return milli
    return _host_amount("cpu", value, Fraction(1000), "milli-CPU")


def _parse_memory_mib(value: Any) -> int:
    mib = _plain_amount(value, "Mi")
    if mib is not None:
        return mib
    gib = _plain_amount(value, "Gi", 8)
    if gib is not None:
        return gib * 1024
    return _host_amount("memory", value, Fraction(1, 2**20), "MiB")


def _plain_amount(value: Any, suffix: str, most: int = 12) -> int | None:
    """The number of a quantity written as ASCII digits and `suffix` ("250m", "512Mi"), the
    forms pods are written in, read without the exact (Fraction) arithmetic; None for any
    other form, and beyond `most` digits (12 for m and Mi, 8 for Gi: inside every bound
    `_host_amount` checks, the 64-bit quantity's included)."""
    if not isinstance(value, str) or not value.endswith(suffix):
        return None
    digits = value[:-len(suffix)]
    if not 0 < len(digits) <= most or not digits.isascii() or not digits.isdigit():
        return None
    return int(digits)


# The scheduler reads every pod's CPU and memory on every watch event, and a cluster's pods
# repeat a handful of strings: the exact (Fraction) arithmetic is done once per string.
_cpu_milli_of = lru_cache(maxsize=4096)(_parse_cpu_milli)
_memory_mib_of = lru_cache(maxsize=4096)(_parse_memory_mib)


def pod_host_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(CPU milli, memory MiB) a pod dict asks of its node, as kube-scheduler counts it
    (component-helpers `resource.PodRequests`, KEP-753): the regular containers and the
    sidecars run together for the pod's life, so they are summed; a classic init container runs
    alone but beside the sidecars started before it, so it needs its own request plus theirs;
    the pod needs the larger of the two; pod-level requests (`spec.resources`) replace that
    for the resources they name; plus the overhead its RuntimeClass set (`spec.overhead`). CPU
    and memory are each taken on their own, as upstream does."""
    spec: Mapping[str, Any] = pod.get("spec") or {}
    containers: Sequence[Mapping[str, Any]] = spec.get("containers") or []
    init_containers: Sequence[Mapping[str, Any]] = spec.get("initContainers") or []
    cpu = sum(_cpu_milli(c.get("resources") or {}) for c in containers)
    mem = sum(_memory_mib(c.get("resources") or {}) for c in containers)
    sidecars_cpu = sidecars_mem = 0  # the sidecars started so far
    init_cpu = init_mem = 0  # the most any step of the init sequence needs
    for init in init_containers:
        resources = init.get("resources") or {}
        step_cpu, step_mem = _cpu_milli(resources), _memory_mib(resources)
        if is_sidecar(init):
            sidecars_cpu, sidecars_mem = sidecars_cpu + step_cpu, sidecars_mem + step_mem
            step_cpu, step_mem = sidecars_cpu, sidecars_mem
        else:
            step_cpu, step_mem = step_cpu + sidecars_cpu, step_mem + sidecars_mem
        init_cpu, init_mem = max(init_cpu, step_cpu), max(init_mem, step_mem)
    cpu = max(cpu + sidecars_cpu, init_cpu)
    mem = max(mem + sidecars_mem, init_mem)
    # Pod-level requests (KEP-2837, on by default since Kubernetes 1.34) replace the
    # containers' sum for the resources they name. Only requests: upstream reads no pod-level
    # limit here, and kube-apiserver's defaulting fills the requests of a pod that set limits
    pod_level = {"requests": (spec.get("resources") or {}).get("requests") or {}}
    if "cpu" in pod_level["requests"]:
        cpu = _cpu_milli(pod_level)
    if "memory" in pod_level["requests"]:
        mem = _memory_mib(pod_level)
    overhead = {"requests": spec.get("overhead") or {}}
    cpu, mem = cpu + _cpu_milli(overhead), mem + _memory_mib(overhead)
    if cpu > MAX_HOST_REQUEST:
        raise ResourceError("cpu", f"{cpu}m", f"the pod's total is at most {MAX_HOST_REQUEST} "
                            "milli-CPU")
    if mem > MAX_HOST_REQUEST:
        raise ResourceError("memory", f"{mem}Mi", f"the pod's total is at most "
                            f"{MAX_HOST_REQUEST} MiB")
    return cpu, mem


def _check_pod_gpu_total(requests: Sequence[ContainerRequest]) -> None:
    """Each value is bounded by its own rule, but sums over containers feed the engine's
    64-bit arithmetic (compute left on a node minus the pod's total): bound the pod's totals
    too, so no request can overflow it."""
    cards = sum(c.cards for c in requests if c.wants_gpu)
    milli = sum(c.total_milli for c in requests)
    if cards > MAX_RESOURCE_VALUE or milli > MAX_RESOURCE_VALUE:
        names = ", ".join(sorted({r for c in requests for r in c.resources}))
        raise ResourceError(names, "", f"the pod's containers together ask for {cards} cards; "
                            f"a pod's total is at most {MAX_RESOURCE_VALUE} milli-cards")


def pod_request_from_manifest(pod: Mapping[str, Any]) -> PodRequest:
    """Read a pod dict (as the API serves it) into a `PodRequest`. Its containers are the
    pod's lifetime containers (`lifetime_containers`: sidecars, then regular containers); a
    classic init container asking a GPU is an error (`INIT_CONTAINER_GPU_REASON`)."""
    meta: Mapping[str, Any] = pod.get("metadata") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    for init in classic_init_containers(pod):
        request = container_request(init.name, init.resources)
        if request.wants_gpu:
            raise ResourceError(", ".join(request.resources), "",
                                f"init container {init.name} asks for a GPU; "
                                f"{INIT_CONTAINER_GPU_REASON}")
    requests = tuple(container_request(c.name, c.resources) for c in lifetime_containers(pod))
    if str(annotations.get(ann.MIG_DISTINCT_CARDS, "")).strip().lower() == "true":
        requests = tuple(replace(c, distinct=True) if c.kind is RequestKind.MIG else c
                         for c in requests)
    _check_pod_gpu_total(requests)
    cpu, mem = pod_host_requests(pod)
    return PodRequest(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "default")),
        uid=str(meta.get("uid", "")),
        containers=requests,
        cpu_milli=cpu,
        memory_mib=mem,
        allowed_models=parse_model_list(annotations.get(ann.GPU_MODEL_ALLOW)),
        denied_models=parse_model_list(annotations.get(ann.GPU_MODEL_DENY)) or frozenset(),
        node_policy=annotations.get(ann.NODE_POLICY),
        card_policy=annotations.get(ann.CARD_POLICY),
        allowed_cards=parse_uuid_list(annotations.get(ann.GPU_UUID_ALLOW)),
        denied_cards=parse_uuid_list(annotations.get(ann.GPU_UUID_DENY)) or frozenset(),
    )
