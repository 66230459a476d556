"""The MIG adapter (docs/mig-adapter.md, DESIGN.md 7.3): pods pending for a MIG profile move to
a compatible free one, and back when theirs frees; every move recorded in a MIGSubstitution.

One level-triggered round (a single work-queue key, so rounds never overlap) reads the caches
(pods, Nodes, GPUDevices, MIGSubstitutions) and decides with the pure functions of `core.mig`:

0. each rule is checked alone (`core.mig.rules.check_rule`): one the adapter did not write (no
   `app.kubernetes.io/managed-by` label of its own), or one it cannot read or verify (savedPod
   missing or malformed, the recorded uid or digest missing or not matching), is not carried
   out: `Valid=False` with the reason in its status and a Warning Event; the rest go on;
1. bare pods' rules are made true again (`core.mig.bare.bare_rule_step`): a pod deleted but not
   re-created (a controller killed between the two) is created from the rule's saved pod, a
   move or a return that stopped before its delete goes on, rules nothing refers to go;
2. pods Pending (PodScheduled False, Unschedulable) for one MIG instance in a namespace the
   configuration governs get `plan_substitutions` over the free instances (the Nodes' GPUDevices
   less what the pods there hold by their assignments, less the instances reserved by moves
   in flight): a move writes the rule first (with the saved pod for a bare pod), then deletes
   the pod (uid precondition); a bare pod is created again from the rule at once, an owner's
   replacement is rewritten by the webhook by the rule. `NoCompatibleProfileFree` is a
   Warning Event on the pod;
3. moved pods go back by `move_back` under the configured policy: an owner's pod has its
   rule deleted, then the pod (the replacement asks the original profile); a bare pod's rule
   is marked returning, the pod deleted and created as written, the rule deleted;
4. owner rules no unfinished pod refers to, older than the grace, with no move in flight,
   are deleted.

Ordering with the webhook: the webhook reads a MIG pod's rules from the API (a quorum list of
the pod's namespace) at admission, so a rule written (201) before the pod is deleted is seen by
the admission of its replacement, which is created after the delete (docs/mig-adapter.md,
"Ordering").
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from elastic_gpu.api import elasticgpu as egpu_api
from elastic_gpu.api import gpudevice
from elastic_gpu.api import migsubstitution as rules_api
from elastic_gpu.api.elasticgpu import GROUP, VERSION, ElasticGPUObjectError
from elastic_gpu.controller.claims import DEVICES, EGPUS
from elastic_gpu.controller.config import MigConfig
from elastic_gpu.controller.manager import Context
from elastic_gpu.core import annotations as ann
from elastic_gpu.core import nodeaffinity
from elastic_gpu.core.assignment import Assignment, AssignmentError
from elastic_gpu.core.claims.model import Condition
from elastic_gpu.core.mig import bare as mig_bare
from elastic_gpu.core.mig import recarve as mig_recarve
from elastic_gpu.core.mig import rules as mig_rules
from elastic_gpu.core.mig import substitution as mig_substitution
from elastic_gpu.core.model import Node
from elastic_gpu.core.request import PodRequest, RequestKind, pod_request_from_manifest
from elastic_gpu.core.resources import MigProfile, ResourceError
from elastic_gpu.kube.client import PODS, Resource
from elastic_gpu.kube.errors import AlreadyExists, ApiError, Conflict, NotFound
from elastic_gpu.kube.events import NORMAL, WARNING
from elastic_gpu.kube.informer import Handler, Obj, object_key
from elastic_gpu.kube.paths import CORE, group_prefix
from elastic_gpu.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)

RULES = Resource(group_prefix(GROUP, VERSION), rules_api.PLURAL, True)
NODES = Resource(CORE, "nodes", False)
RULE_API_VERSION = f"{GROUP}/{VERSION}"

ROUND = "round"
#: a reservation of a free instance by a move in flight ends when its pod is placed, or then
RESERVATION_TTL_S = 30.0
#: how often a round runs with nothing changing (grace periods, reservations expiring)
RESYNC_S = 5.0
#: a bare pod whose re-creation comes back un-rewritten is deleted again at most this often
MAX_REPAIRS = 3
#: the scheduler's annotations a re-created pod must not inherit (a new placement comes)
SCHEDULER_ANNOTATIONS = (ann.ASSIGNMENT, ann.ASSIGNED_NODE, ann.ALLOCATED)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _age_s(obj: Mapping[str, Any]) -> float:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return 0.0
    try:
        made = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return 0.0
    return (dt.datetime.now(dt.UTC) - made).total_seconds()


def as_pod(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object with apiVersion and kind (list items come without; Events need them)."""
    return {"apiVersion": "v1", "kind": "Pod", **obj}


def as_rule(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": RULE_API_VERSION, "kind": rules_api.KIND, **obj}


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    notes = _meta(obj).get("annotations")
    return notes if isinstance(notes, Mapping) else {}


def finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def unschedulable(pod: Mapping[str, Any]) -> bool:
    """Pending, not placed, and kube-scheduler said why (PodScheduled False, Unschedulable)."""
    if (pod.get("spec") or {}).get("nodeName") or _meta(pod).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if status.get("phase", "Pending") != "Pending":
        return False
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               and c.get("reason") == "Unschedulable"
               for c in status.get("conditions") or [] if isinstance(c, Mapping))


def controller_owner(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in _meta(pod).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return ref
    refs = _meta(pod).get("ownerReferences") or []
    return refs[0] if refs and isinstance(refs[0], Mapping) else None


def pod_profile(request: PodRequest) -> MigProfile | None:
    return mig_substitution.mig_request(request)


def _applied_rules(pod: Mapping[str, Any]) -> list[str]:
    return [r for r in _annotations(pod).get(mig_rules.MIG_SUBSTITUTION, "").split(",") if r]


@dataclass
class Reservation:
    """A free instance promised to a move in flight, until a pod of `selector` is placed with
    a uid other than `old_uid`, or the deadline."""

    uuid: str
    node: str
    namespace: str
    owner_uid: str | None
    pod_name: str | None
    old_uid: str
    deadline: float
    source_node: str = ""

    def fulfilled_by(self, pod: Mapping[str, Any]) -> bool:
        meta = _meta(pod)
        if meta.get("namespace") != self.namespace or meta.get("uid") == self.old_uid:
            return False
        if not (pod.get("spec") or {}).get("nodeName"):
            return False
        if self.owner_uid is not None:
            return any(isinstance(r, Mapping) and r.get("uid") == self.owner_uid
                       for r in meta.get("ownerReferences") or [])
        return meta.get("name") == self.pod_name


class MigMetrics:
    def __init__(self, ctx: Context) -> None:
        registry = ctx.metrics.registry
        self.moves = Counter(
            "elasticgpu_mig_moves", "Pods moved by the MIG adapter, by direction (substitute: "
            "to a compatible profile; back: to their original), profiles and namespace",
            ["direction", "from_profile", "to_profile", "namespace"], registry=registry)
        self.unmovable = Counter(
            "elasticgpu_mig_unmovable", "Pending MIG pods found unmovable (counted once per pod "
            "and reason, when its Event is written), by reason (NoCompatibleProfileFree)",
            ["reason", "namespace"], registry=registry)
        self.recreated = Counter(
            "elasticgpu_mig_bare_pods_recreated", "Bare pods created again from their rule's "
            "saved manifest, by step (move, back, recovered: after a controller stopped "
            "between the delete and the create)", ["step"], registry=registry)
        self.rules = Gauge("elasticgpu_mig_rules", "MIGSubstitutions in the cache",
                           registry=registry)
        self.pending = Gauge("elasticgpu_mig_pending_pods",
                             "Pods pending for a MIG profile the adapter governs (last round)",
                             registry=registry)


class MigController:
    name = "mig"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.client = ctx.client
        self.recorder = ctx.recorder
        self.config: MigConfig = ctx.config.mig
        self.queue: WorkQueue[str] = WorkQueue(ctx.new_backoff())
        f = ctx.informers
        self.pods = f.informer(PODS.path(), "pods")
        self.nodes = f.informer(NODES.path(), "nodes")
        # (a cluster without these CRDs has no MIG to adapt; the other controllers go on)
        self.devices = f.informer(DEVICES.path(), "gpudevices", missing_ok=True)
        self.rules = f.informer(RULES.path(), "migsubstitutions", missing_ok=True)
        # ElasticGPUs hold MIG instances for their claims as pods do (the claims issue)
        self.egpus = f.informer(EGPUS.path(), "elasticgpus", missing_ok=True)
        self.metrics = MigMetrics(ctx)
        self.reservations: list[Reservation] = []
        #: bare rule name -> times its pod was deleted again because it came un-rewritten
        self.repairs: dict[str, int] = {}
        #: pod uid -> the reason last told in an Event (told again only when it changes)
        self.told: dict[str, str] = {}
        #: rules and pods of this round whose API calls failed (each alone; see _bare_rules)
        self.item_failures = 0
        #: rule uid -> why it is not carried out, as last told (told again only on a change)
        self.refused: dict[str, str] = {}
        changed = Handler(on_add=lambda _o: self.kick(),
                          on_update=lambda _o, _n: self.kick(),
                          on_delete=lambda _o: self.kick())
        for informer in (self.pods, self.nodes, self.devices, self.rules, self.egpus):
            informer.add_handler(changed)

    def kick(self) -> None:
        self.queue.add(ROUND)

    async def run(self, workers: int) -> None:
        del workers  # one round at a time: the key is one
        self.kick()
        try:
            while True:
                key = await self.queue.get()
                if key is None:
                    return
                started = time.perf_counter()
                result = "ok"
                try:
                    self.item_failures = 0
                    await self.round()
                    if self.item_failures:  # a rule or pod failed alone: soon again, backing off
                        result = "requeue"
                        self.queue.add_rate_limited(key)
                    else:
                        self.queue.forget(key)
                        self.queue.add_after(ROUND, RESYNC_S)
                except asyncio.CancelledError:
                    raise
                except (Conflict, NotFound) as err:
                    result = "requeue"
                    log.info("mig round: %s; again", err)
                    self.queue.add_rate_limited(key)
                except Exception:
                    result = "error"
                    delay = self.queue.add_rate_limited(key)
                    log.exception("mig round failed; again in %.3f s", delay)
                finally:
                    self.queue.done(key)
                    self.ctx.metrics.reconciles.labels(self.name, result).inc()
                    self.ctx.metrics.reconcile_seconds.labels(self.name).observe(
                        time.perf_counter() - started)
        finally:
            self.queue.shutdown()

    # ------------------------------------------------------------------ reading the caches

    def _nodes(self) -> list[Node]:
        devices = []
        for obj in self.devices.items():
            try:
                gpudevice.card_from_object(obj)
            except gpudevice.GPUDeviceError as err:
                log.debug("GPUDevice skipped: %s", err)
                continue
            devices.append(obj)
        return gpudevice.nodes_from_objects(devices, self.nodes.items())

    def _bound(self) -> list[mig_substitution.BoundPod]:
        out = []
        for pod in self.pods.items():
            if finished(pod):
                continue
            notes = _annotations(pod)
            node = (pod.get("spec") or {}).get("nodeName") or notes.get(ann.ASSIGNED_NODE)
            raw = notes.get(ann.ASSIGNMENT)
            if raw:
                try:
                    assignment = Assignment.from_json(raw)
                except AssignmentError:
                    assignment = None
                if assignment is not None:
                    out.append(mig_substitution.BoundPod(assignment.node, tuple(
                        s.mig_uuid for s in assignment.shares() if s.mig_uuid)))
                    continue
            if not node:
                continue
            try:
                request = pod_request_from_manifest(pod)
            except (ResourceError, ValueError):
                continue
            profiles = tuple(c.mig_profile for c in request.gpu_containers
                             if c.kind is RequestKind.MIG and c.mig_profile is not None
                             for _ in range(max(1, c.cards)))
            if profiles:
                out.append(mig_substitution.BoundPod(str(node), (), profiles))
        for obj in self.egpus.items():
            try:
                egpu = egpu_api.elasticgpu_from_object(obj)
            except ElasticGPUObjectError:
                continue
            held = tuple(s.mig_uuid for s in egpu.shares if s.mig_uuid)
            if held:  # in every phase until deleted, as the extender counts them
                out.append(mig_substitution.BoundPod(egpu.node, held))
        return out

    def _allowed_nodes(self, pod: Mapping[str, Any]) -> frozenset[str] | None:
        try:
            rules = nodeaffinity.rules_from_manifest(pod)
        except nodeaffinity.RulesError:
            return frozenset()
        allowed = set()
        for node in self.nodes.items():
            name = str(_meta(node).get("name"))
            labels = _meta(node).get("labels") or {}
            if nodeaffinity.refusal(rules, name, labels,
                                    nodeaffinity.taints_from_node(node)) is None:
                allowed.add(name)
        return frozenset(allowed)

    def _rules(self) -> tuple[dict[str, tuple[Obj, mig_rules.SubstitutionRule]],
                              list[tuple[Obj, mig_rules.RuleRefusal]]]:
        """The rules the round carries out, and those it refuses, each alone: one rule that
        cannot be read, is not the adapter's or fails its check holds up no other."""
        out = {}
        refused = []
        for obj in self.rules.items():
            try:
                rule = rules_api.rule_from_object(obj)
            except rules_api.MIGSubstitutionError as err:
                refused.append((obj, mig_rules.RuleRefusal(mig_rules.RuleProblem.INVALID_SPEC, str(err))))
                continue
            refusal = mig_rules.check_rule(rule)
            if refusal is not None:
                refused.append((obj, refusal))
                continue
            out[object_key(obj)] = (obj, rule)
        return out, refused

    async def _refuse(self, obj: Obj, refusal: mig_rules.RuleRefusal) -> None:
        """A rule not carried out says why: a Warning Event (once per rule and message) and
        `Valid=False` with the reason in its status (written only when it differs)."""
        meta = _meta(obj)
        uid = str(meta.get("uid"))
        if self.refused.get(uid) == refusal.message:
            return
        self.refused[uid] = refusal.message
        log.warning("%s (%s)", refusal.message, refusal.problem.value)
        self.recorder.record(as_rule(obj), WARNING, refusal.problem.value, refusal.message)
        existing = (obj.get("status") or {}).get("conditions") or []
        if any(isinstance(c, Mapping) and c.get("type") == mig_rules.VALID_CONDITION and
               (c.get("status"), c.get("reason"), c.get("message")) ==
               ("False", refusal.problem.value, refusal.message) for c in existing):
            return
        conditions = egpu_api.merge_condition(
            [c for c in existing if isinstance(c, Mapping)],
            Condition(mig_rules.VALID_CONDITION, "False", refusal.problem.value, refusal.message),
            _now(), int(meta.get("generation") or 0))
        try:
            await self.client.patch(RULES.path(meta.get("namespace"), meta.get("name"),
                                               "status"), {"status": {"conditions": conditions}})
        except NotFound:
            return
        except ApiError as err:
            log.warning("marking MIGSubstitution %s invalid: %s", object_key(obj), err)

    # ------------------------------------------------------------------ the round

    async def round(self) -> None:
        now = time.monotonic()
        pods = self.pods.items()
        self.reservations = [r for r in self.reservations if r.deadline > now and not any(
            r.fulfilled_by(p) for p in pods)]
        rules, refused = self._rules()
        self.metrics.rules.set(len(rules) + len(refused))
        present = {str(_meta(o).get("uid")) for o in self.rules.items()}
        self.refused = {uid: why for uid, why in self.refused.items() if uid in present}
        for obj, refusal in refused:
            await self._refuse(obj, refusal)
        await self._bare_rules(rules)
        nodes = self._nodes()
        held = mig_substitution.held_instances(nodes, self._bound())
        held.update(r.uuid for r in self.reservations)
        free = mig_substitution.free_instances(nodes, held)
        if not self.config.enabled:
            return
        await self._substitute(pods, free, rules, nodes, held)
        free = mig_substitution.without(free, (r.uuid for r in self.reservations))
        await self._move_back(pods, free, rules)
        await self._forget_owner_rules(pods, rules)

    # ---- 1. bare pods' rules

    async def _bare_rules(self, rules: Mapping[str, tuple[Obj, mig_rules.SubstitutionRule]]) -> None:
        for key, (obj, rule) in sorted(rules.items()):
            try:
                await self._bare_rule(key, obj, rule)
            except ApiError as err:
                # One rule's trouble (its namespace being deleted refuses the create with 403;
                # a conflict) must not hold up the others nor the substitutions after them:
                # the next round, at most RESYNC_S away, tries it again.
                log.warning("MIGSubstitution %s: %s; again next round", key, err)
                self.item_failures += 1
            except (ValueError, TypeError) as err:
                # data the checks let through and still cannot be carried out: this rule
                # alone is refused, the round goes on
                await self._refuse(obj, mig_rules.RuleRefusal(
                    mig_rules.RuleProblem.INVALID_SPEC, f"MIGSubstitution {key}: {err}"))

    async def _bare_rule(self, key: str, obj: Obj, rule: mig_rules.SubstitutionRule) -> None:
        if rule.pod_name is None:
            return
        pod = self.pods.get(f"{rule.namespace}/{rule.pod_name}")
        recorded = bool((obj.get("status") or {}).get("movedPods"))
        state = mig_bare.BarePodState(
            exists=pod is not None,
            rewritten=pod is not None and rule.name in _applied_rules(pod),
            pending=pod is not None and unschedulable(pod),
            finished=pod is not None and finished(pod),
            recorded=recorded,
            terminating=pod is not None and bool(
                (pod.get("metadata") or {}).get("deletionTimestamp")))
        step = mig_bare.bare_rule_step(rule, state)
        if step is mig_bare.BareStep.WAIT:  # its DELETED event starts the next round
            return
        if step is mig_bare.BareStep.NONE:
            if pod is not None and not recorded:
                await self._record(obj, pod)
            return
        if step is mig_bare.BareStep.CREATE:
            if pod is None and await self._live_pod(rule.namespace, rule.pod_name):
                return  # the cache is behind: the pod exists
            created = await self._create_bare(obj, rule, "back" if rule.returning
                                              else "recovered")
            if created is not None and not rule.returning:
                await self._record(obj, created)
            if created is not None and rule.returning:
                await self._delete_rule(obj, rule, "the pod is back on "
                                        f"{rule.from_profile.name}")
        elif step is mig_bare.BareStep.DELETE_POD and pod is not None:
            if not rule.returning:
                # a move that stopped before its delete: only the very pod the adapter saved
                # is deleted and replaced (a rule naming another pod leaves it alone)
                refusal = mig_rules.check_live_pod(rule, pod)
                if refusal is not None:
                    await self._refuse(obj, refusal)
                    return
                count = self.repairs.get(key, 0)
                if count >= MAX_REPAIRS:
                    await self._delete_rule(obj, rule, "its pod came back un-rewritten "
                                            f"{count} times")
                    return
                self.repairs[key] = count + 1
            await self._delete_pod(pod)
            created = await self._create_bare(obj, rule, "back" if rule.returning
                                              else "recovered")
            if created is not None and rule.returning:
                await self._delete_rule(obj, rule, "the pod is back on "
                                        f"{rule.from_profile.name}")
            elif created is not None:
                await self._record(obj, created)
        elif step is mig_bare.BareStep.DELETE_RULE:
            await self._delete_rule(obj, rule, "nothing refers to it")

    async def _live_pod(self, namespace: str, name: str) -> bool:
        try:
            await self.client.get(PODS.path(namespace, name))
        except NotFound:
            return False
        return True

    async def _create_bare(self, rule_obj: Obj, rule: mig_rules.SubstitutionRule, step: str
                           ) -> Obj | None:
        # every pod the adapter creates passes here: from a rule it wrote, as it recorded it
        refusal = mig_rules.check_rule(rule)
        if refusal is not None:
            await self._refuse(rule_obj, refusal)
            return None
        manifest = mig_rules.recreated_pod(rule, SCHEDULER_ANNOTATIONS)
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

    async def _record(self, rule_obj: Obj, pod: Mapping[str, Any]) -> None:
        meta = _meta(rule_obj)
        moved = [{"name": _meta(pod).get("name", ""), "uid": _meta(pod).get("uid", ""),
                  "node": (pod.get("spec") or {}).get("nodeName") or "", "movedAt": _now()}]
        try:
            await self.client.patch(RULES.path(meta.get("namespace"), meta.get("name"),
                                               "status"),
                                    {"status": {"movedPods": moved, "moved": 1}})
        except NotFound:
            return

    async def _delete_rule(self, obj: Obj, rule: mig_rules.SubstitutionRule, why: str) -> None:
        meta = _meta(obj)
        try:
            await self.client.delete(RULES.path(rule.namespace, rule.name),
                                     uid=meta.get("uid"))
        except NotFound:
            return
        self.repairs.pop(f"{rule.namespace}/{rule.name}", None)
        log.info("MIGSubstitution %s/%s deleted: %s", rule.namespace, rule.name, why)
        self.recorder.record(as_rule(obj), NORMAL, "Deleted", f"rule deleted: {why}")

    async def _delete_pod(self, pod: Mapping[str, Any]) -> None:
        meta = _meta(pod)
        try:
            await self.client.delete(PODS.path(meta.get("namespace"), meta.get("name")),
                                     uid=meta.get("uid"))
        except NotFound:
            return

    # ---- 2. substitutions

    def _pending(self, pods: list[Obj], rules: Mapping[str, tuple[Obj, mig_rules.SubstitutionRule]]
                 ) -> tuple[list[mig_substitution.PendingPod], dict[str, Obj]]:
        by_key: dict[str, Obj] = {}
        pending: list[tuple[str, mig_substitution.PendingPod]] = []
        bare_rules = {(r.namespace, r.pod_name) for _, r in rules.values() if r.pod_name}
        for pod in pods:
            meta = _meta(pod)
            namespace = str(meta.get("namespace", ""))
            if not unschedulable(pod) or not self.config.governs(namespace):
                continue
            if _applied_rules(pod) or (namespace, meta.get("name")) in bare_rules:
                continue  # moved already (waits on its substitute), or its move is in flight
            owner = controller_owner(pod)
            if owner is not None and owner.get("kind") not in mig_substitution.RESTARTING_OWNERS:
                continue  # only owners that re-create their pods
            try:
                request = pod_request_from_manifest(pod)
            except (ResourceError, ValueError):
                continue
            profile = pod_profile(request)
            if profile is None:
                continue
            allowed = self.config.substitutions
            if owner is not None:
                existing = [r for _, r in rules.values() if r.owner_uid == owner.get("uid")
                            and r.namespace == namespace and r.from_profile == profile
                            and not r.returning]
                if existing:  # one rule per owner and profile: only its target again
                    allowed = {profile.name: frozenset({existing[0].to_profile.name})}
            key = object_key(pod)
            by_key[key] = pod
            constraints = mig_substitution.constraints_for(request, self._allowed_nodes(pod), allowed)
            pending.append((str(meta.get("creationTimestamp", "")),
                            mig_substitution.PendingPod(key, profile, constraints)))
        pending.sort(key=lambda p: (p[0], p[1].key))
        return [p for _, p in pending], by_key

    async def _substitute(self, pods: list[Obj], free: dict[str, list[mig_substitution.FreeInstance]],
                          rules: Mapping[str, tuple[Obj, mig_rules.SubstitutionRule]],
                          nodes: list[Node], held: set[str]) -> None:
        pending, by_key = self._pending(pods, rules)
        self.metrics.pending.set(len(pending))
        waiting = {str(_meta(p).get("uid")) for p in by_key.values()}
        self.told = {uid: why for uid, why in self.told.items() if uid in waiting}
        if not pending:
            return
        plan = mig_substitution.plan_substitutions(pending, free)
        for item in pending:
            decision = plan[item.key]
            pod = by_key[item.key]
            namespace = str(_meta(pod).get("namespace"))
            if decision.instance is None:
                uid = str(_meta(pod).get("uid"))
                if decision.reason is not mig_substitution.NoSubstitute.NONE_COMPATIBLE:
                    continue
                message = decision.message
                if self.config.recarve_advice:
                    advice = mig_recarve.recarve_advice(item.requested, nodes, held, item.constraints)
                    message += f"; {advice.message}" if advice is not None else \
                        "; dry run: no re-carve of a card the pod may use would fit it either"
                if self.told.get(uid) != message:
                    # once per pod and reason (a round runs on every change: no Event storm)
                    self.told[uid] = message
                    self.metrics.unmovable.labels(decision.reason.value, namespace).inc()
                    self.recorder.record(as_pod(pod), WARNING, decision.reason.value, message)
                continue
            try:
                await self._move(pod, item.requested, decision.instance, decision.message)
            except ApiError as err:  # this pod's trouble is not the others' (see _bare_rules)
                log.warning("moving %s/%s: %s; again next round", namespace,
                            _meta(pod).get("name"), err)
                self.item_failures += 1

    async def _move(self, pod: Obj, requested: MigProfile, target: mig_substitution.FreeInstance,
                    message: str) -> None:
        meta = _meta(pod)
        namespace, name = str(meta["namespace"]), str(meta["name"])
        owner = controller_owner(pod)
        to = target.profile
        reason = (f"no {requested.name} instance free on a node the pod may use; "
                  f"{to.name} free on node {target.node}")
        spec: dict[str, Any] = {"fromProfile": requested.name, "toProfile": to.name,
                                "reason": reason}
        if owner is not None:
            subject, key = str(owner.get("name", "owner")), str(owner["uid"])
            spec["selector"] = {"ownerUID": key}
        else:  # what it needs to re-create exactly this pod, and to verify it did
            subject, key = name, f"{namespace}/{name}"
            spec["selector"] = {"podName": name}
            spec["savedPod"] = mig_rules.saved_pod(pod)
            spec["savedPodDigest"] = mig_rules.saved_pod_digest(spec["savedPod"])
            spec["movedPodUID"] = str(meta.get("uid"))
        rule_name = mig_rules.rule_name(subject, requested, to, key)
        body = {"apiVersion": RULE_API_VERSION, "kind": rules_api.KIND,
                "metadata": {"name": rule_name, "namespace": namespace,
                             "labels": {ann.MANAGED_BY: mig_rules.ADAPTER}}, "spec": spec}
        try:  # 1. the rule, before anything is deleted
            rule_obj = await self.client.create(RULES.path(namespace), body)
        except AlreadyExists:
            rule_obj = await self.client.get(RULES.path(namespace, rule_name))
            if _annotations(rule_obj).get(mig_rules.MIG_RETURNING) is not None:
                return  # a return under this name is finishing; next round
            if owner is None:
                return  # a bare move in flight: step 1 of the next round finishes it
            try:  # an owner's rule of that name is reused only if it is the adapter's
                refusal = mig_rules.check_rule(rules_api.rule_from_object(rule_obj))
            except rules_api.MIGSubstitutionError as err:
                refusal = mig_rules.RuleRefusal(mig_rules.RuleProblem.INVALID_SPEC, str(err))
            if refusal is not None:
                await self._refuse(rule_obj, refusal)
                return  # its pod is not deleted under a rule the adapter did not write
        self.reservations.append(Reservation(
            target.uuid, target.node, namespace, str(owner["uid"]) if owner else None,
            None if owner else name, str(meta.get("uid")), time.monotonic() + RESERVATION_TTL_S))
        # 2. the pod: its uid as a precondition (never a newer pod of the same name)
        try:
            await self.client.delete(PODS.path(namespace, name), uid=meta.get("uid"))
        except (NotFound, Conflict):
            self.reservations.pop()
            return
        self.metrics.moves.labels("substitute", requested.name, to.name, namespace).inc()
        text = f"moved from {requested.name} to {to.name} ({message}); rule {rule_name}"
        self.recorder.record(as_pod(pod), NORMAL, "MIGSubstituted", text)
        self.recorder.record(as_rule(rule_obj), NORMAL, "MIGSubstituted",
                             f"pod {name}: {text}")
        log.info("%s/%s: %s", namespace, name, text)
        if owner is None:  # 3. a bare pod: created again from the rule, rewritten at admission
            rule = rules_api.rule_from_object(rule_obj)
            created = await self._create_bare(rule_obj, rule, "move")
            if created is not None:
                await self._record(rule_obj, created)

    # ---- 3. moving back

    def _moved(self, pods: list[Obj]) -> tuple[list[mig_substitution.MovedPod], dict[str, Obj]]:
        out: list[tuple[str, mig_substitution.MovedPod]] = []
        by_key: dict[str, Obj] = {}
        for pod in pods:
            meta = _meta(pod)
            notes = _annotations(pod)
            node = (pod.get("spec") or {}).get("nodeName")
            if not node or not _applied_rules(pod) or finished(pod) or \
                    meta.get("deletionTimestamp") or mig_rules.MIG_ORIGINAL not in notes:
                continue
            namespace = str(meta.get("namespace", ""))
            if not self.config.governs(namespace):
                continue
            try:
                request = pod_request_from_manifest(pod)
            except (ResourceError, ValueError):
                continue
            current = pod_profile(request)
            if current is None:
                continue
            originals = mig_rules.parse_original(notes[mig_rules.MIG_ORIGINAL])
            container = request.gpu_containers[0].name
            original = originals.get(container)
            if original is None or original == current:
                continue
            owner = controller_owner(pod)
            key = object_key(pod)
            by_key[key] = pod
            out.append((str(meta.get("creationTimestamp", "")), mig_substitution.MovedPod(
                key, original, current, str(node),
                str(owner.get("kind")) if owner is not None else None,
                str((pod.get("spec") or {}).get("restartPolicy") or "Always"), None,
                mig_substitution.constraints_for(request, self._allowed_nodes(pod)))))
        out.sort(key=lambda p: (p[0], p[1].key))
        return [m for _, m in out], by_key

    async def _move_back(self, pods: list[Obj], free: dict[str, list[mig_substitution.FreeInstance]],
                         rules: Mapping[str, tuple[Obj, mig_rules.SubstitutionRule]]) -> None:
        moved, by_key = self._moved(pods)
        if not moved:
            return
        busy = frozenset({r.node for r in self.reservations} |
                         {r.source_node for r in self.reservations if r.source_node})
        originals = [i for insts in free.values() for i in insts]
        for back in mig_substitution.move_back(moved, originals, self.config.move_back, busy):
            try:
                await self._return(by_key[back.pod.key], back, rules)
            except ApiError as err:  # this pod's trouble is not the others' (see _bare_rules)
                log.warning("moving %s back: %s; again next round", back.pod.key, err)
                self.item_failures += 1

    async def _return(self, pod: Obj, back: mig_substitution.MoveBack,
                      rules: Mapping[str, tuple[Obj, mig_rules.SubstitutionRule]]) -> None:
        meta = _meta(pod)
        namespace, name = str(meta["namespace"]), str(meta["name"])
        owner = controller_owner(pod)
        applied = [rules[f"{namespace}/{r}"] for r in _applied_rules(pod)
                   if f"{namespace}/{r}" in rules]
        text = (f"moved back from {back.pod.current.name} to {back.pod.original.name}: "
                f"{back.pod.original.name} free on node {back.instance.node}")
        self.reservations.append(Reservation(
            back.instance.uuid, back.instance.node, namespace,
            str(owner["uid"]) if owner else None, None if owner else name, str(meta.get("uid")),
            time.monotonic() + RESERVATION_TTL_S, back.pod.node))
        if owner is None:
            bare = [(o, r) for o, r in applied if r.pod_name == name]
            if not bare:
                return  # no saved manifest to create it from: it stays
            obj, rule = bare[0]
            # 1. the rule stops rewriting (the webhook reads it live), keeping the saved pod
            obj = await self.client.patch(RULES.path(namespace, rule.name), {
                "metadata": {"annotations": {mig_rules.MIG_RETURNING: _now()}}})
            rule = rules_api.rule_from_object(obj)
            await self._delete_pod(pod)  # 2.
            self._count_back(back, namespace, pod, obj, text)
            created = await self._create_bare(obj, rule, "back")  # 3.
            if created is not None:
                await self._delete_rule(obj, rule, f"pod {name} is back on "
                                        f"{back.pod.original.name}")  # 4.
            return
        for obj, rule in applied:  # 1. the owner's replacement is no longer rewritten
            await self._delete_rule(obj, rule, f"pod {name} goes back to "
                                    f"{back.pod.original.name}")
        await self._delete_pod(pod)  # 2. the owner creates it again, as written
        self._count_back(back, namespace, pod, applied[0][0] if applied else None, text)

    def _count_back(self, back: mig_substitution.MoveBack, namespace: str, pod: Obj, rule_obj: Obj | None,
                    text: str) -> None:
        self.metrics.moves.labels("back", back.pod.current.name, back.pod.original.name,
                                  namespace).inc()
        self.recorder.record(as_pod(pod), NORMAL, "MIGMovedBack", text)
        if rule_obj is not None:
            self.recorder.record(as_rule(rule_obj), NORMAL, "MIGMovedBack",
                                 f"pod {_meta(pod).get('name')}: {text}")
        log.info("%s: %s", object_key(pod), text)

    # ---- 4. owner rules nothing refers to

    async def _forget_owner_rules(self, pods: list[Obj],
                                  rules: Mapping[str, tuple[Obj, mig_rules.SubstitutionRule]]) -> None:
        referring: dict[str, int] = {}
        for pod in pods:
            if finished(pod):
                continue
            namespace = _meta(pod).get("namespace")
            for name in _applied_rules(pod):
                referring[f"{namespace}/{name}"] = referring.get(f"{namespace}/{name}", 0) + 1
        for key, (obj, rule) in sorted(rules.items()):
            if rule.owner_uid is None:
                continue
            in_flight = any(r.owner_uid == rule.owner_uid for r in self.reservations)
            if mig_bare.owner_rule_unused(referring.get(key, 0), in_flight, _age_s(obj),
                                      self.config.rule_grace_s):
                try:
                    await self._delete_rule(obj, rule, "no pod refers to it")
                except ApiError as err:
                    log.warning("deleting MIGSubstitution %s: %s", key, err)
