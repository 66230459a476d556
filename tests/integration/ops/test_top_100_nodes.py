"""`egpu top` on a real control plane with 100 kwok GPU nodes (issue #18, must-show 4).

100 nodes of 8 cards (800 GPUDevices), 400 running GPU pods whose assignments hold shares of
them, and 10 claimed ElasticGPUs: one `egpu top` refresh (four LISTs through the project's
REST client, the pure view, the rich table rendered to text) must take under a second. The
refresh is timed three times after a warm-up and the best is held to the bound, so a moment
of load on a shared machine does not fail it; bench/top_render.py reports the medians by
stage (docs/benchmarks.md). The rendered text must show every node, card and holder.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from egpu_testing.claims import install_crds
from egpu_testing.scenario import create_pods
from egpu_testing.topload import Refresh, claimed_elasticgpus, holder_pods, timed_refresh
from elastic_gpu.kube.client import KubeClient

pytestmark = pytest.mark.integration

NODES, CARDS, PODS, EGPUS = 100, 8, 400, 10
BOUND_S = 1.0


async def best_of_three(kubeconfig: Any) -> Refresh:
    client = KubeClient.from_config(kubeconfig)
    try:
        await timed_refresh(client)  # warm-up: the connection, first decodes
        return min([await timed_refresh(client) for _ in range(3)], key=lambda r: r.total)
    finally:
        await client.close()


def test_top_renders_100_gpu_nodes_in_under_a_second(
        k8s_cluster: Any, fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str) -> None:
    install_crds(k8s_cluster)
    nodes = fake_gpu_nodes(NODES, gpus=CARDS)
    create_pods(k8s_cluster.client(), holder_pods(k8s_namespace, nodes, PODS, CARDS))
    k8s_cluster.kubectl("create", "-f", "-", input=json.dumps(
        claimed_elasticgpus(k8s_namespace, nodes, EGPUS, card=7)))

    best = asyncio.run(best_of_three(k8s_cluster.kubeconfig))
    mine = [n for n in best.result.nodes if n.name in set(nodes)]
    assert len(mine) == NODES and all(len(n.cards) == CARDS for n in mine)
    assert sum(n.used_milli for n in mine) == PODS * 300 + EGPUS * 500
    assert sum(len(c.holders) for n in mine for c in n.cards) == PODS + EGPUS
    assert all(name in best.text for name in nodes)
    assert f"{k8s_namespace}/p0399 (main) 30% 8.0Gi" in best.text
    assert f"egpu egpu-top-0 claim {k8s_namespace}/c0" in best.text
    print(f"\negpu top, {NODES} nodes x {CARDS} cards, {PODS} pods: best of 3 refreshes "
          f"{best.total * 1000:.0f} ms (fetch {best.fetch * 1000:.0f}, view "
          f"{best.view * 1000:.0f}, render {best.render * 1000:.0f})")
    assert best.total < BOUND_S, f"one egpu top refresh took {best.total:.2f} s (bound {BOUND_S} s)"
