"""What a container is given for its cards: environment, device files, mounts, annotations.

Pure: from the card shares (the scheduler's assignment, or kubelet's choice of replicas) and
the node's logical cards. Isolation is the backend's (`agent.backends.isolation`): for the
config's sharing mode it names an `Isolation` whose settings (environment, mounts) hold the
container to its share, e.g. CUDA MPS for NVIDIA cards; with none (`accounting` mode) the
scheduler only counts shares, nothing stops a container from using more of the card, and the
container is told so in EGPU_ISOLATION=accounting-only. MIG instances are isolated by the
hardware in every mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from elastic_gpu.agent.backends.isolation import Isolation, IsolationError, MountSpec, ShareLimit
from elastic_gpu.agent.config import AgentConfig
from elastic_gpu.agent.devices import LogicalCard
from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.model import Card
from elastic_gpu.core.resources import MILLI_PER_CARD, MILLI_PER_PERCENT

ISOLATION_ANNOTATION = "elasticgpu.io/isolation"


class GrantError(RuntimeError):
    """The assignment does not fit this node's cards (stale or wrong): refuse, never guess."""


@dataclass(frozen=True)
class DeviceFile:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class Grant:
    envs: dict[str, str]
    devices: tuple[DeviceFile, ...] = ()
    mounts: tuple[MountSpec, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)


class DeviceFiles:
    """Host device files per physical card; a backend provides them."""

    def __init__(self, per_card: Mapping[str, Sequence[str]], control: Sequence[str]) -> None:
        self.per_card = per_card
        self.control = tuple(control)


def _check(share: CardShare, cards: Mapping[int, LogicalCard]) -> LogicalCard:
    lc = cards.get(share.index)
    if lc is None:
        raise GrantError(f"assignment names card {share.index}, which this node does not have")
    if share.uuid != lc.card.uuid:
        raise GrantError(f"assignment names card {share.index} as {share.uuid}, but it is "
                         f"{lc.card.uuid} here: the assignment is stale")
    if share.mig_uuid is not None and share.mig_uuid not in {m.uuid for m in lc.card.mig}:
        raise GrantError(f"assignment names MIG instance {share.mig_uuid} on card {share.index}, "
                         "which has no such instance")
    if not lc.card.healthy:
        raise GrantError(f"card {share.index} ({lc.card.uuid}) is unhealthy")
    return lc


def build_grant(shares: Sequence[CardShare], cards: Mapping[int, LogicalCard], config: AgentConfig,
                visible_env: str, files: DeviceFiles, isolation: Isolation | None,
                limit_compute: bool = True) -> Grant:
    """`isolation`: the backend's enforcement for the config's sharing mode (None: shares are
    only accounted). `limit_compute`: whether the container asked compute
    (`core.request.limits_compute`); False: the provider limits its memory only."""
    if not shares:
        raise GrantError("no cards to give")
    logical = [_check(share, cards) for share in shares]
    visible: list[str] = []
    chips: list[Card] = []
    for share, lc in zip(shares, logical, strict=True):
        if share.mig_uuid is not None:
            visible.append(share.mig_uuid)
        else:
            visible.extend(lc.uuids)
        chips.extend(lc.chips)
    envs = {
        visible_env: ",".join(visible),
        "EGPU_CARDS": ",".join(str(s.index) for s in shares),
    }
    mounts: list[MountSpec] = []
    all_mig = all(s.mig_uuid is not None for s in shares)
    # A whole card is all of its compute; the scheduler writes it with the card's memory too
    # (`Engine` allocates both), so memory alone does not make a share.
    is_share = any(s.milli < MILLI_PER_CARD for s in shares)
    if all_mig:
        mode = "mig"
    elif isolation is not None:
        refusal = isolation.refusal([chip.uuid for chip in chips])
        if refusal is not None:
            raise GrantError(refusal)
        try:
            settings = isolation.settings([
                ShareLimit(s.milli, s.memory_mib, len(lc.chips),
                           tuple(chip.uuid for chip in lc.chips), limit_compute)
                for s, lc in zip(shares, logical, strict=True)])
        except IsolationError as err:
            raise GrantError(str(err)) from None
        mode = settings.mode or isolation.name
        envs.update(settings.envs)
        mounts.extend(settings.mounts)
    else:
        mode = "accounting-only" if is_share else "exclusive"
    envs["EGPU_ISOLATION"] = mode
    if is_share:
        envs["EGPU_CORE_PERCENT"] = ",".join(str(s.milli // MILLI_PER_PERCENT) for s in shares)
        envs["EGPU_MEMORY_MIB"] = ",".join(str(s.memory_mib) for s in shares)
    devices: list[DeviceFile] = []
    if config.deviceSpecs:
        paths = list(files.control)
        for chip in chips:
            paths.extend(files.per_card.get(chip.uuid, ()))
        devices = [DeviceFile(p, p) for p in dict.fromkeys(paths)]
    return Grant(envs, tuple(devices), tuple(mounts), {ISOLATION_ANNOTATION: mode})


def whole_shares(card_indexes: Sequence[int], cards: Mapping[int, LogicalCard],
                 mig_uuids: Sequence[str | None] | None = None) -> tuple[CardShare, ...]:
    """Shares for devices kubelet chose itself (time-sliced replicas): whole cards, no limits."""
    result = []
    for i, index in enumerate(card_indexes):
        lc = cards[index]
        mig = mig_uuids[i] if mig_uuids else None
        result.append(CardShare(index, lc.card.uuid, MILLI_PER_CARD, 0,
                                "mig" if mig else None, mig))
    return tuple(result)
