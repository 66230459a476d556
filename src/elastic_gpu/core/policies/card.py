"""Card-tier policies: which card(s) of the chosen node a container gets."""

from __future__ import annotations

from collections.abc import Sequence

from elastic_gpu.core.frag import sigmoid, sorted_free
from elastic_gpu.core.policies.base import CardPolicy, CardView, ScoreContext, share_runs
from elastic_gpu.core.topology import best_linked_set


class BinpackCards(CardPolicy):
    """Tightest fit: the card with the least free compute that still fits (then memory, index)."""

    name = "binpack"

    def pick_share(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                   milli: int, memory_mib: int) -> int:
        return min(candidates, key=lambda p: (view.free_milli[p], view.free_memory[p],
                                              view.tie(p)))


class SpreadCards(CardPolicy):
    """Loosest fit: the card with the most free compute."""

    name = "spread"

    def pick_share(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                   milli: int, memory_mib: int) -> int:
        return min(candidates, key=lambda p: (-view.free_milli[p], -view.free_memory[p],
                                              view.tie(p)))


class RandomCards(CardPolicy):
    """Any card that fits, uniformly at random (seeded); whole cards at random too."""

    name = "random"

    def pick_share(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                   milli: int, memory_mib: int) -> int:
        return int(candidates[int(ctx.rng.integers(len(candidates)))])

    def pick_whole(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                   count: int) -> list[int]:
        if count >= len(candidates):
            return list(candidates)
        # Whole cards are interchangeable for fragmentation; keep the FGD artifact's choice
        # (lowest indexes) so that random differs from it only where it matters: shares.
        return super().pick_whole(ctx, view, candidates, count)


class TopologyCards(BinpackCards):
    """Multi-card requests take the set of free cards with the strongest links between them
    (NVLink over board over PCIe switch over NUMA over system); shares pack like binpack."""

    name = "topology"

    def pick_whole(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                   count: int) -> list[int]:
        if count <= 1:
            return super().pick_whole(ctx, view, candidates, count)
        return best_linked_set(view.cards, candidates, count)

    def pick_shares(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                    milli: int, memory_mib: int, count: int) -> list[int]:
        """A multi-card share's cards talk to each other as whole cards do: the candidates
        with the strongest links between them."""
        return best_linked_set(view.cards, candidates, count)


def fgd_run_scores(ctx: ScoreContext, view: CardView, runs: Sequence[Sequence[int]],
                   milli: int) -> list[tuple[int, float]]:
    """FGD's score (as `fgd_card_scores`) and the fragmentation left, of putting `milli` on
    each card of each run (a multi-card share's candidate placements, `base.share_runs`)."""
    node = view.node
    cpu_after = node.cpu_free - view.task.cpu_milli
    before = ctx.frag.node(node.model, node.cpu_free, sorted_free(view.free_milli))
    out: list[tuple[int, float]] = []
    for run in runs:
        free = list(view.free_milli)
        for pos in run:
            free[pos] -= milli
        after = ctx.frag.node(node.model, cpu_after, sorted_free(free))
        out.append((int(sigmoid((before - after) / 1000) * 100), after))
    return out


def fgd_card_scores(ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                    milli: int) -> dict[int, int]:
    """FGD's score of putting `milli` on each candidate card, as the authors' simulator has it:
    sigmoid(fragmentation decrease in cards) truncated to an integer 0..100."""
    node = view.node
    cpu_after = node.cpu_free - view.task.cpu_milli
    before = ctx.frag.node(node.model, node.cpu_free, sorted_free(view.free_milli))
    scores: dict[int, int] = {}
    for pos in candidates:
        free = list(view.free_milli)
        free[pos] -= milli
        after = ctx.frag.node(node.model, cpu_after, sorted_free(free))
        scores[pos] = int(sigmoid((before - after) / 1000) * 100)
    return scores


class FragCards(CardPolicy):
    """FGD's card rule as the authors' simulator has it: the best `fgd_card_scores`; ties: the
    lowest card index."""

    name = "fgd"

    def pick_share(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                   milli: int, memory_mib: int) -> int:
        scores = fgd_card_scores(ctx, view, candidates, milli)
        return min(candidates, key=lambda p: (-scores[p], view.tie(p)))

    def pick_shares(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                    milli: int, memory_mib: int, count: int) -> list[int]:
        """The run of `count` cards by free room (`base.share_runs`) with the best FGD score;
        ties: the tightest run (the one leaving the loosest cards free)."""
        runs = share_runs(view, candidates, count)
        scores = fgd_run_scores(ctx, view, runs, milli)
        best = min(range(len(runs)), key=lambda i: (-scores[i][0], -i))
        return runs[best]


class FragWasteCards(CardPolicy):
    """FGD's card score first; its ties go to the card whose use adds the least expected
    eventual waste (core/waste.py), then to the lowest index.

    The integer score ties often: e.g. 0.23 on a card with 350 free or on one with 460 free.
    Lowest index picks whichever comes first; the waste model sees that 120 left takes almost
    nothing of the workload while 230 left takes a 0.23, and keeps the 350 for a 0.32.
    """

    name = "fgd-waste"

    def pick_share(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                   milli: int, memory_mib: int) -> int:
        scores = fgd_card_scores(ctx, view, candidates, milli)
        return min(candidates, key=lambda p: (
            -scores[p], ctx.waste.added(view.cards[p].model, view.free_milli[p], milli),
            view.tie(p)))

    def pick_shares(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                    milli: int, memory_mib: int, count: int) -> list[int]:
        """The run of `count` cards (`base.share_runs`) with the best FGD score; ties: the
        least expected waste added over the run's cards, then the tightest run."""
        runs = share_runs(view, candidates, count)
        scores = fgd_run_scores(ctx, view, runs, milli)

        def key(i: int) -> tuple[int, float, int]:
            waste = sum(ctx.waste.added(view.cards[p].model, view.free_milli[p], milli)
                        for p in runs[i])
            return (-scores[i][0], waste, -i)

        return runs[min(range(len(runs)), key=key)]


class ExactFragCards(CardPolicy):
    """The card whose use leaves the lowest expected fragmentation, exactly; ties: the tightest
    fit, then the lowest index."""

    name = "frag-exact"

    def pick_share(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                   milli: int, memory_mib: int) -> int:
        node = view.node
        cpu_after = node.cpu_free - view.task.cpu_milli

        def key(pos: int) -> tuple[float, int, tuple[int, ...]]:
            free = list(view.free_milli)
            free[pos] -= milli
            after = ctx.frag.node(node.model, cpu_after, sorted_free(free))
            return (after, view.free_milli[pos], view.tie(pos))

        return min(candidates, key=key)

    def pick_shares(self, ctx: ScoreContext, view: CardView, candidates: Sequence[int],
                    milli: int, memory_mib: int, count: int) -> list[int]:
        """The run of `count` cards (`base.share_runs`) leaving the lowest fragmentation;
        ties: the tightest run."""
        runs = share_runs(view, candidates, count)
        scores = fgd_run_scores(ctx, view, runs, milli)
        return runs[min(range(len(runs)), key=lambda i: (scores[i][1], -i))]


CARD_POLICY_CLASSES: tuple[type[CardPolicy], ...] = (
    BinpackCards, SpreadCards, RandomCards, TopologyCards, FragCards, FragWasteCards,
    ExactFragCards,
)
