"""What a card's node observes on it: memory and compute in use, by holders and by no one.

The scheduler counts what pods asked; the agent samples what processes use. These values carry
the sample from the agent (which writes them into each card's GPUDevice status) to the
scheduler (which subtracts out-of-band memory in fit and can prefer cool cards) and to
`egpu top`. Plain immutable values; `Card.usage` holds one (None: nothing observed yet, or an
agent that does not observe).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

#: Utilisation is a percentage of the card's streaming multiprocessors' time.
MAX_PERCENT = 100


@dataclass(frozen=True)
class ContainerUsage:
    """One holder's observed use of one card."""

    namespace: str
    pod: str
    container: str
    memory_mib: int
    #: SM utilisation attributed to the container's processes, percent of the card; None where
    #: the backend cannot sample per process.
    sm_percent: int | None = None

    def __post_init__(self) -> None:
        _check_mib("container memory", self.memory_mib)
        if self.sm_percent is not None:
            _check_percent("container utilisation", self.sm_percent)


@dataclass(frozen=True)
class CardUsage:
    """One card's observed use.

    `used_mib` is every process's memory on the card; `out_of_band_mib` is the part no holder
    of the card accounts for (processes outside any pod holding it, leaked contexts): memory a
    new share cannot have, whatever the ledger says.
    """

    used_mib: int
    out_of_band_mib: int
    sm_percent: int
    #: When the agent sampled it, RFC 3339 (as written on the wire).
    observed_at: str = ""
    containers: tuple[ContainerUsage, ...] = ()

    def __post_init__(self) -> None:
        _check_mib("used memory", self.used_mib)
        _check_mib("out-of-band memory", self.out_of_band_mib)
        _check_percent("utilisation", self.sm_percent)
        if self.out_of_band_mib > self.used_mib:
            raise ValueError(f"out-of-band memory {self.out_of_band_mib} MiB exceeds the used "
                             f"memory {self.used_mib} MiB")


def _check_mib(what: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} {value!r} MiB is not a whole number >= 0")


def _check_percent(what: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PERCENT:
        raise ValueError(f"{what} {value!r}% is not a whole number in 0..{MAX_PERCENT}")


# -- from a sample to a card's usage (the agent's decisions, pure) ------------------------------


class ContainerRef(NamedTuple):
    """A container of a pod: who a process belongs to, once mapped."""

    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod} ({self.container})"


@dataclass(frozen=True)
class ProcessUse:
    """One process on a card as sampled and mapped: `owner` None when it belongs to no pod
    container of this node (a host process, a pod the agent does not know)."""

    memory_mib: int
    sm_percent: int | None = None
    owner: ContainerRef | None = None


def observe_card(used_mib: int, sm_percent: int, processes: Sequence[ProcessUse],
                 holders: Collection[ContainerRef], observed_at: str = "") -> CardUsage:
    """A card's `CardUsage` from one sample.

    Out-of-band memory is what no holder of the card accounts for: the memory of processes that
    are not in a container holding the card (per the node's ledger: `holders`) plus the memory
    the card reports used beyond all its processes' sum (contexts the driver still keeps for a
    process gone, or processes NVML does not list). Used memory is the larger of the card's
    figure and the processes' sum (the two are not read at one instant). A holder's SM
    utilisation is the sum of its processes' samples, None when none of them has one."""
    per_holder: dict[ContainerRef, tuple[int, int | None]] = {}
    foreign = 0
    total = 0
    for proc in processes:
        total += proc.memory_mib
        if proc.owner is None or proc.owner not in holders:
            foreign += proc.memory_mib
            continue
        memory, sm = per_holder.get(proc.owner, (0, None))
        if proc.sm_percent is not None:
            sm = min(MAX_PERCENT, (sm or 0) + proc.sm_percent)
        per_holder[proc.owner] = (memory + proc.memory_mib, sm)
    used = max(used_mib, total)
    leaked = max(0, used_mib - total)
    containers = tuple(ContainerUsage(ref.namespace, ref.pod, ref.container, memory, sm)
                       for ref, (memory, sm) in sorted(per_holder.items()))
    return CardUsage(used_mib=used, out_of_band_mib=min(used, foreign + leaked),
                     sm_percent=min(MAX_PERCENT, max(0, sm_percent)), observed_at=observed_at,
                     containers=containers)


@dataclass(frozen=True)
class WritePolicy:
    """When the agent writes a card's `status.usage` (agent config `usage:`)."""

    #: At most one periodic round of writes per node per period.
    period_s: float = 30.0
    #: A card whose out-of-band memory moved this much since its last write is written at once.
    out_of_band_threshold_mib: int = 1024
    #: A figure is news when it moved this much since its last write; less is noise.
    memory_quantum_mib: int = 256
    percent_quantum: int = 10
    #: An unchanged card is written again this long after its last write, so `observedAt`
    #: says the sample is still current (0: never).
    refresh_s: float = 300.0


def changed(new: CardUsage, old: CardUsage, policy: WritePolicy) -> bool:
    """Whether `new` is news against `old`, the last written: a holder came or went, or a
    figure moved by at least its step (memory `memory_quantum_mib`, utilisation
    `percent_quantum`) since that write. Measured from the last written value, not by
    rounding both: a value that jitters around a rounding boundary would be news on every
    round; `observedAt` is left out."""

    def moved(a: int | None, b: int | None, step: int) -> bool:
        if a is None or b is None:
            return a is not b
        return abs(a - b) >= step

    mib, pct = policy.memory_quantum_mib, policy.percent_quantum
    if (moved(new.used_mib, old.used_mib, mib) or moved(new.out_of_band_mib, old.out_of_band_mib, mib)
            or moved(new.sm_percent, old.sm_percent, pct)):
        return True
    holders = {(c.namespace, c.pod, c.container): c for c in old.containers}
    if set(holders) != {(c.namespace, c.pod, c.container) for c in new.containers}:
        return True
    return any(moved(c.memory_mib, holders[(c.namespace, c.pod, c.container)].memory_mib, mib)
               or moved(c.sm_percent, holders[(c.namespace, c.pod, c.container)].sm_percent, pct)
               for c in new.containers)


@dataclass(frozen=True)
class Written:
    """What the agent last wrote for a card, and when (monotonic seconds)."""

    usage: CardUsage
    at: float


@dataclass(frozen=True)
class WritePlan:
    """Which cards to write now; `periodic` True when this was the node's periodic round (the
    agent starts the next period from `now`)."""

    cards: tuple[int, ...]
    periodic: bool
    urgent: tuple[int, ...] = ()


def plan_writes(sampled: Mapping[int, CardUsage], written: Mapping[int, Written],
                last_round: float | None, now: float, policy: WritePolicy) -> WritePlan:
    """The rate limit. Urgent (at once, whatever the period): a card never written, or whose
    out-of-band memory moved by `out_of_band_threshold_mib` or more since its last write (the
    scheduler must see memory it cannot give). Otherwise at most one round per `period_s`,
    writing only cards whose usage `changed` or whose last write is older than
    `refresh_s`."""
    urgent = []
    for index, usage in sorted(sampled.items()):
        last = written.get(index)
        if last is None or (abs(usage.out_of_band_mib - last.usage.out_of_band_mib)
                            >= policy.out_of_band_threshold_mib):
            urgent.append(index)
    if last_round is not None and now - last_round < policy.period_s:
        return WritePlan(tuple(urgent), periodic=False, urgent=tuple(urgent))
    due = set(urgent)
    for index, usage in sampled.items():
        last = written.get(index)
        news = last is None or changed(usage, last.usage, policy)
        stale = (last is not None and policy.refresh_s > 0
                 and now - last.at >= policy.refresh_s)
        if news or stale:
            due.add(index)
    return WritePlan(tuple(sorted(due)), periodic=True, urgent=tuple(urgent))


# -- drift: a container above its memory share ----------------------------------------------------


@dataclass(frozen=True)
class OverShare:
    """A container using more of a card's memory than its share gives it."""

    ref: ContainerRef
    card: int
    used_mib: int
    share_mib: int

    def message(self, uuid: str = "") -> str:
        on = f"card {self.card}" + (f" ({uuid})" if uuid else "")
        return (f"container {self.ref.container} of {self.ref.namespace}/{self.ref.pod} uses "
                f"{self.used_mib} MiB of GPU memory on {on}; its share is {self.share_mib} MiB")


def over_shares(card: int, usage: CardUsage, shares: Mapping[ContainerRef, int]
                ) -> list[OverShare]:
    """Holders of `card` whose observed memory is above their share (`shares`: each holder's
    memory share on this card, MiB). A holder with no memory share (0: a compute-only share)
    is promised no memory and is never over it."""
    out = []
    for use in usage.containers:
        ref = ContainerRef(use.namespace, use.pod, use.container)
        share = shares.get(ref, 0)
        if share > 0 and use.memory_mib > share:
            out.append(OverShare(ref, card, use.memory_mib, share))
    return out


@dataclass(frozen=True)
class KubeletMismatch:
    """A container's processes run on a card the kubelet's device accounting (PodResources
    `List`) never gave it, though it gave the container devices of this agent's resources.

    `assigned`: the scheduler's assignment gives it the card (Allocate hands out the assignment,
    so only kubelet's bookkeeping is off: GetPreferredAllocation could not steer its choice);
    False: neither source gives it the card (its memory is out-of-band there)."""

    ref: ContainerRef
    card: int
    kubelet_cards: tuple[int, ...]
    assigned: bool

    def message(self) -> str:
        gave = ", ".join(str(c) for c in self.kubelet_cards)
        whose = ("its assignment does (kubelet's device accounting differs from what Allocate "
                 "gave)" if self.assigned else
                 "nor does its assignment: its memory there is out-of-band")
        return (f"container {self.ref.container} of {self.ref.namespace}/{self.ref.pod} runs "
                f"on card {self.card}, but kubelet gave it devices of card(s) {gave} only; "
                f"{whose}")


def kubelet_mismatches(seen: Mapping[int, Collection[ContainerRef]],
                       kubelet: Mapping[int, Collection[ContainerRef]],
                       assigned: Mapping[int, Collection[ContainerRef]]
                       ) -> list[KubeletMismatch]:
    """The cross-check of the cgroup mapping against the kubelet: for each card, the
    containers whose processes were `seen` on it (by cgroup) that kubelet knows as holders of
    some card (`kubelet`: card -> containers it gave devices of it) but not of this one.
    Containers kubelet gave none of our devices (status-only resources, claims) are not
    judged. Sorted by card and container."""
    by_ref: dict[ContainerRef, set[int]] = {}
    for card, refs in kubelet.items():
        for ref in refs:
            by_ref.setdefault(ref, set()).add(card)
    out = []
    for card in sorted(seen):
        for ref in sorted(set(seen[card])):
            cards = by_ref.get(ref)
            if cards is None or card in cards:
                continue
            out.append(KubeletMismatch(ref, card, tuple(sorted(cards)),
                                       ref in assigned.get(card, ())))
    return out


@dataclass(frozen=True)
class MigUsage:
    """One MIG instance observed: its memory in use and what each pod container's processes
    on it use. No utilisation: NVML has none per MIG instance (docs/agent.md). Published as
    metrics only; the card's `CardUsage` (its parent's figures) is what the scheduler reads."""

    card: int
    mig_uuid: str
    used_mib: int
    containers: tuple[tuple[ContainerRef, int], ...] = ()


def observe_mig(card: int, mig_uuid: str, used_mib: int, processes: Sequence[ProcessUse]
                ) -> MigUsage:
    """A MIG instance's usage from one sample: used memory is the larger of the instance's
    figure and its processes' sum (not read at one instant), as for a card; each container's
    memory is its processes' sum (processes in no pod container are left out)."""
    per: dict[ContainerRef, int] = {}
    for proc in processes:
        if proc.owner is not None:
            per[proc.owner] = per.get(proc.owner, 0) + proc.memory_mib
    total = sum(p.memory_mib for p in processes)
    return MigUsage(card, mig_uuid, max(used_mib, total), tuple(sorted(per.items())))
