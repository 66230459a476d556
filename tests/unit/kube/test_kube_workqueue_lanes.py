"""The work queue's two lanes: news (watch events, retries) before a resync pass (a new
leader's look at every object), one place per key across both."""

from __future__ import annotations

from elastic_gpu.kube.workqueue import WorkQueue


async def _drain(q: WorkQueue[str]) -> list[str]:
    out = []
    while len(q):
        key = await q.get()
        assert key is not None
        out.append(key)
        q.done(key)
    return out


async def test_news_is_handed_out_before_the_resync_that_was_queued_first() -> None:
    q: WorkQueue[str] = WorkQueue()
    for key in ("old-1", "old-2", "old-3"):
        q.add(key, resync=True)
    q.add("new-1")
    q.add("new-2")
    assert (q.queued(resync=False), q.queued(resync=True)) == (2, 3)
    assert await _drain(q) == ["new-1", "new-2", "old-1", "old-2", "old-3"]


async def test_news_of_a_key_waiting_for_the_resync_moves_it_up_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "c"):
        q.add(key, resync=True)
    q.add("c")  # an event for c: it goes first, and is not handed out a second time later
    assert len(q) == 3
    assert (q.queued(resync=False), q.queued(resync=True)) == (1, 2)
    assert await _drain(q) == ["c", "a", "b"]
    assert len(q) == 0


async def test_a_resync_add_leaves_a_key_with_news_in_the_news_lane() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("old", resync=True)
    q.add("x")
    q.add("x", resync=True)
    assert await _drain(q) == ["x", "old"]


async def test_news_during_a_resync_reconcile_comes_back_ahead_of_the_resync() -> None:
    q: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "c"):
        q.add(key, resync=True)
    first = await q.get()
    assert first == "a"
    q.add("a")  # changed while its resync reconcile runs: again after done, as news
    q.add("a", resync=True)
    q.done("a")
    assert await _drain(q) == ["a", "b", "c"]


async def test_a_resync_of_a_key_in_progress_waits_for_done_in_the_resync_lane() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    assert await q.get() == "a"
    q.add("a", resync=True)
    q.add("b")
    assert len(q) == 1  # a is not queued while a worker holds it
    q.done("a")
    assert await _drain(q) == ["b", "a"]


async def test_a_steady_stream_of_news_cannot_stop_a_resync() -> None:
    """A tenant rewriting their own object in a loop keeps news waiting all the time: the
    resync lane still gets one key every RESYNC_EVERY news keys."""
    from elastic_gpu.kube.workqueue import RESYNC_EVERY

    q: WorkQueue[str] = WorkQueue()
    for key in ("old-1", "old-2"):
        q.add(key, resync=True)
    handed = []
    for i in range(3 * (RESYNC_EVERY + 1)):
        q.add(f"spam-{i}")  # news arrives faster than it is served: always some waiting
        q.add(f"spam-{i}-again")
        key = await q.get()
        assert key is not None
        handed.append(key)
        q.done(key)
    assert handed.index("old-1") == RESYNC_EVERY, handed
    assert handed.index("old-2") == 2 * RESYNC_EVERY + 1, handed
