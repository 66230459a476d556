"""Expected eventual waste: how much of a card's free compute is likely never to be used.

FGD's fragmentation asks which tasks of the target workload could *not* use a card's free
compute now. It says nothing about what the card ends up as: 530 milli free (after a 0.47
share) will most likely take another 0.47 and end with 60 idle, while 120 free (after a 0.65
and a 0.23) takes almost nothing of this workload and stays 120 idle. When FGD's coarse card
score ties, that difference is what should decide (docs/simulator.md, "fgd-waste").

The model, per card model and per free amount r (milli, 0..1000): the next task that reaches
the card is drawn from the target workload's GPU tasks the card can take (per-card request at
most r; a whole-card or multi-card task only takes an untouched card). With no such task, all
of r is waste. Otherwise the card goes on with r - s with probability `c(r)` and freezes with r
idle with probability 1 - c(r), where c(r) = (share of GPU-task weight that fits r) ** persistence:
the rarer the tasks that fit, the likelier the cluster fills up before one arrives. So

    W(r) = r                                        if no task fits r
    W(r) = c(r) * E[W(r - s) | s fits r] + (1 - c(r)) * r   otherwise.

persistence 0 assumes a fitting task always comes (small remainders look cheap because a rare
0.16 share could fill them); 1 freezes a card as soon as a random next task does not fit. The
default 0.5 sits between (chosen on seeds 52-61, docs/simulator.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from elastic_gpu.core.resources import MILLI_PER_CARD
from elastic_gpu.core.workload import TargetWorkload

DEFAULT_PERSISTENCE = 0.5


class ExpectedWaste:
    """W(r) per card model against one target workload; tables built on first use."""

    def __init__(self, workload: TargetWorkload, persistence: float = DEFAULT_PERSISTENCE) -> None:
        if not 0.0 <= persistence <= 1.0:
            raise ValueError(f"persistence must be within 0..1, got {persistence}")
        self.workload = workload
        self.persistence = persistence
        self._tables: dict[str, tuple[float, ...]] = {}

    def of(self, model: str, free_milli: int) -> float:
        """Expected idle milli a card of `model` with `free_milli` free ends with."""
        return self._table(model)[max(0, min(free_milli, MILLI_PER_CARD))]

    def added(self, model: str, free_milli: int, milli: int) -> float:
        """How much expected waste placing `milli` on a card with `free_milli` free adds."""
        if milli > free_milli:
            raise ValueError(f"{milli} milli does not fit a card with {free_milli} free")
        table = self._table(model)
        return table[free_milli - milli] - table[free_milli]

    def _table(self, model: str) -> tuple[float, ...]:
        table = self._tables.get(model)
        if table is None:
            sizes = self._sizes(model)
            table = waste_table(sizes, sum(weight for _, weight in sizes), self.persistence)
            self._tables[model] = table
        return table

    def _sizes(self, model: str) -> list[tuple[int, float]]:
        """(per-card milli, weight) of the GPU tasks a card of `model` can take, ascending."""
        sizes: dict[int, float] = {}
        for shape, weight in zip(self.workload.shapes, self.workload.weights, strict=True):
            if shape.gpu_count == 0 or shape.gpu_milli == 0 or not shape.accepts(model):
                continue
            milli = min(shape.gpu_milli, MILLI_PER_CARD)
            sizes[milli] = sizes.get(milli, 0.0) + weight
        return sorted(sizes.items())


def waste_table(sizes: Sequence[tuple[int, float]], total: float, persistence: float
                ) -> tuple[float, ...]:
    """W(0..1000) for tasks of these (per-card milli, weight), ascending; `total` is the weight
    of all GPU tasks, of which `sizes` may be a part (the rest never fits a card of this kind)."""
    table = [0.0] * (MILLI_PER_CARD + 1)
    for free in range(1, MILLI_PER_CARD + 1):
        fitting = expected = 0.0
        for milli, weight in sizes:
            if milli > free:
                break
            fitting += weight
            expected += weight * table[free - milli]
        if fitting == 0.0:
            table[free] = float(free)
            continue
        goes_on = (fitting / total) ** persistence
        table[free] = goes_on * expected / fitting + (1.0 - goes_on) * free
    return tuple(table)
