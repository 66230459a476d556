"""The claims controller: its work queue's workers, which route each key to its reconcile.

Keys are `claim:<namespace>/<name>` (`binder.ClaimBinder`) and `egpu:<name>`
(`reclaimer.Reclaimer`); the caches (`caches.ClaimCaches`) enqueue them from watch events.
A `Requeue`, a 409 or an unanswered provisioning is retried with backoff and logged in one
line; anything else is logged with its stack and retried the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time

from elastic_gpu.controller.claims.binder import ClaimBinder, Requeue
from elastic_gpu.controller.claims.caches import CLAIM_KEY, EGPU_KEY, ClaimCaches
from elastic_gpu.controller.claims.metrics import PhaseCollector
from elastic_gpu.controller.claims.reclaimer import Reclaimer
from elastic_gpu.controller.manager import Context
from elastic_gpu.controller.provisioning import ProvisionError
from elastic_gpu.kube.errors import Conflict
from elastic_gpu.kube.informer import object_key
from elastic_gpu.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)


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
        for obj in self.caches.claims.items():  # everything once at start (the informers'
            self.caches.claim_changed(obj)      # adds may predate leadership)
        for obj in self.caches.egpus.items():
            self.queue.add(EGPU_KEY + object_key(obj))
        try:
            await asyncio.gather(*(self._worker() for _ in range(workers)))
        finally:
            self.queue.shutdown()

    async def _worker(self) -> None:
        metrics = self.ctx.metrics
        while True:
            key = await self.queue.get()
            if key is None:
                return
            started = time.perf_counter()
            result = "ok"
            try:
                if key.startswith(CLAIM_KEY):
                    await self.binder.reconcile_claim(key[len(CLAIM_KEY):])
                else:
                    await self.reclaimer.reconcile_egpu(key[len(EGPU_KEY):])
                self.queue.forget(key)
                log.debug("%s reconciled in %.1f ms", key, (time.perf_counter() - started) * 1e3)
            except asyncio.CancelledError:
                raise
            except (Requeue, Conflict, ProvisionError) as err:
                result = "requeue"
                delay = self.queue.add_rate_limited(key)
                log.info("%s: %s; retry in %.3f s", key, err, delay)
            except Exception:
                result = "error"
                delay = self.queue.add_rate_limited(key)
                log.exception("%s: reconcile failed; retry in %.3f s", key, delay)
            finally:
                self.queue.done(key)
                metrics.reconciles.labels(self.name, result).inc()
                metrics.reconcile_seconds.labels(self.name).observe(time.perf_counter() - started)
