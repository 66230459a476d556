"""The budgets' mutators (issue #17): the lower PriorityClass of an over-budget namespace's
GPU pods, and the budget keeper's finalizer."""

from __future__ import annotations

from typing import Any

from elastic_gpu.core.admission.jsonpatch import PatchOp, pointer
from elastic_gpu.core.admission.mutation import MutationInput
from elastic_gpu.core.budget.settle import FINALIZER


def budget_priority(data: MutationInput) -> list[PatchOp]:
    """A GPU pod (device-plugin names or claims of our DeviceClasses) of an over-budget
    namespace (`data.budget`, looked up by the adapter) gets the
    lower PriorityClass: `priorityClassName`, the matching `priority` (the apiserver's Priority
    plugin resolved the class before the webhooks ran, so both are set) and the class's
    `preemptionPolicy` when it has one. A pod already at or below that priority is left alone
    (a budget never raises a priority), which also makes the patch empty under reinvocation;
    in budget, nothing."""
    lower = data.budget
    if lower is None or not data.gpu_pod:
        return []
    spec = data.pod.get("spec") or {}
    current = spec.get("priority")
    if isinstance(current, int) and not isinstance(current, bool) and current <= lower.priority:
        return []
    wanted: list[tuple[str, Any]] = [("priorityClassName", lower.priority_class),
                                     ("priority", lower.priority)]
    if lower.preemption_policy is not None:
        wanted.append(("preemptionPolicy", lower.preemption_policy))
    return [{"op": "replace" if key in spec else "add", "path": pointer("spec", key), "value": value}
            for key, value in wanted if spec.get(key) != value]


def budget_finalizer(data: MutationInput) -> list[PatchOp]:
    """A GPU pod of a namespace with a GPU budget (`data.budgeted`) gets the budget keeper's
    finalizer `elasticgpu.io/budget` (`core.budget.settle.FINALIZER`) at CREATE, so a pod that ends
    (or is deleted) while the keeper is down stays until its usage is settled
    (docs/budgets.md). Only there: a finalizer holds a deleted pod's object until
    `egpu controller` removes it, so a namespace with nothing to settle must not wait for it
    (issue #26). Opt-in: the webhook's `--budget-finalizer` appends it to its mutators."""
    if not data.gpu_pod or not data.budgeted:
        return []
    meta = data.pod.get("metadata") or {}
    finalizers = meta.get("finalizers")
    if not isinstance(finalizers, list):
        return [{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]
    if FINALIZER in finalizers:
        return []
    return [{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}]
