"""What the ledger allocates on every card, as of one moment, read node by node later.

A reader of every card (the extender's `/metrics` page: five series a card) once had the engine
build a list per node under the state's lock: ~58 ms of the event loop at 15,000 nodes of 8
cards, in one step. `CardTable` is what that reader now takes instead: the layout's two usage
matrices copied (one NumPy copy each, under a millisecond at any size) and its rows' card lists
(replaced, never changed in place, when a node changes), so its per-node lists are made as the
reader goes, between the other work of its event loop, and still say one moment.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from elastic_gpu.core.model import Card
from elastic_gpu.core.placement.layout import IntArray, Layout

#: A card's (index, compute allocated in milli-cards, memory allocated in MiB).
CardUse = tuple[int, int, int]


class CardTable(Mapping[str, list[CardUse]]):
    """node name -> [(card index, milli-cards allocated, MiB allocated)] for each of its cards
    by index, read from copies taken at construction (`Engine.card_table`)."""

    def __init__(self, layout: Layout) -> None:
        self._names = [row.node.name for row in layout.rows]
        self._cards: list[list[Card]] = [row.cards for row in layout.rows]
        self._milli: IntArray = layout.used_milli.copy()
        self._mem: IntArray = layout.used_mem.copy()
        self._row_of: dict[str, int] | None = None

    def _uses(self, row: int) -> list[CardUse]:
        milli = self._milli[row].tolist()
        mem = self._mem[row].tolist()
        return [(card.index, milli[c], mem[c]) for c, card in enumerate(self._cards[row])]

    def __getitem__(self, name: str) -> list[CardUse]:
        if self._row_of is None:
            self._row_of = {n: row for row, n in enumerate(self._names)}
        return self._uses(self._row_of[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def items(self) -> Iterator[tuple[str, list[CardUse]]]:  # type: ignore[override]
        """Node by node, in the engine's order, each list made when it is reached."""
        for row, name in enumerate(self._names):
            yield name, self._uses(row)
