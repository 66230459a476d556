"""The MIG adapter's controller: its informers, the round, and what the round reads off the
caches (the Nodes' MIG instances, what holds them, the rules).

One level-triggered round at a time (a single work-queue key); see the package's docstring
for its steps.
"""

from __future__ import annotations

import logging
import time

from elastic_gpu.api import elasticgpu as egpu_api
from elastic_gpu.api import gpudevice
from elastic_gpu.api import migsubstitution as rules_api
from elastic_gpu.api.elasticgpu import ElasticGPUObjectError
from elastic_gpu.controller.config import MigConfig
from elastic_gpu.controller.manager import Context
from elastic_gpu.controller.mig.bare import BareRules
from elastic_gpu.controller.mig.metrics import MigMetrics
from elastic_gpu.controller.mig.moveback import MoveBack
from elastic_gpu.controller.mig.objects import (
    Rules,
    age_s,
    applied_rules,
    device_round_inputs,
    holds_mig,
    metadata_of,
)
from elastic_gpu.controller.mig.state import RoundState
from elastic_gpu.controller.mig.substitution import Substitution
from elastic_gpu.controller.mig.writes import AdapterWrites
from elastic_gpu.controller.worker import Done, Outcome, Retry, run_rounds
from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.core.mig import substitution as mig_substitution
from elastic_gpu.core.mig.bare import owner_rule_unused
from elastic_gpu.core.mig.rules import RuleProblem, RuleRefusal, SubstitutionRule, check_rule
from elastic_gpu.core.mig.substitution import (
    BoundPod,
    bound_pod,
    free_instances,
    held_instances,
)
from elastic_gpu.core.model import Node
from elastic_gpu.core.podlife import finished
from elastic_gpu.kube.errors import ApiError, Conflict, NotFound
from elastic_gpu.kube.informer import Handler, Obj, object_key, on_any_change
from elastic_gpu.kube.resources import ELASTICGPUS, GPUDEVICES, NODES, PODS
from elastic_gpu.kube.resources import MIG_SUBSTITUTIONS as RULES
from elastic_gpu.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)

ROUND = "round"
#: how often a round runs with nothing changing (grace periods, reservations expiring)
RESYNC_S = 5.0


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
        self.devices = f.informer(GPUDEVICES.path(), "gpudevices", missing_ok=True)
        self.rules = f.informer(RULES.path(), "migsubstitutions", missing_ok=True)
        # ElasticGPUs hold MIG instances for their claims as pods do (the claims issue)
        self.egpus = f.informer(ELASTICGPUS.path(), "elasticgpus", missing_ok=True)
        self.metrics = MigMetrics(ctx)
        self.state = RoundState()
        self.writes = AdapterWrites(self.client, self.recorder, self.metrics, self.state)
        self.bare = BareRules(self.pods, self.state, self.writes)
        self.substitution = Substitution(ctx, self.nodes, self.metrics, self.state, self.writes)
        self.move_back = MoveBack(ctx, self.nodes, self.metrics, self.state, self.writes)
        changed = on_any_change(self.kick)
        for informer in (self.pods, self.nodes, self.rules):
            informer.add_handler(changed)
        # a round decodes every GPUDevice and ElasticGPU: started by each of their events, it
        # ran back to back under a stream of claims (their ElasticGPUs, the allocation
        # columns) and took most of the controller's CPU, in the event loop the claims share
        self.devices.add_handler(Handler(
            on_add=lambda _o: self.kick(),
            on_update=lambda o, n: self._kick_if(device_round_inputs(o) != device_round_inputs(n)),
            on_delete=lambda _o: self.kick()))
        self.egpus.add_handler(Handler(
            on_add=lambda o: self._kick_if(holds_mig(o)),
            on_update=lambda o, n: self._kick_if(holds_mig(o) or holds_mig(n)),
            on_delete=lambda o: self._kick_if(holds_mig(o))))

    def kick(self) -> None:
        self.queue.add(ROUND)

    def _kick_if(self, relevant: bool) -> None:
        if relevant:
            self.kick()

    async def run(self, workers: int) -> None:
        del workers  # one round at a time: the key is one
        await run_rounds(self.queue, self.name, self.ctx.metrics, self._round_key, self.kick,
                         describe="mig round", expected=(Conflict, NotFound))

    async def _round_key(self, key: str) -> Outcome:
        del key  # the one key: a round over every rule and pod
        self.state.item_failures = 0
        await self.round()
        if self.state.item_failures:  # a rule or pod failed alone: soon again, backing off
            return Retry(f"{self.state.item_failures} item(s) failed alone")
        return Done(after=RESYNC_S)

    # ------------------------------------------------------------------ reading the caches

    def _nodes(self) -> list[Node]:
        return gpudevice.nodes_from_readable_objects(
            self.devices.items(), self.nodes.items(),
            lambda err: log.debug("GPUDevice skipped: %s", err))

    def _opted_in(self) -> frozenset[str]:
        """The Nodes opted in to dynamic MIG (docs/mig-apply.md, "Opting in")."""
        return frozenset(str(metadata_of(n).get("name")) for n in self.nodes.items()
                         if (metadata_of(n).get("labels") or {}).get(MIG_DYNAMIC_LABEL) == "true")

    def _bound(self) -> list[BoundPod]:
        out = [bound for pod in self.pods.items() if (bound := bound_pod(pod)) is not None]
        for obj in self.egpus.items():
            try:
                egpu = egpu_api.elasticgpu_from_object(obj)
            except ElasticGPUObjectError:
                continue
            held = tuple(s.mig_uuid for s in egpu.shares if s.mig_uuid)
            if held:  # in every phase until deleted, as the extender counts them
                out.append(BoundPod(egpu.node, held))
        return out

    def _rules(self) -> tuple[dict[str, tuple[Obj, SubstitutionRule]],
                              list[tuple[Obj, RuleRefusal]]]:
        """The rules the round carries out, and those it refuses, each alone: one rule that
        cannot be read, is not the adapter's or fails its check holds up no other."""
        out = {}
        refused = []
        for obj in self.rules.items():
            try:
                rule = rules_api.rule_from_object(obj)
            except rules_api.MIGSubstitutionError as err:
                refused.append((obj, RuleRefusal(RuleProblem.INVALID_SPEC, str(err))))
                continue
            refusal = check_rule(rule)
            if refusal is not None:
                refused.append((obj, refusal))
                continue
            out[object_key(obj)] = (obj, rule)
        return out, refused

    # ------------------------------------------------------------------ the round

    async def round(self) -> None:
        now = time.monotonic()
        pods = self.pods.items()
        self.state.reservations = [r for r in self.state.reservations if r.deadline > now
                                   and not any(r.fulfilled_by(p) for p in pods)]
        rules, refused = self._rules()
        self.metrics.rules.set(len(rules) + len(refused))
        present = {str(metadata_of(o).get("uid")) for o in self.rules.items()}
        self.state.refused = {uid: why for uid, why in self.state.refused.items() if uid in present}
        for obj, refusal in refused:
            await self.writes.refuse(obj, refusal)
        await self.bare.carry_out(rules)
        nodes = self._nodes()
        held = held_instances(nodes, self._bound())
        held.update(r.uuid for r in self.state.reservations)
        free = free_instances(nodes, held)
        if not self.config.enabled:
            return
        # dynamic MIG gives out the opted-in nodes' free instances (it carves what waits there)
        targets = mig_substitution.off_nodes(free, self._opted_in()) \
            if self.config.dynamic.enabled else free
        await self.substitution.carry_out(pods, targets, rules, nodes, held)
        free = mig_substitution.without(free, (r.uuid for r in self.state.reservations))
        await self.move_back.carry_out(pods, free, rules)
        await self._forget_owner_rules(pods, rules)

    # ---- 4. owner rules nothing refers to

    async def _forget_owner_rules(self, pods: list[Obj], rules: Rules) -> None:
        referring: dict[str, int] = {}
        for pod in pods:
            if finished(pod):
                continue
            namespace = metadata_of(pod).get("namespace")
            for name in applied_rules(pod):
                referring[f"{namespace}/{name}"] = referring.get(f"{namespace}/{name}", 0) + 1
        for key, (obj, rule) in sorted(rules.items()):
            if rule.owner_uid is None:
                continue
            in_flight = any(r.owner_uid == rule.owner_uid for r in self.state.reservations)
            if owner_rule_unused(referring.get(key, 0), in_flight, age_s(obj),
                                      self.config.rule_grace_s):
                try:
                    await self.writes.delete_rule(obj, rule, "no pod refers to it")
                except ApiError as err:
                    log.warning("deleting MIGSubstitution %s: %s", key, err)

