"""Step 1 of a round: bare pods' rules are made true again (`core.mig.bare.bare_rule_step`).

A pod deleted but not re-created (a controller killed between the two) is created from the
rule's saved pod, a move or a return that stopped before its delete goes on, and rules nothing
refers to go. Each rule alone: one rule's trouble holds up no other.
"""

from __future__ import annotations

import logging

from elastic_gpu.controller.mig.objects import (
    Rules,
    applied_rules,
    unschedulable,
)
from elastic_gpu.controller.mig.state import RoundState
from elastic_gpu.controller.mig.writes import AdapterWrites
from elastic_gpu.core.mig.bare import BarePodState, BareStep, bare_rule_step
from elastic_gpu.core.mig.rules import RuleProblem, RuleRefusal, SubstitutionRule, check_live_pod
from elastic_gpu.core.podlife import finished
from elastic_gpu.kube.errors import ApiError
from elastic_gpu.kube.informer import Informer, Obj

log = logging.getLogger(__name__)

#: a bare pod whose re-creation comes back un-rewritten is deleted again at most this often
MAX_REPAIRS = 3


class BareRules:
    """Makes each bare pod's rule true again (step 1)."""

    def __init__(self, pods: Informer, state: RoundState, writes: AdapterWrites) -> None:
        self.pods = pods
        self.state = state
        self.writes = writes

    async def carry_out(self, rules: Rules) -> None:
        for key, (obj, rule) in sorted(rules.items()):
            try:
                await self._bare_rule(key, obj, rule)
            except ApiError as err:
                # One rule's trouble (its namespace being deleted refuses the create with 403;
                # a conflict) must not hold up the others nor the substitutions after them:
                # the next round, at most RESYNC_S away, tries it again.
                log.warning("MIGSubstitution %s: %s; again next round", key, err)
                self.state.item_failures += 1
            except (ValueError, TypeError) as err:
                # data the checks let through and still cannot be carried out: this rule
                # alone is refused, the round goes on
                await self.writes.refuse(obj, RuleRefusal(
                    RuleProblem.INVALID_SPEC, f"MIGSubstitution {key}: {err}"))

    async def _bare_rule(self, key: str, obj: Obj, rule: SubstitutionRule) -> None:
        if rule.pod_name is None:
            return
        pod = self.pods.get(f"{rule.namespace}/{rule.pod_name}")
        recorded = bool((obj.get("status") or {}).get("movedPods"))
        state = BarePodState(
            exists=pod is not None,
            rewritten=pod is not None and rule.name in applied_rules(pod),
            pending=pod is not None and unschedulable(pod),
            finished=pod is not None and finished(pod),
            recorded=recorded,
            terminating=pod is not None and bool(
                (pod.get("metadata") or {}).get("deletionTimestamp")))
        step = bare_rule_step(rule, state)
        if step is BareStep.WAIT:  # its DELETED event starts the next round
            return
        if step is BareStep.NONE:
            if pod is not None and not recorded:
                await self.writes.record(obj, pod)
            return
        if step is BareStep.CREATE:
            if pod is None and await self.writes.live_pod(rule.namespace, rule.pod_name):
                return  # the cache is behind: the pod exists
            created = await self.writes.create_bare(obj, rule, "back" if rule.returning
                                              else "recovered")
            if created is not None and not rule.returning:
                await self.writes.record(obj, created)
            if created is not None and rule.returning:
                await self.writes.delete_rule(obj, rule, "the pod is back on "
                                        f"{rule.from_profile.name}")
        elif step is BareStep.DELETE_POD and pod is not None:
            if not rule.returning:
                # a move that stopped before its delete: only the very pod the adapter saved
                # is deleted and replaced (a rule naming another pod leaves it alone)
                refusal = check_live_pod(rule, pod)
                if refusal is not None:
                    await self.writes.refuse(obj, refusal)
                    return
                count = self.state.repairs.get(key, 0)
                if count >= MAX_REPAIRS:
                    await self.writes.delete_rule(obj, rule, "its pod came back un-rewritten "
                                            f"{count} times")
                    return
                self.state.repairs[key] = count + 1
            await self.writes.delete_pod(pod)
            created = await self.writes.create_bare(obj, rule, "back" if rule.returning
                                              else "recovered")
            if created is not None and rule.returning:
                await self.writes.delete_rule(obj, rule, "the pod is back on "
                                        f"{rule.from_profile.name}")
            elif created is not None:
                await self.writes.record(obj, created)
        elif step is BareStep.DELETE_RULE:
            await self.writes.delete_rule(obj, rule, "nothing refers to it")
