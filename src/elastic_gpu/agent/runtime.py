"""The running agent: discover, publish, serve the plugins, follow health, keep columns fresh.

How the cards reach the cluster is the node mode (`agent.nodemode`), picked from the config
once (`node_mode`): GPUDevices and device plugins (`deviceplugin.node.DevicePluginNode`), or,
with `dra.enabled`, ResourceSlices and the kubelet's DRA plugin (`dra.node.DraNode`). Past
that choice nothing here knows which mode runs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastic_gpu.agent.accounting import CardUse
from elastic_gpu.agent.backends.base import Backend, BackendError
from elastic_gpu.agent.backends.isolation import Gated, Isolation
from elastic_gpu.agent.config import AgentConfig, SharingMode
from elastic_gpu.agent.deviceplugin.allocator import Allocator
from elastic_gpu.agent.deviceplugin.node import DevicePluginNode
from elastic_gpu.agent.dra.node import DraNode
from elastic_gpu.agent.dra.prepare import GrantInputs
from elastic_gpu.agent.grant import DeviceFiles
from elastic_gpu.agent.miglayout import LayoutCache, MigApplier
from elastic_gpu.agent.miglayout import run as run_mig
from elastic_gpu.agent.mps_supervisor import MpsSupervisor
from elastic_gpu.agent.nodemode import NodeMode, NodeModeError
from elastic_gpu.agent.podresources import list_devices
from elastic_gpu.agent.pods import ApiPods, PodCache, PodSource
from elastic_gpu.agent.snapshot import NodeSnapshot, discover, snapshot
from elastic_gpu.agent.state import NodeState
from elastic_gpu.agent.usage.monitor import UsageMonitor, UsageSinks
from elastic_gpu.agent.usage.sinks import COMPONENT as EVENT_COMPONENT
from elastic_gpu.agent.usage.sinks import ApiSinks
from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.kube.events import WARNING, EventRecorder
from elastic_gpu.kube.resources import NODES
from elastic_gpu.kube.sync import SyncKubeClient

if TYPE_CHECKING:
    from elastic_gpu.runtime.metrics import MetricsThread

log = logging.getLogger(__name__)

#: how often the MIG applier looks at its node's MigLayouts (dynamic MIG, opted-in nodes only)
MIG_PERIOD_S = 1.0


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
        self.mode: NodeMode = self._node_mode(files, isolation)
        self.usage: UsageMonitor | None = None
        self._usage_sinks: ApiSinks | None = None
        if config.usage.enabled:
            self._usage_sinks = self.mode.usage_sinks()
            node_pods = self.pods
            self.usage = UsageMonitor(
                node_name, self.snapshot.cards, backend, config.usage,
                (lambda: self.mode.holdings(node_pods.on_node(node_name)))
                if node_pods is not None else list,
                self._usage_sinks.sinks() if self._usage_sinks is not None
                else UsageSinks(None, lambda *event: None, lambda pod: None),
                kubelet=partial(list_devices, config.usage.podResourcesSocket),
                plans=self.snapshot.plans)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._metrics_server: MetricsThread | None = None
        #: the dynamic-MIG applier, once its thread runs (opted-in nodes only)
        self.mig_applier: MigApplier | None = None

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

    def _node_mode(self, files: DeviceFiles, isolation: Isolation | None) -> NodeMode:
        """The one place the agent asks which mode its node is in."""
        config, backend = self.config, self.backend
        if not config.dra.enabled:
            allocator = Allocator(self.node_name, config, self.state,
                                  backend.visible_devices_env, files, isolation, self.pods)
            return DevicePluginNode(config, self.node_name, self.client, self.state, allocator,
                                    self.plugin_dir, self.current, self.reasons, self.pods)
        if self.client is None:
            raise NodeModeError("dra.enabled needs the Kubernetes API (ResourceSlices, "
                                "ResourceClaims): run without --no-api")
        # no device plugins: the cards are the DRA driver's devices
        self.snapshot = snapshot(self.node_name, self.snapshot.cards, config, plans=())
        # the same grant inputs as the device-plugin path's Allocator
        return DraNode(config, self.node_name, self.client, self.state,
                       GrantInputs(config, backend.visible_devices_env, files, isolation))

    def _mps_changed(self) -> None:
        try:
            self.mode.reasons_changed()
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
        self.mode.start()  # refuses a node of the other mode's group before anything is served
        if self.pod_cache is not None:
            self.pod_cache.start()
        if self.mps is not None:
            self.mps.start()  # before the plugins: the first grant finds the daemons up
        self.mode.serve()
        if self.config.healthCheck.enabled:
            self._spawn("health", self._health_loop)
        if self.client is not None:
            self._spawn("sync", self._sync_loop)
            if self.mode.applies_mig_layouts and self._mig_dynamic():
                self._spawn("mig-layouts", self._mig_loop)
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
            (lambda: self.mode.holdings(pods.on_node(self.node_name)))
            if pods is not None else None,
            self.mode.outcomes, observed if monitor is not None else None)
        # always registered (no series without daemons): a page's families do not depend on
        # the node's config, so one documented table holds for every agent
        from elastic_gpu.agent.metrics import MpsDaemonCollector

        mps = self.mps
        registry.register(MpsDaemonCollector(
            self.node_name, mps.up if mps is not None else lambda: {}))
        # always too: 0 for every card where no applier runs (the node is not opted in)
        from elastic_gpu.agent.metrics import MigPendingResetCollector

        registry.register(MigPendingResetCollector(
            self.node_name, lambda: self.current().node.cards,
            lambda: self.mig_applier.pending_reset() if self.mig_applier is not None
            else frozenset()))
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
        self.mode.stop()
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
            if changed:
                try:
                    self.mode.cards_changed()
                except Exception:
                    log.exception("publishing health")

    def _mig_dynamic(self) -> bool:
        """The Node opted in to dynamic MIG (label elasticgpu.io/mig-dynamic=true, read once
        at start: a node changes group by a restart of its agent)."""
        assert self.client is not None
        node = self.client.get(NODES.path(name=self.node_name))
        return ((node.get("metadata") or {}).get("labels") or {}).get(MIG_DYNAMIC_LABEL) == \
            "true"

    def layout_changed(self) -> None:
        """A MIG step changed a card: rediscover, re-serve and republish (`agent.miglayout`)."""
        self.snapshot = discover(self.backend, self.config, self.node_name)
        self.state.replace_cards(self.snapshot.cards)
        self.mode.layout_changed()

    def _mig_loop(self) -> None:
        assert self.client is not None
        fence, held = self.mode.mig_seam()
        cache = LayoutCache(self.client, self.node_name)  # a watch, not a LIST per round
        cache.start()
        # a card waiting for a GPU reset: a Warning Event on its MigLayout, once per reset
        recorder = EventRecorder(self.client.async_client, EVENT_COMPONENT, self.node_name)
        events = self.client.submit(recorder.run())
        client = self.client

        def warn(obj: Mapping[str, Any], reason: str, message: str) -> None:
            client.loop.call_soon_threadsafe(recorder.record, obj, WARNING, reason, message)

        applier = MigApplier(self.client, self.node_name, self.backend, self.layout_changed,
                             fence=fence, held=held, cache=cache, publish_each_step=False,
                             warn=warn)
        self.mig_applier = applier
        try:
            run_mig(applier, self._stop.wait, MIG_PERIOD_S)
        finally:
            cache.stop()
            events.cancel()

    def sync_allocations(self) -> dict[int, CardUse]:
        """Allocation columns, holders and heartbeat (pods from the watch cache once it has
        synced); re-assert the Node's GPU capacity (a kubelet restart zeroes extended
        resources)."""
        return self.mode.sync()

    def _sync_loop(self) -> None:
        while not self._stop.wait(self.config.syncSeconds):
            try:
                self.sync_allocations()
            except Exception:
                log.exception("allocation sync")
