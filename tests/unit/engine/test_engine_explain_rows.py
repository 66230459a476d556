"""`explain.why_not_rows` (the explanations of a filter's failed nodes, in one pass) says of
every node exactly what `why_not` says of it alone, and nodes that fail alike share one
failure object (issue 39, "Cost per pod")."""

from __future__ import annotations

import contextlib
import random

import pytest

from elastic_gpu.core.fit import FitFailure, FitKind, Unschedulable
from elastic_gpu.core.model import Card, Health, Node
from elastic_gpu.core.placement import Engine, PolicyConfig
from elastic_gpu.core.placement.explain import why_not, why_not_rows
from elastic_gpu.core.request import ContainerRequest, PodRequest
from elastic_gpu.core.usage import CardUsage

MODELS = (("A100-SXM4-80GB", 81920), ("T4", 16384), ("L4", 23034))


def cluster(rng: random.Random, check_host: bool) -> Engine:
    nodes = []
    for i in range(80):
        model, mib = rng.choice(MODELS)
        cards = tuple(
            Card(c, f"GPU-{i}-{c}", model, mib,
                 health=Health.HEALTHY if rng.random() > 0.05 else Health.UNHEALTHY,
                 usage=CardUsage(mib // 2, mib // 3, 0) if rng.random() < 0.05 else None)
            for c in range(rng.choice((0, 1, 2, 4, 8))))
        nodes.append(Node(f"n{i:03d}", rng.choice((8_000, 96_000)), 262_144, cards))
    engine = Engine(nodes, PolicyConfig(check_host_resources=check_host), seed=1)
    for i in range(250):
        with contextlib.suppress(Unschedulable):  # a full cluster refuses some
            engine.allocate(f"bg{i}", engine.place(pod(rng, f"bg{i}")), None)
    return engine


def pod(rng: random.Random, key: str) -> PodRequest:
    kind = rng.random()
    if kind < 0.45:
        main = ContainerRequest.share("main", rng.randrange(50, 1000, 50),
                                      rng.randrange(0, 40) * 1024)
    elif kind < 0.9:
        main = ContainerRequest.whole("main", rng.choice((1, 1, 2, 4, 8)))
    else:
        main = ContainerRequest.whole("main", 1, 20000)
    allowed = frozenset({"T4"}) if rng.random() < 0.1 else None
    denied = frozenset({"L4"}) if rng.random() < 0.05 else frozenset()
    return PodRequest(key, containers=(main,), cpu_milli=rng.randrange(100, 12_000, 100),
                      memory_mib=1024, allowed_models=allowed, denied_models=denied)


@pytest.mark.parametrize("check_host", [False, True])
def test_rows_are_explained_as_each_node_alone(check_host: bool) -> None:
    rng = random.Random(39)
    engine = cluster(rng, check_host)
    lay, binpack = engine._layout, engine._card_policy("binpack")
    rows = list(range(len(lay.rows)))
    kinds: set[FitKind] = set()
    for i in range(150):
        request = pod(rng, f"p{i}")
        alone = [why_not(lay, engine.ctx, check_host, binpack, row, request) for row in rows]
        assert why_not_rows(lay, engine.ctx, check_host, binpack, rows, request) == alone
        kinds |= {f.kind for f in alone if f is not None}
    assert {FitKind.INSUFFICIENT_CARDS, FitKind.INSUFFICIENT_SHARE, FitKind.NO_HEALTHY_GPU,
            FitKind.MODEL_NOT_ACCEPTED, FitKind.OUT_OF_BAND_MEMORY} <= kinds
    if check_host:
        assert FitKind.HOST_CPU in kinds


def test_nodes_that_fail_alike_share_one_failure() -> None:
    full = [Node(f"full{i}", 32_000, 65_536, tuple(Card(c, f"G-{i}-{c}", "T4", 16384)
                                                   for c in range(4))) for i in range(5)]
    engine = Engine(full, PolicyConfig(check_host_resources=False))
    for i, node in enumerate(full):
        engine.allocate(f"bg{i}", engine.assign(
            PodRequest(f"bg{i}", containers=(ContainerRequest.whole("main", 4),)), node.name))
    lay = engine._layout
    request = PodRequest("p", containers=(ContainerRequest.whole("main", 1),))
    why = why_not_rows(lay, engine.ctx, False, engine._card_policy("binpack"),
                       list(range(5)), request)
    assert all(isinstance(f, FitFailure) and f.kind is FitKind.INSUFFICIENT_CARDS for f in why)
    assert len({id(f) for f in why}) == 1
