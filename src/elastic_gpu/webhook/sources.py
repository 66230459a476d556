"""What the rules need from the cluster for one review, behind one lookup protocol.

`review.Admission` asks a `Sources` for the ElasticGPUClaims a pod names, for its namespace's
MIGSubstitutions (read live before a MIG pod is mutated: docs/mig-adapter.md), for its
namespace's GPU budget and for the ResourceClaims and templates it names (read live, once
for the DRA rules, quota, budget and placement gate); it never sees where an answer came
from. `Lookups` is the webhook's implementation over its watch caches and live reads
(`kube.ClaimCache`, `migrules.RuleCache`, `budgets.BudgetLookup`, `draclaims.DraClaimReader`),
each part optional (absent: nothing to look up), and counts where each answer came from for
the metrics.

Failure rules (unchanged from before the split): a claim the cache lacks is read live, and a
read that fails is raised (the review refuses: it cannot tell); a rule read that fails falls
back to the cache (`None`); a budget lookup fails open inside `BudgetLookup`; a ResourceClaim
read that fails is raised (the review refuses, `dra-claim-lookup`), a DeviceClass read for the
placement opt-out fails open inside `DraClaimReader` (the pod is not gated).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from elastic_gpu.core.budget.priority import NamespaceBudget
from elastic_gpu.core.claims.model import Claim
from elastic_gpu.core.dra.podclaims import ClaimRef, PodDraClaims
from elastic_gpu.core.mig.rules import SubstitutionRule

log = logging.getLogger(__name__)

ClaimLookup = Callable[[str, str], Claim | None]
ClaimFetch = Callable[[str, str], Awaitable[Claim | None]]
RuleFetch = Callable[[str], Awaitable[tuple[SubstitutionRule, ...]]]
BudgetLookupFn = Callable[[str], Awaitable[NamespaceBudget]]
DraFetch = Callable[[str, Sequence[ClaimRef]], Awaitable[PodDraClaims]]


class Sources(Protocol):
    """The cluster lookups of one review."""

    def cached_claim(self, namespace: str, name: str) -> Claim | None:
        """The claim as the watch has it (no API call); None: not known."""
        ...

    async def claim(self, namespace: str, name: str) -> Claim | None:
        """The claim, read live when the cache lacks it; None: it does not exist. Raises when
        it cannot tell (the API is unreachable)."""
        ...

    async def mig_rules(self, namespace: str) -> tuple[SubstitutionRule, ...] | None:
        """The namespace's MIGSubstitutions as the API has them now; None: no live read (the
        facts' copy from the watch stands)."""
        ...

    async def budget(self, namespace: str) -> NamespaceBudget:
        """What a new GPU pod of the namespace gets of its GPU budget."""
        ...

    async def dra_claims(self, namespace: str, refs: Sequence[ClaimRef]) -> PodDraClaims:
        """The ResourceClaims and templates a pod names, read live (None each that does not
        exist). Raises when it cannot tell."""
        ...


def _no_claim(_namespace: str, _name: str) -> Claim | None:
    return None


def _ignore(_source: str) -> None:
    return None


@dataclass
class Lookups:
    """`Sources` over the webhook's caches and live reads.

    `claims`: the ElasticGPUClaims known (the watch cache); `fetch`: a live read of one claim,
    made only when the cache does not have it, so that a claim created a moment before its pod
    is not refused (a cache hit makes no API call); `on_claim_lookup` is told "cache" or "api"
    for each claim. `fetch_rules`: a live read of one namespace's MIGSubstitutions;
    `on_rule_lookup` is told "api", or "cache" when that read failed. `budgets`: the
    namespace's over-budget downgrade (None: budgets are not looked up). `fetch_dra`: a live
    read of the ResourceClaims and templates a pod names (`draclaims.DraClaimReader`; None:
    not read, the DRA rules see none)."""

    claims: ClaimLookup = _no_claim
    fetch: ClaimFetch | None = None
    on_claim_lookup: Callable[[str], None] = _ignore
    fetch_rules: RuleFetch | None = None
    on_rule_lookup: Callable[[str], None] = _ignore
    budgets: BudgetLookupFn | None = None
    fetch_dra: DraFetch | None = None

    def cached_claim(self, namespace: str, name: str) -> Claim | None:
        return self.claims(namespace, name)

    async def claim(self, namespace: str, name: str) -> Claim | None:
        claim = self.claims(namespace, name)
        self.on_claim_lookup("cache" if claim is not None or self.fetch is None else "api")
        if claim is None and self.fetch is not None:
            claim = await self.fetch(namespace, name)
        return claim

    async def mig_rules(self, namespace: str) -> tuple[SubstitutionRule, ...] | None:
        if self.fetch_rules is None:
            return None
        try:
            live = await self.fetch_rules(namespace)
        except Exception as err:  # the watch's copy is the best there is
            log.warning("reading the MIGSubstitutions of %s: %s; using the cache",
                        namespace, err)
            self.on_rule_lookup("cache")
            return None
        self.on_rule_lookup("api")
        return live

    async def budget(self, namespace: str) -> NamespaceBudget:
        return await self.budgets(namespace) if self.budgets is not None else NamespaceBudget()

    async def dra_claims(self, namespace: str, refs: Sequence[ClaimRef]) -> PodDraClaims:
        if self.fetch_dra is None or not refs:
            return PodDraClaims()
        return await self.fetch_dra(namespace, refs)
