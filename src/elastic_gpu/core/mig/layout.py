"""Where MIG instances may sit on one card: NVIDIA's placement rules, checked and packed.

A card of a 7-slice model (A100, H100, H200) has 8 placement slots, one per memory slice; an
A30 has 4. An instance of a profile spans its memory slices (`ProfileSize.memory_slices`) from
its start, and may start only at the slots NVIDIA allows it (`ProfileSize.starts`, the MIG user
guide's profile figures and `nvidia-smi mig -lgipp`): a `3g.40gb` at 0 or 4, a `2g.20gb` at 0,
2 or 4, a `1g.10gb` at 0..6. Two instances never share a slot, and no profile appears more often
than its instances per card (one `+me` per card). These are the rules NVML applies when it
creates a GPU instance at a placement; `check_layout` says which one a layout breaks.

- `check_layout(model, layout)`: None, or the reason the layout is refused;
- `fits_at(model, layout, profile)`: the starts where `profile` may be added beside `layout`;
- `pack(model, profiles, fixed)`: starts for `profiles` beside the instances `fixed` (held
  ones, never moved) leaving the least fragmentation (`headroom`), or None;
- `headroom(model, layout)`: the largest profile (compute slices) that still fits, and the
  compute slices that could still be carved in all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from elastic_gpu.core.mig.profiles import MIG_MODELS, MigModel, ProfileSize, mig_model
from elastic_gpu.core.resources import MigProfile

_MODELS = {m.name: m for m in MIG_MODELS}


@dataclass(frozen=True)
class Placement:
    """One instance on a card: its profile and its start slot."""

    profile: MigProfile
    start: int

    @property
    def name(self) -> str:
        return f"{self.profile.name}@{self.start}"


@dataclass(frozen=True)
class Headroom:
    """What a card's free slots could still carry: the compute slices of the largest profile
    that fits, and the most compute slices that could be carved in all (more is less
    fragmented)."""

    largest: int
    total: int


def _mask(size: ProfileSize, start: int) -> int:
    return ((1 << size.memory_slices) - 1) << start


def check_layout(model: MigModel, layout: Sequence[Placement]) -> str | None:
    """None when one card of `model` can carry `layout` as placed, else why not (the first
    rule broken, naming the instance): a profile the model does not have, a start NVIDIA does
    not allow for it, two instances on one slot, a profile more often than its instances per
    card."""
    used = 0
    counts: dict[MigProfile, int] = {}
    for place in layout:
        size = model.size(place.profile)
        if size is None:
            return f"{place.profile.name}: not a MIG profile of {model.name}"
        if place.start not in size.starts:
            allowed = ", ".join(str(s) for s in size.starts)
            return (f"{place.name}: a {place.profile.name} on {model.name} may start only at "
                    f"slot {allowed}")
        bits = _mask(size, place.start)
        if used & bits:
            return f"{place.name}: overlaps another instance (slots " \
                   f"{place.start}..{place.start + size.memory_slices - 1})"
        used |= bits
        counts[place.profile] = counts.get(place.profile, 0) + 1
        if counts[place.profile] > size.max_instances:
            return (f"{place.name}: {model.name} holds at most {size.max_instances} "
                    f"{place.profile.name}")
    return None


def occupied(model: MigModel, layout: Sequence[Placement]) -> int:
    """The slots `layout` takes, as a bit mask (profiles the model lacks take none)."""
    used = 0
    for place in layout:
        size = model.size(place.profile)
        if size is not None:
            used |= _mask(size, place.start)
    return used


def fits_at(model: MigModel, layout: Sequence[Placement], profile: MigProfile) -> tuple[int, ...]:
    """The starts at which an instance of `profile` may be added beside `layout` (assumed
    valid) with the card's rules kept; () when none or the model lacks the profile."""
    size = model.size(profile)
    if size is None or sum(1 for p in layout if p.profile == profile) >= size.max_instances:
        return ()
    used = occupied(model, layout)
    return tuple(s for s in size.starts if not used & _mask(size, s))


def _headroom(model: MigModel, used: int) -> Headroom:
    return _headroom_of(model.name, used)


@lru_cache(maxsize=4096)
def _headroom_of(name: str, used: int) -> Headroom:
    model = _MODELS[name]
    plain = [r for r in model.profiles if not r.profile.extra]
    largest = max((r.compute_slices for r in plain
                   if any(not used & _mask(r, s) for s in r.starts)), default=0)
    return Headroom(largest, _carvable(name, used))


@lru_cache(maxsize=4096)
def _carvable(name: str, used: int) -> int:
    """The most compute slices that the free slots of `used` could still carry."""
    model = _MODELS[name]
    free = [k for k in range(model.slots) if not used >> k & 1]
    if not free:
        return 0
    first = free[0]
    best = _carvable(name, used | 1 << first)   # leave the lowest free slot empty
    for row in model.profiles:
        if first in row.starts and not row.profile.extra and not used & _mask(row, first):
            best = max(best, row.compute_slices + _carvable(name, used | _mask(row, first)))
    return best


def _options(model: MigModel, used: int) -> int:
    """The compute slices of every placement still free (a tie-break: of two layouts with the
    same headroom, the one that leaves more ways to carve it)."""
    return _options_of(model.name, used)


@lru_cache(maxsize=4096)
def _options_of(name: str, used: int) -> int:
    model = _MODELS[name]
    return sum(r.compute_slices for r in model.profiles if not r.profile.extra
               for s in r.starts if not used & _mask(r, s))


def headroom(model: MigModel, layout: Sequence[Placement]) -> Headroom:
    """What the free slots beside `layout` could still carry (see `Headroom`)."""
    return _headroom(model, occupied(model, layout))


def pack(model: MigModel, profiles: Sequence[MigProfile],
         fixed: Sequence[Placement] = ()) -> tuple[Placement, ...] | None:
    """Placements for `profiles` (in their order) beside `fixed`, which stay where they are,
    such that the whole is valid (`check_layout`) and leaves the most headroom (the largest
    profile that still fits, then the most compute still carvable, then the most placements
    left free, then the lowest starts of the larger instances); None when they cannot all be
    placed. Every placement is searched (at most 8 slots: a few hundred layouts), and the
    answer remembered (the same card shapes recur in a planner's round)."""
    return _pack(model.name, tuple(profiles), tuple(fixed))


@lru_cache(maxsize=16384)
def _pack(name: str, profiles: tuple[MigProfile, ...],
          fixed: tuple[Placement, ...]) -> tuple[Placement, ...] | None:
    model = _MODELS[name]
    if check_layout(model, fixed) is not None:
        return None
    sizes = [model.size(p) for p in profiles]
    known = [s for s in sizes if s is not None]
    if len(known) != len(sizes):
        return None
    order = sorted(range(len(profiles)), key=lambda i: (-known[i].memory_slices, i))
    counts: dict[MigProfile, int] = {}
    for place in fixed:
        counts[place.profile] = counts.get(place.profile, 0) + 1
    best: tuple[tuple[int, int, int, tuple[int, ...]], tuple[int, ...]] | None = None
    starts = [0] * len(profiles)

    def walk(depth: int, used: int) -> None:
        nonlocal best
        if depth == len(order):
            room = _headroom(model, used)
            key = (-room.largest, -room.total, -_options(model, used),
                   tuple(starts[i] for i in order))
            if best is None or key < best[0]:
                best = (key, tuple(starts))
            return
        i = order[depth]
        size = known[i]
        if counts.get(size.profile, 0) >= size.max_instances:
            return
        # identical profiles take increasing starts: each set of places is tried once
        floor = next((starts[order[d]] + 1 for d in range(depth - 1, -1, -1)
                      if profiles[order[d]] == profiles[i]), 0)
        counts[size.profile] = counts.get(size.profile, 0) + 1
        for start in size.starts:
            bits = _mask(size, start)
            if start >= floor and not used & bits:
                starts[i] = start
                walk(depth + 1, used | bits)
        counts[size.profile] -= 1

    walk(0, occupied(model, fixed))
    if best is None:
        return None
    return tuple(Placement(p, s) for p, s in zip(profiles, best[1], strict=True))


def layout_starts(card_model: str, profiles: Sequence[MigProfile]) -> tuple[int, ...]:
    """Valid starts for `profiles` (in order) carved on one card of `card_model` (the fake
    backends' and test layouts' placements: `pack`). A model the table does not know gets
    consecutive compute slices (the driver's rules are unknown there). Raises ValueError with
    the reason when a known model cannot carry them."""
    model = mig_model(card_model)
    if model is None:
        out, start = [], 0
        for profile in profiles:
            out.append(start)
            start += profile.slices
        return tuple(out)
    placed = pack(model, profiles)
    if placed is None:
        names = ", ".join(p.name for p in profiles)
        raise ValueError(f"[{names}] cannot be carved on one {model.name} card by NVIDIA's "
                         "placement rules")
    return tuple(p.start for p in placed)
