"""Step 3 of a round: moved pods go back to their original profile (`core.mig.substitution.move_back`,
under the configured policy) when one of its instances frees.

An owner's pod has its rule deleted, then the pod (the replacement asks the original profile);
a bare pod's rule is marked returning, the pod deleted and created as written, the rule
deleted.
"""

from __future__ import annotations

import logging

from elastic_gpu.api import migsubstitution as rules_api
from elastic_gpu.controller.mig.objects import (
    Rules,
    allowed_nodes,
    annotations_of,
    applied_rules,
    as_pod,
    as_rule,
    controller_owner,
    metadata_of,
    now_stamp,
    pod_profile,
)
from elastic_gpu.controller.mig.state import Reservation
from elastic_gpu.controller.mig.step import MovingStep
from elastic_gpu.core.mig import substitution as mig_substitution
from elastic_gpu.core.mig.rules import MIG_ORIGINAL, MIG_RETURNING, parse_original
from elastic_gpu.core.mig.substitution import FreeInstance, MovedPod, constraints_for, move_back
from elastic_gpu.core.podlife import finished
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.core.resources import ResourceError
from elastic_gpu.kube.errors import ApiError
from elastic_gpu.kube.events import NORMAL
from elastic_gpu.kube.informer import Obj, object_key
from elastic_gpu.kube.resources import MIG_SUBSTITUTIONS as RULES

log = logging.getLogger(__name__)


class MoveBack(MovingStep):
    """Moves the round's moved pods back (step 3); state and writes are shared with the round."""


    def _moved(self, pods: list[Obj]) -> tuple[list[MovedPod], dict[str, Obj]]:
        out: list[tuple[str, MovedPod]] = []
        by_key: dict[str, Obj] = {}
        for pod in pods:
            meta = metadata_of(pod)
            notes = annotations_of(pod)
            node = (pod.get("spec") or {}).get("nodeName")
            if not node or not applied_rules(pod) or finished(pod) or \
                    meta.get("deletionTimestamp") or MIG_ORIGINAL not in notes:
                continue
            namespace = str(meta.get("namespace", ""))
            if not self.config.governs(namespace):
                continue
            try:
                request = pod_request_from_manifest(pod)
            except (ResourceError, ValueError):
                continue
            current = pod_profile(request)
            if current is None:
                continue
            originals = parse_original(notes[MIG_ORIGINAL])
            container = request.gpu_containers[0].name
            original = originals.get(container)
            if original is None or original == current:
                continue
            owner = controller_owner(pod)
            key = object_key(pod)
            by_key[key] = pod
            out.append((str(meta.get("creationTimestamp", "")), MovedPod(
                key, original, current, str(node),
                str(owner.get("kind")) if owner is not None else None,
                str((pod.get("spec") or {}).get("restartPolicy") or "Always"), None,
                constraints_for(request, allowed_nodes(pod, self.nodes.items())))))
        out.sort(key=lambda p: (p[0], p[1].key))
        return [m for _, m in out], by_key

    async def carry_out(self, pods: list[Obj], free: dict[str, list[FreeInstance]],
                         rules: Rules) -> None:
        moved, by_key = self._moved(pods)
        if not moved:
            return
        busy = frozenset({r.node for r in self.state.reservations} |
                         {r.source_node for r in self.state.reservations if r.source_node})
        originals = [i for insts in free.values() for i in insts]
        for back in move_back(moved, originals, self.config.move_back, busy):
            try:
                await self._return(by_key[back.pod.key], back, rules)
            except ApiError as err:  # this pod's trouble is not the others' (see bare.py)
                log.warning("moving %s back: %s; again next round", back.pod.key, err)
                self.state.item_failures += 1

    async def _return(self, pod: Obj, back: mig_substitution.MoveBack,
                      rules: Rules) -> None:
        meta = metadata_of(pod)
        namespace, name = str(meta["namespace"]), str(meta["name"])
        owner = controller_owner(pod)
        applied = [rules[f"{namespace}/{r}"] for r in applied_rules(pod)
                   if f"{namespace}/{r}" in rules]
        text = (f"moved back from {back.pod.current.name} to {back.pod.original.name}: "
                f"{back.pod.original.name} free on node {back.instance.node}")
        self.state.reservations.append(Reservation(
            back.instance.uuid, back.instance.node, namespace,
            str(owner["uid"]) if owner else None, None if owner else name, str(meta.get("uid")),
            Reservation.deadline_from_now(), back.pod.node))
        if owner is None:
            bare = [(o, r) for o, r in applied if r.pod_name == name]
            if not bare:
                return  # no saved manifest to create it from: it stays
            obj, rule = bare[0]
            # 1. the rule stops rewriting (the webhook reads it live), keeping the saved pod
            obj = await self.client.patch(RULES.path(namespace, rule.name), {
                "metadata": {"annotations": {MIG_RETURNING: now_stamp()}}})
            rule = rules_api.rule_from_object(obj)
            await self.writes.delete_pod(pod)  # 2.
            self._count_back(back, namespace, pod, obj, text)
            created = await self.writes.create_bare(obj, rule, "back")  # 3.
            if created is not None:
                await self.writes.delete_rule(obj, rule, f"pod {name} is back on "
                                        f"{back.pod.original.name}")  # 4.
            return
        for obj, rule in applied:  # 1. the owner's replacement is no longer rewritten
            await self.writes.delete_rule(obj, rule, f"pod {name} goes back to "
                                    f"{back.pod.original.name}")
        await self.writes.delete_pod(pod)  # 2. the owner creates it again, as written
        self._count_back(back, namespace, pod, applied[0][0] if applied else None, text)

    def _count_back(self, back: mig_substitution.MoveBack, namespace: str, pod: Obj, rule_obj: Obj | None,
                    text: str) -> None:
        self.metrics.moves.labels("back", back.pod.current.name, back.pod.original.name,
                                  namespace).inc()
        self.recorder.record(as_pod(pod), NORMAL, "MIGMovedBack", text)
        if rule_obj is not None:
            self.recorder.record(as_rule(rule_obj), NORMAL, "MIGMovedBack",
                                 f"pod {metadata_of(pod).get('name')}: {text}")
        log.info("%s: %s", object_key(pod), text)
