"""`Conflicts`: the ledger's keys that could not be counted, by node, and counting them again
when a hold on their node shrinks (ElasticGPUs first; a nested freeing joins the round)."""

from __future__ import annotations

from elastic_gpu.scheduler.state.conflicts import MAX_RETRY_PASSES, Conflicts
from elastic_gpu.scheduler.state.handle import EGPU_KEY


def test_keys_are_kept_by_node_and_cleared() -> None:
    c = Conflicts()
    c.set("p1", "n1", "held")
    c.set("p1", "n2", "moved")  # set again: one node only
    c.set(EGPU_KEY + "e", "n2", "held")
    assert "p1" in c and c.reasons == {"p1": "moved", EGPU_KEY + "e": "held"}
    assert c.every() == [EGPU_KEY + "e", "p1"]  # ElasticGPUs first
    seen: list[str] = []
    c.retry_on("n1", seen.append)
    assert seen == []
    c.retry_on("n2", seen.append)
    assert seen == [EGPU_KEY + "e", "p1"]
    c.clear("p1")
    c.clear("p1")  # twice: nothing
    assert c.every() == [EGPU_KEY + "e"]


def test_a_freeing_while_counting_again_joins_the_round_without_recursing() -> None:
    c = Conflicts()
    c.set("a", "n1", "held")
    c.set("b", "n2", "held")
    depth = 0
    seen: list[str] = []

    def count_again(key: str) -> None:
        nonlocal depth
        depth += 1
        assert depth == 1  # never re-entered
        seen.append(key)
        c.clear(key)
        if key == "a":
            c.retry_on("n2", count_again)  # a's counting freed something on n2
        depth -= 1

    c.retry_on("n1", count_again)
    assert seen == ["a", "b"] and c.every() == []


def test_a_cycle_stops_after_the_bounded_passes() -> None:
    c = Conflicts()
    c.set("a", "n1", "held")
    calls = 0

    def frees_again(key: str) -> None:
        nonlocal calls
        calls += 1
        c.retry_on("n1", frees_again)  # always "frees" its own node again

    c.retry_on("n1", frees_again)
    assert calls == MAX_RETRY_PASSES
    c.retry_on("n1", frees_again)  # and the next freeing starts afresh
    assert calls == 2 * MAX_RETRY_PASSES
