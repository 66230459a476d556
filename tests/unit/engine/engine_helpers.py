"""Small inventories and pods for engine tests."""

from __future__ import annotations

from elastic_gpu.core.model import Card, Health, Link, LinkKind, MigInstance, Node
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind
from elastic_gpu.core.resources import MigProfile


def gpu_node(name: str, cards: int = 4, model: str = "T4", memory: int = 16000, cpu: int = 32000,
             mem: int = 65536, unhealthy: tuple[int, ...] = ()) -> Node:
    return Node(name, cpu, mem, tuple(
        Card(i, f"GPU-{name}-{i}", model, memory,
             health=Health.UNHEALTHY if i in unhealthy else Health.HEALTHY)
        for i in range(cards)))


def nvlink_node(name: str = "dgx") -> Node:
    """8 cards; 0-3 and 4-7 are NVLink islands, everything else crosses the system."""
    cards = []
    for i in range(8):
        island = range(0, 4) if i < 4 else range(4, 8)
        links = tuple(Link(j, LinkKind.NVLINK, 2) for j in island if j != i)
        cards.append(Card(i, f"GPU-{name}-{i}", "A100", 81920, links=links))
    return Node(name, 128000, 1 << 20, tuple(cards))


def mig_node(name: str = "mig") -> Node:
    profile = MigProfile(3, 40)
    card0 = Card(0, f"GPU-{name}-0", "A100", 81920,
                 mig=(MigInstance(profile, f"MIG-{name}-a", 0), MigInstance(profile, f"MIG-{name}-b", 4)))
    card1 = Card(1, f"GPU-{name}-1", "A100", 81920)
    return Node(name, 64000, 1 << 19, (card0, card1))


def share(name: str, milli: int, memory: int = 0, cpu: int = 1000, mem: int = 1024,
          **kw: object) -> PodRequest:
    return PodRequest(name, containers=(ContainerRequest.share("main", milli, memory),),
                      cpu_milli=cpu, memory_mib=mem, **kw)  # type: ignore[arg-type]


def whole(name: str, cards: int, cpu: int = 1000, mem: int = 1024, **kw: object) -> PodRequest:
    return PodRequest(name, containers=(ContainerRequest.whole("main", cards),),
                      cpu_milli=cpu, memory_mib=mem, **kw)  # type: ignore[arg-type]


def mig(name: str, count: int = 1, profile: str = "3g.40gb") -> PodRequest:
    return PodRequest(name, containers=(ContainerRequest("main", RequestKind.MIG, count, 0, 0,
                                                         MigProfile.parse(profile)),))


def cpu_only(name: str, cpu: int, mem: int = 1024) -> PodRequest:
    return PodRequest(name, containers=(ContainerRequest("main"),), cpu_milli=cpu, memory_mib=mem)
