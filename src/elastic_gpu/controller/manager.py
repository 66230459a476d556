"""The controller manager: shared informers, leader election, metrics/health, the controllers.

    informers (warm on every replica) --> handlers enqueue keys --> work queue --> reconcile
                       only the leader runs the workers ^

Every replica lists and watches (a follower taking over starts with warm caches); only the
one holding the Lease runs reconciles. Losing the Lease (not renewed within the renew
deadline) ends the process with exit code 1, so it restarts as a follower and can never act
beside a new leader; SIGTERM/SIGINT stop the workers, then release the Lease (holder emptied)
so a successor takes over at its next retry.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from elastic_gpu.controller.config import BudgetsConfig, ControllerConfig
from elastic_gpu.controller.provisioning import ExtenderClient, TLSOptions
from elastic_gpu.kube.client import KubeClient
from elastic_gpu.kube.events import EventRecorder
from elastic_gpu.kube.informer import Informer
from elastic_gpu.kube.leaderelection import LeaderElector, LeadershipLost, LeaseConfig
from elastic_gpu.kube.workqueue import ExponentialBackoff
from elastic_gpu.runtime.metrics import add_metrics

log = logging.getLogger(__name__)

COMPONENT = "egpu-controller"


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter("elasticgpu_controller_reconciles",
                                  "Reconciles by controller and result (ok, requeue, error)",
                                  ["controller", "result"], registry=self.registry)
        self.reconcile_seconds = Histogram(
            "elasticgpu_controller_reconcile_duration_seconds", "Time of one reconcile",
            ["controller"], registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.leader = Gauge("elasticgpu_controller_leader",
                            "1 while this replica holds the Lease", registry=self.registry)
        self.queue_depth = Gauge("elasticgpu_controller_queue_depth", "Keys waiting",
                                 ["controller"], registry=self.registry)


class InformerFactory:
    """One informer per collection path, shared by every controller that reads it."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.informers: dict[str, Informer] = {}

    def informer(self, path: str, name: str, *, missing_ok: bool = False) -> Informer:
        """The shared informer of `path`; `missing_ok`: its CRD may not be installed (an
        empty collection until it is, `kube.informer`)."""
        if path not in self.informers:
            self.informers[path] = Informer(self.client, path, name=name, missing_ok=missing_ok)
        return self.informers[path]

    @property
    def synced(self) -> bool:
        return all(i.has_synced for i in self.informers.values())

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.wait_synced() for i in self.informers.values()))


@dataclass
class Context:
    """What a controller is built from."""

    client: KubeClient
    informers: InformerFactory
    recorder: EventRecorder
    metrics: Metrics
    extender: ExtenderClient
    identity: str
    #: the controllers' settings (`--config` and the flags, controller/config.py)
    config: ControllerConfig = field(default_factory=ControllerConfig)

    @property
    def budget(self) -> BudgetsConfig:
        return self.config.budgets

    def new_backoff(self) -> ExponentialBackoff[str]:
        return ExponentialBackoff(self.config.backoff.base_s, self.config.backoff.max_s)


class Controller(Protocol):
    name: str

    async def run(self, workers: int) -> None:
        """Reconcile until cancelled (called once this replica leads and caches are synced)."""


#: name -> factory; a controller joins `egpu controller` by one entry (registry.py fills it).
ControllerFactory = Callable[[Context], Controller]


@dataclass(frozen=True)
class ManagerOptions:
    """What `serve` runs: the settings (`config`), and what the CLI built from them and from
    the process's own flags (the Lease with this replica's identity, the extender's TLS)."""

    kubeconfig: Path | None
    lease: LeaseConfig
    extender_tls: TLSOptions = field(default_factory=TLSOptions)
    config: ControllerConfig = field(default_factory=ControllerConfig)


class _Health:
    def __init__(self, elector: LeaderElector, informers: InformerFactory) -> None:
        self.elector = elector
        self.informers = informers
        self.running = False

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, _: web.Request) -> web.Response:
        if self.elector.is_leader and self.informers.synced and self.running:
            return web.Response(text="leading\n")
        what = "caches syncing" if self.elector.is_leader else "standing by (not the leader)"
        return web.Response(status=503, text=f"{what}\n")


async def serve(options: ManagerOptions, factories: Mapping[str, ControllerFactory]) -> int:
    """Run until SIGTERM/SIGINT (0) or a lost Lease (1)."""
    from elastic_gpu.runtime.eventloop import stop_on_signals

    client = KubeClient.from_config(options.kubeconfig)
    metrics = Metrics()
    informers = InformerFactory(client)
    recorder = EventRecorder(client, COMPONENT, options.lease.identity)
    settings = options.config
    extender = ExtenderClient(settings.extender.url, options.extender_tls)
    context = Context(client, informers, recorder, metrics, extender, options.lease.identity,
                      settings)
    names = list(settings.controllers) or list(factories)
    unknown = [n for n in names if n not in factories]
    if unknown:
        raise ValueError(f"unknown controllers {unknown}; known: {sorted(factories)}")
    controllers = [factories[n](context) for n in names]
    elector = LeaderElector(client, options.lease)
    health = _Health(elector, informers)

    def queue_depths() -> None:
        for c in controllers:
            queue = getattr(c, "queue", None)
            if queue is not None:
                metrics.queue_depth.labels(c.name).set(len(queue))

    app = web.Application()
    add_metrics(app, metrics.registry, refresh=queue_depths)
    app.router.add_get("/healthz", health.healthz)
    app.router.add_get("/readyz", health.readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.metrics.host, settings.metrics.port)
    await site.start()
    log.info("egpu controller %s: metrics on http://%s:%d, controllers %s", options.lease.identity,
             settings.metrics.host, settings.metrics.port, ", ".join(names))

    background = [asyncio.create_task(i.run(), name=f"informer {n}")
                  for n, i in informers.informers.items()]
    background.append(asyncio.create_task(recorder.run(), name="events"))
    stop = asyncio.Event()
    code = 0
    try:
        with stop_on_signals(stop):
            stopper = asyncio.create_task(stop.wait())
            acquire = asyncio.create_task(elector.acquire())
            await asyncio.wait({stopper, acquire}, return_when=asyncio.FIRST_COMPLETED)
            if not acquire.done():
                acquire.cancel()
                return 0
            metrics.leader.set(1)
            # renew from the start: a slow cache sync must not let the Lease expire under us
            renew = asyncio.create_task(elector.keep_renewing())
            started = time.monotonic()
            synced = asyncio.create_task(informers.wait_synced())
            await asyncio.wait({stopper, renew, synced}, return_when=asyncio.FIRST_COMPLETED)
            tasks: list[asyncio.Task[None]] = []
            if synced.done():
                log.info("caches synced in %.2f s; reconciling", time.monotonic() - started)
                health.running = True
                tasks = [asyncio.create_task(c.run(settings.workers), name=c.name)
                         for c in controllers]
                done, _ = await asyncio.wait({stopper, renew, *tasks},
                                             return_when=asyncio.FIRST_COMPLETED)
            else:
                synced.cancel()
                done = {t for t in (stopper, renew) if t.done()}
            health.running = False
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if renew in done:
                err = renew.exception()
                if isinstance(err, LeadershipLost):
                    log.error("leadership lost: %s; exiting so that this replica restarts as a "
                              "follower", err)
                else:
                    log.error("leader election failed: %r", err)
                code = 1
            else:
                renew.cancel()
                for task in tasks:
                    if task in done and not task.cancelled() and task.exception() is not None:
                        log.error("controller %s failed: %r", task.get_name(), task.exception())
                        code = 1
                await recorder.close()
                await elector.release()
            metrics.leader.set(0)
            stopper.cancel()
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await extender.close()
        await client.close()
        await runner.cleanup()
    return code


