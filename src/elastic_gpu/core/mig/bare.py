"""A bare pod's rule, made true again from what the API shows alone.

A move or a return of a bare pod is several writes (rule, delete, create, status); the
controller may stop between any two. `bare_rule_step` reads where it stopped from the objects
alone, so a controller restarted at any point finishes the work; `owner_rule_unused` says when
an owner's rule may go.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from elastic_gpu.core.mig.rules import SubstitutionRule


class BareStep(enum.Enum):
    """The next step of a bare pod's rule (`bare_rule_step`)."""

    #: nothing to do: the pod runs under the rule (or waits)
    NONE = "none"
    #: create the pod from the rule's saved manifest (it was deleted; maybe by a controller
    #: that crashed before it could re-create it)
    CREATE = "create"
    #: delete the pod (a move or a return that stopped before its delete)
    DELETE_POD = "delete-pod"
    #: delete the rule: nothing refers to it any more
    DELETE_RULE = "delete-rule"
    #: wait: the pod is being deleted (this controller's delete, held by a finalizer such as
    #: the budget keeper's); the step after it is gone is CREATE
    WAIT = "wait"


@dataclass(frozen=True)
class BarePodState:
    """What the API shows of a bare pod's rule and its pod."""

    exists: bool
    #: the pod carries the rule's rewrite (`MIG_SUBSTITUTION` names the rule)
    rewritten: bool = False
    #: waiting to be scheduled (no node, marked unschedulable)
    pending: bool = False
    #: it has ended (Succeeded / Failed): a finished pod is not re-created
    finished: bool = False
    #: the rule's status names the pod it re-created (the move finished once)
    recorded: bool = False
    #: it has a deletionTimestamp (a finalizer may hold it for a while)
    terminating: bool = False


def bare_rule_step(rule: SubstitutionRule, pod: BarePodState) -> BareStep:
    """What makes a bare pod's rule true again, from what the API shows alone (no memory of
    what this process did: a controller SIGKILLed at any point finishes after a restart).

    A move is: create the rule with the saved pod, delete the pod, create it from the rule
    (rewritten at admission), record it in the rule's status. A return is: mark the rule
    returning, delete the pod, create it (as written), delete the rule. So a missing pod is
    created, unless the move had finished (`recorded`: then someone else deleted the moved pod,
    and the rule refers to nothing); a moving rule whose pod is still un-rewritten and pending
    stopped before its delete; a returning rule whose pod is still rewritten stopped before
    its delete; a returning rule whose pod runs as written, a moving one whose pod got placed
    on its own profile meanwhile, and one whose pod finished refer to nothing. A pod being
    deleted is waited for, finished or not: until it is gone its name cannot be re-created,
    and judging it as if it stayed would delete the rule holding its saved manifest (the pod
    would be lost). Finished does not tell here: kube-controller-manager's pod GC marks a
    deleted pod that was never scheduled `Failed` while a finalizer (the budget keeper's)
    holds it. Once it is gone, the rules above for a missing pod decide."""
    if pod.exists and pod.terminating:
        return BareStep.WAIT
    if not pod.exists:
        return BareStep.CREATE if rule.returning or not pod.recorded else BareStep.DELETE_RULE
    if rule.returning:
        return BareStep.DELETE_POD if pod.rewritten and not pod.finished else BareStep.DELETE_RULE
    if pod.rewritten:
        return BareStep.DELETE_RULE if pod.finished else BareStep.NONE
    if pod.pending and not pod.recorded:
        return BareStep.DELETE_POD
    return BareStep.DELETE_RULE


def owner_rule_unused(referring_pods: int, in_flight: bool, age_s: float, grace_s: float
                      ) -> bool:
    """Whether an owner's rule may be deleted: no pod refers to it (`MIG_SUBSTITUTION` names
    it on an unfinished pod), no move under it is in flight, and it is older than `grace_s`
    (its owner's replacement may not have been created yet)."""
    return referring_pods == 0 and not in_flight and age_s >= grace_s
