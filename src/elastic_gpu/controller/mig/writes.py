"""The MIG adapter's writes of rules and pods, each told in an Event: a rule refused, a bare
pod created again from its rule, a move recorded in the rule's status, a rule or pod deleted.

Every pod the adapter creates passes through `create_bare`, from a rule it wrote, as it
recorded it; deletes carry the object's uid as a precondition (never a newer object of the
same name).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from elastic_gpu.api import elasticgpu as egpu_api
from elastic_gpu.controller.mig.metrics import MigMetrics
from elastic_gpu.controller.mig.objects import (
    SCHEDULER_ANNOTATIONS,
    as_pod,
    as_rule,
    metadata_of,
    now_stamp,
)
from elastic_gpu.controller.mig.state import RoundState
from elastic_gpu.core.claims.model import Condition
from elastic_gpu.core.mig.rules import (
    VALID_CONDITION,
    RuleRefusal,
    SubstitutionRule,
    check_rule,
    recreated_pod,
)
from elastic_gpu.kube.client import KubeClient
from elastic_gpu.kube.errors import AlreadyExists, ApiError, NotFound
from elastic_gpu.kube.events import NORMAL, WARNING, EventRecorder
from elastic_gpu.kube.informer import Obj, object_key
from elastic_gpu.kube.resources import MIG_SUBSTITUTIONS as RULES
from elastic_gpu.kube.resources import PODS

log = logging.getLogger(__name__)


class AdapterWrites:
    """The writes every step makes; what it told is kept in `state`."""

    def __init__(self, client: KubeClient, recorder: EventRecorder, metrics: MigMetrics,
                 state: RoundState) -> None:
        self.client = client
        self.recorder = recorder
        self.metrics = metrics
        self.state = state

    async def refuse(self, obj: Obj, refusal: RuleRefusal) -> None:
        """A rule not carried out says why: a Warning Event (once per rule and message) and
        `Valid=False` with the reason in its status (written only when it differs)."""
        meta = metadata_of(obj)
        uid = str(meta.get("uid"))
        if self.state.refused.get(uid) == refusal.message:
            return
        self.state.refused[uid] = refusal.message
        log.warning("%s (%s)", refusal.message, refusal.problem.value)
        self.recorder.record(as_rule(obj), WARNING, refusal.problem.value, refusal.message)
        existing = (obj.get("status") or {}).get("conditions") or []
        if any(isinstance(c, Mapping) and c.get("type") == VALID_CONDITION and
               (c.get("status"), c.get("reason"), c.get("message")) ==
               ("False", refusal.problem.value, refusal.message) for c in existing):
            return
        conditions = egpu_api.merge_condition(
            [c for c in existing if isinstance(c, Mapping)],
            Condition(VALID_CONDITION, "False", refusal.problem.value, refusal.message),
            now_stamp(), int(meta.get("generation") or 0))
        try:
            await self.client.patch(RULES.path(meta.get("namespace"), meta.get("name"),
                                               "status"), {"status": {"conditions": conditions}})
        except NotFound:
            return
        except ApiError as err:
            log.warning("marking MIGSubstitution %s invalid: %s", object_key(obj), err)

    async def live_pod(self, namespace: str, name: str) -> bool:
        try:
            await self.client.get(PODS.path(namespace, name))
        except NotFound:
            return False
        return True

    async def create_bare(self, rule_obj: Obj, rule: SubstitutionRule, step: str
                           ) -> Obj | None:
        # every pod the adapter creates passes here: from a rule it wrote, as it recorded it
        refusal = check_rule(rule)
        if refusal is not None:
            await self.refuse(rule_obj, refusal)
            return None
        manifest = recreated_pod(rule, SCHEDULER_ANNOTATIONS)
        try:
            created = await self.client.create(PODS.path(rule.namespace), manifest)
        except AlreadyExists:
            return None
        self.metrics.recreated.labels(step).inc()
        profile = rule.from_profile if rule.returning else rule.to_profile
        self.recorder.record(as_pod(created), NORMAL, "Recreated",
                             f"created again from MIGSubstitution {rule.name} "
                             f"({'back on' if rule.returning else 'moved to'} {profile.name})")
        self.recorder.record(as_rule(rule_obj), NORMAL, "Recreated",
                             f"pod {rule.pod_name} created again on {profile.name}")
        return created

    async def record(self, rule_obj: Obj, pod: Mapping[str, Any]) -> None:
        meta = metadata_of(rule_obj)
        moved = [{"name": metadata_of(pod).get("name", ""), "uid": metadata_of(pod).get("uid", ""),
                  "node": (pod.get("spec") or {}).get("nodeName") or "", "movedAt": now_stamp()}]
        try:
            await self.client.patch(RULES.path(meta.get("namespace"), meta.get("name"),
                                               "status"),
                                    {"status": {"movedPods": moved, "moved": 1}})
        except NotFound:
            return

    async def delete_rule(self, obj: Obj, rule: SubstitutionRule, why: str) -> None:
        meta = metadata_of(obj)
        try:
            await self.client.delete(RULES.path(rule.namespace, rule.name),
                                     uid=meta.get("uid"))
        except NotFound:
            return
        self.state.repairs.pop(f"{rule.namespace}/{rule.name}", None)
        log.info("MIGSubstitution %s/%s deleted: %s", rule.namespace, rule.name, why)
        self.recorder.record(as_rule(obj), NORMAL, "Deleted", f"rule deleted: {why}")

    async def delete_pod(self, pod: Mapping[str, Any]) -> None:
        meta = metadata_of(pod)
        try:
            await self.client.delete(PODS.path(meta.get("namespace"), meta.get("name")),
                                     uid=meta.get("uid"))
        except NotFound:
            return
