"""The engine's kept fit masks (`fitmask.FitMasks`): one mask per request shape, brought up to
date row by row, answers as a mask computed anew would after any sequence of changes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from engine_helpers import gpu_node
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.placement import Engine, PolicyConfig, Unschedulable, fitmask
from elastic_gpu.core.placement.layout import CHANGE_RING, Layout
from elastic_gpu.core.request import ContainerRequest, PodRequest
from elastic_gpu.core.usage import CardUsage


def probe_pods(cpu: int) -> list[PodRequest]:
    """The shapes a burst of pods asks, each pod with its own CPU request."""
    return [PodRequest(f"whole-{cpu}", containers=(ContainerRequest.whole("c", 1),),
                       cpu_milli=cpu, memory_mib=512),
            PodRequest(f"two-{cpu}", containers=(ContainerRequest.whole("c", 2),), cpu_milli=cpu),
            PodRequest(f"share-{cpu}", containers=(ContainerRequest.share("c", 400, 6000),),
                       cpu_milli=cpu),
            PodRequest(f"pair-{cpu}", containers=(ContainerRequest.share("a", 300, 2000),
                                                  ContainerRequest.whole("b", 1)), cpu_milli=cpu),
            PodRequest(f"t4-{cpu}", containers=(ContainerRequest.share("c", 100, 1000),),
                       cpu_milli=cpu, allowed_models=frozenset({"T4"}))]


def inventory() -> list[Node]:
    return [gpu_node(f"n{i}", cards=1 + i % 4, model="T4" if i % 2 else "A100",
                     cpu=8000 if i % 3 else 64000) for i in range(12)]


def fresh_copy(nodes: dict[str, Node], outside: dict[str, tuple[int, int]],
               held: dict[str, tuple[PodRequest, Assignment]], check_host: bool) -> Engine:
    """The same nodes, ledger and outside usage in a new engine (nothing kept yet)."""
    copy = Engine(nodes.values(), PolicyConfig(check_host_resources=check_host))
    for key, (pod, assignment) in held.items():
        copy.allocate(key, assignment, pod)
    for name, (cpu, mem) in outside.items():  # after: outside usage is not checked, allocations are
        copy.set_outside_usage(name, cpu, mem)
    return copy


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(st.sampled_from(("place", "place", "release", "outside", "usage",
                                                "node")),
                              st.integers(0, 11), st.integers(0, 4), st.integers(1, 60)),
                    min_size=1, max_size=40),
       check_host=st.booleans())
def test_kept_masks_answer_as_fresh_ones_after_any_changes(
        ops: list[tuple[str, int, int, int]], check_host: bool) -> None:
    nodes = {n.name: n for n in inventory()}
    engine = Engine(nodes.values(), PolicyConfig(check_host_resources=check_host))
    names = list(nodes)
    held: dict[str, tuple[PodRequest, Assignment]] = {}
    outside: dict[str, tuple[int, int]] = {}
    for step, (op, node_index, shape, amount) in enumerate(ops):
        name = names[node_index]
        if op == "place":
            pod = dataclasses.replace(probe_pods(amount * 500)[shape], name=f"p{step}")
            try:
                assignment = engine.place(pod)
                engine.allocate(pod.key, assignment, pod)  # checks the node's CPU and memory
            except Unschedulable:
                continue
            held[pod.key] = (pod, assignment)
        elif op == "release" and held:
            key = sorted(held)[node_index % len(held)]
            engine.release(key)
            del held[key]
        elif op == "outside":
            outside[name] = (amount * 1000, amount * 512)
            engine.set_outside_usage(name, *outside[name])
        elif op == "usage":  # an agent's sample: memory used out of band on the first card
            node = nodes[name]
            first = dataclasses.replace(node.cards[0], usage=CardUsage(amount * 100,
                                                                      amount * 100 * (shape % 2), 5))
            nodes[name] = dataclasses.replace(node, cards=(first, *node.cards[1:]))
            engine.upsert_node(nodes[name])
        elif op == "node":  # a card fewer or more: the layout is rebuilt
            # never fewer cards than pods hold there, nor less CPU or memory: the fresh copy
            # replays every hold, and one that no longer fits is refused there (NO_SUCH_CARD,
            # HOST_CPU) while the kept ledger still has it; what a node losing what pods hold
            # means is the ledger's question, not the masks'
            needed = max((share.index + 1 for _, held_on in held.values()
                          if held_on.node == name for share in held_on.shares()), default=1)
            old = nodes[name]
            nodes[name] = gpu_node(name, cards=max(1 + amount % 4, needed), model="T4",
                                   cpu=old.cpu_milli, mem=old.memory_mib)
            engine.upsert_node(nodes[name])
        # ask every shape, each time with another CPU request, between the changes
        for pod in probe_pods(1000 + step):
            engine.scored(pod, names)
    fresh = fresh_copy(nodes, outside, held, check_host)
    for pod in probe_pods(777):
        assert engine.scored(pod, names).feasible == fresh.scored(pod, names).feasible, pod.name
        assert engine.best(pod, names) == fresh.best(pod, names), pod.name


def test_a_pod_of_another_cpu_request_recomputes_only_the_rows_changed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The extender's engine does not check host resources (kube-scheduler does): pods that
    differ only in CPU have one mask, and a bind between them costs one row, not every node."""
    engine = Engine(inventory(), PolicyConfig(check_host_resources=False))
    names = list(engine.nodes())
    first, second = probe_pods(100)[0], probe_pods(200)[0]
    engine.scored(first, names)
    engine.allocate(first.key, engine.assign(first, "n3"), first)
    fresh = Engine(inventory(), PolicyConfig(check_host_resources=False))
    fresh.allocate(first.key, engine.assign(first, "n3"), first)
    expected = fresh.scored(second, names).feasible
    computed: list[int] = []
    real = fitmask.fit_mask

    def counting(lay: Layout, *args: object, **kwargs: object) -> np.ndarray:
        rows = args[4] if len(args) > 4 else kwargs.get("rows", fitmask.ALL)
        computed.append(len(lay.rows) if isinstance(rows, slice) else len(rows))  # type: ignore[arg-type]
        return real(lay, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fitmask, "fit_mask", counting)
    assert engine.scored(second, names).feasible == expected
    assert computed == [1]  # only n3's row, where the bind went
    # where host resources are checked, they are part of the fit: CPU makes another mask
    assert fitmask.fit_key(first, False) == fitmask.fit_key(second, False)
    assert fitmask.fit_key(first, True) != fitmask.fit_key(second, True)


def test_the_change_ring_reports_rows_and_when_it_no_longer_reaches_back() -> None:
    lay = Layout()
    lay.upsert(Node("a", 1000, 1024, (Card(0, "GPU-a", "T4", 16000),)), rank=0.0)
    lay.rebuild()
    start = lay.changes
    assert lay.changed_since(start) is not None and lay.changed_since(start).size == 0  # type: ignore[union-attr]
    for row in (0, 0, 0):
        lay.touch(row)
    assert lay.changed_since(start).tolist() == [0, 0, 0]  # type: ignore[union-attr]
    for _ in range(CHANGE_RING - 3):
        lay.touch(0)
    assert lay.changed_since(start).size == CHANGE_RING  # type: ignore[union-attr]  # exactly the ring
    lay.touch(0)
    assert lay.changed_since(start) is None  # past the ring: compute anew
    epoch = lay.epoch
    lay.rebuild()
    assert lay.epoch == epoch + 1
