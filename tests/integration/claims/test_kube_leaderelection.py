"""kube.leaderelection against the real kube-apiserver, in process: racing candidates, expiry,
release, and a renewal that cannot reach the API server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from elastic_gpu.devcluster.pytest_plugin import unique_name
from elastic_gpu.kube.client import LEASES, KubeClient
from elastic_gpu.kube.leaderelection import LeaderElector, LeadershipLost, LeaseConfig

pytestmark = pytest.mark.integration


def elector(client: KubeClient, ns: str, lease: str, who: str,
            timings: tuple[float, float, float] = (3.0, 2.0, 0.2)) -> LeaderElector:
    return LeaderElector(client, LeaseConfig(ns, lease, who, *timings))


async def test_of_candidates_racing_for_a_lease_exactly_one_wins(
        k8s_cluster: Any, k8s_namespace: str) -> None:
    clients = [KubeClient.from_config(k8s_cluster.kubeconfig) for _ in range(5)]
    lease = unique_name("race")
    path = LEASES.path(k8s_namespace, lease)
    try:
        for _ in range(3):
            # a new Lease: one create wins, the others meet AlreadyExists or a fresh holder
            electors = [elector(c, k8s_namespace, lease, f"c{i}") for i, c in enumerate(clients)]
            won = await asyncio.gather(*(e.try_acquire_or_renew() for e in electors))
            assert won.count(True) == 1, won
            assert (await clients[0].get(path))["spec"]["holderIdentity"] == f"c{won.index(True)}"
            # a released Lease: every candidate sees it free; the resourceVersion precondition
            # lets exactly one update win (the others get 409 Conflict)
            leader = electors[won.index(True)]
            leader.is_leader = True
            assert await leader.release()
            electors = [elector(c, k8s_namespace, lease, f"d{i}") for i, c in enumerate(clients)]
            won = await asyncio.gather(*(e.try_acquire_or_renew() for e in electors))
            assert won.count(True) == 1, won
            assert (await clients[0].get(path))["spec"]["holderIdentity"] == f"d{won.index(True)}"
            await clients[0].delete(path)
    finally:
        for c in clients:
            await c.close()


async def test_expiry_takeover_and_release(k8s_cluster: Any, k8s_namespace: str) -> None:
    a_client = KubeClient.from_config(k8s_cluster.kubeconfig)
    b_client = KubeClient.from_config(k8s_cluster.kubeconfig)
    lease = unique_name("lease")
    a = elector(a_client, k8s_namespace, lease, "a")
    b = elector(b_client, k8s_namespace, lease, "b")
    try:
        await asyncio.wait_for(a.acquire(), 5)
        assert a.is_leader
        assert not await b.try_acquire_or_renew()  # held and fresh
        # a stops renewing (as if killed): b takes over once b has seen it unchanged for 3 s
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(b.acquire(), 10)
        waited = loop.time() - started
        assert 2.5 <= waited <= 3.0 + 0.2 * 1.2 + 1.0, waited
        spec = (await b_client.get(LEASES.path(k8s_namespace, lease)))["spec"]
        assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
        # a now finds the Lease taken: renewing raises LeadershipLost
        with pytest.raises(LeadershipLost, match="held by b"):
            await asyncio.wait_for(a.keep_renewing(), 5)
        # b releases: a acquires at its first try, no expiry wait
        assert await b.release()
        spec = (await a_client.get(LEASES.path(k8s_namespace, lease)))["spec"]
        assert not spec.get("holderIdentity")
        assert await a.try_acquire_or_renew()
    finally:
        await a_client.close()
        await b_client.close()


async def test_a_leader_that_cannot_renew_loses_within_the_renew_deadline(
        k8s_cluster: Any, k8s_namespace: str) -> None:
    client = KubeClient.from_config(k8s_cluster.kubeconfig)
    lease = unique_name("lease")
    a = elector(client, k8s_namespace, lease, "a")
    try:
        await asyncio.wait_for(a.acquire(), 5)
        client.rest.server = "https://127.0.0.1:1"  # the API server becomes unreachable
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(LeadershipLost, match="not renewed"):
            await asyncio.wait_for(a.keep_renewing(), 10)
        assert loop.time() - started <= 2.0 + 0.2 + 1.0
        assert not a.is_leader
    finally:
        await client.close()
