"""The running extender: watch-backed caches feeding the state, the HTTP server, expiry.

The API worker (a child process, `apiworker`) lists and watches nodes, non-terminated pods and
GPUDevices and sends their slim forms here, where `Feeds` keeps `SchedulerState` current; the
server answers only once all three have listed (readiness), so a restarted scheduler answers
from the full set of assignments written before it died. Binds go through the same worker.
With `leaderElection.enabled`, only the replica holding the Lease serves (`leadership`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from elastic_gpu.api import elasticgpu, gpudevice
from elastic_gpu.core import nodestatus
from elastic_gpu.core.claims.model import Claim, ElasticGPU, GPUClass
from elastic_gpu.core.nodeaffinity import taints_from_node
from elastic_gpu.core.wakeup import Wake
from elastic_gpu.kube.client import KubeClient
from elastic_gpu.kube.leaderelection import LeaderElector, LeaseConfig
from elastic_gpu.runtime.eventloop import loop_name, stop_on_signals
from elastic_gpu.runtime.http_connections import (
    ConnectionGate,
    GateCollector,
    GatedSite,
    gated_app,
    runner_options,
)
from elastic_gpu.scheduler.config import LeaderElectionConfig, SchedulerConfig
from elastic_gpu.scheduler.dra_allocator import AllocatorSettings, DraAllocator
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.leadership import LeadershipLost, Role, lead
from elastic_gpu.scheduler.metrics import PREFIX
from elastic_gpu.scheduler.state import NodeInfo, SchedulerState
from elastic_gpu.scheduler.worker_link import WorkerLink

log = logging.getLogger(__name__)


def node_info(node: Mapping[str, Any]) -> NodeInfo:
    """The extender's view of a Node: allocatable CPU and memory, the GPU resources it serves
    (`core.nodestatus`: capacity, so a sick card does not turn the node away), labels, taints.
    A node whose GPUDevices predate spec.resources (an older agent) is still checked for the
    resource names a pod writes."""
    meta: Mapping[str, Any] = node.get("metadata") or {}
    offers: dict[str, int] = {}
    for key, quantity in nodestatus.gpu_capacity(node).items():
        count = int(quantity) if quantity is not None else 0
        offers[key] = count if 0 <= count < 2**63 else 0
    return NodeInfo(name=str(meta.get("name", "")),
                    cpu_milli=nodestatus.allocatable(node, "cpu", 1000),
                    memory_mib=nodestatus.allocatable(node, "memory") // 2**20,
                    labels=dict(meta.get("labels") or {}), offers=offers,
                    taints=taints_from_node(node))


def _device(obj: Mapping[str, Any]) -> tuple[str, str, Any] | None:
    name = str((obj.get("metadata") or {}).get("name", ""))
    try:
        node, card = gpudevice.card_from_gpudevice(obj)
    except gpudevice.GPUDeviceError as err:
        log.warning("ignoring %s", err)
        return None
    return name, node, card


def _elasticgpu(obj: Mapping[str, Any]) -> tuple[ElasticGPU, str] | None:
    try:
        return (elasticgpu.elasticgpu_from_object(obj),
                str((obj.get("metadata") or {}).get("uid") or ""))
    except elasticgpu.ElasticGPUObjectError as err:
        log.warning("ignoring %s", err)
        return None


def _claim(obj: Mapping[str, Any]) -> Claim | None:
    try:
        return elasticgpu.claim_from_object(obj)
    except elasticgpu.ElasticGPUObjectError as err:
        log.warning("ignoring %s", err)
        return None


def _class(obj: Mapping[str, Any]) -> GPUClass | None:
    try:
        return elasticgpu.class_from_object(obj)
    except elasticgpu.ElasticGPUObjectError as err:
        log.warning("ignoring %s", err)
        return None


class Feeds:
    """Reflector callbacks: API objects into the state."""

    def __init__(self, state: SchedulerState) -> None:
        self.state = state

    def nodes_replace(self, items: list[dict[str, Any]]) -> None:
        self.state.replace_nodes(node_info(n) for n in items)
        self.state.mark_synced("nodes")

    def nodes_event(self, kind: str, obj: dict[str, Any]) -> None:
        info = node_info(obj)
        if kind == "DELETED":
            self.state.remove_node(info.name)
        else:
            self.state.upsert_node(info)

    def devices_replace(self, items: list[dict[str, Any]]) -> None:
        self.state.replace_devices(d for d in map(_device, items) if d is not None)
        self.state.mark_synced("gpudevices")

    def devices_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        device = _device(obj) if kind != "DELETED" else None
        if device is None:
            self.state.remove_device(name)
        else:
            self.state.upsert_device(*device)

    def pods_replace(self, items: list[dict[str, Any]]) -> None:
        self.state.replace_pods(items)
        self.state.mark_synced("pods")

    def pods_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            uid = str((obj.get("metadata") or {}).get("uid", ""))
            self.state.forget_pod(uid)
        else:
            self.state.observe_pod(obj)

    # ---- the Elastic GPU API (objects that cannot be decoded are logged and skipped: the
    # CRDs' schemas make that a bug, not an input) ----------------------------------------

    def egpus_replace(self, items: list[dict[str, Any]]) -> None:
        self.state.replace_elasticgpus(e for e in map(_elasticgpu, items) if e is not None)
        self.state.mark_synced("elasticgpus")

    def egpus_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.state.remove_elasticgpu(str((obj.get("metadata") or {}).get("name", "")))
            return
        decoded = _elasticgpu(obj)
        if decoded is not None:
            self.state.upsert_elasticgpu(*decoded)

    def claims_replace(self, items: list[dict[str, Any]]) -> None:
        self.state.replace_claims(c for c in map(_claim, items) if c is not None)
        self.state.mark_synced("elasticgpuclaims")

    def claims_event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if kind == "DELETED":
            self.state.remove_claim(str(meta.get("namespace", "")), str(meta.get("name", "")))
            return
        claim = _claim(obj)
        if claim is not None:
            self.state.upsert_claim(claim)

    def classes_replace(self, items: list[dict[str, Any]]) -> None:
        self.state.replace_classes(c for c in map(_class, items) if c is not None)
        self.state.mark_synced("elasticgpuclasses")

    def classes_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.state.remove_class(str((obj.get("metadata") or {}).get("name", "")))
            return
        cls = _class(obj)
        if cls is not None:
            self.state.upsert_class(cls)

    def wakeups(self) -> list[Wake]:
        """Pending pods to wake: GPU capacity they wait for has freed (`state.wakeups`)."""
        return self.state.wakeups()

    def wakeup_pending(self) -> bool:
        return self.state.wakeup_pending()

    def wakeup_result(self, wake: Wake, sent: bool, definite: bool) -> None:
        self.state.wakeup_done(wake, sent, definite)


#: The config's defaults: each serving default is the model's, in one place.
_DEFAULTS = SchedulerConfig()


@dataclass
class ServeOptions:
    """Where and how the extender serves (`serve_options` builds it from the config); the
    defaults are the config's."""

    #: loopback: the extender runs beside kube-scheduler (docs/scheduler.md, "Security")
    host: str = _DEFAULTS.host
    port: int = _DEFAULTS.port
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: when set, clients must present a certificate this CA signed (mutual TLS)
    tls_client_ca: Path | None = None
    #: on SIGTERM, how long binds in progress may take to finish
    drain_s: float = _DEFAULTS.drain_s
    #: a plain-HTTP listener with only /healthz and /readyz, for kubelet's probes when the
    #: extender's own port requires client certificates (0: none)
    health_port: int = _DEFAULTS.health_port
    health_host: str = "0.0.0.0"
    #: this replica's Lease holder identity (`leaderElection`); empty: hostname_pid
    identity: str = ""


def serve_options(config: SchedulerConfig, identity: str = "") -> ServeOptions:
    """Where and how to serve, from the config's keys (flags merged in by the loader) and this
    replica's Lease identity (a flag only: one per pod)."""
    tls = config.tls
    return ServeOptions(host=config.host, port=config.port,
                        tls_cert=Path(tls.cert_file) if tls.cert_file is not None else None,
                        tls_key=Path(tls.key_file) if tls.key_file is not None else None,
                        tls_client_ca=(Path(tls.client_ca_file)
                                       if tls.client_ca_file is not None else None),
                        drain_s=config.drain_s, health_port=config.health_port,
                        identity=identity)


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


class TLSFilesError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names it."""


def tls_context(options: ServeOptions) -> ssl.SSLContext | None:
    """HTTPS for kube-scheduler's `enableHTTPS: true` (its tlsConfig names our CA); with
    `tls_client_ca`, a client without a certificate signed by that CA fails the handshake."""
    if options.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(options.tls_cert), str(options.tls_key or options.tls_cert))
    except (OSError, ssl.SSLError) as err:
        raise TLSFilesError(f"--tls-cert (tls.certFile) {options.tls_cert} / --tls-key "
                            f"(tls.keyFile) {options.tls_key}: {err}") from None
    if options.tls_client_ca is not None:
        try:
            context.load_verify_locations(cafile=str(options.tls_client_ca))
        except (OSError, ssl.SSLError) as err:
            raise TLSFilesError(f"--tls-client-ca (tls.clientCAFile) {options.tls_client_ca}: "
                                f"{err}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    # HTTP/2 first: kube-scheduler's extender client (Go, HTTP/2 enabled) then sends every
    # request on one connection instead of a TLS handshake for most pods (`runtime.http2`)
    context.set_alpn_protocols(["h2", "http/1.1"])
    return context


async def _expiry_loop(state: SchedulerState, period_s: float = 1.0) -> None:
    while True:
        await asyncio.sleep(period_s)
        state.expire()


async def serve_extender(extender: Extender, options: ServeOptions, stop: asyncio.Event,
                         started: asyncio.Event | None = None,
                         background: asyncio.Future[Any] | None = None) -> None:
    """Serve `extender` until `stop` is set (or `background` ends), then drain: close the
    listener, let binds in progress finish (at most `options.drain_s`), close connections."""
    limits = extender.state.config.connection_limits
    gate = ConnectionGate(limits)
    gate.app = extender.http_app()  # HTTP/1.1, and HTTP/2 where a TLS client negotiates it
    runner = web.AppRunner(gated_app(extender.app(), gate), access_log=None,
                           shutdown_timeout=options.drain_s, **runner_options(limits))
    await runner.setup()
    context = tls_context(options)
    site = GatedSite(runner, options.host, options.port, gate=gate, ssl_context=context)
    await site.start()
    log.info("serving the extender on %s:%d (%s%s, %s event loop; at most %d connections, "
             "idle ones closed after %.0f s, %.0f s for a handshake and headers, %.0f s for a "
             "body)", options.host, options.port, "https" if context else "http",
             ", client certificates required" if options.tls_client_ca else "", loop_name(),
             gate.cap, limits.idle_timeout_s, limits.header_timeout_s, limits.body_timeout_s)
    health: web.AppRunner | None = None
    if options.health_port:
        health_app = web.Application()
        health_app.router.add_get("/healthz", extender.healthz)
        health_app.router.add_get("/readyz", extender.readyz)
        health = web.AppRunner(health_app, access_log=None)
        await health.setup()
        await web.TCPSite(health, options.health_host, options.health_port).start()
        log.info("health and readiness on http://%s:%d", options.health_host,
                 options.health_port)
    connections = GateCollector(gate, PREFIX)
    extender.metrics.registry.register(connections)  # until this server stops
    if started is not None:
        started.set()
    waiter = asyncio.ensure_future(stop.wait())
    try:
        pending = {waiter} if background is None else {waiter, background}
        done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if background is not None and background in done:
            background.result()  # a crashed background task ends serving with its error
    finally:
        waiter.cancel()
        log.info("stopping: no new connections; waiting up to %.0f s for binds in progress",
                 options.drain_s)
        await site.stop()  # the listening socket closes: new connections are refused
        if not await extender.drained(options.drain_s):
            log.warning("binds still in progress after %.0f s; stopping anyway",
                        options.drain_s)
        await runner.cleanup()
        if health is not None:
            await health.cleanup()
        extender.metrics.registry.unregister(connections)


async def serve(kubeconfig: Path | None, config: SchedulerConfig, options: ServeOptions,
                started: asyncio.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT (then drain and return) or until cancelled."""
    from elastic_gpu.kube.transport import RestClient

    RestClient.from_config(kubeconfig)  # a broken configuration fails here, with its reason
    state = SchedulerState(config)
    link = WorkerLink(kubeconfig, Feeds(state),
                      log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()))
    election = config.leader_election
    extender = Extender(state, link, claims_api=link, role=Role(elected=election.enabled))
    tasks = [asyncio.create_task(link.run(), name="api-worker"),
             asyncio.create_task(_expiry_loop(state), name="expiry")]
    options = dataclasses.replace(options)
    client: KubeClient | None = None
    elector: LeaderElector | None = None
    if election.enabled:
        client = KubeClient.from_config(kubeconfig)
        elector = LeaderElector(client, lease_config(election, options.identity))
        leading = asyncio.create_task(lead(elector, state, link, extender.role),
                                      name="leadership")

        def lost(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and isinstance(task.exception(), LeadershipLost):
                options.drain_s = 0.0  # a bind in flight must not outlive the Lease

        leading.add_done_callback(lost)
        tasks.append(leading)
    if config.dra_allocation:
        client = client or KubeClient.from_config(kubeconfig)
        allocator = DraAllocator(client, allocator_settings(config),
                                 serving=lambda: extender.role.serving)
        tasks.append(asyncio.create_task(allocator.run(), name="dra-allocator"))
    stop = asyncio.Event()
    background = asyncio.gather(*tasks)
    # at a stop the tasks are cancelled below, which ends `background` with CancelledError:
    # retrieved here, so asyncio does not log it as an error at every clean stop
    background.add_done_callback(lambda f: f.cancelled() or f.exception())
    try:
        with stop_on_signals(stop):
            # the API worker stays up while binds drain: they write through it
            await serve_extender(extender, options, stop, started, background=background)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if elector is not None and stop.is_set():
            # a clean stop (SIGTERM: binds drained, writes refused now): the standby takes
            # over at its next retry instead of waiting for the Lease to expire
            await elector.release()
        if client is not None:
            await client.close()
    log.info("stopped")


def allocator_settings(config: SchedulerConfig) -> AllocatorSettings:
    """The DRA allocator's share of the extender's config: its profiles and policies."""
    return AllocatorSettings(config.scheduler_names, config.node_policy, config.card_policy,
                             config.seed)


def lease_config(election: LeaderElectionConfig, identity: str) -> LeaseConfig:
    return LeaseConfig(election.lease_namespace, election.lease_name,
                       identity or default_identity(), election.lease_duration_s,
                       election.renew_deadline_s, election.retry_period_s)
