"""Applying a MIG layout to one card: the next step, from what is wanted, what is, and who holds.

The agent changes a card one step at a time and decides each step afresh from three facts it
reads (no memory of what it did before), so an agent or controller SIGKILLed mid-change resumes
from the card's real layout and nothing is lost or held twice:

- `wanted`: the card's layout as its `MigLayout` asks (profile and placement of each instance);
- `real`: the instances the backend discovers on the card now;
- `holders`: who the ledger says holds the card (the whole card or a share of it) and which
  of its instances are held;
- `fence`: whether the card is fenced (nothing new is placed on it) and since when.

`next_step` answers one of: `Done` (the card is as wanted, unfenced), `Refuse` (the layout is
bad: unknown model or profile, a placement NVIDIA does not allow, overlapping slices), `Blocked`
(a holder stands in the way: a held whole card or share, or a held instance the layout drops;
held instances are never touched), `Fence` (fence before any change), `Settle` (fenced, but a
bind decided before the fence was seen may still land: wait `FENCE_SETTLE_S`), `Destroy` /
`Create` (one instance; destroys first, as a dropped instance's slices may be a new one's), and
`Unfence` (the card is as wanted, or blocked while fenced: give it back to placement).

Placement (`placement_problems`): an instance of a profile with `m` memory slices and `g`
compute slices starts at a multiple of `m`, ends within the card's memory slices, and
`start + g` is at most the card's compute slices; instances' memory slices do not overlap; no
profile more often than the table's `max_instances`. On the models of `profiles.MIG_MODELS`
this gives exactly the start slots of NVIDIA's MIG user guide ("A100 MIG profiles" placement
diagram: `1g.10gb` 0-6, `1g.20gb` 0/2/4/6, `2g.20gb` 0/2/4, `3g.40gb` 0/4, `4g.40gb` and
`7g.80gb` 0; A30: `1g.6gb` 0-3, `2g.12gb` 0/2, `4g.24gb` 0). Starts are in memory slices, as
NVML's `nvmlGpuInstancePlacement_t.start` (and `MigInstance.start`) count them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from elastic_gpu.core.mig.profiles import MigModel, mig_model
from elastic_gpu.core.model import MigInstance
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
class Unfence:
    #: why the fence goes: "" when the card is as wanted, else the blocking reason
    reason: str = ""
    phase = "Applied"


Step = Done | Refuse | Blocked | FenceCard | Settle | Destroy | Create | Unfence


def placement_problems(card_model: str, wanted: Sequence[Placed]) -> list[str]:
    """Why `wanted` cannot be carved on a card of `card_model` ([] when it can), each
    reason naming the instance."""
    model = mig_model(card_model)
    if model is None:
        return [f"card model {card_model!r} is not a MIG model this table knows"]
    problems: list[str] = []
    taken: dict[int, Placed] = {}
    counts: dict[MigProfile, int] = {}
    for placed in sorted(wanted):
        problem = _one_problem(model, placed)
        if problem:
            problems.append(problem)
            continue
        size = model.size(placed.profile)
        assert size is not None
        counts[placed.profile] = counts.get(placed.profile, 0) + 1
        if counts[placed.profile] == size.max_instances + 1:
            problems.append(f"{placed}: more than {size.max_instances} {placed.profile.name} "
                            f"on a {model.name}")
        for slot in range(placed.start, placed.start + size.memory_slices):
            if slot in taken:
                problems.append(f"{placed}: overlaps {taken[slot]} (memory slice {slot})")
                break
            taken[slot] = placed
    return problems


def _one_problem(model: MigModel, placed: Placed) -> str:
    size = model.size(placed.profile)
    if size is None:
        known = ", ".join(p.profile.name for p in model.profiles)
        return f"{placed}: {placed.profile.name} is not a {model.name} profile ({known})"
    m, g, start = size.memory_slices, size.compute_slices, placed.start
    if start < 0 or start % m or start + m > model.memory_slices \
            or start + g > model.compute_slices:
        starts = [s for s in range(0, model.memory_slices, m)
                  if s + m <= model.memory_slices and s + g <= model.compute_slices]
        return (f"{placed}: {placed.profile.name} may start only at memory slice "
                f"{', '.join(map(str, starts))} on a {model.name}")
    return ""


def placed_of(instances: Iterable[MigInstance]) -> list[Placed]:
    return sorted(Placed(m.start, m.profile) for m in instances)


def next_step(card_model: str, wanted: Sequence[Placed], real: Sequence[MigInstance],
              holders: Holders, fence: Fence, now: float) -> Step:
    """The one next step that brings the card from `real` towards `wanted` (module doc)."""
    problems = placement_problems(card_model, wanted)
    if problems:
        return Refuse("; ".join(problems))
    want = sorted(wanted)
    if placed_of(real) == want:
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
