"""The scheduler's side of a paged list (`WorkerLink._page`): the pages of one list become
one replace of the state, and a list begun again voids the pages of the one it replaces."""

from __future__ import annotations

from typing import Any

from elastic_gpu.scheduler import ipc
from elastic_gpu.scheduler.worker_link import WorkerLink


class Replaces:
    """A feed sink that records each replace; events and wake-ups are not part of this."""

    def __init__(self) -> None:
        self.replaced: list[tuple[str, list[str]]] = []

    def __getattr__(self, name: str) -> Any:
        feed = {"pods_replace": "pods", "nodes_replace": "nodes"}.get(name)
        if feed is None:
            return lambda *args: False
        return lambda items: self.replaced.append((feed, [o["name"] for o in items]))


def _page(feed: str, first: bool, last: bool, *names: str) -> ipc.Page:
    return ipc.Page(feed, first, last, [{"name": n} for n in names])


def test_the_pages_of_a_list_are_one_replace_and_a_list_begun_again_voids_the_old() -> None:
    sink = Replaces()
    link = WorkerLink(None, sink)  # type: ignore[arg-type]
    link._on_message(_page("pods", True, False, "a", "b"))
    link._on_message(_page("nodes", True, True, "n1"))  # feeds interleave
    link._on_message(_page("pods", False, False, "c"))
    assert sink.replaced == [("nodes", ["n1"])]  # nothing of an unfinished list
    link._on_message(_page("pods", False, True, "d"))
    assert sink.replaced[-1] == ("pods", ["a", "b", "c", "d"])
    # a list that broke off (410 Expired) and began again: only the new pages count
    link._on_message(_page("pods", True, False, "x"))
    link._on_message(_page("pods", True, False, "a"))
    link._on_message(_page("pods", False, True, "b"))
    assert sink.replaced[-1] == ("pods", ["a", "b"])
    # an empty collection is one page, first and last
    link._on_message(_page("pods", True, True))
    assert sink.replaced[-1] == ("pods", [])
    # a stray page outside any list replaces nothing
    link._on_message(_page("pods", False, True, "z"))
    assert sink.replaced[-1] == ("pods", [])
    assert len(sink.replaced) == 4
