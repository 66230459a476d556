"""The agent's MIG applier: carries out its node's MigLayouts, one crash-safe step at a time.

Every round (`MigApplier.round`) it reads the MigLayouts of its node (label
`elasticgpu.io/node`; from a watch, `LayoutCache`, where the agent runs one) and, for each
card, decides the next step afresh with `core.mig.apply.next_step` from the wanted layout,
the card's real instances (the backend's `discover`, never a memory of earlier steps), who
holds the card (`holders`: the ledger's trusted assignments and ElasticGPUs on this node) and
the card's fence:

- `FenceCard`: `status.fence` is written on the card's GPUDevice, which the extender reads as
  `Health.FENCED` (nothing new is placed on it or its instances: `FitKind.CARD_FENCED`);
- `Settle`: the fence stands `FENCE_SETTLE_S` before anything changes (a bind decided before
  the fence was seen lands first, and then holds the card: the step is `Blocked`);
- `Destroy` / `Create` / `SetMigMode`: `Backend.apply_mig_step`, then `published()` (the
  GPUDevices, the Node's capacity, the device plugins' `nvidia.com/mig-*`) from the card as it
  now is: after each step, or (`publish_each_step=False`, the running agent) once per round,
  before the phase that ends the round is written;
- `PendingReset`: the card's MIG mode change waits for a GPU reset, which the agent never does:
  the MigLayout says so (`phase: PendingReset`, the reason) and the card stays fenced; the
  operator is told once per pending reset (`warn`: a Warning Event `MigPendingReset` on the
  MigLayout naming the card and what to do, `pending_message`) and the agent's gauge
  `elasticgpu_agent_mig_pending_reset` is 1 for the card meanwhile (`pending_reset()`); each
  round reads the mode again, and once the operator has reset the GPU the card is published
  as it now is (a merged card as a whole card) and unfenced;
- `Unfence`: the fence is removed (as wanted, or blocked by a holder);
- after every step the MigLayout's status (phase, observedGeneration, reason, the real
  instances) is written, so `kubectl get miglayout` says how far the card got.

Where the fence is kept and who holds a card are the node mode's (`CardFence`, `held`;
`NodeMode.mig_seam`): the GPUDevice's `status.fence` and the pods' assignments here by default,
the slices' device taint and the allocated claims on a DRA node (`agent.dra.miglayout`).

A restarted applier keeps nothing: a fence it finds on a GPUDevice counts from its own start
(it settles again; a fence whose MigLayout is gone is removed), and the real layout is read
from the backend, so an applier SIGKILLed at any point carries on and never destroys an
instance someone holds (docs/mig-apply.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from elastic_gpu.agent.accounting import holding_pods
from elastic_gpu.agent.backends.base import Backend, BackendError
from elastic_gpu.api import gpudevice as gd
from elastic_gpu.api import miglayout as ml
from elastic_gpu.api.elasticgpu import elasticgpu_from_object
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.claims.inventory import egpu_assignment, ledger_key
from elastic_gpu.core.mig.apply import (
    Blocked,
    Create,
    Destroy,
    Done,
    Fence,
    FenceCard,
    PendingReset,
    Refuse,
    SetMigMode,
    Settle,
    Step,
    Unfence,
    as_wanted,
    holders_of,
    next_step,
    placement_problems,
)
from elastic_gpu.core.model import Card
from elastic_gpu.kube.errors import ApiError, NotFound
from elastic_gpu.kube.informer import Handler, Informer
from elastic_gpu.kube.resources import ELASTICGPUS, GPUDEVICES, MIG_LAYOUTS, PODS
from elastic_gpu.kube.sync import SyncKubeClient

log = logging.getLogger(__name__)

#: at most this many steps on one card per round (a layout has at most 7 instances: 7
#: destroys, 7 creates, fence and unfence)
MAX_STEPS_PER_ROUND = 16


def fence_reason(layout: ml.MigLayout) -> str:
    return f"MigLayout {layout.name} (generation {layout.generation}): layout changing"


#: the reason of the Warning Event told once per pending reset (`MigApplier.warn`)
PENDING_RESET_EVENT = "MigPendingReset"


def pending_message(node: str, card: Card, reason: str) -> str:
    """What the operator is told when a card's MIG mode change waits for a GPU reset."""
    return (f"GPU {card.index} ({card.uuid}, {card.model}) on node {node}: {reason}. Nothing is "
            f"placed on it until then; once no process uses it, reset it on the node "
            f"(nvidia-smi -r -i {card.index}) and the agent finishes the layout")


def held_on_node(pods: Iterable[Mapping[str, Any]], egpus: Iterable[Mapping[str, Any]],
                 node: str) -> list[tuple[str, Assignment]]:
    """What the ledger says is held on `node`: the pods' trusted assignments
    (`accounting.holding_pods`) and the ElasticGPUs on the node (`elasticgpu:<name>`)."""
    held = list(holding_pods(pods, node))
    for obj in egpus:
        try:
            egpu = elasticgpu_from_object(obj)
        except (ValueError, TypeError):
            continue
        if egpu.node == node:
            held.append((ledger_key(egpu.name), egpu_assignment(egpu)))
    return held


class CardFence(Protocol):
    """Where a node mode keeps a card's fence: the GPUDevice's `status.fence` on a
    device-plugin node (`GpuDeviceFence`), the card's devices' taint in the ResourceSlices on a
    DRA node (`agent.dra.miglayout`)."""

    def fenced(self, cards: Sequence[Card]) -> set[str]:
        """The uuids of `cards` fenced now (a restarted applier settles them again)."""
        ...

    def set(self, card: Card, reason: str | None) -> None:
        """Fence the card (`reason`) or lift its fence (None)."""
        ...


#: who holds what on a node, given its cards now (`MigApplier.held`)
HeldOn = Callable[[Sequence[Card]], list[tuple[str, Assignment]]]


@dataclass
class GpuDeviceFence:
    """The fence of a device-plugin node: `status.fence` on the card's GPUDevice."""

    client: SyncKubeClient
    node: str

    def fenced(self, cards: Sequence[Card]) -> set[str]:
        out = set()
        for card in cards:
            try:
                obj = self.client.get(GPUDEVICES.path(name=gd.object_name(self.node, card.index)))
            except NotFound:
                continue
            if (obj.get("status") or {}).get("fence"):
                out.add(card.uuid)
        return out

    def set(self, card: Card, reason: str | None) -> None:
        self.client.patch(GPUDEVICES.path(name=gd.object_name(self.node, card.index),
                                          subresource="status"), {"status": {"fence": reason}})


def pod_holders(client: SyncKubeClient, node: str) -> list[tuple[str, Assignment]]:
    """A device-plugin node's holders: its pods' trusted assignments and its ElasticGPUs."""
    pods, _ = client.list(PODS.path(), {"fieldSelector": f"spec.nodeName={node}"})
    try:
        egpus, _ = client.list(ELASTICGPUS.path())
    except NotFound:  # the Elastic GPU API is not installed: no ElasticGPU holds a card
        egpus = []
    return held_on_node(pods, egpus, node)


class LayoutCache:
    """The node's MigLayouts (label `elasticgpu.io/node`; every node's with `node` None, which
    the sandbox's stand-ins for many nodes share, each applier keeping its own node's) kept by
    a watch: a `kube.informer.Informer` (LIST + WATCH, relists on 410 Gone and after failures)
    that the client runs in its loop thread, so the applier reads its layouts here rather than
    with a LIST every round. Until the first list is in (`objects` None) the applier lists
    itself."""

    def __init__(self, client: SyncKubeClient, node: str | None) -> None:
        self.client = client
        self.informer = Informer(
            client.async_client, MIG_LAYOUTS.path(),
            name="MigLayouts" if node is None else f"MigLayouts of {node}",
            params=None if node is None else {"labelSelector": f"{gd.NODE_LABEL}={node}"},
            missing_ok=True)
        self._lock = threading.Lock()
        self.version = 0
        bump = Handler(on_add=lambda _o: self._bump(), on_update=lambda _o, _n: self._bump(),
                       on_delete=lambda _o: self._bump())
        self.informer.add_handler(bump)
        self._run: Future[None] | None = None

    def _bump(self) -> None:
        with self._lock:
            self.version += 1

    def objects(self) -> list[dict[str, Any]] | None:
        """The node's MigLayouts as last seen, or None before the first list."""
        if not self.informer.has_synced:
            return None
        return [dict(obj) for obj in self.informer.items()]

    def start(self) -> None:
        self._run = self.client.run_informer(self.informer)

    def stop(self) -> None:
        if self._run is not None:
            self._run.cancel()


@dataclass
class MigApplier:
    """One node's applier (see the module doc). `published` republishes the node's cards after
    a step; `clock` is monotonic seconds (the fence's settle time)."""

    client: SyncKubeClient
    node: str
    backend: Backend
    published: Callable[[], None]
    clock: Callable[[], float] = time.monotonic
    #: card uuid -> when its fence was first seen set by this process
    fences: dict[str, float] = field(default_factory=dict)
    #: called after each step is carried out (tests SIGKILL here)
    after_step: Callable[[Step], None] = lambda step: None
    #: where the fence is kept (None: the GPUDevices', `GpuDeviceFence`)
    fence: CardFence | None = None
    #: who holds what on the node, given its cards now (None: `pod_holders`)
    held: HeldOn | None = None
    #: the node's MigLayouts by a watch (None, or not synced yet: a LIST each round)
    cache: LayoutCache | None = None
    #: `published()` after every step (the sandbox's stand-ins, whose published objects are
    #: the fake card's only memory), or once after a card's last step of the round (an agent:
    #: the card keeps its own layout, and kubelet sees the plugins re-served once per change;
    #: the card is fenced meanwhile, so nothing is placed on what it advertised before)
    publish_each_step: bool = True
    _started: bool = False
    #: layout name -> the status last written (a card as wanted is not rewritten every round)
    _written: dict[str, Any] = field(default_factory=dict)
    #: told once per pending reset: (the MigLayout as an Event's involved object, the Event's
    #: reason, the message); the agent puts a Warning Event on the MigLayout (None: log only)
    warn: Callable[[Mapping[str, Any], str, str], None] | None = None
    #: cards whose MIG mode change waits for a GPU reset (published again once it is done)
    _pending_reset: set[str] = field(default_factory=set)

    def pending_reset(self) -> frozenset[str]:
        """The uuids of the cards waiting for a GPU reset now (the metrics' gauge)."""
        return frozenset(self._pending_reset)

    def _cards(self) -> dict[str, Card]:
        return {card.uuid: card for card in self.backend.discover()}

    def _fence_io(self) -> CardFence:
        if self.fence is None:
            self.fence = GpuDeviceFence(self.client, self.node)
        return self.fence

    def _read_fences(self, cards: Iterable[Card]) -> None:
        """A restart: a fence left on a card counts from now (settle again)."""
        for uuid in self._fence_io().fenced(list(cards)):
            self.fences.setdefault(uuid, self.clock())

    def layouts(self) -> list[ml.MigLayout]:
        items = self.cache.objects() if self.cache is not None else None
        if items is None:
            items, _ = self.client.list(MIG_LAYOUTS.path(),
                                        {"labelSelector": f"{gd.NODE_LABEL}={self.node}"})
        out = []
        for obj in items:
            try:
                layout = ml.layout_from_object(obj)
            except ml.MigLayoutError as err:
                log.warning("MigLayout skipped: %s", err)
                continue
            if layout.node == self.node:
                out.append(layout)
        return out

    def holders(self) -> list[tuple[str, Assignment]]:
        if self.held is not None:
            return self.held(list(self._cards().values()))
        return pod_holders(self.client, self.node)

    def round(self) -> dict[str, str]:
        """Carry every layout of the node as far as it goes now; returns card uuid -> phase."""
        cards = self._cards()
        if not self._started:
            self._read_fences(cards.values())
            self._started = True
        phases = {}
        layouts = self.layouts()
        # a layout deleted while its card waited for a reset: nothing waits for it any more
        self._pending_reset = self._pending_reset & {layout.card_uuid for layout in layouts}
        for uuid in sorted(set(self.fences) - {layout.card_uuid for layout in layouts}):
            if uuid in cards:  # its MigLayout was deleted mid-change: give the card back
                self._fence(cards[uuid], None)
            self.fences.pop(uuid, None)
        for layout in layouts:
            card = cards.get(layout.card_uuid)
            if card is None:
                self._status(layout, "Refused", f"node {self.node} has no card "
                             f"{layout.card_uuid}", ())
                phases[layout.card_uuid] = "Refused"
                continue
            try:
                phases[layout.card_uuid] = self.apply(layout, card)
            except (ApiError, BackendError) as err:
                log.warning("MigLayout %s: %s", layout.name, err)
                phases[layout.card_uuid] = "Pending"
        return phases

    def apply(self, layout: ml.MigLayout, card: Card) -> str:
        """Steps on one card until it is done, blocked, refused or settling; its phase."""
        changed: list[Step] = []
        try:
            return self._apply(layout, card, changed)
        finally:
            self._publish_round(changed)  # an error's path, or a round cut at its step cap

    def _publish_round(self, changed: list[Step]) -> None:
        """Publish the round's changes once (`publish_each_step=False`, the running agent),
        before what follows them is written: the fence's removal, or the phase that ends the
        round (who reads `PendingReset` finds the slices already saying the card's mode)."""
        if changed and not self.publish_each_step:
            changed.clear()
            self.published()

    def _apply(self, layout: ml.MigLayout, card: Card, changed: list[Step]) -> str:
        if card.uuid not in self.fences and as_wanted(layout.instances, card.mig, card.mig_mode) \
                and not placement_problems(card.model, layout.instances):
            # as wanted, unfenced: done whoever holds it (no pod list in the steady state)
            self._status(layout, "Applied", "", card.mig)
            return "Applied"
        held = self.holders()
        for _ in range(MAX_STEPS_PER_ROUND):
            since = self.fences.get(card.uuid)
            step = next_step(card.model, layout.instances, card.mig,
                             holders_of(card.uuid, held), Fence(since), self.clock(),
                             card.mig_mode)
            reason = ""
            tell: str | None = None  # a new pending reset, told once its status is written
            if card.uuid in self._pending_reset and not isinstance(step, PendingReset):
                # the operator reset it: publish anew (a new set: the metrics read it unlocked)
                self._pending_reset = self._pending_reset - {card.uuid}
                self.published()
            if isinstance(step, Refuse | Blocked | PendingReset):
                reason = step.reason
                if isinstance(step, PendingReset) and card.uuid not in self._pending_reset:
                    self._pending_reset = self._pending_reset | {card.uuid}
                    tell = step.reason
            elif isinstance(step, FenceCard):
                self._fence(card, fence_reason(layout))
                self.fences[card.uuid] = self.clock()
            elif isinstance(step, Unfence):
                self._publish_round(changed)  # before the fence goes, never after
                self._fence(card, None)
                self.fences.pop(card.uuid, None)
                reason = step.reason
            elif isinstance(step, Destroy | Create | SetMigMode):
                try:
                    self.backend.apply_mig_step(card.uuid, step)
                except BackendError as err:  # the card refused: alone, with the reason
                    self._publish_round(changed)
                    self._status(layout, "Refused", str(err), card.mig)
                    return "Refused"
                changed.append(step)
                card = self._cards()[card.uuid]
                if self.publish_each_step:
                    self.published()
            phase = "Blocked" if isinstance(step, Unfence) and step.reason else step.phase
            last = isinstance(step, Done | Refuse | Blocked | Settle | Unfence | PendingReset)
            if last:
                self._publish_round(changed)
            self._status(layout, phase, reason, card.mig)
            if tell is not None:  # after the status: who reads the Event finds it PendingReset
                self._tell_pending(layout, card, tell)
            self.after_step(step)
            if last:
                return phase
            held = self.holders()  # a bind may land while the fence settles
        return "Applying"

    def _tell_pending(self, layout: ml.MigLayout, card: Card, reason: str) -> None:
        message = pending_message(self.node, card, reason)
        log.warning("MigLayout %s: %s", layout.name, message)
        if self.warn is not None:
            self.warn(layout.reference(), PENDING_RESET_EVENT, message)

    def _fence(self, card: Card, reason: str | None) -> None:
        self._fence_io().set(card, reason)

    def _status(self, layout: ml.MigLayout, phase: str, reason: str,
                real: Sequence[Any]) -> None:
        body = ml.status_body(phase, layout.generation, reason, real)
        if self._written.get(layout.name) == body and layout.phase == phase:
            return
        try:
            self.client.patch(MIG_LAYOUTS.path(name=layout.name, subresource="status"), body)
        except NotFound:
            return  # deleted meanwhile: the card is as it is, nothing waits for the status
        self._written[layout.name] = body


def run(applier: MigApplier, stop: Callable[[float], bool], period_s: float = 1.0) -> None:
    """Rounds every `period_s` until `stop(period_s)` (e.g. `threading.Event.wait`) is true."""
    while True:
        try:
            applier.round()
        except Exception:
            log.exception("MIG layouts of %s", applier.node)
        if stop(period_s):
            return
