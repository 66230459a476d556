"""`admit(pod, facts)`: is a pod acceptable, and what patch completes it? Pure, no I/O.

It reads a pod (a plain dict, as an AdmissionReview carries it) and the cluster facts
(`facts.ClusterFacts`) and returns a `Verdict`: the rules the pod breaks (`rules.Refusal`) and,
when it is allowed, a minimal JSON Patch made by the mutators (`chain.MUTATORS`). The claims a
pod names are planned first (`claim_plan`), so every rule sees the containers as they will be
stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from elastic_gpu.core.admission.chain import MUTATORS
from elastic_gpu.core.admission.claim_plan import PodClaims, claim_ops, claim_plan
from elastic_gpu.core.admission.dra import check_dra
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import PatchOp, apply_patch
from elastic_gpu.core.admission.mutation import MutationInput, Mutator
from elastic_gpu.core.admission.mutators.claims import claim_resources
from elastic_gpu.core.admission.peers import peer_ops, peer_refusals, translate
from elastic_gpu.core.admission.pod import pod_namespace
from elastic_gpu.core.admission.rules import (
    AdmissionRule,
    Refusal,
    check_annotations,
    check_capacity,
    check_containers,
    check_node_name,
    describe_all,
    from_resource_error,
    shape,
)
from elastic_gpu.core.budget.priority import PriorityDowngrade
from elastic_gpu.core.dra.podclaims import PodDraClaims
from elastic_gpu.core.request import PodRequest, pod_request_from_manifest
from elastic_gpu.core.resources import ResourceError


def validate(pod: Any, facts: ClusterFacts, claims: PodClaims | None = None,
             dra: PodDraClaims | None = None) -> tuple[list[Refusal], PodRequest | None]:
    """Every rule `pod` breaks (empty: none) and, when it breaks none, its `PodRequest`.
    The claims it names are checked first and their resources added to their containers
    (`claim_resources`), so the other checks and the request see the containers as they will
    be stored; a refusal about such a container names its claim."""
    refusals, request, _, _, _ = _validate(pod, facts, claims, dra)
    return refusals, request


def _validate(pod: Any, facts: ClusterFacts, claims: PodClaims | None,
              dra: PodDraClaims | None = None
              ) -> tuple[list[Refusal], PodRequest | None, list[PatchOp], Any, list[PatchOp]]:
    """`validate`, plus the claims' operations and the pod they complete (for `admit`), and
    the operations that wrote a peer's dialect as ours (`peers`: first, so every rule and
    the claims read our names)."""
    malformed = shape(pod)
    if malformed:
        return malformed, None, [], pod, []
    translation = translate(pod, facts)
    if translation.refusals:
        return peer_refusals(translation), None, [], pod, []
    translated = peer_ops(pod, translation)
    if translated:
        pod = apply_patch(pod, translated)
    plan = claim_plan(pod, claims or PodClaims(pod_namespace(pod)))
    if plan.refusals:
        return plan.refusals, None, [], pod, translated
    completing: list[PatchOp] = []
    if plan.resources:
        completing = claim_ops(pod, plan)
        pod = apply_patch(pod, completing)
    refusals, requests = check_containers(pod)
    meta = pod.get("metadata") or {}
    refusals += check_annotations(meta.get("annotations") or {}, facts)
    request: PodRequest | None = None
    if not refusals:
        try:
            request = pod_request_from_manifest(pod)
        except ResourceError as err:
            refusals.append(from_resource_error(err))
        except ValueError as err:  # a container request the core model cannot hold
            refusals.append(Refusal(AdmissionRule.MALFORMED, "spec", "", str(err)))
    refusals += check_capacity(requests, facts)
    refusals += check_dra(pod, dra or PodDraClaims(), requests)
    if request is not None and request.wants_gpu:
        refusals += check_node_name(pod)
    refusals = [replace(r, detail=f"{r.detail} (its GPU resources come from ElasticGPUClaim "
                                  f"{plan.sources[r.container]})")
                if r.container in plan.sources else r
                for r in refusals]
    return refusals, (request if not refusals else None), completing, pod, translated


@dataclass(frozen=True)
class Verdict:
    """Admission's answer: allowed when no rule is broken; `patch` only when allowed."""

    refusals: tuple[Refusal, ...] = ()
    patch: tuple[PatchOp, ...] = field(default_factory=tuple)
    #: the pod asks for a GPU (metrics; a pod without one is allowed unchanged)
    gpu: bool = False

    @property
    def allowed(self) -> bool:
        return not self.refusals

    @property
    def message(self) -> str:
        return describe_all(self.refusals)


def admit(pod: Any, facts: ClusterFacts, *, mutate: bool = False,
          mutators: Sequence[Mutator] = MUTATORS, claims: PodClaims | None = None,
          budget: PriorityDowngrade | None = None, budgeted: bool = False,
          dra: PodDraClaims | None = None) -> Verdict:
    """The verdict on `pod`; with `mutate`, the patch of an allowed pod too. `claims`: the
    ElasticGPUClaims the pod names (`claim_names`), as found in its namespace; None: none
    found (a pod naming one is refused). `budget`: the lower PriorityClass while the pod's
    namespace is over its GPU budget (None: in budget, or no budget); `budgeted`: the
    namespace has a GPU budget (`budget_finalizer`); `dra`: the ResourceClaims and templates
    the pod names, as found (`core.admission.dra`, the placement gate `dra_gate`; None: the
    pod names none).

    The mutating call refuses what the validating call would: kube-apiserver validates the
    object between the two (a negative or fractional extended resource is refused there with
    its own words), so only a refusal at the mutating call reaches the user with our rule."""
    dra = dra or PodDraClaims()
    refusals, request, completing, completed, translated = _validate(pod, facts, claims, dra)
    if refusals or request is None:
        return Verdict(tuple(refusals))
    claims = claims or PodClaims(pod_namespace(pod))
    ops: list[PatchOp] = []
    if mutate:
        current: Mapping[str, Any] = apply_patch(pod, translated) if translated else pod
        ops += translated
        start = current
        for mutator in mutators:
            if mutator is claim_resources and current is start:  # validation made them already
                if completing:
                    current = completed
                    ops += completing
                continue
            step = mutator(MutationInput(current, request, facts, claims, budget, budgeted, dra))
            if step:
                current = apply_patch(current, step)
                ops += step
    return Verdict((), tuple(ops), request.wants_gpu or bool(dra.ours()))
