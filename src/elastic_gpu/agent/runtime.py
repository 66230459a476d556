"""The running agent: discover, publish, serve the plugins, follow health, keep columns fresh.

With `dra.enabled` the node is a DRA node (`agent.dra.mode`): no device plugins and no
GPUDevice objects; ResourceSlices and the kubelet's DRA plugin instead."""

from __future__ import annotations

import logging
import threading
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastic_gpu.agent.accounting import CardUse, card_usage
from elastic_gpu.agent.allocator import Allocator
from elastic_gpu.agent.backends.base import Backend, BackendError
from elastic_gpu.agent.backends.isolation import Gated, Isolation
from elastic_gpu.agent.config import AgentConfig, SharingMode
from elastic_gpu.agent.dra.mode import DraMode, DraModeError, device_plugin_refusal
from elastic_gpu.agent.dra.prepare import GrantInputs
from elastic_gpu.agent.grant import DeviceFiles
from elastic_gpu.agent.inventory_api import publish_allocations, publish_health, require_crd
from elastic_gpu.agent.manager import PluginManager
from elastic_gpu.agent.mps_supervisor import MpsSupervisor
from elastic_gpu.agent.plugin import PluginServer
from elastic_gpu.agent.podresources import list_devices
from elastic_gpu.agent.pods import ApiPods, PodCache, PodSource
from elastic_gpu.agent.publish import (
    NodeSnapshot,
    discover,
    patch_node_capacity,
    publish_snapshot,
    snapshot,
)
from elastic_gpu.agent.state import NodeState
from elastic_gpu.agent.usage.monitor import UsageMonitor, UsageSinks
from elastic_gpu.agent.usage.sinks import ApiSinks
from elastic_gpu.kube.resources import NODES
from elastic_gpu.kube.sync import SyncKubeClient

if TYPE_CHECKING:
    from elastic_gpu.runtime.metrics import MetricsThread

log = logging.getLogger(__name__)


class Agent:
    def __init__(self, config: AgentConfig, backend: Backend, node_name: str,
                 client: SyncKubeClient | None = None, pods: PodSource | None = None,
                 plugin_dir: Path | None = None) -> None:
        self.config = config
        self.backend = backend
        self.node_name = node_name
        self.client = client
        self.plugin_dir = plugin_dir or config.devicePluginDirectory
        # Discovery and planning fail here, before anything is advertised.
        self.snapshot: NodeSnapshot = discover(backend, config, node_name)
        if config.dra.enabled:
            # no device plugins: the cards are the DRA driver's devices
            self.snapshot = snapshot(node_name, self.snapshot.cards, config, plans=())
        self.state = NodeState(self.snapshot.cards)
        files = DeviceFiles({chip.uuid: backend.device_nodes(chip)
                             for lc in self.snapshot.cards for chip in lc.chips},
                            backend.control_nodes())
        self.pod_cache: PodCache | None = None
        if pods is None and client is not None:
            self.pod_cache = PodCache(client, node_name)
            pods = ApiPods(client, self.pod_cache)
        self.pods = pods
        self.mps: MpsSupervisor | None = None
        isolation = self._isolation()
        self.allocator = Allocator(node_name, config, self.state, backend.visible_devices_env,
                                   files, isolation, pods)
        self.manager = PluginManager(
            [PluginServer(plan, self.state, self.allocator, self.plugin_dir)
             for plan in self.snapshot.plans], self.plugin_dir)
        self.dra: DraMode | None = None
        if config.dra.enabled:
            if client is None:
                raise DraModeError("dra.enabled needs the Kubernetes API (ResourceSlices, "
                                   "ResourceClaims): run without --no-api")
            # the same grant inputs as the device-plugin path's Allocator
            self.dra = DraMode(config, node_name, client, self.state,
                               GrantInputs(config, backend.visible_devices_env, files,
                                           isolation))
        self.usage: UsageMonitor | None = None
        self._usage_sinks: ApiSinks | None = None
        if config.usage.enabled:
            # a DRA node has no GPUDevice to write status.usage to: its usage is metrics only
            self._usage_sinks = (ApiSinks(client, node_name)
                                 if client is not None and not config.dra.enabled else None)
            node_pods = self.pods
            self.usage = UsageMonitor(
                node_name, self.snapshot.cards, backend, config.usage,
                (lambda: node_pods.on_node(node_name)) if node_pods is not None else list,
                self._usage_sinks.sinks() if self._usage_sinks is not None
                else UsageSinks(None, lambda *event: None, lambda pod: None),
                kubelet=partial(list_devices, config.usage.podResourcesSocket),
                plans=self.snapshot.plans)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._metrics_server: MetricsThread | None = None

    def _isolation(self) -> Isolation | None:
        """The backend's provider; in `mps` mode with `mps.daemon`, gated by the agent's own
        MPS daemons (one per non-MIG chip), which `start` starts and `stop` quits."""
        isolation = self.backend.isolation(self.config.sharing)
        mps = self.config.sharing.mps
        if isolation is None or self.config.sharing.mode is not SharingMode.MPS or \
                mps.daemon is None:
            return isolation
        uuids = [chip.uuid for lc in self.snapshot.cards if not lc.card.mig_enabled
                 for chip in lc.chips]
        self.mps = MpsSupervisor(uuids, mps.pipeDirectory, mps.daemon,
                                 on_change=self._mps_changed)
        return Gated(isolation, self.mps.refusal)

    def _mps_changed(self) -> None:
        if self.client is None or self.dra is not None:
            return
        try:
            publish_health(self.client, self.current().node, self.reasons())
        except Exception:
            log.exception("publishing MPS daemon health")

    def current(self) -> NodeSnapshot:
        cards = tuple(self.state.cards()[lc.index] for lc in self.snapshot.cards)
        return snapshot(self.node_name, cards, self.config, self.snapshot.plans)

    def reasons(self) -> dict[int, str]:
        """Per card, why it is unhealthy, and why its MPS daemon is down (GPUDevice reason)."""
        reasons = {}
        for lc in self.snapshot.cards:
            parts = [self.state.reason(lc.index)]
            if self.mps is not None:
                parts.extend(self.mps.reason(chip.uuid) for chip in lc.chips)
            reasons[lc.index] = "; ".join(part for part in parts if part)
        return reasons

    def start(self) -> None:
        if self.dra is not None:
            self.dra.check_node()  # before anything is published: a node in the wrong group
        elif self.client is not None:
            refusal = device_plugin_refusal(self.client.get(NODES.path(name=self.node_name)),
                                            self.node_name)
            if refusal is not None:
                raise DraModeError(refusal)
            # The CRD comes from deploy/crds at install time; the agent may not write CRDs.
            require_crd(self.client)
            publish_snapshot(self.client, self.current(), self.config, self.reasons())
        if self.pod_cache is not None:
            self.pod_cache.start()
        if self.mps is not None:
            self.mps.start()  # before the plugins: the first Allocate finds the daemons up
        self.manager.start()
        if self.dra is not None:
            self.dra.start()
        if self.config.healthCheck.enabled:
            self._spawn("health", self._health_loop)
        if self.client is not None:
            self._spawn("sync", self._sync_loop)
        if self.usage is not None:
            if self._usage_sinks is not None:
                self._usage_sinks.start()
            monitor = self.usage
            self._spawn("usage", lambda: monitor.run(self._stop))

    def serve_metrics(self, host: str, port: int) -> int:
        """Serve `/metrics` (docs/metrics.md, `elasticgpu_agent_*`) on a thread; returns the
        port (0 picks a free one)."""
        from elastic_gpu.agent.metrics import agent_registry
        from elastic_gpu.runtime.metrics import MetricsThread

        pods = self.pods
        monitor = self.usage

        def observed() -> tuple[Any, Any, int, Any]:
            if monitor is None:
                return {}, [], 0, {}
            view = monitor.view()
            return view.cards, view.over, monitor.writes, view.mig

        registry = agent_registry(
            self.node_name, lambda: self.current().node.cards,
            (lambda: pods.on_node(self.node_name)) if pods is not None else None,
            lambda: self.allocator.outcomes.copy(), observed if monitor is not None else None)
        # always registered (no series without daemons): a page's families do not depend on
        # the node's config, so one documented table holds for every agent
        from elastic_gpu.agent.metrics import MpsDaemonCollector

        mps = self.mps
        registry.register(MpsDaemonCollector(
            self.node_name, mps.up if mps is not None else lambda: {}))
        self._metrics_server = MetricsThread(registry)
        bound = self._metrics_server.start(host, port)
        log.info("metrics on http://%s:%d/metrics", host, bound)
        return bound

    def _spawn(self, name: str, target: Any) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.config.healthCheck.pollSeconds + 5)
        if self.pod_cache is not None:
            self.pod_cache.stop()
        if self._usage_sinks is not None:
            self._usage_sinks.stop()
        self.manager.stop()
        if self.dra is not None:
            self.dra.stop()
        if self.mps is not None:
            self.mps.stop()
        if self._metrics_server is not None:
            self._metrics_server.stop()
        self.backend.close()

    def request_stop(self) -> None:
        self._stop.set()

    def wait(self) -> None:
        self._stop.wait()

    def _health_loop(self) -> None:
        while not self._stop.is_set():
            try:
                events = self.backend.wait_health(self.config.healthCheck.pollSeconds)
            except BackendError as err:
                log.error("health check: %s", err)
                self._stop.wait(self.config.healthCheck.pollSeconds)
                continue
            if not events:
                continue
            changed = self.state.apply(events)
            for event in events:
                log.warning("card %s is %s: %s", event.uuid, event.health.value, event.reason)
            if changed and self.dra is not None:
                try:
                    self.dra.publish()
                except Exception:
                    log.exception("publishing ResourceSlices")
            elif changed and self.client is not None:
                try:
                    snap = self.current()
                    publish_health(self.client, snap.node, self.reasons())
                    patch_node_capacity(self.client, self.node_name, snap.capacity,
                                        snap.allocatable, self.config)
                except Exception:
                    log.exception("publishing health")

    def sync_allocations(self) -> dict[int, CardUse]:
        """Allocation columns, holders and heartbeat (pods from the watch cache once it has
        synced); re-assert the Node's GPU capacity (a kubelet restart zeroes extended
        resources)."""
        assert self.client is not None and self.pods is not None
        if self.dra is not None:
            # no GPUDevices: re-assert the Node's count and the slices (a kubelet restart
            # zeroes extended resources; someone may have deleted a slice)
            self.dra.publish()
            return {}
        snap = self.current()
        usage = card_usage(self.pods.on_node(self.node_name), self.node_name,
                           {card.index: card for card in snap.node.cards})
        publish_allocations(self.client, snap.node, usage)
        patch_node_capacity(self.client, self.node_name, snap.capacity, snap.allocatable,
                            self.config)
        return usage

    def _sync_loop(self) -> None:
        while not self._stop.wait(self.config.syncSeconds):
            try:
                self.sync_allocations()
            except Exception:
                log.exception("allocation sync")
