"""The mig-dynamic controller's round inputs, decided from what the API says (pure).

The controller (`controller/mig/dynamic.py`) reads pods, GPUDevices, Nodes, ElasticGPUs and
MigLayouts; this module turns them into the planner's inputs (`core.mig.planner.plan`):

- `ledger_holds`: which MIG instances and which whole cards the ledger's holders (pods' trusted
  assignments, ElasticGPUs) hold: a card is changed only with no holder, and a held instance
  is never touched;
- `card_states`: every MIG-capable card as the planner sees it. A card whose MigLayout is still
  being applied (`in_flight`) is shown as its target layout and not changeable: its instances
  to come serve waiting demand (the demand is matched to them, not carved again), and nothing
  changes it twice at once;
- `in_flight`: whether a MigLayout is still being applied (its status is behind its spec);
- `layout_of`: a card plan's target as the MigLayout's instances;
- `withdrawals`: the MigLayouts their agent found `Blocked` (a holder came between the plan
  and the change), put back to the card as it is: left as written, the change would be carried
  out once the holder goes, for a demand since served elsewhere or gone (a card carved for
  nothing, seen on the sandbox); the round decides afresh what waits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.mig.apply import Placed
from elastic_gpu.core.mig.cardstate import CardPlan, CardState, Instance, card_state
from elastic_gpu.core.mig.layout import Placement
from elastic_gpu.core.mig.profiles import mig_model
from elastic_gpu.core.model import Health, Node

#: the phases of a MigLayout whose card is still changing (`api.miglayout.PHASES`)
CHANGING = frozenset({"Pending", "Fencing", "Applying", "PendingReset"})
#: the phase of a MigLayout its agent did not carry out because the card or an instance it
#: would drop is held (`core.mig.apply.Blocked`)
BLOCKED = "Blocked"


def ledger_holds(held: Iterable[tuple[str, Assignment]]) -> tuple[frozenset[str], frozenset[str]]:
    """(held MIG instance uuids, card uuids held whole or by a share) from the ledger's
    trusted holdings (`(key, assignment)`)."""
    instances: set[str] = set()
    cards: set[str] = set()
    for _, assignment in held:
        for share in assignment.shares():
            if share.mig_uuid is not None:
                instances.add(share.mig_uuid)
            else:
                cards.add(share.uuid)
    return frozenset(instances), frozenset(cards)


def in_flight(generation: int, observed_generation: int, phase: str) -> bool:
    """A MigLayout its agent has not carried out yet (or is carrying out)."""
    return observed_generation < generation or phase in CHANGING


def card_states(nodes: Sequence[Node], opted_in: Iterable[str], held_instances: frozenset[str],
                held_cards: frozenset[str], changing: Mapping[str, Sequence[Placed]],
                changed_at: Mapping[str, float]) -> list[CardState]:
    """Every card of a MIG model on `nodes`; changeable only on `opted_in` nodes. `changing`:
    card uuid -> the target of its MigLayout still being applied (shown as that target,
    unchangeable, its instances to come free unless a held one stands there)."""
    opted = set(opted_in)
    out = []
    for node in nodes:
        for card in node.cards:
            if mig_model(card.model) is None:
                continue
            target = changing.get(card.uuid)
            if target is not None:
                real = {(m.profile, m.start): m.uuid for m in card.mig}
                instances = tuple(
                    Instance(Placement(p.profile, p.start),
                             real.get((p.profile, p.start), f"planned:{card.uuid}:{p.start}"),
                             real.get((p.profile, p.start)) in held_instances)
                    for p in sorted(target))
                out.append(CardState(node.name, card.uuid, card.model, instances,
                                     held_whole=card.uuid in held_cards, opted_in=False,
                                     healthy=True, changed_at=changed_at.get(card.uuid),
                                     mig_mode=bool(target)))
                continue
            state = card_state(node.name, card, held_instances,
                               held_whole=card.uuid in held_cards, opted_in=node.name in opted,
                               changed_at=changed_at.get(card.uuid))
            if card.health is Health.FENCED:  # mid-change with no MigLayout of ours: hands off
                state = CardState(state.node, state.uuid, state.model, state.instances,
                                  state.held_whole, False, False, state.changed_at)
            out.append(state)
    return out


def layout_of(plan: CardPlan) -> list[Placed]:
    """The MigLayout instances of a card plan's target ([] with `merge`: the whole card)."""
    return sorted(Placed(p.start, p.profile) for p in plan.layout)


def found_blocked(generation: int, observed_generation: int, phase: str) -> bool:
    """A MigLayout its agent found blocked at its current spec (not a newer spec yet to try)."""
    return phase == BLOCKED and observed_generation >= generation


def withdrawals(nodes: Sequence[Node], blocked: Mapping[str, Sequence[Placed]]
                ) -> list[tuple[str, str, list[Placed]]]:
    """(node, card uuid, the card's instances as they are) for each card whose MigLayout was
    found blocked (`blocked`: card uuid -> that layout's instances) and asks another layout.
    A card in MIG mode with no instance is left as it is (its layout [] would ask mode off,
    a change no demand decided)."""
    out = []
    for node in nodes:
        for card in node.cards:
            wanted = blocked.get(card.uuid)
            if wanted is None:
                continue
            real = sorted(Placed(m.start, m.profile) for m in card.mig)
            if not real and card.mig_mode is not None and card.mig_mode.current:
                continue
            if sorted(wanted) != real:
                out.append((node.name, card.uuid, real))
    return out
