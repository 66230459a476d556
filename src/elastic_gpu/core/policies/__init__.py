"""Policy registries: node tier and card tier, by name.

A new policy is a subclass of `NodePolicy` or `CardPolicy` (policies/base.py) added with
`register_node_policy` / `register_card_policy`; the engine, the extender and `egpu simulate`
then accept its name. A node policy scores node views (`score`), and may also score every
node at once from arrays (`score_arrays`); the engine uses the arrays when a policy has them.
"""

from __future__ import annotations

from elastic_gpu.core.policies.base import (
    CardPolicy,
    CardView,
    HostThresholds,
    NodeArrays,
    NodePolicy,
    NodeView,
    ScoreContext,
)
from elastic_gpu.core.policies.card import CARD_POLICY_CLASSES
from elastic_gpu.core.policies.node import NODE_POLICY_CLASSES

NODE_POLICIES: dict[str, type[NodePolicy]] = {cls.name: cls for cls in NODE_POLICY_CLASSES}

#: The node policy used when none is named: `egpu simulate --policy` and the extender's
#: `nodePolicy` both default to it (one rule for both; docs/simulator.md, "When CPU is scarce").
DEFAULT_NODE_POLICY = "fgdx-auto"
CARD_POLICIES: dict[str, type[CardPolicy]] = {cls.name: cls for cls in CARD_POLICY_CLASSES}


def register_node_policy(cls: type[NodePolicy]) -> type[NodePolicy]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    NODE_POLICIES[cls.name] = cls
    return cls


def register_card_policy(cls: type[CardPolicy]) -> type[CardPolicy]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    CARD_POLICIES[cls.name] = cls
    return cls


def node_policy(name: str) -> NodePolicy:
    try:
        return NODE_POLICIES[name]()
    except KeyError:
        known = ", ".join(sorted(NODE_POLICIES))
        raise ValueError(f"unknown node policy {name!r}; known: {known}") from None


def default_card_policy(node_policy_name: str) -> str:
    """The card tier a node policy is paired with when none is named (`NodePolicy.card_tier`).

    The one pairing rule: `egpu simulate --card-policy auto` and the extender without
    `cardPolicy` both use it, so the cluster gets the quality the simulator measured. As in the
    FGD artifact: random -> random, fgd -> fgd, the others -> binpack (tightest card); ours:
    fgdx, fgdx-mem and fgdx-auto -> fgd-waste, fgdx-cpufit -> fgd."""
    try:
        cls = NODE_POLICIES[node_policy_name]
    except KeyError:
        known = ", ".join(sorted(NODE_POLICIES))
        raise ValueError(f"unknown node policy {node_policy_name!r}; known: {known}") from None
    if cls.card_tier not in CARD_POLICIES:
        raise ValueError(f"node policy {node_policy_name!r} is paired with card policy "
                         f"{cls.card_tier!r}, which is not registered")
    return cls.card_tier


def card_policy(name: str) -> CardPolicy:
    try:
        return CARD_POLICIES[name]()
    except KeyError:
        known = ", ".join(sorted(CARD_POLICIES))
        raise ValueError(f"unknown card policy {name!r}; known: {known}") from None


__all__ = [
    "CARD_POLICIES", "DEFAULT_NODE_POLICY", "NODE_POLICIES", "CardPolicy", "CardView",
    "HostThresholds", "NodeArrays", "NodePolicy", "NodeView", "ScoreContext", "card_policy",
    "default_card_policy",
    "node_policy", "register_card_policy", "register_node_policy",
]
