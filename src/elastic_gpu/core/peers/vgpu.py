"""The vGPU vocabulary HAMi and Volcano share: a count of cards, memory per card in MiB or in
percent, and compute in percent of each card.

HAMi's defaults (pkg/device/nvidia/device.go, `GenerateResourceRequests`,
`mutateContainerResource`, `defaultExclusiveCoreIfNeeded`), followed here:
- a memory or compute name without the count means one card (`defaultGPUNum: 1`);
- no memory (neither MiB nor percent, or 0) means all of each card's memory (100 %);
- no compute (or 0) means no compute reserved: the cards' compute is shared as it comes;
- 100 % compute, or all of the memory with no compute named, is the card exclusively.
Where we differ, on purpose (docs/coming-from/hami.md):
- a memory percentage is MiB of the smallest card the cluster has (our shares are MiB, the
  same on every card), and all of the memory with some compute is that much too;
- a percentage over 100 is refused (HAMi clamps it), as is gpucores over 100, memory over the
  largest card, and MiB and percent both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastic_gpu.core.peers import (
    Ask,
    PeerFacts,
    PeerRefusal,
    Rewrite,
    exclusive,
    memory_of_smallest,
    merged_resources,
    over_largest,
    peer_rewrite,
    whole_number,
)
from elastic_gpu.core.resources import PERCENT_PER_CARD, lookup


@dataclass(frozen=True)
class Vocabulary:
    """One peer's spelling of the vGPU request."""

    peer: str
    count: str
    memory: str
    percentage: str
    cores: str
    #: names read and dropped (they mean nothing to us: HAMi's task priority)
    dropped: tuple[str, ...] = ()

    @property
    def share_names(self) -> tuple[str, ...]:
        return (self.memory, self.percentage, self.cores)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.count, *self.share_names, *self.dropped)


HAMI = Vocabulary("HAMi", "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage",
                  "nvidia.com/gpucores", ("nvidia.com/priority",))
VOLCANO = Vocabulary("Volcano", "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory",
                     "volcano.sh/vgpu-memory-percentage", "volcano.sh/vgpu-cores")
VOCABULARIES = (HAMI, VOLCANO)

#: Every resource name a vGPU vocabulary has that our resource table does not.
PEER_RESOURCE_NAMES = tuple(n for v in VOCABULARIES for n in v.names if lookup(n) is None)


def vgpu_ask(vocab: Vocabulary, values: Mapping[str, Any], facts: PeerFacts,
             container: str = "") -> Ask | list[PeerRefusal]:
    """What `values` (a container's merged requests and limits) ask in `vocab`, in our units."""
    refusals: list[PeerRefusal] = []

    def number(name: str, default: int, **bounds: int) -> int:
        if name not in values:
            return default
        got = whole_number(name, values[name], container, **bounds)
        if isinstance(got, PeerRefusal):
            refusals.append(got)
            return default
        return got

    cards = number(vocab.count, 1, least=1)
    mib = number(vocab.memory, 0)
    percentage = number(vocab.percentage, 0, most=PERCENT_PER_CARD)
    cores = number(vocab.cores, 0, most=PERCENT_PER_CARD)
    if refusals:
        return refusals
    if mib and percentage:
        return [PeerRefusal(f"{vocab.memory}, {vocab.percentage}", "",
                            "give memory in MiB or in percent, not both", container)]
    too_much = over_largest(vocab.memory, values.get(vocab.memory), mib, facts, container)
    if too_much is not None:
        return [too_much]
    if not mib and not percentage:
        percentage = PERCENT_PER_CARD  # HAMi: all of the card's memory
    if exclusive(cores, percentage):
        return Ask(cards, whole=True)
    if percentage:
        sized = memory_of_smallest(
            vocab.percentage if vocab.percentage in values else vocab.memory,
            values.get(vocab.percentage, ""), percentage, facts,
            f"memory in MiB ({vocab.memory})", container)
        if isinstance(sized, PeerRefusal):
            return [sized]
        mib = sized
    return Ask(cards, cores, mib)


def vgpu_rewrite(vocab: Vocabulary, name: str, container: Mapping[str, Any],
                 facts: PeerFacts) -> Rewrite | list[PeerRefusal] | None:
    """One container's rewrite in `vocab` (None: it names no share of it; a bare count that is
    ours, HAMi's `nvidia.com/gpu`, stays whole cards as it is)."""
    values = merged_resources(container)
    written = [n for n in vocab.names if n in values]
    if not written:
        return None
    if not any(n in values for n in vocab.share_names) and lookup(vocab.count) is not None:
        dropped = tuple(n for n in vocab.dropped if n in values)
        return Rewrite(name, dropped) if dropped else None
    return peer_rewrite(name, tuple(written), vgpu_ask(vocab, values, facts, name))
