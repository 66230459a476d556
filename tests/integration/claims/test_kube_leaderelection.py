"""kube.leaderelection against the real kube-apiserver, in process: racing candidates, expiry,
release, and a renewal that cannot reach the API server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from egpu_testing.pytest_plugin import unique_name
from elastic_gpu.kube.client import KubeClient
from elastic_gpu.kube.leaderelection import (
    EXPIRY_MARGIN_S,
    LeaderElector,
    LeadershipLost,
    LeaseConfig,
)
from elastic_gpu.kube.resources import LEASES

pytestmark = pytest.mark.integration


class ReplicaClock:
    """One replica's monotonic clock, moved only by the test (and by the replica's own
    sleeps): the protocol's durations are measured on it, never on how fast the machine
    runs, so no assertion here depends on the load of the box (issue #26)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        self.slept += seconds
        await asyncio.sleep(0)


class AsleepClock(ReplicaClock):
    """A replica clock whose sleeps never end: the replica makes no attempt after its first."""

    async def sleep(self, seconds: float) -> None:
        self.slept += seconds
        await asyncio.Event().wait()


#: lease duration, renew deadline, retry period (seconds of the replicas' own clocks)
TIMINGS = (60.0, 40.0, 2.0)


def elector(client: KubeClient, ns: str, lease: str, who: str,
            timings: tuple[float, float, float] = TIMINGS,
            clock: ReplicaClock | None = None) -> LeaderElector:
    if clock is None:
        return LeaderElector(client, LeaseConfig(ns, lease, who, *timings))
    return LeaderElector(client, LeaseConfig(ns, lease, who, *timings), clock, clock.sleep)


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
    """The Lease protocol on each replica's own clock: b takes over exactly when a's record
    has been unchanged for the lease duration as b observed it, not a moment before; a then
    finds the Lease taken; a release hands it over at once."""
    a_client = KubeClient.from_config(k8s_cluster.kubeconfig)
    b_client = KubeClient.from_config(k8s_cluster.kubeconfig)
    lease = unique_name("lease")
    a_clock, b_clock = ReplicaClock(), ReplicaClock()
    a = elector(a_client, k8s_namespace, lease, "a", clock=a_clock)
    b = elector(b_client, k8s_namespace, lease, "b", clock=b_clock)
    duration = TIMINGS[0]
    try:
        await a.acquire()
        assert a.is_leader and a_clock.slept == 0  # a free Lease is taken at the first try
        assert not await b.try_acquire_or_renew()  # held and fresh: b starts observing it
        # a stops renewing (as if killed); b's clock runs
        b_clock.advance(duration - 0.001)
        assert not await b.try_acquire_or_renew(), "taken over before the lease expired"
        b_clock.advance(0.002)
        assert await b.try_acquire_or_renew(), "not taken over once the lease expired"
        spec = (await b_client.get(LEASES.path(k8s_namespace, lease)))["spec"]
        assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
        # a comes back (its clock barely moved): at its next renewal it finds the Lease
        # taken and stops leading
        with pytest.raises(LeadershipLost, match="held by b"):
            await a.keep_renewing()
        assert not a.is_leader and a_clock.slept == TIMINGS[2]
        # b releases: a acquires at its first try, no expiry wait
        b.is_leader = True
        assert await b.release()
        spec = (await a_client.get(LEASES.path(k8s_namespace, lease)))["spec"]
        assert not spec.get("holderIdentity")
        assert await a.try_acquire_or_renew()
    finally:
        await a_client.close()
        await b_client.close()


async def test_a_standby_tries_the_moment_a_dead_leaders_lease_expires(
        k8s_cluster: Any, k8s_namespace: str) -> None:
    """The expiry falls between two retry periods: b's next attempt is then, not a retry
    period later (the extender's failover is the Lease's duration, not that plus a retry)."""
    a_client = KubeClient.from_config(k8s_cluster.kubeconfig)
    b_client = KubeClient.from_config(k8s_cluster.kubeconfig)
    lease = unique_name("lease")
    b_clock = ReplicaClock()
    a = elector(a_client, k8s_namespace, lease, "a")
    b = elector(b_client, k8s_namespace, lease, "b", clock=b_clock)
    duration, _, retry = TIMINGS
    try:
        await a.acquire()
        assert not await b.try_acquire_or_renew()  # b observes a's record from now
        b_clock.advance(duration - retry / 4)  # a has died: its record does not change
        await b.acquire()
        assert b.is_leader
        assert b_clock.slept == pytest.approx(retry / 4 + EXPIRY_MARGIN_S)
    finally:
        await a_client.close()
        await b_client.close()


async def test_a_standby_counts_the_expiry_from_the_last_renewal_it_watched(
        k8s_cluster: Any, k8s_namespace: str) -> None:
    """Between its attempts a standby watches the Lease: a renewal is observed when it is
    written, not at the standby's next poll (which would push a dead leader's expiry, and the
    takeover, up to a retry period later)."""
    a_client = KubeClient.from_config(k8s_cluster.kubeconfig)
    b_client = KubeClient.from_config(k8s_cluster.kubeconfig)
    lease = unique_name("lease")
    b_clock = AsleepClock()
    a = elector(a_client, k8s_namespace, lease, "a")
    b = elector(b_client, k8s_namespace, lease, "b", clock=b_clock)
    duration, _, retry = TIMINGS
    try:
        await a.acquire()
        standby = asyncio.create_task(b.acquire())
        while b_clock.slept == 0:  # b's first attempt failed: it sleeps (for good), watching
            await asyncio.sleep(0.01)
        b_clock.advance(duration - retry / 4)  # to just before expiry, on b's clock
        assert await a.try_acquire_or_renew()  # a renews; b makes no attempt meanwhile
        deadline = asyncio.get_running_loop().time() + 30
        while b._expires_in() != pytest.approx(duration, abs=retry):
            assert asyncio.get_running_loop().time() < deadline, "the renewal was not watched"
            await asyncio.sleep(0.01)
        assert not standby.done()
        standby.cancel()
        with pytest.raises(asyncio.CancelledError):
            await standby
    finally:
        await a_client.close()
        await b_client.close()


async def test_a_replica_restarted_with_its_identity_renews_its_lease_at_once(
        k8s_cluster: Any, k8s_namespace: str) -> None:
    """Issue #26: a controller SIGKILLed and started again with the same identity (the chart's
    pod name, the sandbox's fixed one) does not wait for its own Lease to expire; another
    identity does."""
    client = KubeClient.from_config(k8s_cluster.kubeconfig)
    lease = unique_name("lease")
    try:
        first = elector(client, k8s_namespace, lease, "pod-0", clock=ReplicaClock())
        await first.acquire()  # then SIGKILLed: nothing released
        again = elector(client, k8s_namespace, lease, "pod-0", clock=ReplicaClock())
        other = elector(client, k8s_namespace, lease, "pod-1", clock=ReplicaClock())
        assert not await other.try_acquire_or_renew()
        assert await again.try_acquire_or_renew()
        spec = (await client.get(LEASES.path(k8s_namespace, lease)))["spec"]
        assert spec["holderIdentity"] == "pod-0" and spec["leaseTransitions"] == 0
    finally:
        await client.close()


async def test_a_leader_that_cannot_renew_loses_within_the_renew_deadline(
        k8s_cluster: Any, k8s_namespace: str) -> None:
    client = KubeClient.from_config(k8s_cluster.kubeconfig)
    lease = unique_name("lease")
    clock = ReplicaClock()
    a = elector(client, k8s_namespace, lease, "a", clock=clock)
    try:
        await a.acquire()
        client.rest.server = "https://127.0.0.1:1"  # the API server becomes unreachable
        with pytest.raises(LeadershipLost, match="not renewed"):
            await a.keep_renewing()
        # lost at the first retry at or past the renew deadline, on its own clock
        _, deadline, retry = TIMINGS
        assert deadline <= clock.slept <= deadline + retry, clock.slept
        assert not a.is_leader
    finally:
        await client.close()
