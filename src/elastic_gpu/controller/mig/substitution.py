"""Step 2 of a round: pods pending for a MIG profile move to a compatible free instance.

Pods Pending (PodScheduled False, Unschedulable) for one MIG instance in a namespace the
configuration governs get `core.mig.substitution.plan_substitutions` over the free instances; a move writes
the rule first (with the saved pod for a bare pod), then deletes the pod (uid precondition); a
bare pod is created again from the rule at once, an owner's replacement is rewritten by the
webhook by the rule. `NoCompatibleProfileFree` is a Warning Event on the pod, once per reason.
"""

from __future__ import annotations

import logging
from typing import Any

from elastic_gpu.api import migsubstitution as rules_api
from elastic_gpu.controller.mig.objects import (
    RULE_API_VERSION,
    Rules,
    allowed_nodes,
    annotations_of,
    applied_rules,
    as_pod,
    as_rule,
    controller_owner,
    metadata_of,
    pod_profile,
    unschedulable,
)
from elastic_gpu.controller.mig.state import Reservation
from elastic_gpu.controller.mig.step import MovingStep
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.mig import rules as mig_rules
from elastic_gpu.core.mig.recarve import recarve_advice
from elastic_gpu.core.mig.rules import (
    ADAPTER,
    MIG_RETURNING,
    RuleProblem,
    RuleRefusal,
    check_rule,
    saved_pod,
    saved_pod_digest,
)
from elastic_gpu.core.mig.substitution import (
    RESTARTING_OWNERS,
    FreeInstance,
    NoSubstitute,
    PendingPod,
    constraints_for,
    plan_substitutions,
)
from elastic_gpu.core.model import Node
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.core.resources import MigProfile, ResourceError
from elastic_gpu.kube.errors import AlreadyExists, ApiError, Conflict, NotFound
from elastic_gpu.kube.events import NORMAL, WARNING
from elastic_gpu.kube.informer import Obj, object_key
from elastic_gpu.kube.resources import MIG_SUBSTITUTIONS as RULES
from elastic_gpu.kube.resources import PODS

log = logging.getLogger(__name__)


class Substitution(MovingStep):
    """Moves the round's pending MIG pods (step 2); state and writes are shared with the round."""


    def _pending(self, pods: list[Obj], rules: Rules
                 ) -> tuple[list[PendingPod], dict[str, Obj]]:
        by_key: dict[str, Obj] = {}
        pending: list[tuple[str, PendingPod]] = []
        bare_rules = {(r.namespace, r.pod_name) for _, r in rules.values() if r.pod_name}
        for pod in pods:
            meta = metadata_of(pod)
            namespace = str(meta.get("namespace", ""))
            if not unschedulable(pod) or not self.config.governs(namespace):
                continue
            if applied_rules(pod) or (namespace, meta.get("name")) in bare_rules:
                continue  # moved already (waits on its substitute), or its move is in flight
            owner = controller_owner(pod)
            if owner is not None and owner.get("kind") not in RESTARTING_OWNERS:
                continue  # only owners that re-create their pods
            try:
                request = pod_request_from_manifest(pod)
            except (ResourceError, ValueError):
                continue
            profile = pod_profile(request)
            if profile is None:
                continue
            allowed = self.config.substitutions
            if owner is not None:
                existing = [r for _, r in rules.values() if r.owner_uid == owner.get("uid")
                            and r.namespace == namespace and r.from_profile == profile
                            and not r.returning]
                if existing:  # one rule per owner and profile: only its target again
                    allowed = {profile.name: frozenset({existing[0].to_profile.name})}
            key = object_key(pod)
            by_key[key] = pod
            constraints = constraints_for(request, allowed_nodes(pod, self.nodes.items()), allowed)
            pending.append((str(meta.get("creationTimestamp", "")),
                            PendingPod(key, profile, constraints)))
        pending.sort(key=lambda p: (p[0], p[1].key))
        return [p for _, p in pending], by_key

    async def carry_out(self, pods: list[Obj], free: dict[str, list[FreeInstance]],
                          rules: Rules,
                          nodes: list[Node], held: set[str]) -> None:
        pending, by_key = self._pending(pods, rules)
        self.metrics.pending.set(len(pending))
        waiting = {str(metadata_of(p).get("uid")) for p in by_key.values()}
        self.state.told = {uid: why for uid, why in self.state.told.items() if uid in waiting}
        if not pending:
            return
        plan = plan_substitutions(pending, free)
        for item in pending:
            decision = plan[item.key]
            pod = by_key[item.key]
            namespace = str(metadata_of(pod).get("namespace"))
            if decision.instance is None:
                uid = str(metadata_of(pod).get("uid"))
                if decision.reason is not NoSubstitute.NONE_COMPATIBLE:
                    continue
                message = decision.message
                if self.config.recarve_advice:
                    advice = recarve_advice(item.requested, nodes, held, item.constraints)
                    message += f"; {advice.message}" if advice is not None else \
                        "; dry run: no re-carve of a card the pod may use would fit it either"
                if self.state.told.get(uid) != message:
                    # once per pod and reason (a round runs on every change: no Event storm)
                    self.state.told[uid] = message
                    self.metrics.unmovable.labels(decision.reason.value, namespace).inc()
                    self.recorder.record(as_pod(pod), WARNING, decision.reason.value, message)
                continue
            try:
                await self._move(pod, item.requested, decision.instance, decision.message)
            except ApiError as err:  # this pod's trouble is not the others' (see bare.py)
                log.warning("moving %s/%s: %s; again next round", namespace,
                            metadata_of(pod).get("name"), err)
                self.state.item_failures += 1

    async def _move(self, pod: Obj, requested: MigProfile, target: FreeInstance,
                    message: str) -> None:
        meta = metadata_of(pod)
        namespace, name = str(meta["namespace"]), str(meta["name"])
        owner = controller_owner(pod)
        to = target.profile
        reason = (f"no {requested.name} instance free on a node the pod may use; "
                  f"{to.name} free on node {target.node}")
        spec: dict[str, Any] = {"fromProfile": requested.name, "toProfile": to.name,
                                "reason": reason}
        if owner is not None:
            subject, key = str(owner.get("name", "owner")), str(owner["uid"])
            spec["selector"] = {"ownerUID": key}
        else:  # what it needs to re-create exactly this pod, and to verify it did
            subject, key = name, f"{namespace}/{name}"
            spec["selector"] = {"podName": name}
            spec["savedPod"] = saved_pod(pod)
            spec["savedPodDigest"] = saved_pod_digest(spec["savedPod"])
            spec["movedPodUID"] = str(meta.get("uid"))
        rule_name = mig_rules.rule_name(subject, requested, to, key)
        body = {"apiVersion": RULE_API_VERSION, "kind": rules_api.KIND,
                "metadata": {"name": rule_name, "namespace": namespace,
                             "labels": {ann.MANAGED_BY: ADAPTER}}, "spec": spec}
        try:  # 1. the rule, before anything is deleted
            rule_obj = await self.client.create(RULES.path(namespace), body)
        except AlreadyExists:
            rule_obj = await self.client.get(RULES.path(namespace, rule_name))
            if annotations_of(rule_obj).get(MIG_RETURNING) is not None:
                return  # a return under this name is finishing; next round
            if owner is None:
                return  # a bare move in flight: step 1 of the next round finishes it
            try:  # an owner's rule of that name is reused only if it is the adapter's
                refusal = check_rule(rules_api.rule_from_object(rule_obj))
            except rules_api.MIGSubstitutionError as err:
                refusal = RuleRefusal(RuleProblem.INVALID_SPEC, str(err))
            if refusal is not None:
                await self.writes.refuse(rule_obj, refusal)
                return  # its pod is not deleted under a rule the adapter did not write
        self.state.reservations.append(Reservation(
            target.uuid, target.node, namespace, str(owner["uid"]) if owner else None,
            None if owner else name, str(meta.get("uid")), Reservation.deadline_from_now()))
        # 2. the pod: its uid as a precondition (never a newer pod of the same name)
        try:
            await self.client.delete(PODS.path(namespace, name), uid=meta.get("uid"))
        except (NotFound, Conflict):
            self.state.reservations.pop()
            return
        self.metrics.moves.labels("substitute", requested.name, to.name, namespace).inc()
        text = f"moved from {requested.name} to {to.name} ({message}); rule {rule_name}"
        self.recorder.record(as_pod(pod), NORMAL, "MIGSubstituted", text)
        self.recorder.record(as_rule(rule_obj), NORMAL, "MIGSubstituted",
                             f"pod {name}: {text}")
        log.info("%s/%s: %s", namespace, name, text)
        if owner is None:  # 3. a bare pod: created again from the rule, rewritten at admission
            rule = rules_api.rule_from_object(rule_obj)
            created = await self.writes.create_bare(rule_obj, rule, "move")
            if created is not None:
                await self.writes.record(rule_obj, created)
