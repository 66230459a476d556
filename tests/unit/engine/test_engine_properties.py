"""Property tests: whatever the cluster, pods and policies, no placement ever exceeds a card's
compute or memory, a node's CPU or memory, or a pod's model constraint; and place agrees with
filter. Usage is recomputed independently from the ledger, not read back from the engine."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastic_gpu.core.model import Card, Health, Link, LinkKind, MigInstance, Node
from elastic_gpu.core.placement import Engine, PolicyConfig, Unschedulable
from elastic_gpu.core.policies import CARD_POLICIES, NODE_POLICIES
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind
from elastic_gpu.core.resources import MigProfile

MODELS = ("T4", "A100")
PROFILE = MigProfile(3, 40)


@st.composite
def nodes(draw: st.DrawFn) -> list[Node]:
    out = []
    for n in range(draw(st.integers(1, 4))):
        count = draw(st.integers(0, 6))
        cards = []
        for i in range(count):
            model = draw(st.sampled_from(MODELS))
            mig = ()
            if model == "A100" and draw(st.integers(0, 4)) == 0:
                mig = (MigInstance(PROFILE, f"MIG-{n}-{i}-a", 0), MigInstance(PROFILE, f"MIG-{n}-{i}-b", 4))
            cards.append(Card(i, f"GPU-{n}-{i}", model, draw(st.sampled_from((8000, 16000))),
                              health=Health.UNHEALTHY if draw(st.integers(0, 9)) == 0 else Health.HEALTHY,
                              links=tuple(Link(j, LinkKind.NVLINK) for j in range(count)
                                          if j != i and j % 2 == i % 2),
                              mig=mig))
        out.append(Node(f"n{n}", draw(st.sampled_from((4000, 16000, 64000))),
                        draw(st.sampled_from((8192, 65536))), tuple(cards)))
    return out


def container(draw: st.DrawFn, name: str) -> ContainerRequest:
    kind = draw(st.sampled_from(("none", "share", "share", "whole", "mig")))
    if kind == "share":
        return ContainerRequest.share(name, draw(st.integers(0, 999)) or 1,
                                      draw(st.sampled_from((0, 0, 1000, 6000))))
    if kind == "whole":
        return ContainerRequest.whole(name, draw(st.integers(1, 3)))
    if kind == "mig":
        return ContainerRequest(name, RequestKind.MIG, draw(st.integers(1, 2)), 0, 0, PROFILE)
    return ContainerRequest(name)


@st.composite
def pods(draw: st.DrawFn) -> list[PodRequest]:
    out = []
    for p in range(draw(st.integers(1, 25))):
        count = draw(st.sampled_from((1, 1, 1, 2, 3)))
        containers = tuple(container(draw, f"c{i}") for i in range(count))
        allowed = draw(st.sampled_from((None, None, frozenset({"T4"}), frozenset({"A100"}))))
        out.append(PodRequest(f"p{p}", containers=containers, cpu_milli=draw(st.sampled_from((0, 500, 3000))),
                              memory_mib=draw(st.sampled_from((0, 1024, 4096))), allowed_models=allowed))
    return out


def check_invariants(engine: Engine, inventory: dict[str, Node], held: dict[str, PodRequest]) -> None:
    milli: Counter[tuple[str, int]] = Counter()
    memory: Counter[tuple[str, int]] = Counter()
    cpu: Counter[str] = Counter()
    host_mem: Counter[str] = Counter()
    mig_seen: set[str] = set()
    for key, assignment in engine.allocations().items():
        pod = held[key]
        node = inventory[assignment.node]
        cpu[node.name] += pod.cpu_milli
        host_mem[node.name] += pod.memory_mib
        for name, shares in assignment.containers.items():
            request = next(c for c in pod.containers if c.name == name)
            assert request.wants_gpu
            assert len(shares) == request.cards
            for share in shares:
                card = node.card(share.index)
                assert pod.accepts_model(card.model), (pod, card)
                if request.kind is RequestKind.MIG:
                    assert share.mig_uuid in {m.uuid for m in card.mig}
                    assert share.mig_uuid not in mig_seen
                    mig_seen.add(share.mig_uuid)
                    continue
                assert not card.mig_enabled and card.healthy
                milli[(node.name, card.index)] += share.milli
                memory[(node.name, card.index)] += share.memory_mib
        assert set(assignment.containers) == {c.name for c in pod.gpu_containers}
    for (node_name, index), used in milli.items():
        card = inventory[node_name].card(index)
        assert used <= card.compute_milli
        assert memory[(node_name, index)] <= card.memory_mib
    for node_name, used in cpu.items():
        assert used <= inventory[node_name].cpu_milli
        assert host_mem[node_name] <= inventory[node_name].memory_mib


@pytest.mark.parametrize("policy", sorted(NODE_POLICIES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=nodes(), workload=pods(), card=st.sampled_from(sorted(CARD_POLICIES)),
       release_every=st.integers(2, 6), seed=st.integers(0, 3))
def test_no_placement_ever_exceeds_a_capacity(policy: str, cluster: list[Node], workload: list[PodRequest],
                                              card: str, release_every: int, seed: int) -> None:
    replay_with_releases(cluster, workload, policy, card, release_every, seed, check_invariants)


# ---------------------------------------------------------------------------- offers, replicas

NV, IX = "nvidia.com/gpu", "iluvatar.com/gpu"
CORE, MEM = "elasticgpu.io/gpu-core", "elasticgpu.io/gpu-memory"


@st.composite
def offering_nodes(draw: st.DrawFn) -> list[Node]:
    """Nodes whose agents advertise NVIDIA or IX whole cards (time-sliced or not), with or
    without shares; some say it per card, some (older agents) only in the Node, some not at all."""
    out = []
    for n in range(draw(st.integers(1, 4))):
        gpu = draw(st.sampled_from((NV, IX, IX)))
        replicas = draw(st.sampled_from((1, 2, 4, 7)))
        shares = draw(st.booleans())
        how = draw(st.sampled_from(("card", "card", "node", "unknown")))
        cards = []
        for i in range(draw(st.integers(0, 4))):
            memory = draw(st.sampled_from((8000, 16000)))
            offers = {gpu: replicas, MEM: memory, **({CORE: 100} if shares else {})}
            cards.append(Card(i, f"GPU-{n}-{i}", draw(st.sampled_from(MODELS)), memory,
                              health=Health.UNHEALTHY if draw(st.integers(0, 9)) == 0 else Health.HEALTHY,
                              offers=offers if how == "card" else None))
        healthy = [c for c in cards if c.healthy]
        node_offers = None
        if how != "unknown":
            node_offers = {gpu: replicas * len(healthy), MEM: sum(c.memory_mib for c in healthy)}
            if shares:
                node_offers[CORE] = 100 * len(healthy)
        out.append(Node(f"n{n}", 64000, 1 << 18, tuple(cards), offers=node_offers))
    return out


@st.composite
def named_pods(draw: st.DrawFn) -> list[PodRequest]:
    from elastic_gpu.core.request import container_request

    shapes = [{NV: "1"}, {NV: "2"}, {IX: "1"}, {IX: "1"}, {IX: "3"}, {CORE: "30"},
              {CORE: "60", MEM: "2000"}, {"tencent.com/vcuda-core": "50"}, {CORE: "100"}, {}]
    out = []
    for p in range(draw(st.integers(1, 30))):
        count = draw(st.sampled_from((1, 1, 1, 2)))
        containers = tuple(container_request(f"c{i}", {"limits": draw(st.sampled_from(shapes))})
                           for i in range(count))
        out.append(PodRequest(f"p{p}", containers=containers, cpu_milli=100))
    return out


def effective_count(node: Node, card: Card, name: str) -> int:
    """What the card backs of `name`, computed here from the rule, not read from the engine."""
    from elastic_gpu.core.model import offered

    if node.offers is not None and offered(node.offers, name) == 0:
        return 0
    if card.offers is not None:
        return offered(card.offers, name)
    if node.offers is not None:
        if name in (NV, IX):
            # the Node's capacity counts every plain card, healthy or not
            plain = sum(1 for c in node.cards if not c.mig_enabled)
            return max(1, offered(node.offers, name) // max(1, plain))
        return offered(node.offers, name)
    return 1


def check_offer_invariants(engine: Engine, inventory: dict[str, Node],
                           held: dict[str, PodRequest]) -> None:
    milli: Counter[tuple[str, int]] = Counter()
    replicas: Counter[tuple[str, int]] = Counter()
    per_node: Counter[tuple[str, str]] = Counter()
    for key, assignment in engine.allocations().items():
        pod = held[key]
        node = inventory[assignment.node]
        for name, shares in assignment.containers.items():
            request = next(c for c in pod.containers if c.name == name)
            assert sum(max(s.replicas, 1) for s in shares) == request.cards
            for share in shares:
                card = node.card(share.index)
                for resource in request.resources:  # the card backs every name written
                    assert effective_count(node, card, resource) > 0, (resource, card, node.offers)
                milli[(node.name, card.index)] += share.milli
                if share.replicas:
                    (gpu,) = [r for r in request.resources if r in (NV, IX)]
                    r = effective_count(node, card, gpu)
                    assert r > 1 and share.milli == share.replicas * (card.compute_milli // r)
                    assert share.memory_mib == 0
                    replicas[(node.name, card.index)] += share.replicas
                    assert replicas[(node.name, card.index)] <= r
                    per_node[(node.name, gpu)] += share.replicas
    for (node_name, index), used in milli.items():
        assert used <= inventory[node_name].card(index).compute_milli
    # node level: never more replicas of a resource than the node advertises
    for (node_name, gpu), used in per_node.items():
        node = inventory[node_name]
        advertised = (node.offers or {}).get(gpu, 0) if node.offers is not None else sum(
            (c.offers or {}).get(gpu, 0) for c in node.cards)
        assert used <= advertised


@pytest.mark.parametrize("policy", sorted(NODE_POLICIES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=offering_nodes(), workload=named_pods(), card=st.sampled_from(sorted(CARD_POLICIES)),
       release_every=st.integers(2, 6), seed=st.integers(0, 3))
def test_offers_and_replicas_are_never_exceeded(policy: str, cluster: list[Node],
                                                workload: list[PodRequest], card: str,
                                                release_every: int, seed: int) -> None:
    replay_with_releases(cluster, workload, policy, card, release_every, seed, check_offer_invariants)


def replay_with_releases(cluster: list[Node], workload: list[PodRequest], policy: str, card: str,
                         release_every: int, seed: int,
                         check: Callable[[Engine, dict[str, Node], dict[str, PodRequest]], None]
                         ) -> None:
    """Place every pod that fits (filter and place must agree), release the oldest every
    `release_every` pods, and check the invariants after each step."""
    engine = Engine(cluster, PolicyConfig(node_policy=policy, card_policy=card), seed=seed)
    inventory = {n.name: n for n in cluster}
    held: dict[str, PodRequest] = {}
    for i, pod in enumerate(workload):
        feasible = engine.filter(pod).feasible
        try:
            assignment = engine.place(pod)
        except Unschedulable:
            assert feasible == []
        else:
            assert assignment.node in feasible
            engine.allocate(pod.key, assignment, pod)
            held[pod.key] = pod
        if i % release_every == release_every - 1 and held:
            engine.release(next(iter(held)))
            held.pop(next(iter(held)))
        check(engine, inventory, held)
