"""The allocation ledger: what each pod was given, checked against capacity and applied.

Usage is a function of the ledger: `check` refuses an entry that would exceed a card's compute,
memory or replica slots (or the node's CPU and memory), `apply` adds or takes an entry's usage
on the layout's arrays, and after a rebuild the engine replays every entry (`replay`), so usage
survives a change of the nodes on the cards that still exist.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.fit import FitFailure, FitKind, Unit, Unschedulable
from elastic_gpu.core.placement.layout import Layout
from elastic_gpu.core.resources import MILLI_PER_CARD


@dataclass
class Entry:
    """One allocation: what was given, and the host resources and task class it holds."""

    assignment: Assignment
    cpu_milli: int
    memory_mib: int
    tag: str | None


def assignment_tag(assignment: Assignment) -> str | None:
    shares = [s for s in assignment.shares() if s.mig_uuid is None]
    if not shares:
        return None
    if len(shares) == 1 and shares[0].milli < MILLI_PER_CARD:
        return "share-gpu"
    return f"{len(shares)}-gpu"


def apply(lay: Layout, pod_key: str, entry: Entry, sign: int) -> int | None:
    """Add (sign +1) or take (-1) the entry's usage; the row it changed, if any."""
    row = lay.row_of.get(entry.assignment.node)
    if row is None:
        return None
    lay.touch(row)
    r = lay.rows[row]
    lay.cpu_used[row] += sign * entry.cpu_milli
    lay.mem_used[row] += sign * entry.memory_mib
    for share in entry.assignment.shares():
        col = r.column.get(share.index)
        if col is None:
            continue
        if share.mig_uuid is not None:
            if sign > 0:
                r.mig_owner[share.mig_uuid] = pod_key
            else:
                r.mig_owner.pop(share.mig_uuid, None)
        lay.used_milli[row, col] += sign * share.milli
        lay.used_mem[row, col] += sign * share.memory_mib
        lay.used_rep[row, col] += sign * share.replicas
    if entry.tag is not None:
        r.tags[entry.tag] += sign
        if r.tags[entry.tag] <= 0:
            del r.tags[entry.tag]
    return row


def rekey(lay: Layout, old_key: str, new_key: str, entry: Entry) -> None:
    """The entry now belongs to `new_key`: its MIG instances name their new owner. Usage is
    the same, so the arrays are left as they are (a stale layout rebuilds the owners on replay)."""
    row = lay.row_of.get(entry.assignment.node)
    if row is None or lay.stale:
        return
    owners = lay.rows[row].mig_owner
    for share in entry.assignment.shares():
        if share.mig_uuid is not None and owners.get(share.mig_uuid) == old_key:
            owners[share.mig_uuid] = new_key


def check(lay: Layout, pod_key: str, entry: Entry) -> None:
    """Raise Unschedulable if the entry would exceed a capacity of its node or cards."""
    assignment = entry.assignment
    row = lay.row(assignment.node)
    r = lay.rows[row]
    node = r.node.name
    if lay.cpu_used[row] + entry.cpu_milli > lay.cpu_cap[row]:
        raise Unschedulable(FitFailure(
            FitKind.HOST_CPU, "cpu", entry.cpu_milli, int(lay.cpu_cap[row] - lay.cpu_used[row]),
            int(lay.cpu_cap[row]), Unit.MILLI_CPU), node)
    if lay.mem_used[row] + entry.memory_mib > lay.mem_cap[row]:
        raise Unschedulable(FitFailure(
            FitKind.HOST_MEMORY, "memory", entry.memory_mib,
            int(lay.mem_cap[row] - lay.mem_used[row]), int(lay.mem_cap[row]), Unit.MIB), node)
    add_milli: Counter[int] = Counter()
    add_mem: Counter[int] = Counter()
    add_rep: Counter[int] = Counter()
    for share in assignment.shares():
        col = r.column.get(share.index)
        if col is None:
            raise Unschedulable(FitFailure(FitKind.NO_SUCH_CARD, card=share.index), node)
        card = r.cards[col]
        if share.mig_uuid is not None:
            instance = next((m for m in card.mig if m.uuid == share.mig_uuid), None)
            if instance is None:
                raise Unschedulable(FitFailure(FitKind.NO_SUCH_MIG_INSTANCE, card=card.index,
                                               instance=share.mig_uuid), node)
            owner = r.mig_owner.get(share.mig_uuid)
            if owner is not None and owner != pod_key:
                raise Unschedulable(FitFailure(FitKind.MIG_INSTANCE_HELD, card=card.index,
                                               instance=share.mig_uuid, holder=owner), node)
            continue
        if card.mig_enabled:
            raise Unschedulable(FitFailure(FitKind.MIG_ENABLED_CARD, card=card.index), node)
        add_milli[col] += share.milli
        add_mem[col] += share.memory_mib
        add_rep[col] += share.replicas
    for col, count in add_rep.items():
        card = r.cards[col]
        slots = lay.replica_slots(row, col)
        if lay.used_rep[row, col] + count > slots:
            raise Unschedulable(FitFailure(
                FitKind.CARD_REPLICAS, "", count, max(0, slots - int(lay.used_rep[row, col])),
                slots, Unit.REPLICAS, card=card.index), node)
    for col, milli in add_milli.items():
        card = r.cards[col]
        if lay.used_milli[row, col] + milli > card.compute_milli:
            raise Unschedulable(FitFailure(
                FitKind.CARD_COMPUTE, "", milli,
                int(card.compute_milli - lay.used_milli[row, col]), card.compute_milli,
                Unit.MILLI_CARDS, card=card.index), node)
        if lay.used_mem[row, col] + add_mem[col] > card.memory_mib:
            raise Unschedulable(FitFailure(
                FitKind.CARD_MEMORY, "", add_mem[col],
                int(card.memory_mib - lay.used_mem[row, col]), card.memory_mib, Unit.MIB,
                card=card.index), node)


def holdable(lay: Layout, pod_key: str, assignment: Assignment) -> Assignment | None:
    """The part of `assignment` that `pod_key` could hold now, by `check`'s rules: each MIG
    instance no other key holds; of each share of a card's compute and memory as much of each
    as the card has left after the shares before it (a share left with none of something it
    asks is dropped); a share of time-sliced replica slots whole or not at all. None when no
    part is (or the node or its cards are unknown). Host CPU and memory are no part of it. For
    a reservation made while the pods it moves still hold some of its cards: it keeps the rest
    meanwhile."""
    row = lay.row_of.get(assignment.node)
    if row is None:
        return None
    r = lay.rows[row]
    add_milli: Counter[int] = Counter()
    add_mem: Counter[int] = Counter()
    add_rep: Counter[int] = Counter()
    kept: dict[str, tuple[CardShare, ...]] = {}
    for container, shares in assignment.containers.items():
        out: list[CardShare] = []
        for share in shares:
            col = r.column.get(share.index)
            if col is None:
                continue
            card = r.cards[col]
            if share.mig_uuid is not None:
                owner = r.mig_owner.get(share.mig_uuid)
                if any(m.uuid == share.mig_uuid for m in card.mig) and owner in (None, pod_key):
                    out.append(share)
                continue
            if card.mig_enabled:
                continue
            if share.replicas and lay.used_rep[row, col] + add_rep[col] + share.replicas \
                    > lay.replica_slots(row, col):
                continue
            milli_left = int(card.compute_milli - lay.used_milli[row, col]) - add_milli[col]
            mem_left = int(card.memory_mib - lay.used_mem[row, col]) - add_mem[col]
            milli, mem = min(share.milli, milli_left), min(share.memory_mib, mem_left)
            if share.replicas and (milli, mem) != (share.milli, share.memory_mib):
                continue  # a replica slot is its card's fixed slice: whole or not at all
            if (share.milli and milli <= 0) or (share.memory_mib and mem <= 0) \
                    or (milli <= 0 and mem <= 0):
                continue
            add_milli[col] += milli
            add_mem[col] += mem
            add_rep[col] += share.replicas
            out.append(replace(share, milli=max(milli, 0), memory_mib=max(mem, 0)))
        if out:
            kept[container] = tuple(out)
    if not kept:
        return None
    return Assignment(assignment.node, kept,
                      {c: e for c, e in assignment.claims.items() if c in kept})


def replay(lay: Layout, ledger: dict[str, Entry]) -> None:
    """Every entry onto freshly built arrays; shares on cards that no longer exist are dropped
    from the entry for good. Only the extender's state changes a node after the start (the
    simulator never does), and its ledger counts a pod again when its card comes back
    (`scheduler.state.ledger.recount_node`, which compares the engine's entry with the hold)."""
    for key, entry in list(ledger.items()):
        row = lay.row_of.get(entry.assignment.node)
        if row is None:
            continue
        kept = {name: tuple(s for s in shares if s.index in lay.rows[row].column)
                for name, shares in entry.assignment.containers.items()}
        entry = Entry(Assignment(entry.assignment.node, kept), entry.cpu_milli,
                      entry.memory_mib, entry.tag)
        ledger[key] = entry
        apply(lay, key, entry, +1)
