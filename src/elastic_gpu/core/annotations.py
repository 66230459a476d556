"""Annotation and label keys: the contract between scheduler, agent, webhook and users.

Kept in one module so that a key is spelled once. See docs/architecture.md, "Contracts".
"""

from __future__ import annotations

PREFIX = "elasticgpu.io"

#: Written by the scheduler in the pod's Binding (one write that also sets the node name):
#: JSON of the chosen cards per container (see `elastic_gpu.core.assignment`). The source of
#: truth for allocations.
ASSIGNMENT = f"{PREFIX}/assignment"
#: Node the assignment was made for; lets the agent ignore stale assignments.
ASSIGNED_NODE = f"{PREFIX}/assigned-node"
#: Written by the agent once Allocate has handed the cards to the container runtime.
ALLOCATED = f"{PREFIX}/allocated"

#: User choices, per pod.
NODE_POLICY = f"{PREFIX}/node-policy"
CARD_POLICY = f"{PREFIX}/card-policy"
GPU_MODEL_ALLOW = f"{PREFIX}/gpu-model"  # "A100|H100": only these models
GPU_MODEL_DENY = f"{PREFIX}/gpu-model-deny"  # "T4": never these models

#: Elastic GPU (original) claim binding on a pod: egpuc.elasticgpu.io/<container>: <claim>.
CLAIM_PREFIX = "egpuc.elasticgpu.io/"

#: Node label the agent sets where it runs, and the label with the card model.
AGENT_LABEL = f"{PREFIX}/agent"
GPU_MODEL_LABEL = f"{PREFIX}/gpu-model"

#: The Kubernetes recommended label naming the tool that manages an object. The MIG adapter
#: puts it on every MIGSubstitution it writes (`core.mig.ADAPTER`); a rule without it is not
#: the adapter's and is never carried out (docs/mig-adapter.md, "Whose rules are carried out").
MANAGED_BY = "app.kubernetes.io/managed-by"
