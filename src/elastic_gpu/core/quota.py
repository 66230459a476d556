"""ResourceQuota on GPU shares in canonical units, whatever alias a pod uses. Pure, no I/O.

A ResourceQuota counts a pod's `requests.<name>` under the exact names it was written with, so
a quota on `tencent.com/vcuda-core` misses the same share written `nano-gpu/gpu-percent`,
`elasticgpu.io/gpu-core` or through an ElasticGPUClaim. The mutating webhook therefore adds to
every GPU container two accounting resources in canonical units (`quota_resources`):

- `quota.elasticgpu.io/gpu-core`: compute in percent of one card: a share its percent, whole
  cards 100 each (`nvidia.com/gpu: 2` -> 200), a MIG instance 100 x its card fraction
  (`core.mig.profiles.card_fraction`, by the profile's name: the card is not chosen yet)
  rounded up, per instance (A100/H100 `1g` 15, `3g` 43, `7g` 100; A30 `1g` 25);
- `quota.elasticgpu.io/gpu-memory`: card memory in MiB: a share's memory (`vcuda-memory: 4` ->
  1024), a MIG instance its profile's memory (`3g.40gb` -> 40960); whole cards state none.

A quota written in them (`requests.quota.elasticgpu.io/gpu-core: "100"`: one card's worth)
then counts every alias and every claim the same. ResourceQuota's admission runs after the
mutating webhooks (it is a validating plug-in), so it sees the added names (on sidecars too:
it sums a sidecar's requests with the containers' as kube-scheduler does), and the webhook
sets them whatever the user wrote, so they cannot be understated.

What the rest of the system sees: no node advertises these names. kube-scheduler must not
count them (they are `managedResources` of the extender with `ignoredByScheduler: true`, like
every GPU name, or NodeResourcesFit reports them insufficient); kubelet's admission drops
requests of extended resources its node does not advertise (`removeMissingExtendedResources`)
and its device manager calls Allocate only for resources a device plugin registered, so the
agent never sees them; the extender reads GPU requests through the resource table, which does
not know them. `core.admission.chain.QUOTA_MUTATORS` is behind the webhook's `--quota-resources` (it passes
`admit(..., mutators=QUOTA_MUTATORS)`), not part of `MUTATORS`, because a kube-scheduler
configured by someone else may not ignore the names; the chart and the sandbox, which
configure kube-scheduler themselves, turn it on. See docs/budgets.md, "Quota".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from elastic_gpu.core.admission.jsonpatch import PatchOp, pointer
from elastic_gpu.core.admission.mutation import MutationInput
from elastic_gpu.core.dra.podclaims import container_demand
from elastic_gpu.core.dra.quota import Demand
from elastic_gpu.core.mig.profiles import card_fraction
from elastic_gpu.core.request import (
    ContainerRequest,
    RequestKind,
    container_request,
    lifetime_containers,
)
from elastic_gpu.core.resources import MILLI_PER_CARD, PERCENT_PER_CARD, ResourceError

QUOTA_CORE = "quota.elasticgpu.io/gpu-core"
QUOTA_MEMORY = "quota.elasticgpu.io/gpu-memory"
QUOTA_NAMES = (QUOTA_CORE, QUOTA_MEMORY)

#: What every node of a cluster with our DeviceClasses advertises of each of the quota's
#: accounting names (`core.quota.QUOTA_NAMES`), more than any node's pods can ask.
#: kube-scheduler's DynamicResources filter (KEP-5004, beta in 1.36) checks *every* extended
#: resource of a pod that asks a DRA-mapped name (`nvidia.com/gpu`) against the node's
#: allocatable, and fails the node with "cannot fit resource" for one neither advertised nor
#: DRA-backed; it does not read the extender's `ignoredByScheduler`. The webhook puts the
#: accounting names on every GPU container, so without them advertised an `nvidia.com/gpu`
#: pod fits no node at all, device-plugin nodes included.
ACCOUNTING_ALLOCATABLE = "1000000000"


def accounting_allocatable() -> dict[str, str]:
    """The quota's accounting names as a node of a DRA-enabled cluster advertises them."""
    return dict.fromkeys(QUOTA_NAMES, ACCOUNTING_ALLOCATABLE)


def with_accounting(gpu: Mapping[str, str]) -> dict[str, str]:
    """The GPU part of a node's status (capacity or allocatable): the GPU names its agent
    advertises (`gpu`, in either mode) and, on a GPU node (any GPU name), the quota's
    accounting names beside them (`accounting_allocatable`). The one rule for every writer of
    a Node's status: the agent's capacity patch (`agent.node_status.status_patch`) and the
    sandbox's kwok Node manifests, which are the status that patch would leave."""
    return {**gpu, **accounting_allocatable()} if gpu else {}


def canonical_resources(request: ContainerRequest) -> dict[str, str]:
    """One container's accounting resources (none for a container without a GPU; a zero
    measure is left out)."""
    core = memory = 0
    if request.kind is RequestKind.MIG:
        assert request.mig_profile is not None
        # rounded up: a quota must not under-count
        per = math.ceil(PERCENT_PER_CARD * card_fraction(request.mig_profile))
        core = per * request.cards
        memory = request.mig_profile.memory_gb * 1024 * request.cards
    elif request.kind is not RequestKind.NONE:
        # a TFLOPS share at the most it can become: its card is not known yet
        core = -(-request.most_milli * PERCENT_PER_CARD // MILLI_PER_CARD)
        memory = request.memory_mib * request.cards
    out: dict[str, str] = {}
    if core:
        out[QUOTA_CORE] = str(core)
    if memory:
        out[QUOTA_MEMORY] = str(memory)
    return out


def _with_claims(wanted: dict[str, str], demand: Demand | None) -> dict[str, str]:
    if not demand:
        return wanted
    out = dict(wanted)
    for name, value in ((QUOTA_CORE, demand.core), (QUOTA_MEMORY, demand.memory)):
        if value:
            out[name] = str(int(out.get(name, "0")) + value)
    return out


def quota_resources(data: MutationInput) -> list[PatchOp]:
    """Each GPU container gets the accounting resources of its request (`canonical_resources`)
    in its limits, and in its requests when it has them (ResourceQuota counts requests; an
    extended resource's request defaults to its limit). The request is read from the container
    as the mutators before left it, like `node_resources`: a claim's resources, and the profile
    a MIG substitution gave it, not the one written. ResourceClaims of our DeviceClasses the pod
    bills (`core.dra.podclaims.container_demand`: a shared claim on its first user, each claim
    on one container) add their demand (`core.dra.quota`), in limits and requests both, written
    whole where the container has none. A value already right is kept, any other is replaced:
    idempotent under reinvocation, and a user cannot understate it."""
    ops: list[PatchOp] = []
    claimed = container_demand(data.pod, data.dra, max(1, data.facts.largest_cards))
    # sidecars too: ResourceQuota sums them with the containers, as kube-scheduler does
    for item in lifetime_containers(data.pod):
        resources: Mapping[str, Any] = item.resources
        try:
            request = container_request(item.name, resources)
        except (ResourceError, ValueError):
            continue  # validation refused such a container before any mutator ran
        demand = claimed.get(item.name)
        wanted = _with_claims(canonical_resources(request), demand)
        if not wanted:
            continue
        if demand and "resources" not in item.container:
            ops.append({"op": "add", "path": pointer("spec", item.field, item.index,
                                                     "resources"),
                        "value": {"limits": dict(wanted), "requests": dict(wanted)}})
            continue
        for part in ("limits", "requests"):
            values = resources.get(part)
            if not isinstance(values, Mapping):
                if demand:
                    ops.append({"op": "add", "path": pointer("spec", item.field, item.index,
                                                             "resources", part),
                                "value": dict(wanted)})
                continue
            for name, value in wanted.items():
                if str(values.get(name)) == value:
                    continue
                ops.append({"op": "replace" if name in values else "add",
                            "path": pointer("spec", item.field, item.index, "resources",
                                            part, name),
                            "value": value})
    return ops
