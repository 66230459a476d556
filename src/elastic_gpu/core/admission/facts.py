"""What admission knows of the cluster (`ClusterFacts`), and how it is made from Nodes.

The webhook keeps these facts from its watches (Nodes, MIGSubstitutions) and the scheduler's
policy registries; the rules read them, never the API.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.dra.nodemode import is_dra_node
from elastic_gpu.core.mig.profiles import mig_model
from elastic_gpu.core.mig.rules import SubstitutionRule
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.nodestatus import gpu_capacity
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.resources import MILLI_PER_CARD, PERCENT_PER_CARD, Measure, lookup

#: Node labels naming the card model (the agent's, NVIDIA's GPU feature discovery's).
MODEL_LABELS = (ann.GPU_MODEL_LABEL, "nvidia.com/gpu.product")
#: the node's GPU count as NVIDIA's GPU feature discovery labels it (the sandbox's nodes too)
GPU_COUNT_LABEL = "nvidia.com/gpu.count"


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
    #: the least memory one GPU node's cards have (MiB; 0: none known): a peer's memory
    #: percentage is sized on it (`core.peers`)
    smallest_card_memory_mib: int = 0
    #: the UUIDs of the cluster's cards (the webhook's GPUDevice watch; None: not known)
    card_uuids: frozenset[str] | None = None
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
    without GPUs or one whose capacity cannot be read. Capacity as `core.nodestatus` reads it
    for every component."""
    if not isinstance(node, Mapping):
        return None
    meta = node.get("metadata")
    status = node.get("status")
    if not isinstance(meta, Mapping) or not isinstance(status, Mapping):
        return None
    cards = 0
    memory_total = 0
    migs: set[str] = set()
    for key, quantity in gpu_capacity(node).items():
        spec = lookup(key)
        if spec is None or quantity is None or quantity.denominator != 1 or quantity <= 0:
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
    raw_labels = meta.get("labels")
    labels: Mapping[str, Any] = raw_labels if isinstance(raw_labels, Mapping) else {}
    if is_dra_node(labels):
        # a DRA-mode node advertises no GPU name but its node-level count, 100 per card
        # (`core.nodefit`): whole cards there are `nvidia.com/gpu` through the DeviceClass
        cards = max(cards, _node_core(status) // PERCENT_PER_CARD)
    if cards == 0 and not migs:
        return None
    model = next((str(labels[k]) for k in MODEL_LABELS if isinstance(labels.get(k), str)), "")
    if labels.get(ann.MIG_DYNAMIC_LABEL) == "true":
        # dynamic MIG carves any profile of the model on demand, and merges carved cards back
        # for whole-card pods (docs/mig-apply.md): every card of the node (GPU feature
        # discovery's count) may be whole again
        mig_table = mig_model(model)
        if mig_table is not None:
            migs.update(p.profile.resource_name for p in mig_table.profiles)
        count = str(labels.get(GPU_COUNT_LABEL, ""))
        if count.isdigit() and count.isascii():
            cards = max(cards, int(count))
    return NodeGpus(str(meta.get("name", "")), cards, memory_total // cards if cards else 0, model,
                    frozenset(migs))


def _node_core(status: Mapping[str, Any]) -> int:
    raw = (status.get("capacity") or status.get("allocatable") or {})
    value = raw.get(NODE_CORE) if isinstance(raw, Mapping) else None
    try:
        quantity = parse_quantity(value) if isinstance(value, (str, int)) else None
    except QuantityError:
        return 0
    return int(quantity) if quantity is not None and quantity > 0 else 0


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
        smallest_card_memory_mib=min((n.memory_mib_per_card for n in ordered
                                      if n.memory_mib_per_card), default=0),
        models=frozenset(n.model for n in ordered if n.model),
        mig_profiles=frozenset(m for n in ordered for m in n.mig_profiles),
        node_policies=frozenset(node_policies) if node_policies is not None else None,
        card_policies=frozenset(card_policies) if card_policies is not None else None,
    )


def default_policies() -> tuple[frozenset[str], frozenset[str]]:
    """The node and card policy names the scheduler knows (its registries)."""
    from elastic_gpu.core.policies import CARD_POLICIES, NODE_POLICIES

    return frozenset(NODE_POLICIES), frozenset(CARD_POLICIES)
