"""A node's GPU mode: what the extender's verbs ask it, instead of branching on DRA. Pure.

kube-scheduler asks the extender three questions of a pod and some nodes: which fit (filter),
how well (prioritize), and which of its proposed victims to keep (preempt). Who answers
depends on the node's mode (`core.dra.nodemode`):

- device-plugin nodes: our engine decides fit, scores and chooses victims from its card
  state, after the pod's ElasticGPUClaims are checked (`scheduler.verbs.DevicePluginMode`,
  an adapter over the scheduler's state, where the engine lives behind its lock);
- DRA nodes (`DraMode`, here): kube-scheduler's DynamicResources plugin allocates their
  devices; ours only checks that the pod's GPU names can be served there, scores every
  node 0, and keeps kube-scheduler's victims only where the pod could be served.

A mode answers over all of its nodes at once (a filter names up to thousands, and the engine
checks them in one pass): fit is a `FilterResult`, a node's `FitFailure` or its place among
the feasible ones. A failure's `check` says which check refused ("engine", "claims",
"dra-mode"), as kube-scheduler's `framework.Status` names its plugin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from elastic_gpu.core.dra.nodemode import dra_fit_failure
from elastic_gpu.core.placement import FilterResult
from elastic_gpu.core.request import PodRequest

#: kube-scheduler's proposed victims on one node: (their pod uids, PDB violations)
Victims = tuple[list[str], int]


class NodeMode(Protocol):
    """The answers of one node mode, over nodes all of that mode."""

    def fit(self, request: PodRequest, uid: str, nodes: Sequence[str],
            claims: Mapping[str, str]) -> FilterResult:
        """Which of `nodes` can take the pod, and each other's `FitFailure`. `claims`: the
        ElasticGPUClaims its containers name (container -> claim name; empty: none)."""
        ...

    def score(self, request: PodRequest, uid: str, nodes: Sequence[str]) -> dict[str, int]:
        """Each node's score, 0..10 (kube-scheduler's extender range)."""
        ...

    def may_preempt(self, request: PodRequest, uid: str, candidates: Mapping[str, Victims],
                    claims: Mapping[str, str]) -> dict[str, Victims]:
        """Of kube-scheduler's candidate nodes, those where preempting lets the pod in, each
        with the victims to evict; the others are left out. `claims` as in `fit`."""
        ...


class DraMode:
    """DRA-mode nodes: kube-scheduler allocates their devices; we never count cards there."""

    def fit(self, request: PodRequest, uid: str, nodes: Sequence[str],
            claims: Mapping[str, str]) -> FilterResult:
        # one answer for every DRA-mode node: one failure object, its sentence made once
        failure = dra_fit_failure(request, names_claims=bool(claims))
        if failure is None:
            return FilterResult(sorted(nodes), {})
        return FilterResult([], dict.fromkeys(nodes, failure))

    def score(self, request: PodRequest, uid: str, nodes: Sequence[str]) -> dict[str, int]:
        # kube-scheduler scores the devices it allocates itself: ours says nothing there
        return dict.fromkeys(sorted(nodes), 0)

    def may_preempt(self, request: PodRequest, uid: str, candidates: Mapping[str, Victims],
                    claims: Mapping[str, str]) -> dict[str, Victims]:
        # kube-scheduler's DynamicResources plugin chose these victims for the devices it
        # allocates: kept as proposed where the pod may go at all (as `fit` answers), no card
        # of ours freed
        if dra_fit_failure(request, names_claims=bool(claims)) is not None:
            return {}
        return dict(candidates)


#: The one DRA mode (it holds no state).
DRA_MODE = DraMode()
