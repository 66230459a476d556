"""The extender's processes freeze what survives a full collection (`runtime.gcpolicy`), so the
next full collection visits only what survived since, not the whole state again."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from elastic_gpu.runtime import gcpolicy


@pytest.fixture
def freezing() -> Iterator[None]:
    gcpolicy.freeze_survivors()
    try:
        yield
    finally:
        gcpolicy.stop_freezing()


@pytest.mark.usefixtures("freezing")
def test_a_full_collection_freezes_its_survivors_and_young_cycles_are_still_collected() -> None:
    kept = [{"pod": i} for i in range(10_000)]  # a state: lives on, freed by refcounting
    gc.collect()
    frozen = gc.get_freeze_count()
    assert frozen >= len(kept)  # the survivors moved out of the collector's way
    visited = len(gc.get_objects())
    assert visited < frozen  # what a full collection visits now is what was made since

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a  # a young cycle, garbage once dropped
    del a, b
    assert gc.collect() >= 2  # still collected: it never lived through a full collection
    assert kept  # the state itself is untouched


def test_installing_twice_installs_once_and_stopping_restores_the_collector() -> None:
    gcpolicy.freeze_survivors()
    gcpolicy.freeze_survivors()
    try:
        assert gc.callbacks.count(gcpolicy._freeze_after_full_collection) == 1
    finally:
        gcpolicy.stop_freezing()
    assert gcpolicy._freeze_after_full_collection not in gc.callbacks
    assert gc.get_freeze_count() == 0


def test_the_scheduler_and_its_api_worker_install_it_at_start() -> None:
    """Both entry points (`egpu scheduler`, `python -m elastic_gpu.scheduler.apiworker`) run
    with the policy: the API worker's main installs it before its loop starts."""
    script = textwrap.dedent("""
        import gc, sys
        from elastic_gpu.scheduler import apiworker
        from elastic_gpu.runtime import eventloop, gcpolicy
        def fake_run(coro):
            coro.close()
            print(gcpolicy._freeze_after_full_collection in gc.callbacks)
            return 0
        eventloop.run = fake_run
        sys.exit(apiworker.main([]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "True"
