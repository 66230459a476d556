"""The webhook's side of the peers' dialects: its match condition sends their pods, its
GPUDevice cache gives the card UUIDs a pin is checked against."""

from __future__ import annotations

from elastic_gpu.core.peers import kai
from elastic_gpu.core.peers.koordinator import PEER_RESOURCE_NAMES as KOORDINATOR
from elastic_gpu.core.peers.vgpu import PEER_RESOURCE_NAMES as VGPU
from elastic_gpu.webhook.cards import CardCache
from elastic_gpu.webhook.registration import match_expression


def test_the_match_condition_names_every_peer_resource_and_kais_annotations() -> None:
    expression = match_expression()
    for name in (*VGPU, *KOORDINATOR):
        assert f"'{name}'" in expression
    assert "nvidia.com/gpumem" in VGPU and "volcano.sh/vgpu-number" in VGPU
    assert f"object.spec.schedulerName == '{kai.SCHEDULER}'" in expression
    assert f"'{kai.FRACTION}', '{kai.MEMORY}'" in expression


def test_card_cache_gives_the_uuids_and_none_while_it_knows_no_card() -> None:
    seen: list[frozenset[str] | None] = []
    cache = CardCache(seen.append)
    cache.replace([])
    assert seen[-1] is None
    cache.replace([{"metadata": {"name": "n1-0"}, "spec": {"uuid": "GPU-a"}},
                   {"metadata": {"name": "n1-1"}, "spec": {"uuid": "GPU-b"}},
                   {"metadata": {"name": "bad"}, "spec": {}}])
    assert seen[-1] == {"GPU-a", "GPU-b"}
    cache.event("DELETED", {"metadata": {"name": "n1-0"}})
    assert seen[-1] == {"GPU-b"}
