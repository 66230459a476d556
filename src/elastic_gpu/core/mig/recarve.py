"""The dry-run re-carve advisor (optional, behind `mig.recarveAdvice`): which change of one
card's MIG layout would let a pending pod run. Advice only: the adapter never changes a layout.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from elastic_gpu.core.mig.layout import Placement, check_layout, pack
from elastic_gpu.core.mig.profiles import MigModel, compatible, mig_model
from elastic_gpu.core.mig.substitution import Constraints
from elastic_gpu.core.model import Health, Node
from elastic_gpu.core.resources import MigProfile


@dataclass(frozen=True)
class Recarve:
    """A layout change that would let a pod run: on `card`, destroy the free instances
    `destroy` and create `create`; `layout` is the card's layout after it. Advice only: the
    adapter never changes a MIG layout."""

    node: str
    card: str
    model: str
    destroy: tuple[MigProfile, ...]
    create: MigProfile
    layout: tuple[MigProfile, ...]

    @property
    def message(self) -> str:
        gone = ", ".join(p.name for p in self.destroy) or "nothing"
        return (f"dry run: card {self.card} on node {self.node} ({self.model}) could hold a "
                f"{self.create.name} if re-carved (destroy free {gone}; layout "
                f"{' + '.join(p.name for p in self.layout)}); no layout is changed")


def layout_fits(model: MigModel, layout: Sequence[MigProfile]) -> bool:
    """Whether one card of `model` can carry these instances together by NVIDIA's slice
    counts: every profile the model's, the compute and memory slices within the card's, no
    profile more often than its instances per card (a necessary condition; the driver's
    placement rules pick the exact positions)."""
    sizes = [model.size(p) for p in layout]
    if any(s is None for s in sizes):
        return False
    known = [s for s in sizes if s is not None]
    if sum(s.compute_slices for s in known) > model.compute_slices or \
            sum(s.memory_slices for s in known) > model.memory_slices:
        return False
    return all(sum(1 for k in known if k.profile == s.profile) <= s.max_instances
               for s in known)


def recarve_advice(requested: MigProfile, nodes: Iterable[Node], held: Iterable[str],
                   constraints: Constraints = Constraints()  # noqa: B008 (frozen)
                   ) -> Recarve | None:
    """The re-carve that would give a pod asking `requested` an instance where it may run,
    destroying the fewest free instances (held ones are never touched): on each
    healthy card of a model it may use, the profile to create is `requested` if the model has
    it, else the smallest profile compatible with it; the free instances destroyed are the
    fewest (then the fewest compute slices) after which the layout fits (`layout_fits`) and
    the created and kept free instances can be placed beside the held ones, which stay where
    they are (`core.mig.layout.pack`, NVIDIA's placement rules).
    None when no card can. Ties: node, then card."""
    taken = set(held)
    best: tuple[tuple[int, int, str, str], Recarve] | None = None
    for node in nodes:
        if constraints.nodes is not None and node.name not in constraints.nodes:
            continue
        for card in node.cards:
            model = mig_model(card.model)
            if model is None or not card.healthy or card.model in constraints.denied_models or \
                    (constraints.models is not None and card.model not in constraints.models):
                continue
            if model.size(requested) is not None:
                create = requested
            else:
                options = sorted((r.profile for r in model.profiles
                                  if compatible(requested, r.profile, card.model)),
                                 key=lambda p: (p.slices, p.memory_gb, bool(p.extra)))
                if not options:
                    continue
                create = options[0]
            pinned = [Placement(i.profile, i.start) for i in card.mig
                      if i.uuid in taken or i.health is not Health.HEALTHY]
            kept = [p.profile for p in pinned]
            free = [i.profile for i in card.mig if i.uuid not in taken
                    and i.health is Health.HEALTHY]
            # the held instances stay where they are: the rest must be placeable beside them
            # by NVIDIA's rules (a layout the rules do not know is judged by the counts alone)
            placed = check_layout(model, pinned) is None
            for count in range(len(free) + 1):
                found = None
                for gone in itertools.combinations(range(len(free)), count):
                    rest = [p for k, p in enumerate(free) if k not in gone]
                    layout = [*kept, *rest, create]
                    if layout_fits(model, layout) and \
                            (not placed or pack(model, [*rest, create], pinned) is not None):
                        cost = sum(free[k].slices for k in gone)
                        if found is None or cost < found[0]:
                            found = (cost, tuple(free[k] for k in gone), tuple(layout))
                if found is not None:
                    key = (count, found[0], node.name, card.uuid)
                    advice = Recarve(node.name, card.uuid, card.model, found[1], create, found[2])
                    if best is None or key < best[0]:
                        best = (key, advice)
                    break
    return best[1] if best is not None else None
