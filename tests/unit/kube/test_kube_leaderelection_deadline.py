"""A leader renews in one request (a 409 then a read); its renew deadline is counted from when
its last successful renewal was sent, and its serving ends at that deadline on its own clock
(`LeaderElector.leads_now`, which the extender's `Role` asks per verb), whether or not the
renewal loop has noticed: a slow answer or a stalled loop never keeps a leader serving once a
standby may hold the Lease."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from egpu_testing.clock import InstantSleeps, ManualClock
from egpu_testing.lease_api import LeaseApi
from elastic_gpu.kube.client import KubeClient
from elastic_gpu.kube.leaderelection import LeaderElector, LeadershipLost, LeaseConfig
from elastic_gpu.scheduler.leadership import Role

CONFIG = LeaseConfig("ns", "lease", "me", lease_duration_s=2.0, renew_deadline_s=1.5,
                     retry_period_s=0.5)


def elector(api: LeaseApi, clock: ManualClock, sleep: Any = None) -> LeaderElector:
    return LeaderElector(cast(KubeClient, api), CONFIG, clock=clock,
                         sleep=sleep or InstantSleeps())


async def test_keep_renewing_records_the_send_time_and_gives_up_by_it() -> None:
    # renewals every 0.5 s; the first answered 1.2 s after it was sent, then the API is
    # down. Counted from the answer the leader would lead until
    # 1.7 + 1.5 = 3.2 s; from the send, until 2.0 s.
    clock = ManualClock(0.0)
    api = LeaseApi(clock)
    leader = elector(api, clock)
    await leader.acquire()

    class Sleeps(InstantSleeps):
        async def __call__(self, seconds: float) -> None:
            clock.advance(seconds)
            if len(self.delays) == 0:
                api.latency_s = 1.2
            else:
                api.latency_s, api.down = 0.0, True
            await super().__call__(seconds)

    leader._sleep = Sleeps()
    with pytest.raises(LeadershipLost):
        await asyncio.wait_for(leader.keep_renewing(), 5)
    assert clock.now <= 2.0 + CONFIG.retry_period_s  # noticed at the first turn past 2.0 s
    assert not leader.leads_now()


async def test_a_leaders_role_refuses_the_instant_its_deadline_passes() -> None:
    clock = ManualClock(0.0)
    api = LeaseApi(clock)
    leader = elector(api, clock)
    await leader.acquire()
    role = Role(elected=True)
    role.set(True, "leading", lease_held=leader.leads_now)
    assert role.serving
    clock.advance(CONFIG.renew_deadline_s - 0.01)
    assert role.serving
    clock.advance(0.02)  # no renewal ran (a stalled loop): the Lease may soon be another's
    assert not role.serving


def test_a_replica_without_election_always_serves() -> None:
    assert Role().serving


async def test_a_leader_renews_with_one_write_and_sees_another_holder_on_conflict() -> None:
    clock = ManualClock(0.0)
    api = LeaseApi(clock)
    leader = elector(api, clock)
    await leader.acquire()
    api.requests.clear()
    assert await leader.try_acquire_or_renew()
    assert api.requests == ["update"]  # no read first: one round trip per renewal
    api.take("other")  # e.g. it saw the Lease expire while our renewals were failing
    api.requests.clear()
    with pytest.raises(LeadershipLost, match="held by other"):
        await asyncio.wait_for(leader.keep_renewing(), 5)
    assert api.requests == ["update", "get"]  # the 409, then the Lease read as it is
