"""`core.gpuview.build_view`: what `egpu top` shows, from nodes, pods' assignments and
ElasticGPUs (pure)."""

from __future__ import annotations

import pytest

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.gpuview import ElasticGPUHold, PodHold, build_view
from elastic_gpu.core.model import Card, Health, MigInstance, Node
from elastic_gpu.core.resources import MigProfile


def card(index: int, *, node: str = "n1", health: Health = Health.HEALTHY,
         mig: tuple[MigInstance, ...] = (), model: str = "A100-SXM4-80GB") -> Card:
    return Card(index, f"GPU-{node}-{index}", model, 81920, health=health, mig=mig)


def share(index: int, milli: int, mib: int = 0, node: str = "n1", **kw: str) -> CardShare:
    return CardShare(index, f"GPU-{node}-{index}", milli, mib, kw.get("mig"), kw.get("mig_uuid"))


def pod(name: str, node: str, containers: dict[str, list[CardShare]],
        claims: dict[str, str] | None = None) -> PodHold:
    return PodHold("team-a", name, Assignment(node, {c: tuple(s) for c, s in containers.items()},
                                              claims or {}))


def test_cards_show_their_holders_free_compute_and_memory() -> None:
    node = Node("n1", 0, 0, (card(0), card(1), card(2)))
    view = build_view([node], [
        pod("train", "n1", {"main": [share(0, 300, 8192)], "side": [share(0, 200, 1024)]}),
        pod("big", "n1", {"main": [share(1, 1000, 81920)]})])
    (n1,) = view.nodes
    c0, c1, c2 = n1.cards
    assert (c0.used_milli, c0.used_mib, c0.free_milli, c0.free_mib) == (500, 9216, 500, 72704)
    assert [(h.name, h.detail, h.milli) for h in c0.holders] == [
        ("team-a/train", "main", 300), ("team-a/train", "side", 200)]
    assert c1.free_milli == 0 and not c1.entirely_free
    assert c2.entirely_free and c2.holders == ()
    assert (n1.free_cards, n1.free_milli, n1.stranded_milli) == (1, 1500, 500)
    # a third of the free compute can only take shares
    assert n1.fragmentation == pytest.approx(500 / 1500)
    assert (view.cards, view.used_milli, view.compute_milli) == (3, 1500, 3000)


def test_an_unhealthy_card_offers_nothing_and_is_counted() -> None:
    node = Node("n1", 0, 0, (card(0, health=Health.UNHEALTHY), card(1)))
    view = build_view([node], [pod("p", "n1", {"main": [share(0, 100)]})])
    bad, _ = view.nodes[0].cards
    assert not bad.healthy and bad.free_milli == 0 and bad.free_mib == 0
    assert bad.used_milli == 100  # still held by the pod that was there
    assert bad.stranded_milli == 0  # nothing can use it: not fragmentation
    assert (view.unhealthy, view.free_milli, view.fragmentation) == (1, 1000, 0.0)


def test_claim_backed_containers_are_shown_under_their_elasticgpu_once() -> None:
    node = Node("n1", 0, 0, (card(0), card(1)))
    egpu = ElasticGPUHold("egpu-u1", "n1", (share(0, 600, 4096),), claim="team-a/c1")
    consumer = pod("infer", "n1", {"main": [share(0, 600, 4096)], "tool": [share(1, 100)]},
                   claims={"main": "egpu-u1"})
    second = pod("infer-2", "n1", {"main": [share(0, 600, 4096)]}, claims={"main": "egpu-u1"})
    view = build_view([node], [consumer, second], [egpu])
    c0, c1 = view.nodes[0].cards
    (held,) = c0.holders
    assert (held.kind, held.name, held.detail, held.users) == (
        "elasticgpu", "egpu-u1", "team-a/c1", ("team-a/infer", "team-a/infer-2"))
    assert c0.used_milli == 600  # not 1800: the consumers hold nothing of their own there
    assert [(h.name, h.detail) for h in c1.holders] == [("team-a/infer", "tool")]


def test_mig_instances_count_their_slices_and_show_who_holds_them() -> None:
    mig = (MigInstance(MigProfile.parse("3g.40gb"), "MIG-a", 0),
           MigInstance(MigProfile.parse("3g.40gb"), "MIG-b", 4))
    node = Node("n1", 0, 0, (card(0, mig=mig),))
    view = build_view([node], [
        pod("m", "n1", {"main": [share(0, 0, 0, mig="3g.40gb", mig_uuid="MIG-b")]})])
    (c0,) = view.nodes[0].cards
    assert (c0.used_milli, c0.used_mib) == (1000 * 3 // 7, 40 * 1024)
    assert [(m.uuid, m.holder) for m in c0.mig] == [("MIG-a", None), ("MIG-b", "pod team-a/m")]
    assert c0.stranded_milli == 0 and not c0.entirely_free  # carved: not for shares
    # free is the free instance, not the rest of the card (the 7th slice is in no instance)
    assert (c0.free_milli, c0.free_mib) == (1000 * 3 // 7, 40 * 1024)


def test_nodes_are_sorted_filtered_to_known_cards_and_uninventoried_nodes_listed() -> None:
    nodes = [Node("n2", 0, 0, (card(1, node="n2"), card(0, node="n2"))),
             Node("n1", 0, 0, (card(0),))]
    view = build_view(nodes, [pod("gone", "n9", {"main": [share(0, 500, node="n9")]})],
                      uninventoried={"legacy": {"nvidia.com/gpu": 4}})
    assert [n.name for n in view.nodes] == ["legacy", "n1", "n2"]
    assert [c.index for c in view.nodes[2].cards] == [0, 1]
    assert view.used_milli == 0  # a hold on a node no inventory lists is not counted
    legacy = view.nodes[0]
    assert legacy.cards == () and legacy.uninventoried == {"nvidia.com/gpu": 4}
    assert build_view([], []).fragmentation == 0.0
