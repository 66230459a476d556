"""The MIG adapter's mutator: a pod a MIGSubstitution selects gets its rule's profile."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elastic_gpu.core.admission.jsonpatch import PatchOp, apply_patch, pointer, set_annotation
from elastic_gpu.core.admission.mutation import MutationInput
from elastic_gpu.core.admission.pod import owner_uids, pod_containers, pod_namespace
from elastic_gpu.core.mig.rules import MIG_ORIGINAL, MIG_SUBSTITUTION


def mig_substitution(data: MutationInput) -> list[PatchOp]:
    """The MIG adapter's rewrite (docs/mig-adapter.md): a pod a MIGSubstitution selects (its
    owner's uid, or its name, in the rule's namespace; `facts.mig_substitutions`) gets each
    `nvidia.com/mig-<from>` of its containers' limits and requests replaced by
    `nvidia.com/mig-<to>` (the same amount), and the request as written is recorded in
    `elasticgpu.io/mig-original` (`<container>=<profile>`, comma-separated; kept when a pod
    moves twice) and the rule in
    `elasticgpu.io/mig-substitution`. Idempotent: a rewritten pod asks no `<from>` any more.
    Rules are applied in name order; a second rule for the same `<from>` finds nothing left.

    The two annotations are the system's (`ann.SYSTEM_POD_ANNOTATIONS`), written here during
    the CREATE of whoever makes the pod, so this mutator is authoritative over them: a pod
    arriving with them keeps them only when every rule its `mig-substitution` names selects it
    (this mutator's own record, seen again on reinvocation, or a pod the MIG adapter re-creates
    after a second move); any other value is removed, so no pod author can forge where a pod
    came from or which rule moved it."""
    pod = data.pod
    meta = pod.get("metadata") or {}
    rules = sorted((r for r in data.facts.mig_substitutions
                    if r.selects(pod_namespace(pod), str(meta.get("name") or ""), owner_uids(pod))),
                   key=lambda r: r.name)
    given = (meta.get("annotations") or {})
    named = [r for r in str(given.get(MIG_SUBSTITUTION, "")).split(",") if r]
    own_record = bool(named) and set(named) <= {r.name for r in rules}
    forged = [key for key in (MIG_ORIGINAL, MIG_SUBSTITUTION) if key in given and not own_record]
    if not rules:
        return [{"op": "remove", "path": pointer("metadata", "annotations", key)}
                for key in forged]
    ops: list[PatchOp] = []
    original: list[str] = []
    applied: list[str] = []
    current: Mapping[str, Any] = pod
    for rule in rules:
        step: list[PatchOp] = []
        source, target = rule.from_profile.resource_name, rule.to_profile.resource_name
        for kind in ("initContainers", "containers"):
            for index, container in enumerate(pod_containers(current, kind)):
                resources = container.get("resources") or {}
                moved = False
                for part in ("limits", "requests"):
                    values = resources.get(part)
                    # (a container asks one MIG profile at most: validation says so)
                    if not isinstance(values, Mapping) or source not in values \
                            or target in values:
                        continue
                    where = ("spec", kind, index, "resources", part)
                    step.append({"op": "remove", "path": pointer(*where, source)})
                    step.append({"op": "add", "path": pointer(*where, target),
                                 "value": values[source]})
                    moved = True
                if moved:
                    original.append(f"{container.get('name', index)}={rule.from_profile.name}")
        if step:
            current = apply_patch(current, step)
            ops += step
            applied.append(rule.name)
    if not ops:
        return [{"op": "remove", "path": pointer("metadata", "annotations", key)}
                for key in forged]
    annotations = (current.get("metadata") or {}).get("annotations") or {}
    if MIG_ORIGINAL not in annotations or not own_record:
        ops.append(set_annotation(current, MIG_ORIGINAL, ",".join(original)))
        current = apply_patch(current, ops[-1:])
    ops.append(set_annotation(current, MIG_SUBSTITUTION, ",".join(applied)))
    return ops
