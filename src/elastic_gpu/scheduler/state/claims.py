"""The Elastic GPU API as the watches show it: claims and classes (the ElasticGPUs hold cards,
so the ledger keeps them); and the verbs for pods that name claims (filter, reserve) and for
/provision.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.claims import decisions as claims_decisions
from elastic_gpu.core.claims import model as claims_model
from elastic_gpu.core.claims import pods as claims_pods
from elastic_gpu.core.claims import provisioning as claims_provisioning
from elastic_gpu.core.claims.binding import decide
from elastic_gpu.core.claims.decisions import Decision, Pending
from elastic_gpu.core.claims.inventory import ledger_key
from elastic_gpu.core.claims.model import Claim, GPUClass
from elastic_gpu.core.claims.pods import (
    ClaimAnnotationError,
    PodClaims,
    off_node_failure,
    pod_claims,
    resolve_pod_claims,
)
from elastic_gpu.core.fit import FitFailure, FitKind
from elastic_gpu.core.placement import (
    FilterResult,
    Unschedulable,
)
from elastic_gpu.core.request import PodRequest
from elastic_gpu.core.wakeup import Wake
from elastic_gpu.scheduler.state.handle import StateHandle
from elastic_gpu.scheduler.state.placement import without_containers
from elastic_gpu.scheduler.state.records import PodInfo

log = logging.getLogger(__name__)


class Deciding(Protocol):
    """What the claims ask of placement (`Placement`)."""

    def prepare(self) -> None: ...

    def filter(self, pod: PodRequest, uid: str, node_names: Sequence[str], *,
               narrow: bool | None = None) -> FilterResult: ...


class ElasticGPULedger(Protocol):
    """What the claims ask of the ledger (`Ledger`): it keeps the ElasticGPUs, which hold
    cards, and the reservations of binds and creations."""

    def pod(self, uid: str) -> PodInfo | None: ...

    def elasticgpus(self) -> Mapping[str, claims_model.ElasticGPU]: ...

    def put_elasticgpu(self, egpu: claims_model.ElasticGPU, uid: str = "") -> bool: ...

    def drop_elasticgpu(self, name: str) -> claims_model.ElasticGPU | None: ...

    def defrag_hold_released(self, uid: str) -> AbstractContextManager[None]: ...

    def reserve_assignment(self, pod: PodRequest, uid: str, node: str,
                           assignment: Assignment) -> int: ...

    def reserve_elasticgpu(self, egpu: claims_model.ElasticGPU) -> int: ...

    def drop_reservations(self, uid: str, token: int | None = None) -> None: ...

    def keep_for_ttl(self, key: str, token: int) -> None: ...


class ClaimWaiters(Protocol):
    """What the claims tell the pods waiting (`Wakeups`)."""

    def stop_waiting_for_capacity(self, uid: str) -> None: ...

    def wait_for_claims(self, uid: str, namespace: str, name: str,
                        claims: frozenset[str]) -> None: ...

    def stop_waiting_for_claims(self, uid: str) -> None: ...

    def claim_waiters(self) -> list[tuple[str, tuple[str, str, frozenset[str]]]]: ...

    def wake_for_claims(self, wake: Wake) -> None: ...


class ClaimCaches:
    """Claims and classes; placing pods that name claims."""

    def __init__(self, handle: StateHandle, placement: Deciding, ledger: ElasticGPULedger,
                 waiters: ClaimWaiters) -> None:
        self._h = handle
        self._placement = placement
        self._ledger = ledger
        self._waiters = waiters
        self._claims: dict[tuple[str, str], Claim] = {}
        self._classes: dict[str, GPUClass] = {}

    def _claim_keys_changed(self, keys: Iterable[str]) -> None:
        """Claims (namespace/name) whose binding may have changed: wake the pods waiting for
        them that can now be placed (`wakeups`)."""
        changed = set(keys)
        if not changed:
            return
        for uid, (namespace, name, waits) in self._waiters.claim_waiters():
            if waits & changed:
                self._recheck_claim_waiter(uid, namespace, name)

    def _recheck_claim_waiter(self, uid: str, namespace: str, name: str) -> None:
        pod = self._ledger.pod(uid)
        if pod is None:
            self._waiters.stop_waiting_for_claims(uid)
            return
        try:
            named = pod_claims(pod.manifest)
        except ClaimAnnotationError:
            return
        view = self._claim_view(namespace, named)
        if not view.blocked:
            where = f" on node {view.node}" if view.node else ""
            self._waiters.wake_for_claims(Wake(
                uid, namespace, name, view.node or "",
                f"the ElasticGPUClaims this pod names can now be placed{where}"))

    def upsert_elasticgpu(self, egpu: claims_model.ElasticGPU, uid: str = "") -> None:
        """An ElasticGPU from the watch (or the API's answer to our create): it holds its cards
        from now on; any reservation made to create it ends (the truth is known)."""
        with self._h.lock:
            if not self._ledger.put_elasticgpu(egpu, uid):
                return
            if egpu.claim_ref is not None:
                self._claim_keys_changed([f"{egpu.claim_ref.namespace}/{egpu.claim_ref.name}"])

    def remove_elasticgpu(self, name: str) -> None:
        with self._h.lock:
            egpu = self._ledger.drop_elasticgpu(name)
            if egpu is not None and egpu.claim_ref is not None:
                self._claim_keys_changed([f"{egpu.claim_ref.namespace}/{egpu.claim_ref.name}"])

    def replace_elasticgpus(self, egpus: Iterable[tuple[claims_model.ElasticGPU, str]]) -> None:
        """A relist: exactly these ElasticGPUs (with their object UIDs) exist."""
        with self._h.lock:
            fresh = {egpu.name: (egpu, uid) for egpu, uid in egpus}
            for name in set(self._ledger.elasticgpus()) - set(fresh):
                self.remove_elasticgpu(name)
            for egpu, uid in fresh.values():
                self.upsert_elasticgpu(egpu, uid)

    def upsert_claim(self, claim: Claim) -> None:
        with self._h.lock:
            if self._claims.get((claim.namespace, claim.name)) == claim:
                return
            self._claims[(claim.namespace, claim.name)] = claim
            self._claim_keys_changed([claim.key])

    def remove_claim(self, namespace: str, name: str) -> None:
        with self._h.lock:
            if self._claims.pop((namespace, name), None) is not None:
                self._claim_keys_changed([f"{namespace}/{name}"])

    def replace_claims(self, claims: Iterable[Claim]) -> None:
        with self._h.lock:
            fresh = {(c.namespace, c.name): c for c in claims}
            for namespace, name in set(self._claims) - set(fresh):
                self.remove_claim(namespace, name)
            for claim in fresh.values():
                self.upsert_claim(claim)

    def upsert_class(self, cls: GPUClass) -> None:
        with self._h.lock:
            if self._classes.get(cls.name) != cls:
                self._classes[cls.name] = cls
                self._claim_keys_changed(self._claims_of_class(cls.name))

    def remove_class(self, name: str) -> None:
        with self._h.lock:
            if self._classes.pop(name, None) is not None:
                self._claim_keys_changed(self._claims_of_class(name))

    def replace_classes(self, classes: Iterable[GPUClass]) -> None:
        with self._h.lock:
            fresh = {c.name: c for c in classes}
            for name in set(self._classes) - set(fresh):
                self.remove_class(name)
            for cls in fresh.values():
                self.upsert_class(cls)

    def _claims_of_class(self, name: str) -> list[str]:
        return [c.key for c in self._claims.values() if c.class_name == name]

    def claim(self, namespace: str, name: str) -> Claim | None:
        return self._claims.get((namespace, name))

    def elasticgpu(self, name: str) -> claims_model.ElasticGPU | None:
        return self._ledger.elasticgpus().get(name)

    def elasticgpus(self) -> dict[str, claims_model.ElasticGPU]:
        with self._h.lock:
            return dict(self._ledger.elasticgpus())

    def classes(self) -> dict[str, GPUClass]:
        with self._h.lock:
            return dict(self._classes)

    def _claim_view(self, namespace: str, named: Mapping[str, str]) -> PodClaims:
        return resolve_pod_claims(namespace, named, self._claims, self._classes,
                                  self._ledger.elasticgpus())

    def claim_view(self, namespace: str, named: Mapping[str, str]) -> PodClaims:
        """How a pod of `namespace` naming these claims (container -> claim) is placed now."""
        with self._h.lock:
            return self._claim_view(namespace, named)

    def filter_claims(self, pod: PodRequest, uid: str, node_names: Sequence[str],
                      named: Mapping[str, str], *, narrow: bool | None = None
                      ) -> tuple[FilterResult, dict[str, FitFailure]]:
        """`filter` for a pod whose containers name claims: (the engine's result for its other
        containers, node -> why a claim rules the node out: the "claims" check's failures). A
        bound claim's containers need nothing more, on its ElasticGPU's node only; an unbound
        WaitForFirstConsumer claim's container is placed like any (it carries the claim's
        request); any other unbound claim rules out every node, and the pod waits for it
        (`wakeups`). `narrow`: as `Placement.filter`'s."""
        with self._h.lock:
            self._placement.prepare()
            view = self._claim_view(pod.namespace, named)
            if view.blocked:
                self._waiters.stop_waiting_for_capacity(uid)
                if node_names:
                    self._waiters.wait_for_claims(uid, pod.namespace, pod.name, view.waits_for)
                blocked = FitFailure(FitKind.CLAIM_BLOCKED, claim_blocks=view.blocked)
                return FilterResult([], {}), dict.fromkeys(node_names, blocked)
            self._waiters.stop_waiting_for_claims(uid)
            rest = without_containers(pod, view.bound)
            node = view.node
            if node is None:
                return self._placement.filter(rest, uid, node_names, narrow=narrow), {}
            container, egpu = next(iter(sorted(view.bound.items())))
            off = off_node_failure(container, f"{pod.namespace}/{named[container]}", egpu)
            reasons = {n: off for n in node_names if n != node}
            if node not in node_names:
                self._waiters.stop_waiting_for_capacity(uid)
                return FilterResult([], {}), reasons
            if not rest.wants_gpu:
                self._waiters.stop_waiting_for_capacity(uid)
                return FilterResult([node], {}), reasons
            return self._placement.filter(rest, uid, [node], narrow=narrow), reasons

    def reserve_claims(self, pod: PodRequest, uid: str, node: str, view: PodClaims
                       ) -> tuple[int, Assignment, list[tuple[claims_model.ElasticGPU, int]]]:
        """`reserve` for a pod naming claims: its bound claims' containers get their
        ElasticGPUs' cards (held already, under the ElasticGPUs' keys); cards are chosen on
        `node` for the others, and those chosen for a WaitForFirstConsumer claim's container are
        reserved for the claim's ElasticGPU (`first_consumer_elasticgpu`, to be created before
        the Binding). Returns the pod's token, its whole assignment (with the `claims` mark)
        and each ElasticGPU to create with its reservation token (`settle_elasticgpu`)."""
        with self._h.lock:
            self._placement.prepare()
            with self._ledger.defrag_hold_released(uid):
                return self._reserve_claims(pod, uid, node, view)

    def _reserve_claims(self, pod: PodRequest, uid: str, node: str, view: PodClaims
                        ) -> tuple[int, Assignment, list[tuple[claims_model.ElasticGPU, int]]]:
        rest = without_containers(pod, view.bound)
        placed = self._h.engine.assign(rest, node) if rest.wants_gpu else Assignment(node, {})
        made = []
        for container, claim in sorted(view.first_consumer.items()):
            cls = self._classes.get(claim.class_name or "")
            if cls is None:
                raise Unschedulable(FitFailure(FitKind.UNDETAILED), node)
            made.append(claims_pods.first_consumer_elasticgpu(
                claim, cls, node, tuple(placed.containers.get(container, ()))))
        own = Assignment(node, {c: s for c, s in placed.containers.items()
                                if c not in view.first_consumer})
        token = self._ledger.reserve_assignment(pod, uid, node, own)
        tokens = []
        try:
            for egpu in made:
                tokens.append((egpu, self._ledger.reserve_elasticgpu(egpu)))
        except Unschedulable:
            for egpu, etoken in tokens:
                self._ledger.drop_reservations(ledger_key(egpu.name), etoken)
            self._ledger.drop_reservations(uid, token)
            raise
        containers = dict(placed.containers)
        containers.update({c: e.shares for c, e in view.bound.items()})
        return token, Assignment(node, containers, view.marks()), tokens

    def provision(self, claim: Claim) -> tuple[Decision | claims_model.ElasticGPU, int | None]:
        """/provision's decision for a claim, from the caches (`core.claims.decide`); on
        Provision, the ElasticGPU placed by the engine (`core.claims.provision`) with its cards
        reserved under its ledger key (the token, for `settle_elasticgpu`)."""
        with self._h.lock:
            self._placement.prepare()
            decision = decide(claim, self._classes, self._ledger.elasticgpus())
            if not isinstance(decision, claims_decisions.Provision):
                return decision, None
            cls = self._classes[claim.class_name or ""]
            made = claims_provisioning.provision(decision, claim, cls, self._h.engine)
            if isinstance(made, Pending):
                return made, None
            return made, self._ledger.reserve_elasticgpu(made)

    def settle_elasticgpu(self, name: str, token: int, outcome: str,
                          created: claims_model.ElasticGPU | None = None, uid: str = "") -> None:
        """End an ElasticGPU's reservation: `created` (pass what the API holds: it holds the
        cards from now on, as if the watch had shown it), `failed` (nothing was created) or
        `unknown` (kept for the TTL, until the watch shows the truth)."""
        with self._h.lock:
            key = ledger_key(name)
            if outcome == "unknown":
                self._ledger.keep_for_ttl(key, token)
                return
            if outcome == "created" and created is not None:
                self.upsert_elasticgpu(created, uid)  # ends every reservation of it
            self._ledger.drop_reservations(key, token)
