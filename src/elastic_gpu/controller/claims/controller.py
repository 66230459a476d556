"""The claims controller: its work queue's workers, which route each key to its reconcile.

Keys are `claim:<namespace>/<name>` (`binder.ClaimBinder`) and `egpu:<name>`
(`reclaimer.Reclaimer`); the caches (`caches.ClaimCaches`) enqueue them from watch events.
A `Requeue`, a 409 or an unanswered provisioning is retried with backoff and logged in one
line; anything else is logged with its stack and retried the same way.
"""

from __future__ import annotations

import asyncio
import logging

from elastic_gpu.api import elasticgpu as api
from elastic_gpu.controller.claims.binder import ClaimBinder, Requeue
from elastic_gpu.controller.claims.caches import CLAIM_KEY, EGPU_KEY, ClaimCaches
from elastic_gpu.controller.claims.metrics import PhaseCollector
from elastic_gpu.controller.claims.reclaimer import Reclaimer
from elastic_gpu.controller.manager import Context
from elastic_gpu.controller.provisioning import ProvisionError
from elastic_gpu.controller.worker import Done, Outcome, work
from elastic_gpu.core.claims.binding import settled
from elastic_gpu.kube.errors import Conflict
from elastic_gpu.kube.informer import Obj, object_key
from elastic_gpu.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)


def _settled(obj: Obj) -> bool:
    try:
        return settled(api.claim_from_object(obj))
    except api.ElasticGPUObjectError:
        return False  # its reconcile says what is wrong with it


class ClaimController:
    name = "claims"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.queue: WorkQueue[str] = WorkQueue(ctx.new_backoff())
        self.caches = ClaimCaches(ctx, self.queue)
        self.binder = ClaimBinder(ctx, self.caches)
        self.reclaimer = Reclaimer(ctx, self.caches)
        ctx.metrics.registry.register(PhaseCollector(self.caches))

    async def run(self, workers: int) -> None:
        self.takeover_pass()
        try:
            await asyncio.gather(*(self._worker() for _ in range(workers)))
        finally:
            self.queue.shutdown()

    def takeover_pass(self) -> None:
        """Everything once at start (the informers' adds may predate leadership, and the last
        leader may have died mid-reconcile), as a resync: what arrives from now on goes
        first. The claims that still need work (`core.claims.binding.settled`: created,
        pending, deleting) join the news, ahead of the pass over the settled claims and
        every ElasticGPU; the wait of a claim created around a takeover no longer grows with
        the objects that exist (docs/architecture.md, "Claims after a controller takeover")."""
        self.queue.move_to_resync()
        for obj in self.caches.claims.items():
            self.caches.claim_changed(obj, resync=_settled(obj))
        for obj in self.caches.egpus.items():
            self.queue.add(EGPU_KEY + object_key(obj), resync=True)

    async def _worker(self) -> None:
        await work(self.queue, self.name, self.ctx.metrics, self._reconcile_key,
                   expected=(Requeue, Conflict, ProvisionError))

    async def _reconcile_key(self, key: str) -> Outcome:
        if key.startswith(CLAIM_KEY):
            await self.binder.reconcile_claim(key[len(CLAIM_KEY):])
        else:
            await self.reclaimer.reconcile_egpu(key[len(EGPU_KEY):])
        return Done()
