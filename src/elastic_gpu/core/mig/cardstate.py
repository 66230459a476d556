"""The dynamic-MIG planner's inputs and outputs (pure values; `core.mig.planner` decides).

A `CardState` is one card as the planner sees it: its model, its instances with their
placements and whether each is held (an assignment, a claim, a DRA allocation names it), whether
it is held whole, whether its node group opted in, and when its layout last changed. Demand
is `MigDemand` (one pod or claim asking one instance of a profile) and `WholeDemand` (one pod
asking whole cards on one node). A `CardPlan` is one card's target layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_gpu.core.mig.layout import Placement
from elastic_gpu.core.mig.profiles import mig_model, smallest_profile_for_memory
from elastic_gpu.core.model import Card, Health
from elastic_gpu.core.request import PodRequest, RequestKind
from elastic_gpu.core.resources import MigProfile


@dataclass(frozen=True)
class Instance:
    """One MIG instance on a card: where it sits, its uuid, and whether something holds it."""

    placement: Placement
    uuid: str
    held: bool = False


@dataclass(frozen=True)
class CardState:
    """One card the planner may look at."""

    node: str
    uuid: str
    model: str
    instances: tuple[Instance, ...] = ()
    #: held as a whole card (no MIG mode, a pod or claim holds it): never changed
    held_whole: bool = False
    #: its node group opted in to dynamic MIG (`migDynamic`); others are never changed
    opted_in: bool = True
    healthy: bool = True
    #: when its layout last changed or its last instance was released (seconds, the caller's
    #: clock); None: long ago (no cool-down left)
    changed_at: float | None = None
    #: MIG mode is on (a card with instances always is; one with none may be too, and then
    #: serves no whole-card pod until merged back)
    mig_mode: bool = False

    @property
    def carved(self) -> bool:
        """In MIG mode: it has instances, or its mode is on with none."""
        return bool(self.instances) or self.mig_mode

    @property
    def held(self) -> tuple[Instance, ...]:
        return tuple(i for i in self.instances if i.held)

    @property
    def free(self) -> tuple[Instance, ...]:
        return tuple(i for i in self.instances if not i.held)

    @property
    def changeable(self) -> bool:
        """Opted in, healthy, a model whose placement rules are known, not held whole."""
        return self.opted_in and self.healthy and not self.held_whole \
            and mig_model(self.model) is not None


def card_state(node: str, card: Card, held: frozenset[str] | set[str], *,
               held_whole: bool = False, opted_in: bool = True,
               changed_at: float | None = None, mig_mode: bool = False) -> CardState:
    """A core `Card` as the planner sees it: `held` are the instance uuids something holds;
    an unhealthy instance counts as held (it is never destroyed under a report). A card in MIG
    mode with no instance (`Card.mig_enabled`: its driver's mode, as the GPUDevice says) is
    carved: no whole card until merged back."""
    return CardState(node, card.uuid, card.model, tuple(
        Instance(Placement(i.profile, i.start), i.uuid,
                 i.uuid in held or i.health is not Health.HEALTHY) for i in card.mig),
        held_whole=held_whole, opted_in=opted_in,
        healthy=card.health is Health.HEALTHY, changed_at=changed_at,
        mig_mode=mig_mode or card.mig_enabled)


@dataclass(frozen=True)
class MigDemand:
    """One waiting pod or claim asking one MIG instance."""

    key: str
    profile: MigProfile
    #: the nodes it may run on; None: any
    nodes: frozenset[str] | None = None
    #: the card models it may use; None: any
    models: frozenset[str] | None = None
    #: demands of one group go on distinct cards (a container's instances asked so,
    #: `ContainerRequest.distinct`); None: any card
    group: str | None = None
    #: further profiles that serve it as well, in order of preference after `profile` (a DRA
    #: claim's `||`, memory bound or `firstAvailable`: `core.dra.migselect`)
    alternatives: tuple[MigProfile, ...] = ()

    @property
    def choices(self) -> tuple[MigProfile, ...]:
        """Every profile that serves it, the preferred first."""
        return (self.profile, *self.alternatives)


def hami_mig_demand(key: str, memory_mib: int, card_model: str,
                    nodes: frozenset[str] | None = None) -> MigDemand | None:
    """HAMi's `nvidia.com/vgpu-mode: mig` share as MIG demand on cards of `card_model`: the
    smallest profile with at least the memory asked (`smallest_profile_for_memory`); None
    when the model has none that large."""
    profile = smallest_profile_for_memory(memory_mib, card_model)
    if profile is None:
        return None
    return MigDemand(key, profile, nodes, frozenset({card_model}))


@dataclass(frozen=True)
class WholeDemand:
    """One waiting pod asking `cards` whole cards on one node."""

    key: str
    cards: int = 1
    nodes: frozenset[str] | None = None


def pod_demand(request: PodRequest, nodes: frozenset[str] | None = None
               ) -> tuple[list[MigDemand], list[WholeDemand]]:
    """A waiting pod's demand: one `MigDemand` per MIG instance its containers ask (keys
    `<namespace>/<name>`, then `#1`, `#2`... when it asks several; a container asking its
    instances on distinct cards gives them one `group`), and one `WholeDemand` for
    the whole cards of all its containers together; `nodes` where it may run, its allowed
    models as the MIG demand's models."""
    key = f"{request.namespace}/{request.name}"
    mig: list[MigDemand] = []
    cards = 0
    for container in request.containers:
        if container.kind is RequestKind.MIG and container.mig_profile is not None:
            group = f"{key}/{container.name}" if container.distinct else None
            for _ in range(container.cards):
                name = key if not mig else f"{key}#{len(mig)}"
                mig.append(MigDemand(name, container.mig_profile, nodes,
                                     request.allowed_models, group))
        elif container.kind is RequestKind.WHOLE:
            cards += container.cards
    return mig, ([WholeDemand(key, cards, nodes)] if cards else [])


@dataclass(frozen=True)
class CardPlan:
    """One card's change: its target layout (`layout`; empty with `merge` is MIG off, a whole
    card again), the free instances destroyed and the ones created, and the demand it serves.
    Held instances are in `layout` at their own starts and never in `destroy`."""

    node: str
    card: str
    model: str
    layout: tuple[Placement, ...]
    destroy: tuple[Instance, ...] = ()
    create: tuple[Placement, ...] = ()
    serves: tuple[str, ...] = ()
    merge: bool = False
    reason: str = ""


@dataclass(frozen=True)
class Plan:
    """One round's decision: the cards to change, what is served by instances already free
    (`matched`: demand key -> instance uuid), the free whole cards kept for whole-card demand
    (`reserved`: key -> card uuid; the cards merged back for it are the `CardPlan`s that serve
    it), and the demand left waiting (MIG and whole-card keys)."""

    cards: tuple[CardPlan, ...] = ()
    matched: tuple[tuple[str, str], ...] = ()
    unserved: tuple[str, ...] = ()
    reserved: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PlannerConfig:
    """The planner's knobs (`mig.dynamic` in the controller's config)."""

    #: a carved card with no holder is merged back for waiting whole-card demand only after
    #: its layout has been unchanged this long (seconds): a card is not flipped back and forth
    merge_cooldown_s: float = 300.0
    #: at most this many cards changed per round (0: no limit)
    max_cards_per_round: int = 0
