"""AdmissionReview in, typed outcome out: the HTTP-free part of `egpu webhook`.

`Admission.review_async` decodes a review (msgspec, into typed structs at the edge; the pod
stays a plain dict for the core), asks its `sources.Sources` for what the rules need (the claims
the pod names, a MIG pod's namespace's MIGSubstitutions, the namespace's GPU budget) and
returns an `Outcome`: `Answered` (the review's uid and a decision: `Allowed` with its patch,
`Refused` with the rules and the message, or `NotGoverned`) or `BadRequest` (not an
AdmissionReview). `server.py` turns an outcome into the HTTP answer and the metrics; nothing
here knows HTTP.

- Pods naming ElasticGPUClaims are judged with the claims of a list and watch of them; a claim
  the cache lacks is read live before the pod is refused; a read that fails refuses the pod
  (rule `claim-lookup`: it cannot tell).
- Pods a MIGSubstitution selects are rewritten by its rule (docs/mig-adapter.md). A pod asking
  a MIG profile has its namespace's rules read live before /mutate judges it, so a rule the MIG
  adapter wrote before deleting a pod rewrites its replacement whatever the watch has
  delivered; the watch's copy is the fallback when the read fails.
- GPU pods of a namespace over its GPU budget get the lower PriorityClass (fail-open lookups,
  docs/budgets.md).
- Pods naming ResourceClaims or templates have them read live (`draclaims`): one that does not
  exist refuses the pod (`dra-claim-not-found`), a read that fails too (`dra-claim-lookup`);
  those of our DeviceClasses are the pod's GPU for the DRA rules, the quota and the budget.
- An ElasticGPUClaim being created gets the claim-protection finalizer (`review_claim`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from elastic_gpu.api.elasticgpu import CLAIM_KIND, CLAIM_PLURAL
from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.chain import MUTATORS
from elastic_gpu.core.admission.claim_plan import PodClaims, claim_names
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import PatchOp
from elastic_gpu.core.admission.mutation import Mutator
from elastic_gpu.core.budget.priority import NamespaceBudget
from elastic_gpu.core.claims.model import Claim
from elastic_gpu.core.claims.pods import protection_patch
from elastic_gpu.core.dra.podclaims import PodDraClaims, claim_refs
from elastic_gpu.core.jsondepth import nesting_refusal
from elastic_gpu.core.names import InvalidName, NameRule, check_name
from elastic_gpu.webhook.sources import Lookups, Sources

log = logging.getLogger(__name__)

API_VERSION = "admission.k8s.io/v1"

class _Kind(msgspec.Struct):
    group: str = ""
    version: str = ""
    kind: str = ""


class _Resource(msgspec.Struct):
    group: str = ""
    version: str = ""
    resource: str = ""


class _Request(msgspec.Struct):
    uid: str = ""
    kind: _Kind | None = None
    resource: _Resource | None = None
    subResource: str = ""
    operation: str = ""
    namespace: str = ""
    name: str = ""
    object: Any = None


class _Review(msgspec.Struct):
    apiVersion: str = ""
    kind: str = ""
    request: _Request | None = None


_DECODER = msgspec.json.Decoder(_Review)


@dataclass(frozen=True)
class Allowed:
    """Let the object through, with the patch that completes it (empty: unchanged)."""

    patch: tuple[PatchOp, ...] = ()
    #: shown to the user by kubectl (AdmissionReview `warnings`); none are given today
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refused:
    """Refuse the object: `message` for the user, `rules` the keys of the rules broken (empty:
    the webhook itself failed)."""

    message: str
    rules: tuple[str, ...] = ()


@dataclass(frozen=True)
class NotGoverned:
    """Not what this webhook judges (the registration sends only CREATEs of its kinds): let it
    through unchanged."""


Decision = Allowed | Refused | NotGoverned


@dataclass(frozen=True)
class Answered:
    """A review answered: its request's uid and the decision."""

    uid: str
    decision: Decision


@dataclass(frozen=True)
class BadRequest:
    """Not an AdmissionReview kube-apiserver sends: `reason` says what is wrong."""

    reason: str


Outcome = Answered | BadRequest


def asks_mig(pod: Any) -> bool:
    """Whether a pod manifest asks a `nvidia.com/mig-*` resource in some container."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if not isinstance(spec, dict):
        return False
    for kind in ("containers", "initContainers"):
        containers = spec.get(kind)
        if not isinstance(containers, list):  # malformed: the core refuses it with its reason
            continue
        for container in containers:
            resources = container.get("resources") if isinstance(container, dict) else None
            if not isinstance(resources, dict):
                continue
            for part in ("limits", "requests"):
                values = resources.get(part)
                if isinstance(values, dict) and any(
                        isinstance(k, str) and k.startswith("nvidia.com/mig-") for k in values):
                    return True
    return False


def _is_create(request: _Request, kind: str, resource: str) -> bool:
    return (request.kind.kind if request.kind else "") == kind and \
        (request.resource.resource if request.resource else "") == resource and \
        not request.subResource and request.operation == "CREATE"


class Admission:
    """AdmissionReview bytes in, `Outcome` out, with the cluster facts (`facts`, kept current
    by the server's watches) and the lookups of one review (`sources`)."""

    def __init__(self, facts: ClusterFacts | None = None, sources: Sources | None = None,
                 mutators: Sequence[Mutator] = MUTATORS) -> None:
        self.facts = facts or ClusterFacts()
        self.sources: Sources = sources if sources is not None else Lookups()
        self.mutators = tuple(mutators)

    def _decode(self, body: bytes) -> _Request | Outcome:
        """The review's request when it is a pod CREATE to judge, else the outcome."""
        request = self._decode_review(body)
        if not isinstance(request, _Request):
            return request
        if not _is_create(request, "Pod", "pods"):
            # Not what this webhook governs (the registration sends only pod CREATEs).
            return Answered(request.uid, NotGoverned())
        return request

    def review_claim(self, body: bytes) -> Outcome:
        """/mutate-claims: an ElasticGPUClaim being created gets the claim-protection
        finalizer (`core.claims.pods.protection_patch`); anything else is let through as it is."""
        request = self._decode_review(body)
        if not isinstance(request, _Request):
            return request
        if not _is_create(request, CLAIM_KIND, CLAIM_PLURAL):
            return Answered(request.uid, NotGoverned())
        if not isinstance(request.object, dict):
            return Answered(request.uid, Refused("the ElasticGPUClaim in the review is not "
                                                 "an object (rule malformed)", ("malformed",)))
        return Answered(request.uid, Allowed(tuple(protection_patch(request.object))))

    def _decode_review(self, body: bytes) -> _Request | BadRequest:
        """The review's request, else what is wrong with it."""
        # Before anything decodes or walks it (the core reads the pod recursively).
        deep = nesting_refusal(body, "the AdmissionReview")
        if deep is not None:
            return BadRequest(deep)
        try:
            review = _DECODER.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            return BadRequest(f"not an AdmissionReview: {err}")
        if review.apiVersion != API_VERSION or review.kind != "AdmissionReview":
            return BadRequest(f"apiVersion {review.apiVersion!r} kind {review.kind!r}: "
                              f"expected {API_VERSION} AdmissionReview")
        request = review.request
        if request is None or not request.uid:
            return BadRequest("request.uid is required")
        try:  # it goes into API paths (claims, rules, budgets): one kube-apiserver could send
            check_name(self._namespace(request), NameRule.LABEL, "request.namespace")
        except InvalidName as err:
            return BadRequest(f"not an AdmissionReview kube-apiserver sends: {err}")
        return request

    @staticmethod
    def _namespace(request: _Request) -> str:
        if request.namespace:
            return request.namespace
        obj = request.object
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        namespace = meta.get("namespace") if isinstance(meta, dict) else None
        return namespace if isinstance(namespace, str) and namespace else "default"

    def review(self, body: bytes, *, mutate: bool) -> Outcome:
        """The outcome, with the claims the cache has (no API call)."""
        request = self._decode(body)
        if not isinstance(request, _Request):
            return request
        namespace = self._namespace(request)
        found = {name: self.sources.cached_claim(namespace, name)
                 for name in claim_names(request.object)}
        return self._judge(request, mutate, PodClaims(namespace, found))

    async def review_async(self, body: bytes, *, mutate: bool) -> Outcome:
        """The outcome; a claim the cache lacks is read from the API before the pod is judged."""
        request = self._decode(body)
        if not isinstance(request, _Request):
            return request
        namespace = self._namespace(request)
        found: dict[str, Claim | None] = {}
        for name in sorted(claim_names(request.object)):
            try:
                found[name] = await self.sources.claim(namespace, name)
            except Exception as err:  # API unreachable: cannot tell, so refuse (retry)
                log.warning("reading ElasticGPUClaim %s/%s: %s", namespace, name, err)
                return Answered(request.uid, Refused(
                    f"ElasticGPUClaim {name} in namespace {namespace} could not be read "
                    f"({type(err).__name__}: {err}); try again", ("claim-lookup",)))
        refs = claim_refs(request.object) if isinstance(request.object, dict) else []
        try:
            dra = await self.sources.dra_claims(namespace, refs)
        except Exception as err:  # API unreachable: cannot tell what the pod holds, refuse
            log.warning("reading the ResourceClaims of a pod in %s: %s", namespace, err)
            return Answered(request.uid, Refused(
                f"the ResourceClaims and ResourceClaimTemplates the pod names in namespace "
                f"{namespace} could not be read ({type(err).__name__}: {err}); try again",
                ("dra-claim-lookup",)))
        facts = self.facts
        if mutate and asks_mig(request.object):
            live = await self.sources.mig_rules(namespace)
            if live is not None:
                facts = replace(facts, mig_substitutions=tuple(
                    r for r in facts.mig_substitutions if r.namespace != namespace) + live)
        budget = await self.sources.budget(namespace) if mutate else NamespaceBudget()
        return self._judge(request, mutate, PodClaims(namespace, found), facts, budget, dra)

    def _judge(self, request: _Request, mutate: bool, claims: PodClaims,
               facts: ClusterFacts | None = None,
               budget: NamespaceBudget | None = None,
               dra: PodDraClaims | None = None) -> Outcome:
        budget = budget or NamespaceBudget()
        try:
            verdict = admit(request.object, facts or self.facts, mutate=mutate, claims=claims,
                            mutators=self.mutators, budget=budget.downgrade,
                            budgeted=budget.budgeted, dra=dra)
        except Exception as err:  # a bug must not become a 500 kube-apiserver reports vaguely
            log.exception("admission of %s/%s failed", request.namespace, request.name)
            return Answered(request.uid, Refused(f"elastic-gpu webhook error: {err!r}"))
        if not verdict.allowed:
            rules = tuple(sorted({r.rule.value for r in verdict.refusals}))
            return Answered(request.uid, Refused(verdict.message, rules))
        return Answered(request.uid, Allowed(verdict.patch))


__all__ = ["API_VERSION", "Admission", "Allowed", "Answered", "BadRequest", "Decision",
           "NotGoverned", "Outcome", "Refused", "asks_mig"]
