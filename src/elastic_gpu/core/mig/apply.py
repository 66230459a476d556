"""Applying a MIG layout to one card: the next step, from what is wanted, what is, and who holds.

The agent changes a card one step at a time and decides each step afresh from three facts it
reads (no memory of what it did before), so an agent or controller SIGKILLed mid-change resumes
from the card's real layout and nothing is lost or held twice:

- `wanted`: the card's layout as its `MigLayout` asks (profile and placement of each instance);
- `real`: the instances the backend discovers on the card now;
- `holders`: who the ledger says holds the card (the whole card or a share of it) and which
  of its instances are held (`holders_of`, from the ledger's trusted assignments);
- `fence`: whether the card is fenced (nothing new is placed on it) and since when;
- `mode`: the card's MIG mode as the driver reports it (current and pending), where the
  backend reads one (None: the card is in MIG mode exactly when it has instances).

`next_step` answers one of: `Done` (the card is as wanted, unfenced), `Refuse` (the layout is
bad: unknown model or profile, a placement NVIDIA does not allow, overlapping slices), `Blocked`
(a holder stands in the way: a held whole card or share, or a held instance the layout drops;
held instances are never touched), `Fence` (fence before any change), `Settle` (fenced, but a
bind decided before the fence was seen may still land: wait `FENCE_SETTLE_S`), `Destroy` /
`Create` (one instance; destroys first, as a dropped instance's slices may be a new one's),
`SetMigMode` (MIG mode on before the first create, off after the last destroy when the layout
is the whole card), `PendingReset` (the mode change waits for a GPU reset, which only the
operator does: the card stays fenced, and the next round reads the mode again), and `Unfence`
(the card is as wanted, or blocked while fenced: give it back to placement).

Placement (`placement_problems`) is the planner's (`core.mig.layout.check_layout`: NVIDIA's
start slots per profile, no shared slot, no profile beyond its instances per card). Starts are
in memory slices, as NVML's `nvmlGpuInstancePlacement_t.start` (and `MigInstance.start`) count
them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.mig.layout import Placement, check_layout
from elastic_gpu.core.mig.profiles import mig_model
from elastic_gpu.core.model import MigInstance, MigMode
from elastic_gpu.core.resources import MigProfile

#: Seconds a fence stands before a card is changed: a bind the extender decided before it saw
#: the fence lands within this (the extender's watch lag plus one bind round trip).
FENCE_SETTLE_S = 5.0


@dataclass(frozen=True)
class Placed:
    """One instance of a layout: a profile at a start (memory slices)."""

    start: int
    profile: MigProfile

    def __lt__(self, other: Placed) -> bool:
        return (self.start, self.profile.name) < (other.start, other.profile.name)

    def __str__(self) -> str:
        return f"{self.profile.name}@{self.start}"


@dataclass(frozen=True)
class Holders:
    """Who the ledger says holds a card: `card` names holders of the whole card or a share of
    it (pods, ElasticGPUs), `instances` maps held MIG instance UUIDs to their holders."""

    card: tuple[str, ...] = ()
    instances: tuple[tuple[str, str], ...] = ()

    def of(self, uuid: str) -> tuple[str, ...]:
        return tuple(holder for held, holder in self.instances if held == uuid)


@dataclass(frozen=True)
class Fence:
    """The card's fence: `since` the monotonic second it was seen set, None when unfenced."""

    since: float | None = None

    @property
    def up(self) -> bool:
        return self.since is not None


@dataclass(frozen=True)
class Done:
    phase = "Applied"


@dataclass(frozen=True)
class Refuse:
    reason: str
    phase = "Refused"


@dataclass(frozen=True)
class Blocked:
    reason: str
    phase = "Blocked"


@dataclass(frozen=True)
class FenceCard:
    phase = "Fencing"


@dataclass(frozen=True)
class Settle:
    wait_s: float
    phase = "Fencing"


@dataclass(frozen=True)
class Destroy:
    instance: MigInstance
    phase = "Applying"


@dataclass(frozen=True)
class Create:
    placed: Placed
    phase = "Applying"


@dataclass(frozen=True)
class SetMigMode:
    """Turn the card's MIG mode on (before its first instance) or off (a merge-back, after its
    last instance is destroyed)."""

    on: bool
    phase = "Applying"


@dataclass(frozen=True)
class PendingReset:
    """The card's MIG mode change waits for a GPU reset (the driver's pending mode is the one
    wanted, its current one is not): the agent never resets a GPU, so the card stays fenced
    until the operator has, and the step is decided again from the mode read then."""

    reason: str
    phase = "PendingReset"


def pending_reset_reason(on: bool) -> str:
    return (f"MIG mode {'on' if on else 'off'} is pending a GPU reset; the operator resets the "
            "GPU (nvidia-smi -r) when idle")


@dataclass(frozen=True)
class Unfence:
    #: why the fence goes: "" when the card is as wanted, else the blocking reason
    reason: str = ""
    phase = "Applied"


Step = (Done | Refuse | Blocked | FenceCard | Settle | Destroy | Create | SetMigMode
        | PendingReset | Unfence)

#: the steps a backend carries out (`Backend.apply_mig_step`)
CardChange = Create | Destroy | SetMigMode


def mode_step(on: bool, mode: MigMode | None) -> SetMigMode | PendingReset | None:
    """What the card's MIG mode needs for a layout with (`on`) or without instances: nothing
    (None: as wanted now and after a reset, or no mode read), `PendingReset` (the wanted mode
    is pending a reset), or `SetMigMode` (also to take back a pending change not wanted)."""
    if mode is None or (mode.current == on and mode.pending == on):
        return None
    if mode.pending == on:
        return PendingReset(pending_reset_reason(on))
    return SetMigMode(on)


def placement_problems(card_model: str, wanted: Sequence[Placed]) -> list[str]:
    """Why `wanted` cannot be carved on a card of `card_model` ([] when it can): NVIDIA's
    placement rules, as `core.mig.layout.check_layout` checks them (the planner's own)."""
    model = mig_model(card_model)
    if model is None:
        return [f"card model {card_model!r} is not a MIG model this table knows"]
    reason = check_layout(model, [Placement(p.profile, p.start) for p in sorted(wanted)])
    return [reason] if reason else []


def holders_of(card_uuid: str, held: Iterable[tuple[str, Assignment]]) -> Holders:
    """Who holds `card_uuid`, from the ledger's trusted holdings (`(key, assignment)`: a pod's
    `namespace/name` and what it holds itself, or `elasticgpu:<name>` and its ElasticGPU's cards;
    the caller keeps only what the ledger counts, `core.assignment.distrust`). A share naming a
    MIG instance holds that instance; any other share of the card (a whole card, a share, a
    replica) holds the card."""
    card: set[str] = set()
    instances: set[tuple[str, str]] = set()
    for key, assignment in held:
        for share in assignment.shares():
            if share.uuid != card_uuid:
                continue
            if share.mig_uuid is not None:
                instances.add((share.mig_uuid, key))
            else:
                card.add(key)
    return Holders(tuple(sorted(card)), tuple(sorted(instances)))


def placed_of(instances: Iterable[MigInstance]) -> list[Placed]:
    return sorted(Placed(m.start, m.profile) for m in instances)


def as_wanted(wanted: Sequence[Placed], real: Sequence[MigInstance],
              mode: MigMode | None = None) -> bool:
    """The card has the wanted instances, and its MIG mode is the layout's."""
    return placed_of(real) == sorted(wanted) and mode_step(bool(wanted), mode) is None


def next_step(card_model: str, wanted: Sequence[Placed], real: Sequence[MigInstance],
              holders: Holders, fence: Fence, now: float, mode: MigMode | None = None) -> Step:
    """The one next step that brings the card from `real` towards `wanted` (module doc)."""
    problems = placement_problems(card_model, wanted)
    if problems:
        return Refuse("; ".join(problems))
    want = sorted(wanted)
    if as_wanted(want, real, mode):
        return Unfence() if fence.up else Done()
    blocking = _blocking(want, real, holders)
    if blocking:
        # a fenced card no one may change is given back to placement until its holders go
        return Unfence(blocking) if fence.up else Blocked(blocking)
    if fence.since is None:
        return FenceCard()
    left = fence.since + FENCE_SETTLE_S - now
    if left > 0:
        return Settle(left)
    for instance in sorted(real, key=lambda m: (m.start, m.uuid)):
        if Placed(instance.start, instance.profile) not in want:
            return Destroy(instance)
    mode_change = mode_step(bool(want), mode)
    if mode_change is not None:  # off once the last instance is gone, on before the first
        return mode_change
    have = placed_of(real)
    missing = [p for p in want if p not in have]
    return Create(missing[0])


def _blocking(want: Sequence[Placed], real: Sequence[MigInstance], holders: Holders) -> str:
    if holders.card:
        return f"the card is held by {', '.join(sorted(holders.card))}"
    for instance in real:
        held = holders.of(instance.uuid)
        if held and Placed(instance.start, instance.profile) not in want:
            return (f"instance {instance.profile.name}@{instance.start} ({instance.uuid}) is "
                    f"held by {', '.join(sorted(held))}")
    return ""
