"""Observed usage for the sandbox's kwok nodes, where no agent runs: the agent's own sampling
loop (`UsageMonitor`, its rate limit and drift Events) over a fake backend per node, as
`publish.sync_fake_allocations` does for the allocation columns.

The usage model is the fake backend's (docs/agent.md "Observed usage"): each holder's pod
annotation `fake.elasticgpu.io/usage`, and per card, from the Node's annotation of the same key,
`{"<card index>": {"outOfBandMiB": N, "smPercent": M}}` (the kwok node's stand-in for the fake
inventory's `usage:`). Only nodes kwok plays (annotation `kwok.x-k8s.io/node`) are sampled: a
real node's agent writes its own cards. One monitor per node lives across calls, so the write
period holds as on a real node.

Each pass ends by keeping what the agent's `/metrics` would show for each node (`nodes()`,
`agent.metrics.NodeMetrics`), so one endpoint can serve them all (`allocation-sync --port`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from elastic_gpu.agent.backends.fake import USAGE_ANNOTATION, FakeBackend, FakeUsage
from elastic_gpu.agent.config import UsageConfig
from elastic_gpu.agent.devices import LogicalCard
from elastic_gpu.agent.metrics import NodeMetrics
from elastic_gpu.agent.usage.monitor import UsageMonitor
from elastic_gpu.agent.usage.sinks import ApiSinks
from elastic_gpu.api.gpudevice import GPUDeviceError, card_from_object
from elastic_gpu.core.model import Card, Health
from elastic_gpu.kube.events import EventRecorder
from elastic_gpu.kube.resources import GPUDEVICES, NODES, PODS
from elastic_gpu.kube.sync import SyncKubeClient

log = logging.getLogger(__name__)

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
#: No host processes are looked up for kwok pods: nothing of theirs runs here.
NO_PROC = Path("/nonexistent-proc")


def card_usage_model(node: Mapping[str, Any]) -> dict[int, FakeUsage]:
    """The Node annotation's per-card usage; malformed (it is test input) is ignored with a
    log line, never a reason to stop the sync."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(USAGE_ANNOTATION)
    if raw is None:
        return {}
    try:
        data = json.loads(raw) if isinstance(raw, str) and len(raw) <= 65536 else None
        if not isinstance(data, dict):
            raise ValueError("not a JSON object of card indexes")
        return {int(index): FakeUsage.model_validate(entry) for index, entry in data.items()}
    except (ValueError, ValidationError) as err:
        name = (node.get("metadata") or {}).get("name")
        log.warning("node %s: %s ignored: %s", name, USAGE_ANNOTATION, str(err).splitlines()[0])
        return {}


class FakeUsageSync:
    def __init__(self, client: SyncKubeClient, config: UsageConfig | None = None) -> None:
        self.client = client
        self.config = config or UsageConfig()
        self.recorder = EventRecorder(client.async_client, "egpu-sandbox")
        self._events = client.submit(self.recorder.run())
        self._nodes: dict[str, tuple[tuple[Card, ...], FakeBackend, UsageMonitor]] = {}
        self._pods: dict[str, list[dict[str, Any]]] = {}
        #: the last whole pass, for scrapes on another thread (replaced, never changed)
        self._metrics: tuple[NodeMetrics, ...] = ()

    def nodes(self) -> tuple[NodeMetrics, ...]:
        """Each sampled node's cards, pods and newest sample, as of the last pass."""
        return self._metrics

    def close(self) -> None:
        self._events.cancel()

    def _monitor(self, node: str, cards: tuple[Card, ...]) -> tuple[FakeBackend, UsageMonitor]:
        known = self._nodes.get(node)
        if known is not None and known[0] == cards:
            return known[1], known[2]
        backend = FakeBackend.from_cards(cards, node, proc=NO_PROC)
        logical = [LogicalCard(card, (card,)) for card in backend.discover()]
        sinks = ApiSinks(self.client, node, self.recorder).sinks()
        monitor = UsageMonitor(node, logical, backend, self.config,
                               lambda: self._pods.get(node, []), sinks, proc=NO_PROC)
        self._nodes[node] = (cards, backend, monitor)
        return backend, monitor

    def sync(self) -> int:
        """Sample every kwok node with cards once; returns the cards written."""
        nodes, _ = self.client.list(NODES.path())
        kwok = {str(n["metadata"]["name"]): n for n in nodes
                if KWOK_NODE_ANNOTATION in ((n.get("metadata") or {}).get("annotations") or {})}
        cards: dict[str, list[Card]] = {}
        for device in self.client.list(GPUDEVICES.path())[0]:
            try:
                node, card = card_from_object(device)
            except GPUDeviceError:
                continue
            if node in kwok:
                cards.setdefault(node, []).append(card)
        pods, _ = self.client.list(PODS.path())
        self._pods = {}
        for pod in pods:
            bound = (pod.get("spec") or {}).get("nodeName")
            if bound in cards:
                self._pods.setdefault(str(bound), []).append(pod)
        written = 0
        metrics: list[NodeMetrics] = []
        for node, node_cards in sorted(cards.items()):
            plain = tuple(sorted((_plain(c) for c in node_cards), key=lambda c: c.index))
            try:
                backend, monitor = self._monitor(node, plain)
            except Exception as err:  # a node the fake cannot describe: say so, go on
                log.warning("node %s: no usage model: %s", node, err)
                continue
            model = card_usage_model(kwok[node])
            for card in plain:
                backend.set_usage(card.uuid, model.get(card.index))
            before = monitor.writes
            view = monitor.tick()
            written += monitor.writes - before
            # the cards as published (health included), not the fake backend's plain ones
            metrics.append(NodeMetrics(node, sorted(node_cards, key=lambda c: c.index),
                                       self._pods.get(node, []), view.cards, view.over,
                                       monitor.writes, view.mig))
        for gone in set(self._nodes) - set(cards):
            del self._nodes[gone]
        self._metrics = tuple(metrics)
        return written


def _plain(card: Card) -> Card:
    """The card as the fake backend builds it (no offers, no observed usage, healthy)."""
    return replace(card, offers=None, usage=None, health=Health.HEALTHY)
