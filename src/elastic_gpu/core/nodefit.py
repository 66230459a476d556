"""GPU compute at node level, counted by kube-scheduler itself, so that its preemption sees a
node short of GPU (issue #17, must-show 2). Pure, no I/O.

Every GPU name is `ignoredByScheduler` (the extender places cards), so on a node short only of
GPU kube-scheduler's filter plugins saw no shortage, DefaultPreemption proposed no victim and
the extender's `preempt` verb was never asked. One extended resource closes that gap:

- the agent advertises `node.elasticgpu.io/gpu-core` in its Node's status, 100 per card (100 x
  r for a card time-sliced into r replicas of a whole-card name), capacity and allocatable
  alike (`node_capacity`);
- the mutating webhook puts the same name on every GPU container (`node_core`), limits and
  (when present) requests;
- it is a managed resource of the extender with `ignoredByScheduler: false`: kube-scheduler's
  NodeResourcesFit counts it, finds the node full, and DefaultPreemption proposes
  lower-priority pods whose removal frees enough of it; the extender's `preempt` then keeps
  only victims that free the cards the pod needs (adding lower-priority holders if not).

The count is a **lower bound** of what the extender holds, never more: kube-scheduler must never
refuse a node the extender would place a pod on (the extender refines, it cannot add room).
Hence, unlike the quota's `quota.elasticgpu.io/gpu-core` (`core.quota`, rounded up so a quota
cannot be understated): a share counts its percent rounded down, a MIG instance 100 x its card fraction
(`core.mig.profiles.card_fraction`, by the profile's name) rounded down (seven A100 `1g` make
98, not 105; four A30 `1g` 100), a container backed by an ElasticGPUClaim counts 0
(the ElasticGPU holds its cards whoever consumes it, and evicting a consumer frees none of
them: the extender's `preempt` agrees), and a node's allocatable is its capacity whatever the
cards' health (the extender refuses unhealthy cards; a pod still holding one must not make the
node look full). Memory is not counted at node level: whole cards state none, so its sum would
not bound a node's use. See docs/budgets.md, "Preemption (must-show 2)".
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from elastic_gpu.core.mig.profiles import card_fraction
from elastic_gpu.core.request import ContainerRequest, RequestKind
from elastic_gpu.core.resources import MILLI_PER_CARD, PERCENT_PER_CARD

NODE_CORE = "node.elasticgpu.io/gpu-core"


def node_core(request: ContainerRequest) -> int:
    """What one container counts in `NODE_CORE` (0: no GPU, or nothing it alone holds)."""
    if request.kind is RequestKind.MIG:
        assert request.mig_profile is not None
        # rounded down per instance: the count must not overstate what the extender holds
        return math.floor(PERCENT_PER_CARD * card_fraction(request.mig_profile)) * request.cards
    if request.kind is RequestKind.NONE:
        return 0
    return request.total_milli * PERCENT_PER_CARD // MILLI_PER_CARD


def node_capacity(replicas_per_card: Iterable[int]) -> int:
    """A node's `NODE_CORE`: 100 per card, 100 x r for a card serving r > 1 time-sliced
    replicas of a whole-card name (each replica pod counts 100, as it asked for a card)."""
    return sum(PERCENT_PER_CARD * max(1, r) for r in replicas_per_card)
