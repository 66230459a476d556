"""The Elastic GPU API as the watches show it: ElasticGPUs, claims, classes; and the verbs for
pods that name claims (filter, reserve) and for /provision.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.claims import decisions as claims_decisions
from elastic_gpu.core.claims import model as claims_model
from elastic_gpu.core.claims import pods as claims_pods
from elastic_gpu.core.claims import provisioning as claims_provisioning
from elastic_gpu.core.claims.binding import decide
from elastic_gpu.core.claims.decisions import Decision, Pending
from elastic_gpu.core.claims.inventory import egpu_assignment, ledger_key
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
from elastic_gpu.scheduler.state.base import EGPU_KEY, StateBase
from elastic_gpu.scheduler.state.holds import MAX_GONE
from elastic_gpu.scheduler.state.placement import without_containers
from elastic_gpu.scheduler.state.records import Reservation

log = logging.getLogger(__name__)

#: Pods remembered as waiting for a claim to be bound.
MAX_CLAIM_WAITING = 10_000


class ClaimCaches(StateBase):
    """ElasticGPUs, claims and classes; placing pods that name claims."""

    def _claim_keys_changed(self, keys: Iterable[str]) -> None:
        """Claims (namespace/name) whose binding may have changed: wake the pods waiting for
        them that can now be placed (`wakeups`)."""
        changed = set(keys)
        if not changed or not self._claim_waiting:
            return
        for uid, (namespace, name, waits) in list(self._claim_waiting.items()):
            if waits & changed:
                self._recheck_claim_waiter(uid, namespace, name)

    def _recheck_claim_waiter(self, uid: str, namespace: str, name: str) -> None:
        pod = self._pods.get(uid)
        if pod is None:
            self._claim_waiting.pop(uid, None)
            return
        try:
            named = pod_claims(pod.manifest)
        except ClaimAnnotationError:
            return
        view = self._claim_view(namespace, named)
        if not view.blocked:
            del self._claim_waiting[uid]
            where = f" on node {view.node}" if view.node else ""
            self._claim_wakes[uid] = Wake(
                uid, namespace, name, view.node or "",
                f"the ElasticGPUClaims this pod names can now be placed{where}")

    def upsert_elasticgpu(self, egpu: claims_model.ElasticGPU, uid: str = "") -> None:
        """An ElasticGPU from the watch (or the API's answer to our create): it holds its cards
        from now on; any reservation made to create it ends (the truth is known)."""
        with self._lock:
            if uid and uid in self._egpus_gone:
                return  # a late copy of a deleted one
            key = ledger_key(egpu.name)
            if self._egpus.get(egpu.name) == egpu and key not in self._inflight:
                return
            self._egpus[egpu.name] = egpu
            if uid:
                self._egpu_uids[egpu.name] = uid
            self._sync_consumers(egpu.name)  # they give its cards back first
            self._drop_reservations(key)
            self._sync(key)
            if egpu.claim_ref is not None:
                self._claim_keys_changed([f"{egpu.claim_ref.namespace}/{egpu.claim_ref.name}"])

    def remove_elasticgpu(self, name: str) -> None:
        with self._lock:
            egpu = self._egpus.pop(name, None)
            uid = self._egpu_uids.pop(name, None)
            if uid:
                self._egpus_gone[uid] = None
                while len(self._egpus_gone) > MAX_GONE:
                    self._egpus_gone.popitem(last=False)
            self._sync(ledger_key(name))
            self._sync_consumers(name)  # a running pod using its cards holds them now
            if egpu is not None and egpu.claim_ref is not None:
                self._claim_keys_changed([f"{egpu.claim_ref.namespace}/{egpu.claim_ref.name}"])

    def replace_elasticgpus(self, egpus: Iterable[tuple[claims_model.ElasticGPU, str]]) -> None:
        """A relist: exactly these ElasticGPUs (with their object UIDs) exist."""
        with self._lock:
            fresh = {egpu.name: (egpu, uid) for egpu, uid in egpus}
            for name in set(self._egpus) - set(fresh):
                self.remove_elasticgpu(name)
            for egpu, uid in fresh.values():
                self.upsert_elasticgpu(egpu, uid)

    def upsert_claim(self, claim: Claim) -> None:
        with self._lock:
            if self._claims.get((claim.namespace, claim.name)) == claim:
                return
            self._claims[(claim.namespace, claim.name)] = claim
            self._claim_keys_changed([claim.key])

    def remove_claim(self, namespace: str, name: str) -> None:
        with self._lock:
            if self._claims.pop((namespace, name), None) is not None:
                self._claim_keys_changed([f"{namespace}/{name}"])

    def replace_claims(self, claims: Iterable[Claim]) -> None:
        with self._lock:
            fresh = {(c.namespace, c.name): c for c in claims}
            for namespace, name in set(self._claims) - set(fresh):
                self.remove_claim(namespace, name)
            for claim in fresh.values():
                self.upsert_claim(claim)

    def upsert_class(self, cls: GPUClass) -> None:
        with self._lock:
            if self._classes.get(cls.name) != cls:
                self._classes[cls.name] = cls
                self._claim_keys_changed(self._claims_of_class(cls.name))

    def remove_class(self, name: str) -> None:
        with self._lock:
            if self._classes.pop(name, None) is not None:
                self._claim_keys_changed(self._claims_of_class(name))

    def replace_classes(self, classes: Iterable[GPUClass]) -> None:
        with self._lock:
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
        return self._egpus.get(name)

    def elasticgpus(self) -> dict[str, claims_model.ElasticGPU]:
        with self._lock:
            return dict(self._egpus)

    def classes(self) -> dict[str, GPUClass]:
        with self._lock:
            return dict(self._classes)

    def _claim_view(self, namespace: str, named: Mapping[str, str]) -> PodClaims:
        return resolve_pod_claims(namespace, named, self._claims, self._classes, self._egpus)

    def claim_view(self, namespace: str, named: Mapping[str, str]) -> PodClaims:
        """How a pod of `namespace` naming these claims (container -> claim) is placed now."""
        with self._lock:
            return self._claim_view(namespace, named)

    def filter_claims(self, pod: PodRequest, uid: str, node_names: Sequence[str],
                      named: Mapping[str, str]) -> tuple[FilterResult, dict[str, FitFailure]]:
        """`filter` for a pod whose containers name claims: (the engine's result for its other
        containers, node -> why a claim rules the node out: the "claims" check's failures). A
        bound claim's containers need nothing more, on its ElasticGPU's node only; an unbound
        WaitForFirstConsumer claim's container is placed like any (it carries the claim's
        request); any other unbound claim rules out every node, and the pod waits for it
        (`wakeups`)."""
        with self._lock:
            self._prepare()
            view = self._claim_view(pod.namespace, named)
            if view.blocked:
                self._waiting.pop(uid, None)
                if node_names:
                    self._claim_waiting.pop(uid, None)
                    self._claim_waiting[uid] = (pod.namespace, pod.name, view.waits_for)
                    while len(self._claim_waiting) > MAX_CLAIM_WAITING:
                        del self._claim_waiting[next(iter(self._claim_waiting))]
                    self.wakeup_counts["claim_turned_away"] += 1
                blocked = FitFailure(FitKind.CLAIM_BLOCKED, claim_blocks=view.blocked)
                return FilterResult([], {}), dict.fromkeys(node_names, blocked)
            self._claim_waiting.pop(uid, None)
            rest = without_containers(pod, view.bound)
            node = view.node
            if node is None:
                return self.filter(rest, uid, node_names), {}
            container, egpu = next(iter(sorted(view.bound.items())))
            off = off_node_failure(container, f"{pod.namespace}/{named[container]}", egpu)
            reasons = {n: off for n in node_names if n != node}
            if node not in node_names:
                self._waiting.pop(uid, None)
                return FilterResult([], {}), reasons
            if not rest.wants_gpu:
                self._waiting.pop(uid, None)
                return FilterResult([node], {}), reasons
            return self.filter(rest, uid, [node]), reasons

    def reserve_claims(self, pod: PodRequest, uid: str, node: str, view: PodClaims
                       ) -> tuple[int, Assignment, list[tuple[claims_model.ElasticGPU, int]]]:
        """`reserve` for a pod naming claims: its bound claims' containers get their
        ElasticGPUs' cards (held already, under the ElasticGPUs' keys); cards are chosen on
        `node` for the others, and those chosen for a WaitForFirstConsumer claim's container are
        reserved for the claim's ElasticGPU (`first_consumer_elasticgpu`, to be created before
        the Binding). Returns the pod's token, its whole assignment (with the `claims` mark)
        and each ElasticGPU to create with its reservation token (`settle_elasticgpu`)."""
        with self._lock:
            self._prepare()
            with self._defrag_hold_released(uid):
                return self._reserve_claims(pod, uid, node, view)

    def _reserve_claims(self, pod: PodRequest, uid: str, node: str, view: PodClaims
                        ) -> tuple[int, Assignment, list[tuple[claims_model.ElasticGPU, int]]]:
        rest = without_containers(pod, view.bound)
        placed = self.engine.assign(rest, node) if rest.wants_gpu else Assignment(node, {})
        made = []
        for container, claim in sorted(view.first_consumer.items()):
            cls = self._classes.get(claim.class_name or "")
            if cls is None:
                raise Unschedulable(FitFailure(FitKind.UNDETAILED), node)
            made.append(claims_pods.first_consumer_elasticgpu(
                claim, cls, node, tuple(placed.containers.get(container, ()))))
        own = Assignment(node, {c: s for c, s in placed.containers.items()
                                if c not in view.first_consumer})
        token = self._reserve_assignment(pod, uid, node, own)
        tokens = []
        try:
            for egpu in made:
                tokens.append((egpu, self._reserve_egpu(egpu)))
        except Unschedulable:
            for egpu, etoken in tokens:
                self._drop_reservations(ledger_key(egpu.name), etoken)
            self._drop_reservations(uid, token)
            raise
        containers = dict(placed.containers)
        containers.update({c: e.shares for c, e in view.bound.items()})
        return token, Assignment(node, containers, view.marks()), tokens

    def _reserve_egpu(self, egpu: claims_model.ElasticGPU) -> int:
        key = ledger_key(egpu.name)
        assignment = egpu_assignment(egpu)
        self._tokens += 1
        token = self._tokens
        self.engine.allocate(self._reservation_key(key, token), assignment)
        self._version += 1
        self._inflight.setdefault(key, {})[token] = Reservation(assignment)
        return token

    def provision(self, claim: Claim) -> tuple[Decision | claims_model.ElasticGPU, int | None]:
        """/provision's decision for a claim, from the caches (`core.claims.decide`); on
        Provision, the ElasticGPU placed by the engine (`core.claims.provision`) with its cards
        reserved under its ledger key (the token, for `settle_elasticgpu`)."""
        with self._lock:
            self._prepare()
            decision = decide(claim, self._classes, self._egpus)
            if not isinstance(decision, claims_decisions.Provision):
                return decision, None
            cls = self._classes[claim.class_name or ""]
            made = claims_provisioning.provision(decision, claim, cls, self.engine)
            if isinstance(made, Pending):
                return made, None
            return made, self._reserve_egpu(made)

    def settle_elasticgpu(self, name: str, token: int, outcome: str,
                          created: claims_model.ElasticGPU | None = None, uid: str = "") -> None:
        """End an ElasticGPU's reservation: `created` (pass what the API holds: it holds the
        cards from now on, as if the watch had shown it), `failed` (nothing was created) or
        `unknown` (kept for the TTL, until the watch shows the truth)."""
        with self._lock:
            key = ledger_key(name)
            if outcome == "unknown":
                reservation = (self._inflight.get(key) or {}).get(token)
                if reservation is not None:
                    reservation.deadline = self._clock() + self.config.reservation_ttl_s
                return
            if outcome == "created" and created is not None:
                self.upsert_elasticgpu(created, uid)  # ends every reservation of it
            self._drop_reservations(key, token)

    def egpu_holds(self) -> dict[str, Assignment]:
        """ElasticGPU name -> the cards it holds in the engine."""
        with self._lock:
            return {k[len(EGPU_KEY):]: a for k, a in self._holds.items() if k.startswith(EGPU_KEY)}
