"""Annotation and label keys: the contract between scheduler, agent, webhook and users.

Kept in one module so that a key is spelled once. See docs/architecture.md, "Contracts".
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "elasticgpu.io"

#: Written by the scheduler in the pod's Binding (one write that also sets the node name):
#: JSON of the chosen cards per container (see `elastic_gpu.core.assignment`). The source of
#: truth for allocations.
ASSIGNMENT = f"{PREFIX}/assignment"
#: Node the assignment was made for, written by the same Binding: an assignment counts only on
#: a pod bound to this node (`core.assignment.distrust`).
ASSIGNED_NODE = f"{PREFIX}/assigned-node"
#: Written by the agent once Allocate has handed the cards to the container runtime.
ALLOCATED = f"{PREFIX}/allocated"

#: Written by the webhook's MIG mutator at a pod's creation: the request as its user wrote it
#: before the MIG adapter moved it (`<container>=<profile>,...`), and the rules that moved it.
#: The `spec.resourceClaims` entries of our DeviceClasses a pod is billed for (quota and
#: budget), comma-separated: a claim shared by several pods is billed on its first user only
#: (`core.dra.podclaims`). Written by the webhook at creation.
DRA_BILLED_CLAIMS = f"{PREFIX}/dra-billed-claims"
MIG_ORIGINAL = f"{PREFIX}/mig-original"
MIG_SUBSTITUTION = f"{PREFIX}/mig-substitution"
#: On a MIGSubstitution (metadata), written by the MIG adapter: the rule's pods are going back
#: to their original profile.
MIG_RETURNING = f"{PREFIX}/mig-returning"

#: User choices, per pod.
NODE_POLICY = f"{PREFIX}/node-policy"
CARD_POLICY = f"{PREFIX}/card-policy"
GPU_MODEL_ALLOW = f"{PREFIX}/gpu-model"  # "A100|H100": only these models
GPU_MODEL_DENY = f"{PREFIX}/gpu-model-deny"  # "T4": never these models
GPU_UUID_ALLOW = f"{PREFIX}/gpu-uuid"  # "GPU-1,GPU-2": only these cards (HAMi use-gpuuuid)
GPU_UUID_DENY = f"{PREFIX}/gpu-uuid-deny"  # "GPU-3": never these cards
#: "true": each MIG container's N instances go on N distinct cards (HAMi's `nvidia.com/gpu:
#: N` under `vgpu-mode: mig`, written by its translation, `core.peers.hami_mig`)
MIG_DISTINCT_CARDS = f"{PREFIX}/mig-distinct-cards"

#: DRA placement by our engine (docs/dra.md, "Claims placed by our engine"): the scheduling
#: gate the webhook puts on a pod whose ResourceClaims (or templates) are of our DeviceClasses,
#: lifted by the extender's DRA allocator once it has written the claims' allocations.
DRA_PLACEMENT_GATE = f"{PREFIX}/dra-placement"
#: On a DeviceClass: "kube-scheduler" leaves that class's claims to kube-scheduler's own
#: allocator (no gate; the allocator lifts a gate it finds on such a pod without placing it).
DRA_PLACEMENT = f"{PREFIX}/dra-placement"
DRA_PLACEMENT_KUBE_SCHEDULER = "kube-scheduler"

#: Elastic GPU (original) claim binding on a pod: egpuc.elasticgpu.io/<container>: <claim>.
CLAIM_PREFIX = "egpuc.elasticgpu.io/"

#: Test-only: the fake backend's usage model (docs/agent.md "Observed usage"). On a pod, per
#: container `{"<container>": {"memoryMiB": N, "smPercent": M}}`; on a kwok Node, per card
#: index `{"<index>": {"outOfBandMiB": N, "smPercent": M}}`. Real backends ignore it.
FAKE_USAGE = "fake.elasticgpu.io/usage"

#: Pod label of the defragmentation controller (docs/defrag.md): "true" opts a pod in to being
#: moved (evicted for its owner to re-create elsewhere) to make room for a pending pod; "false"
#: keeps it where it is even in a namespace the configuration opts in.
MOVABLE_LABEL = f"{PREFIX}/movable"

#: Node label opting a node's cards in to dynamic MIG (docs/mig-apply.md): "true" lets the
#: mig-dynamic controller carve and merge back its cards (with `mig.dynamic.enabled`).
MIG_DYNAMIC_LABEL = f"{PREFIX}/mig-dynamic"

#: Written on a pending pod by the defragmentation controller before it evicts pods to make
#: room for it (`core.defrag.reservation`): JSON of the cards the plan frees and an expiry;
#: the extender keeps those cards for this pod until it is bound or the expiry passes.
DEFRAG_RESERVATION = f"{PREFIX}/defrag-reservation"
#: Written on a pending pod by the defragmentation controller with each new plan for it
#: (`core.defrag.record`): JSON of the moves and the pod's planned placement, in report mode
#: the plan it would carry out; `egpu top` shows it while the pod is not bound.
DEFRAG_PLAN = f"{PREFIX}/defrag-plan"

#: Node label with the card model.
GPU_MODEL_LABEL = f"{PREFIX}/gpu-model"

#: The Kubernetes recommended label naming the tool that manages an object. The MIG adapter
#: puts it on every MIGSubstitution it writes (`core.mig.rules.ADAPTER`); a rule without it is not
#: the adapter's and is never carried out (docs/mig-adapter.md, "Whose rules are carried out").
MANAGED_BY = "app.kubernetes.io/managed-by"

#: The virtual permission that makes a requester "the system" for the ledger: RBAC authorizes
#: any resource and verb name, so the chart grants `write` on `ledger.elasticgpu.io` to the
#: Elastic GPU ServiceAccounts that write it; cluster admins hold it through `*`, the built-in
#: `edit` and `admin` roles never do. The admission policies ask it through CEL's authorizer
#: (docs/architecture.md, "Who writes the ledger").
SYSTEM_PERMISSION_GROUP = PREFIX
SYSTEM_PERMISSION_RESOURCE = "ledger"
SYSTEM_PERMISSION_VERB = "write"
#: The virtual permission to use the admission opt-out label (`elasticgpu.io/admission:
#: ignore`, `core.admission.rules.OPT_OUT_LABEL`) on a pod or namespace.
OPT_OUT_PERMISSION_RESOURCE = "admission-opt-out"
OPT_OUT_PERMISSION_VERB = "use"


@dataclass(frozen=True)
class SystemAnnotation:
    """A pod annotation only the system writes: its key, who writes it, and whether the
    mutating webhook writes it into a pod while it is created (then any requester's CREATE may
    carry it, because the webhook is authoritative over it: see `core.admission`)."""

    key: str
    writer: str
    set_at_create: bool = False


#: Every pod annotation the system owns. No one but the system may create a pod with one
#: (except those the webhook writes at creation) nor add, change or remove one on a pod.
SYSTEM_POD_ANNOTATIONS: tuple[SystemAnnotation, ...] = (
    SystemAnnotation(ASSIGNMENT, "the Elastic GPU scheduler, through the pod's Binding"),
    SystemAnnotation(ASSIGNED_NODE, "the Elastic GPU scheduler, through the pod's Binding"),
    SystemAnnotation(ALLOCATED, "the Elastic GPU node agent"),
    SystemAnnotation(MIG_ORIGINAL, "the Elastic GPU webhook when the MIG adapter moves a pod",
                     set_at_create=True),
    SystemAnnotation(MIG_SUBSTITUTION, "the Elastic GPU webhook when the MIG adapter moves a "
                     "pod", set_at_create=True),
    SystemAnnotation(DRA_BILLED_CLAIMS, "the Elastic GPU webhook when a pod names ResourceClaims "
                     "of its DeviceClasses", set_at_create=True),
    SystemAnnotation(DEFRAG_RESERVATION, "the Elastic GPU controller when it makes room for a "
                     "pending pod"),
    SystemAnnotation(DEFRAG_PLAN, "the Elastic GPU controller when it plans room for a pending "
                     "pod"),
)
