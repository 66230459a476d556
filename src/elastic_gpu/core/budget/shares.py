"""Each GPU container's compute share, in cards, read from what the API says of a pod:

from the pod's `elasticgpu.io/assignment` when it has one (the cards it was given: a whole card
counts 1.0, a share its milli / 1000, a MIG instance its card fraction,
`core.mig.profiles.card_fraction`: an A30 `1g` 1/4, an A100 `1g` 1/7; time-sliced replicas the
milli the assignment gives them; containers the `claims` mark backs with an ElasticGPU count the
ElasticGPU's cards, which the assignment lists for them), otherwise from its request
(`core.request`, the one reader of resources); plus what it holds through DRA claims.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import AssignmentError, CardShare, pod_assignment
from elastic_gpu.core.budget.errors import BudgetError
from elastic_gpu.core.dra.pods import pod_claim_compute
from elastic_gpu.core.mig.profiles import card_fraction
from elastic_gpu.core.request import RequestKind, pod_request_from_manifest
from elastic_gpu.core.resources import MILLI_PER_CARD, MigProfile, ResourceError


def card_share(share: CardShare) -> Fraction:
    """The compute of one card share, in cards: a MIG instance its card fraction by its
    profile's name (an assignment names no card model; a name means one size), else milli."""
    if share.mig_profile is not None:
        try:
            return card_fraction(MigProfile.parse(share.mig_profile))
        except ResourceError as err:
            raise BudgetError(f"assignment mig={share.mig_profile!r}: {err}") from None
    return Fraction(share.milli, MILLI_PER_CARD)


def container_shares(pod: Mapping[str, Any],
                     claims: Mapping[str, Mapping[str, Any]] | None = None
                     ) -> dict[str, Fraction]:
    """Each GPU container's compute share in cards (containers without a GPU are left out):
    from the assignment when the pod has one (claim-backed containers included), else from its
    request; plus, with `claims` (its namespace's ResourceClaims by name), what it holds through
    DRA claims (`core.dra.pods`). Raises `BudgetError` for an unreadable assignment or request."""
    out = _device_plugin_shares(pod)
    for name, held in (pod_claim_compute(pod, claims) if claims else {}).items():
        out[name] = out.get(name, Fraction(0)) + held
    return out


def _device_plugin_shares(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    try:
        assignment = pod_assignment(pod)
    except AssignmentError as err:
        raise BudgetError(f"annotation {ann.ASSIGNMENT}: {err}") from None
    if assignment is not None:
        out: dict[str, Fraction] = {}
        for name, shares in assignment.containers.items():
            total = sum((card_share(s) for s in shares), Fraction(0))
            if total:
                out[name] = total
        return out
    try:
        request = pod_request_from_manifest(pod)
    except ResourceError as err:
        raise BudgetError(f"pod resources: {err}") from None
    out = {}
    for container in request.containers:
        if container.kind is RequestKind.MIG:
            assert container.mig_profile is not None
            value = container.cards * card_fraction(container.mig_profile)
        else:
            value = Fraction(container.total_milli, MILLI_PER_CARD)
        if value:
            out[container.name] = value
    return out
