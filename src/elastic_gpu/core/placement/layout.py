"""The cluster as arrays: the layout fit, planning, scoring and the ledger all read.

Nodes live in rows of NumPy arrays, cards in a row-by-column matrix padded to the widest node,
so that fit for the common requests is a handful of vectorised comparisons over the whole
cluster (docs/architecture.md, "Placement engine"). Whenever the set of nodes or cards changes
the arrays are rebuilt (`rebuild`) and the engine replays its ledger onto them.

Offer classes: what a card serves, as far as fit is concerned, is one of few distinct
(card offers, node offers, plain cards) keys; per resource name and per set of written names the
card matrices derived from them are cached until the next rebuild.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import repeat

import numpy as np
import numpy.typing as npt

from elastic_gpu.core.fit import FitFailure, FitKind, Unschedulable
from elastic_gpu.core.model import Card, Node, offered
from elastic_gpu.core.policies import NodeView
from elastic_gpu.core.request import ContainerRequest, RequestKind
from elastic_gpu.core.resources import Measure, lookup

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
#: Card matrices kept per resource name and per set of names before the caches start over.
_OFFER_CACHE_LIMIT = 256
#: What a card serves, as far as fit is concerned: (card offers, node offers, plain
#: cards of the node), the offers as sorted item tuples; None where unknown.
_OfferKey = tuple[tuple[tuple[str, int], ...] | None, tuple[tuple[str, int], ...] | None, int]

UNKNOWN_NODE = FitFailure(FitKind.UNKNOWN_NODE)
#: the compute a TFLOPS share "needs" of a card whose model cannot take it: more than any card
NO_FIT = 2**62


@dataclass
class Row:
    node: Node
    cards: list[Card]  # sorted by index; column c of the matrices is cards[c]
    column: dict[int, int]  # card index -> column
    rank: float  # seeded tie-break: among equal scores the lowest rank wins
    mig_owner: dict[str, str] = field(default_factory=dict)  # MIG uuid -> pod key
    tags: Counter[str] = field(default_factory=Counter)
    #: MIG uuid -> its card, built on first use (`mig_cards`)
    _mig_cards: dict[str, Card] | None = None

    def mig_cards(self) -> dict[str, Card]:
        """Each MIG instance's card by the instance's uuid (the cards never change in a row)."""
        if self._mig_cards is None:
            self._mig_cards = {i.uuid: card for card in self.cards for i in card.mig}
        return self._mig_cards


#: row changes remembered (`Layout.changed_since`): what is kept per row and was last brought
#: up to date more changes ago than this is computed anew
CHANGE_RING = 4096


class Layout:
    """Rows of nodes and matrices of their cards: capacity, usage, health, model, offers."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.row_of: dict[str, int] = {}
        #: node name -> (CPU milli, memory MiB) held by pods outside the ledger
        self.outside: dict[str, tuple[int, int]] = {}
        self.models: list[str] = []
        self.model_id: dict[str, int] = {}
        self.stale = True
        #: bumped by every change of usage or layout (`touch`, `touch_all`)
        self.generation = 0
        #: the rows of the latest CHANGE_RING row changes, a ring: change k is at
        #: k % CHANGE_RING (`changed_since`); `epoch` counts the changes of every row at once
        #: (a rebuild renumbers the rows)
        self.changes = 0
        self.epoch = 0
        self._changed_rows = np.zeros(CHANGE_RING, dtype=np.int64)
        #: offer classes of cards (see `_OfferKey`) and, per resource name and per distinct set
        #: of written names, the card matrices derived from them; rebuilt with the layout
        self.offer_keys: list[_OfferKey] = []
        self.constrained = False
        self.count_cache: dict[str, IntArray] = {}
        #: some node is opted in to dynamic MIG (its label): made once per rebuild, on demand
        self.mig_dynamic: bool | None = None
        self.names_cache: dict[tuple[str, ...], BoolArray] = {}

    def upsert(self, node: Node, rank: float | None) -> None:
        """Add or replace a node (`rank`: the new node's tie-break; a known node keeps its)."""
        cards = sorted(node.cards, key=lambda c: c.index)
        row = self.row_of.get(node.name)
        if row is None:
            assert rank is not None
            self.row_of[node.name] = len(self.rows)
            self.rows.append(Row(node, cards, {c.index: i for i, c in enumerate(cards)}, rank))
        else:
            old = self.rows[row]
            if not self.stale and _without_usage(old.node) == _without_usage(node):
                # Only the observed usage changed (an agent's sample, every write period on
                # every node): its arrays in place, no rebuild of the whole layout.
                old.node, old.cards = node, cards
                self._set_usage(row, cards)
                self.touch(row)
                return
            self.rows[row] = Row(node, cards, {c.index: i for i, c in enumerate(cards)}, old.rank)
        for card in cards:
            self.model_index(card.model)
        self.stale = True

    def _set_usage(self, row: int, cards: Sequence[Card]) -> None:
        for c, card in enumerate(cards):
            usage = card.usage
            self.oob_mem[row, c] = usage.out_of_band_mib if usage is not None else 0
            self.load_pct[row, c] = usage.sm_percent if usage is not None else 0
            self.seen_mem[row, c] = usage.used_mib if usage is not None else 0

    def remove(self, name: str) -> None:
        if name not in self.row_of:
            return
        self.rows = [r for r in self.rows if r.node.name != name]
        self.row_of = {r.node.name: i for i, r in enumerate(self.rows)}
        self.stale = True

    def row(self, name: str) -> int:
        try:
            return self.row_of[name]
        except KeyError:
            raise Unschedulable(UNKNOWN_NODE, name) from None

    def touch(self, row: int) -> None:
        """Row `row`'s usage changed: logged for what is kept per row (`changed_since`)."""
        self.generation += 1
        self._changed_rows[self.changes % CHANGE_RING] = row
        self.changes += 1

    def touch_all(self) -> None:
        """Any row may have changed (or the rows were renumbered): nothing kept per row holds."""
        self.generation += 1
        self.epoch += 1

    def changed_since(self, change: int) -> IntArray | None:
        """The rows changed since `self.changes` was `change` (repeats included), or None when
        the ring no longer reaches back that far."""
        behind = self.changes - change
        if behind > CHANGE_RING or behind < 0:
            return None
        start, end = change % CHANGE_RING, self.changes % CHANGE_RING
        if behind == 0:
            return self._changed_rows[:0]
        if start < end:
            return self._changed_rows[start:end]
        return np.concatenate((self._changed_rows[start:], self._changed_rows[:end]))

    def rows_of(self, node_names: Sequence[str]) -> IntArray:
        """Row of each named node, -1 for unknown names (dict lookups at C speed)."""
        return np.fromiter(map(self.row_of.get, node_names, repeat(-1)), dtype=np.int64,
                           count=len(node_names))

    def model_index(self, model: str) -> int:
        idx = self.model_id.get(model)
        if idx is None:
            idx = self.model_id[model] = len(self.models)
            self.models.append(model)
        return idx

    def nodes(self) -> Iterable[Node]:
        return (r.node for r in self.rows)

    def rebuild(self) -> None:
        """The arrays anew from the rows, usage from outside pods only (the engine replays its
        ledger next)."""
        self.touch_all()
        n = len(self.rows)
        width = max((len(r.cards) for r in self.rows), default=0) or 1
        self.cpu_cap: IntArray = np.array([r.node.cpu_milli for r in self.rows], dtype=np.int64)
        self.mem_cap: IntArray = np.array([r.node.memory_mib for r in self.rows], dtype=np.int64)
        self.cpu_used: IntArray = np.zeros(n, dtype=np.int64)
        self.mem_used: IntArray = np.zeros(n, dtype=np.int64)
        self.rank: FloatArray = np.array([r.rank for r in self.rows], dtype=np.float64)
        self.exists: BoolArray = np.zeros((n, width), dtype=bool)
        self.usable: BoolArray = np.zeros((n, width), dtype=bool)
        self.mig_card: BoolArray = np.zeros((n, width), dtype=bool)
        self.cap_milli: IntArray = np.zeros((n, width), dtype=np.int64)
        self.cap_mem: IntArray = np.zeros((n, width), dtype=np.int64)
        self.used_milli: IntArray = np.zeros((n, width), dtype=np.int64)
        self.used_mem: IntArray = np.zeros((n, width), dtype=np.int64)
        self.card_model: IntArray = np.zeros((n, width), dtype=np.int64)
        #: time-sliced replica slots held per card (shares with `replicas`)
        self.used_rep: IntArray = np.zeros((n, width), dtype=np.int64)
        #: observed by the card's node (`Card.usage`; 0 where nothing is observed): memory no
        #: holder accounts for, which fit takes off a card's free memory; utilisation (percent)
        #: and memory in use, which the load-aware option breaks ties by
        self.oob_mem: IntArray = np.zeros((n, width), dtype=np.int64)
        self.load_pct: IntArray = np.zeros((n, width), dtype=np.int64)
        self.seen_mem: IntArray = np.zeros((n, width), dtype=np.int64)
        #: offer class per card; padding cells hold the spare class past the end (offers nothing)
        self.card_offer: IntArray = np.zeros((n, width), dtype=np.int64)
        offer_id: dict[_OfferKey, int] = {}
        self.offer_keys = []
        self.count_cache.clear()
        self.names_cache.clear()
        self.mig_dynamic = None
        offer_rows: list[list[int]] = []
        for i, r in enumerate(self.rows):
            r.mig_owner.clear()
            r.tags.clear()
            node_offers = (tuple(r.node.offers.items()) if r.node.offers is not None else None)
            silent = -1  # the class of this row's cards that say nothing, once needed
            ids: list[int] = []
            for c, card in enumerate(r.cards):
                self.exists[i, c] = True
                self.usable[i, c] = card.healthy and not card.mig_enabled
                self.mig_card[i, c] = card.mig_enabled
                self.cap_milli[i, c] = card.compute_milli
                self.cap_mem[i, c] = card.memory_mib
                self.card_model[i, c] = self.model_index(card.model)
                if card.offers is None and silent >= 0:
                    ids.append(silent)
                    continue
                okey: _OfferKey
                if card.offers is None:
                    # only these cards split the node's whole-card count over its plain cards
                    # (the count is the Node's capacity: every card, healthy or not)
                    plain = (sum(1 for k in r.cards if not k.mig_enabled)
                             if node_offers is not None else 0)
                    okey = (None, node_offers, plain)
                else:
                    okey = (tuple(card.offers.items()), node_offers, 0)
                idx = offer_id.get(okey)
                if idx is None:
                    idx = offer_id[okey] = len(self.offer_keys)
                    self.offer_keys.append(okey)
                if card.offers is None:
                    silent = idx
                ids.append(idx)
            offer_rows.append(ids)
            self._set_usage(i, r.cards)
        # padding cells (and rows without cards) get the spare class, which offers nothing
        self.card_offer.fill(len(self.offer_keys))
        for i, ids in enumerate(offer_rows):
            self.card_offer[i, :len(ids)] = ids
        self.constrained = any(k[0] is not None or k[1] is not None for k in self.offer_keys)
        for name, (cpu, mem) in self.outside.items():
            row = self.row_of.get(name)
            if row is not None:
                self.cpu_used[row] += cpu
                self.mem_used[row] += mem
        self.stale = False

    def free_mem(self, rows: slice | IntArray = slice(None)) -> IntArray:
        """Memory a new share can have per card cell of `rows`: capacity less what the ledger
        holds and less the card's observed out-of-band memory."""
        out: IntArray = self.cap_mem[rows] - self.used_mem[rows] - self.oob_mem[rows]
        return out

    def share_need(self, c: ContainerRequest, rows: slice | IntArray = slice(None)) -> IntArray | int:
        """The compute (milli-cards) a share needs of each card cell of `rows`: its
        `compute_milli`, or for a TFLOPS share what gives its TFLOPS on each card's model
        (`ContainerRequest.milli_on`; `NO_FIT` where the model cannot take it)."""
        if not c.tflops:
            return c.compute_milli
        table = np.array([NO_FIT if (m := c.milli_on(model)) is None else m
                          for model in self.models] + [NO_FIT], dtype=np.int64)
        out: IntArray = table[self.card_model[rows]]
        return out

    def node_load(self, row: int) -> float:
        """The node's observed utilisation: the mean percent over its usable cards (0 where
        nothing is observed); what the load-aware option breaks node ties by."""
        cols = self.usable[row]
        return float(self.load_pct[row][cols].mean()) if cols.any() else 0.0

    @staticmethod
    def key_count(key: _OfferKey, name: str) -> int:
        """Devices of `name` a card of this offer class serves (see `model.offered`): what the
        card offers, within what its Node advertises; a card that says nothing (an older
        agent) gets the node's whole-card count split over its plain cards; nothing
        known at all serves every name once (the simulator)."""
        card_offers, node_offers, plain = key
        if node_offers is not None and offered(dict(node_offers), name) == 0:
            return 0
        if card_offers is not None:
            return offered(dict(card_offers), name)
        if node_offers is not None:
            count = offered(dict(node_offers), name)
            spec = lookup(name)
            if spec is not None and spec.measure is Measure.CARDS:
                return max(1, count // max(1, plain))
            return count
        return 1

    def counts(self, name: str) -> IntArray:
        """Devices of `name` per card cell (0 where not offered, and in padding cells)."""
        cached = self.count_cache.get(name)
        if cached is None:
            if len(self.count_cache) >= _OFFER_CACHE_LIMIT:
                self.count_cache.clear()  # bounded: requests may name any MIG profile
            table = np.array([self.key_count(k, name) for k in self.offer_keys] + [0],
                             dtype=np.int64)
            counts: IntArray = table[self.card_offer]
            cached = self.count_cache[name] = counts
        return cached

    def offer_mask(self, names: tuple[str, ...]) -> BoolArray | None:
        """Cards that serve every one of `names` (a container's written GPU resources); None
        when no card or node says what it offers (every card serves everything)."""
        if not self.constrained or not names:
            return None
        cached = self.names_cache.get(names)
        if cached is None:
            if len(self.names_cache) >= _OFFER_CACHE_LIMIT:
                self.names_cache.clear()
            mask = self.exists.copy()
            for name in names:
                mask &= self.counts(name) > 0
            cached = self.names_cache[names] = mask
        return cached

    @staticmethod
    def replica_name(c: ContainerRequest) -> str | None:
        """The whole-card resource a WHOLE container wrote (its replicas, if time-sliced)."""
        if c.kind is not RequestKind.WHOLE:
            return None
        for name in c.resources:
            spec = lookup(name)
            if spec is not None and spec.measure is Measure.CARDS:
                return name
        return None

    def replica_slots(self, row: int, col: int) -> int:
        """Time-sliced replicas a card has in all: its largest whole-card offer above 1."""
        key = self.offer_keys[int(self.card_offer[row, col])]
        names = {n for part in key[:2] if part is not None for n, _ in part
                 if (spec := lookup(n)) is not None and spec.measure is Measure.CARDS}
        best = max((self.key_count(key, n) for n in names), default=0)
        return best if best > 1 else 0

    def whole_slots(self, c: ContainerRequest, ok: BoolArray, rows: slice | IntArray = slice(None)
                    ) -> IntArray:
        """Per card cell of `rows` (`ok` has their shape), how many of container c's N
        whole-card units it can take: 1 for an entirely free card (nothing held by the ledger
        and no out-of-band memory observed on it); for a card time-sliced for
        the resource c wrote (it offers r > 1 devices of it), its free replica slots, each
        costing compute // r milli-cards and no memory (so shares and replicas on one card
        never exceed it)."""
        cap_milli, used_milli = self.cap_milli[rows], self.used_milli[rows]
        fits_mem = self.cap_mem[rows] >= c.memory_mib
        slots: IntArray = (ok & (used_milli == 0) & (self.used_mem[rows] == 0)
                           & (self.oob_mem[rows] == 0) & fits_mem).astype(np.int64)
        name = self.replica_name(c)
        if name is None or not self.constrained:
            return slots
        rep = self.counts(name)[rows]
        sliced = ok & (rep > 1) & fits_mem
        if not sliced.any():
            return slots
        per = cap_milli // np.maximum(rep, 1)
        by_milli = np.where(per > 0, (cap_milli - used_milli) // np.maximum(per, 1), rep)
        free = np.maximum(np.minimum(rep - self.used_rep[rows], by_milli), 0)
        out: IntArray = np.where(sliced, free, slots)
        return out

    def offered_names(self, row: int) -> tuple[str, ...]:
        """The GPU resource names some card of the row offers (for messages)."""
        names: set[str] = set()
        for col in range(len(self.rows[row].cards)):
            key = self.offer_keys[int(self.card_offer[row, col])]
            names.update(n for part in key[:2] if part is not None for n, count in part
                         if count > 0 and self.key_count(key, n) > 0)
        return tuple(sorted(names))

    def view(self, row: int) -> NodeView:
        r = self.rows[row]
        cols = [c for c in range(len(r.cards)) if self.usable[row, c]]
        free = tuple(int(self.cap_milli[row, c] - self.used_milli[row, c]) for c in cols)
        model = r.cards[cols[0]].model if cols else (r.cards[0].model if r.cards else "")
        return NodeView(row, r.node.name, model, int(self.cpu_cap[row]),
                        int(self.cpu_cap[row] - self.cpu_used[row]), int(self.mem_cap[row]),
                        int(self.mem_cap[row] - self.mem_used[row]), free, dict(r.tags))


def _without_usage(node: Node) -> Node:
    """The node as placement sees it apart from observed usage (what a usage sample leaves)."""
    if all(c.usage is None for c in node.cards):
        return node
    return replace(node, cards=tuple(replace(c, usage=None) for c in node.cards))
