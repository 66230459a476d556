"""The fake backend: a node's GPUs described in YAML, for tests, the sandbox and kwok nodes.

It goes through exactly the code a real node does (boards, replicas, MIG, device plugins,
inventory publishing, and NVIDIA's isolation settings: CUDA MPS in `mps` mode, as the
NVIDIA-shaped nodes it stands for would get); only discovery and health come from the file. Health changes are
injected either by editing the file's `health:` list (it is re-read when it changes, as a
mounted ConfigMap would be) or programmatically with `FakeBackend.set_health`.

Schema (docs/agent.md has the reference):

    cards:                      # plain cards
      - model: A100-SXM4-80GB   # required
        memoryMiB: 81920        # required
        uuid: GPU-...           # default GPU-fake-<node>-<index>
        numaNode: 0
        links: [{peer: 1, kind: nvlink, count: 12}]
        mig: [{profile: 3g.40gb, uuid: MIG-..., start: 0}]
        devices: [/dev/nvidia0] # host device files; default none (fake nodes run nothing)
        usage: {outOfBandMiB: 2048, smPercent: 10}  # the usage model (below); default none
    boards:                     # multi-chip boards, chips numbered after the cards
      - id: board0
        model: BI-V150
        chips: 2
        memoryMiB: 32768        # per chip
    health:                     # injected health: cards not listed are healthy
      - {index: 1, health: Unhealthy, reason: "XID 79"}
    visibleDevicesEnv: NVIDIA_VISIBLE_DEVICES

MIG state (`FakeConfig.migState`, off unless configured): with a file named, the backend writes
every card's MIG instances to it atomically after each MIG step (`apply_mig_step`) and reads it
at start, so a fake agent killed mid-change restarts with the card's layout as it left it, as
NVML would report a real card's (without it the layout lives in the process, and a restarted
fake starts from its inventory). A card the file names that the inventory lacks, or a layout
its model does not allow, is ignored with a warning; an unreadable file is moved aside and the
inventory's layouts are used.

The usage model (`sample`, test-only; docs/agent.md "Observed usage"): a card's `usage:` sets
memory held by no pod (out-of-band, reported as memory beyond the processes' sum, like a leaked
context) and utilisation of its own; each container holding the card adds what its pod's
annotation `fake.elasticgpu.io/usage: '{"<container>": {"memoryMiB": N, "smPercent": M}}'`
says. Only this backend reads that annotation; real backends sample the hardware and ignore
it. On a node where the container really runs (the real kubelet node), its real processes
(found by their cgroup) are reported as the card's processes, so the agent maps them as it
maps NVML's; on a kwok node, where nothing runs, one process with pid 0 and the owner named.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from elastic_gpu.agent.backends.base import (
    BackendError,
    CardSample,
    HealthEvent,
    Holder,
    MigSample,
    ProcessSample,
)
from elastic_gpu.agent.backends.fake_mig_state import read_mig_state, write_mig_state
from elastic_gpu.agent.backends.isolation import Isolation, cuda_mps_isolation
from elastic_gpu.agent.config import SharingConfig
from elastic_gpu.agent.usage.cgroup import container_pids
from elastic_gpu.api.config.loader import ConfigError, read_file
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.mig.apply import (
    CardChange,
    Create,
    SetMigMode,
    placed_of,
    placement_problems,
)
from elastic_gpu.core.mig.profiles import mig_model
from elastic_gpu.core.model import Card, Health, Link, LinkKind, MigInstance
from elastic_gpu.core.resources import MigProfile, ResourceError
from elastic_gpu.core.usage import MAX_PERCENT

log = logging.getLogger(__name__)

#: The fake backend's usage model per container (test-only; real backends ignore it).
USAGE_ANNOTATION = ann.FAKE_USAGE


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FakeLink(_Strict):
    peer: int = Field(ge=0)
    kind: LinkKind
    count: int = Field(default=1, ge=1)


class FakeMig(_Strict):
    profile: str
    uuid: str
    start: int = Field(default=0, ge=0, le=7)

    @model_validator(mode="after")
    def _profile(self) -> FakeMig:
        try:
            MigProfile.parse(self.profile)
        except ResourceError as err:
            raise ValueError(str(err)) from None
        return self


class FakeUsage(_Strict):
    outOfBandMiB: int = Field(default=0, ge=0)
    smPercent: int = Field(default=0, ge=0, le=MAX_PERCENT)


class FakeCard(_Strict):
    model: str
    memoryMiB: int = Field(gt=0)
    uuid: str | None = None
    numaNode: int | None = Field(default=None, ge=0)
    links: list[FakeLink] = Field(default_factory=list)
    mig: list[FakeMig] = Field(default_factory=list)
    devices: list[str] = Field(default_factory=list)
    usage: FakeUsage | None = None


class FakeBoard(_Strict):
    id: str
    model: str
    chips: int = Field(default=2, ge=1, le=8)
    memoryMiB: int = Field(gt=0)
    numaNode: int | None = Field(default=None, ge=0)


class FakeHealth(_Strict):
    index: int | None = Field(default=None, ge=0)
    uuid: str | None = None
    health: Health = Health.UNHEALTHY
    reason: str = "injected"

    @model_validator(mode="after")
    def _one_key(self) -> FakeHealth:
        if (self.index is None) == (self.uuid is None):
            raise ValueError("a health entry names a card by exactly one of index or uuid")
        return self


class FakeInventory(_Strict):
    cards: list[FakeCard] = Field(default_factory=list)
    boards: list[FakeBoard] = Field(default_factory=list)
    health: list[FakeHealth] = Field(default_factory=list)
    visibleDevicesEnv: str = "NVIDIA_VISIBLE_DEVICES"
    controlDevices: list[str] = Field(default_factory=list)


def parse_inventory(data: Any, source: str) -> FakeInventory:
    try:
        return FakeInventory.model_validate(data or {})
    except ValidationError as err:
        lines = [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
        raise BackendError(f"{source}: invalid fake inventory:\n" + "\n".join(lines)) from None


def board_chips(board_id: str, *, model: str, chips: int, memory_mib: int, first_index: int,
                numa_node: int | None = None) -> tuple[Card, ...]:
    """The chips of one multi-chip board, as the fake inventory's `boards:` lays them out
    (indexes from `first_index`, UUIDs `<board_id>-chip<k>`, each linked to the others as
    chips of one board). `build_cards` and the sandbox's node groups both use it."""
    indexes = range(first_index, first_index + chips)
    return tuple(Card(index=index, uuid=f"{board_id}-chip{chip}", model=model,
                      memory_mib=memory_mib,
                      links=tuple(Link(peer, LinkKind.SAME_BOARD) for peer in indexes
                                  if peer != index),
                      numa_node=numa_node, board=board_id)
                 for chip, index in enumerate(indexes))


def build_cards(inventory: FakeInventory, node: str) -> tuple[tuple[Card, ...], dict[int, tuple[str, ...]]]:
    """Cards (board chips after plain cards) and each card's host device files."""
    cards: list[Card] = []
    devices: dict[int, tuple[str, ...]] = {}
    for index, fc in enumerate(inventory.cards):
        mig = tuple(MigInstance(MigProfile.parse(m.profile), m.uuid, m.start) for m in fc.mig)
        links = tuple(Link(link.peer, link.kind, link.count) for link in fc.links)
        cards.append(Card(index=index, uuid=fc.uuid or f"GPU-fake-{node}-{index}", model=fc.model,
                          memory_mib=fc.memoryMiB, links=links, mig=mig, numa_node=fc.numaNode))
        devices[index] = tuple(fc.devices)
    for board in inventory.boards:
        for chip in board_chips(board.id, model=board.model, chips=board.chips,
                                memory_mib=board.memoryMiB, first_index=len(cards),
                                numa_node=board.numaNode):
            cards.append(chip)
            devices[chip.index] = ()
    known = {card.index for card in cards}
    for card in cards:
        for link in card.links:
            if link.peer not in known or link.peer == card.index:
                raise BackendError(f"fake inventory: card {card.index} links to card {link.peer}, "
                                   "which is not another card of this node")
    return tuple(cards), devices


class FakeBackend:
    """A backend whose devices and health come from a `FakeInventory`."""

    def __init__(self, inventory: FakeInventory, node: str = "node", path: Path | None = None,
                 proc: Path = Path("/proc"), mig_state: Path | None = None) -> None:
        self._node = node
        self._proc = proc
        self._path = path
        self._mtime = path.stat().st_mtime_ns if path is not None else 0
        self._inventory = inventory
        self._cards, self._devices = build_cards(inventory, node)
        #: where the cards' MIG layouts persist across restarts (None: in this process only)
        self._mig_state = mig_state
        if mig_state is not None:
            self._cards = read_mig_state(mig_state, self._cards)
        self._by_uuid = {card.uuid: card for card in self._cards}
        self._lock = threading.Condition()
        self._health: dict[str, tuple[Health, str]] = {}
        self._pending: list[HealthEvent] = []
        self._usage: dict[str, FakeUsage] = {}
        self._apply_file_health(inventory)

    @classmethod
    def from_file(cls, path: Path, node: str = "node",
                  mig_state: Path | None = None) -> FakeBackend:
        # The agent's settings loader: hostile YAML (aliases, deep nesting, huge numbers, bytes
        # that are not UTF-8) is refused here too, not a crash or a hang of the health thread.
        try:
            data = read_file(path)
        except ConfigError as err:
            raise BackendError(f"the fake inventory {err}") from None
        return cls(parse_inventory(data, str(path)), node, path, mig_state=mig_state)

    @classmethod
    def from_dict(cls, data: Any, node: str = "node") -> FakeBackend:
        return cls(parse_inventory(data, "fake inventory"), node)

    @classmethod
    def from_cards(cls, cards: Sequence[Card], node: str = "node",
                   proc: Path = Path("/proc")) -> FakeBackend:
        """A fake backend with exactly these cards (the sandbox's generated inventories).
        Indexes must be 0..n-1 in order, as a driver numbers them. Chips of multi-chip boards
        (`board` set) become the inventory's `boards:`, so they must be laid out as that
        section lays them out (`board_chips`): after the plain cards, each board's chips
        consecutive, named `<board>-chip<k>`, alike in model and memory, linked as one board.
        Anything else is refused rather than published differently from what was asked."""
        if [card.index for card in cards] != list(range(len(cards))):
            raise BackendError(f"node {node}: fake cards must be numbered 0..n-1 in order")
        plain = [c for c in cards if c.board is None]
        chips = cards[len(plain):]
        if any(c.board is None for c in chips):
            raise BackendError(f"node {node}: fake cards: the chips of multi-chip boards must "
                               "come after the plain cards (the fake inventory numbers them so)")
        groups: list[list[Card]] = []
        for chip in chips:
            if groups and groups[-1][0].board == chip.board:
                groups[-1].append(chip)
            elif any(g[0].board == chip.board for g in groups):
                raise BackendError(f"node {node}: fake cards: the chips of board {chip.board} "
                                   "are not consecutive")
            else:
                groups.append([chip])
        try:
            boards = [FakeBoard(id=str(g[0].board), model=g[0].model, chips=len(g),
                                memoryMiB=g[0].memory_mib, numaNode=g[0].numa_node)
                      for g in groups]
        except ValidationError as err:
            raise BackendError(f"node {node}: fake cards: a board the fake inventory cannot "
                               f"describe: {err.errors()[0]['msg']}") from None
        inventory = FakeInventory(
            cards=[FakeCard(model=c.model, memoryMiB=c.memory_mib, uuid=c.uuid,
                            numaNode=c.numa_node,
                            links=[FakeLink(peer=link.peer, kind=link.kind, count=link.count)
                                   for link in c.links],
                            mig=[FakeMig(profile=m.profile.name, uuid=m.uuid, start=m.start)
                                 for m in c.mig])
                   for c in plain],
            boards=boards,
            health=[FakeHealth(index=c.index) for c in cards if not c.healthy])
        built, _ = build_cards(inventory, node)
        for want, got in zip(chips, built[len(plain):], strict=True):
            if replace(want, health=Health.HEALTHY, offers=None) != got:
                raise BackendError(
                    f"node {node}: fake card {want.index} (board {want.board}) is not a chip the "
                    f"fake inventory's boards: section can describe; expected {got}")
        return cls(inventory, node, proc=proc)

    @property
    def name(self) -> str:
        return "fake"

    @property
    def visible_devices_env(self) -> str:
        return self._inventory.visibleDevicesEnv

    def _resolve(self, entry: FakeHealth) -> str:
        if entry.uuid is not None:
            if entry.uuid not in self._by_uuid:
                raise BackendError(f"fake inventory health: no card with uuid {entry.uuid}")
            return entry.uuid
        for card in self._cards:
            if card.index == entry.index:
                return card.uuid
        raise BackendError(f"fake inventory health: no card with index {entry.index}")

    def _apply_file_health(self, inventory: FakeInventory) -> None:
        wanted = {self._resolve(e): (e.health, e.reason) for e in inventory.health}
        with self._lock:
            # The usage model is re-read with health (cards themselves are discovered once).
            self._usage = {card.uuid: fc.usage for card, fc in zip(self._cards, inventory.cards,
                                                                   strict=False)
                           if fc.usage is not None}
            for uuid in self._by_uuid:
                old = self._health.get(uuid, (Health.HEALTHY, ""))
                new = wanted.get(uuid, (Health.HEALTHY, "healthy again" if old[0] is
                                        Health.UNHEALTHY else ""))
                if new[0] is not old[0]:
                    self._pending.append(HealthEvent(uuid, new[0], new[1]))
                self._health[uuid] = new
            self._lock.notify_all()

    def set_health(self, uuid: str, health: Health, reason: str = "injected") -> None:
        """Inject a health change (tests and the sandbox)."""
        if uuid not in self._by_uuid:
            raise BackendError(f"fake backend: no card with uuid {uuid}")
        with self._lock:
            if self._health.get(uuid, (Health.HEALTHY, ""))[0] is not health:
                self._pending.append(HealthEvent(uuid, health, reason))
            self._health[uuid] = (health, reason)
            self._lock.notify_all()

    def set_usage(self, uuid: str, usage: FakeUsage | None) -> None:
        """Set a card's own usage (the inventory's `usage:`), e.g. from a sandbox Node's
        annotation; None clears it."""
        if uuid not in self._by_uuid:
            raise BackendError(f"fake backend: no card with uuid {uuid}")
        with self._lock:
            if usage is None:
                self._usage.pop(uuid, None)
            else:
                self._usage[uuid] = usage

    def _reload_if_changed(self) -> None:
        if self._path is None:
            return
        try:
            mtime = self._path.stat().st_mtime_ns
        except OSError:
            return  # a ConfigMap update swaps a symlink; the next poll sees the new file
        if mtime == self._mtime:
            return
        self._mtime = mtime
        try:
            inventory = parse_inventory(read_file(self._path), str(self._path))
        except (BackendError, ConfigError):
            return  # keep the last good health; a half-written file must not flip cards
        self._apply_file_health(inventory)

    def discover(self) -> tuple[Card, ...]:
        with self._lock:
            return tuple(replace(card, health=self._health.get(card.uuid, (Health.HEALTHY, ""))[0])
                         for card in self._cards)

    def wait_health(self, timeout_s: float) -> list[HealthEvent]:
        deadline = time.monotonic() + timeout_s
        while True:
            self._reload_if_changed()
            with self._lock:
                if self._pending:
                    events, self._pending = self._pending, []
                    return events
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                # Wake early for programmatic injections; poll the file at least every 0.2 s.
                self._lock.wait(min(left, 0.2))

    def device_nodes(self, card: Card) -> tuple[str, ...]:
        return self._devices.get(card.index, ())

    def control_nodes(self) -> tuple[str, ...]:
        return tuple(self._inventory.controlDevices)

    def isolation(self, sharing: SharingConfig) -> Isolation | None:
        return cuda_mps_isolation(sharing)

    def sample(self, holders: Sequence[Holder] = ()) -> tuple[CardSample, ...]:
        self._reload_if_changed()
        with self._lock:
            own = dict(self._usage)
        pids = container_pids(self._proc) if any(h.container_ids for h in holders) else {}
        processes: dict[str, list[ProcessSample]] = {}
        for holder in holders:
            use = container_usage(holder.annotations, holder.ref.container)
            if use is None or holder.card_uuid not in self._by_uuid:
                continue
            memory, sm = use
            real = sorted(p for cid in holder.container_ids for p in pids.get(cid, []))
            if real:  # the first process holds the memory; the others are listed with none
                found = [ProcessSample(real[0], memory, sm)]
                found.extend(ProcessSample(pid, 0, None) for pid in real[1:])
            else:
                found = [ProcessSample(0, memory, sm, owner=holder.ref)]
            # As NVML: the parent card lists every MIG instance's processes too; a MIG
            # instance has no utilisation of its own.
            processes.setdefault(holder.card_uuid, []).extend(found)
            if holder.mig_uuid is not None:
                processes.setdefault(holder.mig_uuid, []).extend(
                    ProcessSample(p.pid, p.memory_mib, None, p.owner) for p in found)
        out = []
        for card in self._cards:
            procs = tuple(processes.get(card.uuid, ()))
            extra = own.get(card.uuid) or FakeUsage()
            used = min(card.memory_mib, sum(p.memory_mib for p in procs) + extra.outOfBandMiB)
            sm_total = min(MAX_PERCENT, extra.smPercent + sum(p.sm_percent or 0 for p in procs))
            migs = tuple(MigSample(m.uuid, sum(p.memory_mib for p in in_mig), in_mig)
                         for m in card.mig
                         for in_mig in (tuple(processes.get(m.uuid, ())),))
            out.append(CardSample(card.uuid, used, sm_total, procs, migs))
        return tuple(out)

    def apply_mig_step(self, card_uuid: str, step: CardChange) -> tuple[MigInstance, ...]:
        """As a MIG-capable card would: refuses a placement the model does not allow or that
        overlaps an instance; a new instance's UUID is made from the card and its placement
        (`MIG-<card>-<profile>-<start>`). The layout lives in this process, and in the MIG state
        file where one is configured (written before this returns: a restarted fake agent then
        reads the card's layout as it was left; without one it starts from its inventory,
        docs/mig-apply.md). A fake card has no mode of
        its own (`Card.mig_mode` None: in MIG mode exactly when it has instances), so a mode
        change applies at once: it is refused only where the card could not take it (MIG
        mode off with instances, or on a model without MIG)."""
        with self._lock:
            card = self._by_uuid.get(card_uuid)
            if card is None:
                raise BackendError(f"fake backend: no card with uuid {card_uuid}")
            if isinstance(step, SetMigMode):
                if mig_model(card.model) is None:
                    raise BackendError(f"card {card_uuid} ({card.model}) has no MIG mode")
                if not step.on and card.mig:
                    raise BackendError(f"card {card_uuid}: MIG mode off refused, it has "
                                       f"{len(card.mig)} instances (In Use)")
                return card.mig
            if isinstance(step, Create):
                problems = placement_problems(card.model, [*placed_of(card.mig), step.placed])
                if problems:
                    raise BackendError(f"card {card_uuid} refuses {step.placed}: "
                                       + "; ".join(problems))
                placed = step.placed
                made = MigInstance(placed.profile,
                                   f"MIG-{card_uuid}-{placed.profile.name}-{placed.start}",
                                   placed.start)
                mig = (*card.mig, made)
            else:
                if all(m.uuid != step.instance.uuid for m in card.mig):
                    raise BackendError(f"no MIG device {step.instance.uuid} on card {card_uuid}")
                mig = tuple(m for m in card.mig if m.uuid != step.instance.uuid)
            changed = replace(card, mig=tuple(sorted(mig, key=lambda m: (m.start, m.uuid))))
            cards = tuple(changed if c.uuid == card_uuid else c for c in self._cards)
            if self._mig_state is not None:  # the card's layout first, then this process's
                write_mig_state(self._mig_state, cards)
            self._cards = cards
            self._by_uuid[card_uuid] = changed
            return changed.mig

    def close(self) -> None:
        return None


def container_usage(annotations: dict[str, str] | Any, container: str
                    ) -> tuple[int, int] | None:
    """(memory MiB, SM percent) the usage annotation gives `container`; None when it gives
    none. A malformed annotation is ignored with a warning (it is test input, never a reason
    for the agent to stop sampling)."""
    raw = annotations.get(USAGE_ANNOTATION) if hasattr(annotations, "get") else None
    if raw is None:
        return None
    try:
        data = json.loads(raw) if isinstance(raw, str) and len(raw) <= 65536 else None
        entry = data.get(container) if isinstance(data, dict) else None
        if entry is None:
            return None
        memory, sm = entry.get("memoryMiB", 0), entry.get("smPercent", 0)
        if (not isinstance(memory, int) or isinstance(memory, bool) or not 0 <= memory < 1 << 40
                or not isinstance(sm, int) or isinstance(sm, bool)
                or not 0 <= sm <= MAX_PERCENT):
            raise ValueError(f"memoryMiB {memory!r} / smPercent {sm!r} out of range")
        return memory, sm
    except (ValueError, AttributeError) as err:
        log.warning("%s: ignored for container %s: %s", USAGE_ANNOTATION, container, err)
        return None
