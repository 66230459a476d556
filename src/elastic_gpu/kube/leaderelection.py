"""Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it.

- Acquire: create the Lease, or take it over when its holder is empty or has not renewed for
  `lease_duration_s` *as observed by us* (the time we last saw its record change, on our own
  monotonic clock: no trust in the other holder's wall clock); the write carries the Lease's
  resourceVersion, so of two candidates racing for an expired Lease exactly one wins (the
  other gets 409 Conflict). Between attempts a candidate watches the Lease, so it sees each
  renewal when it is written (not at its next poll), and it tries again the moment the Lease
  would expire when that comes before its next retry (`next_attempt_s`): a dead holder is
  replaced `lease_duration_s` after its last renewal, not up to two retry periods later.
- Renew every `retry_period_s`, in one write (the Lease as last written, its resourceVersion
  the precondition; a 409 means someone else wrote it, and the leader reads it); a leader
  that has not renewed successfully for `renew_deadline_s` has lost leadership
  (`LeadershipLost`). The caller must stop acting at once: the controller process exits
  non-zero and comes back as a follower. The deadline is counted from when the last
  successful request was *sent* (the API wrote the renewal after that, and a candidate
  counts the expiry from when it saw the write): a slow answer does not stretch the leader's
  term past `lease_duration_s - renew_deadline_s` of margin before a candidate may take
  over. `leads_now()` says, on the leader's own clock, whether that deadline has passed,
  for callers that must not wait for the renewal loop to notice.
- Release on a clean shutdown: the Lease's holder is emptied, so a successor takes over at its
  next retry instead of waiting for the lease to expire.

Defaults are client-go's: 15 s lease, 10 s renew deadline, 2 s retry period.

A replica that comes back with the identity it had (the chart's `--identity=$(POD_NAME)`, the
sandbox's fixed one) renews its own Lease at once, as client-go does: a restart after a
SIGKILL does not wait for the Lease to expire. Identities must therefore be unique among live
replicas (a pod's name is).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from elastic_gpu.api.config.leaderelection import JITTER
from elastic_gpu.kube.client import KubeClient
from elastic_gpu.kube.errors import AlreadyExists, ApiError, Conflict, NotFound
from elastic_gpu.kube.resources import LEASES

log = logging.getLogger(__name__)


#: How long after the Lease's expiry (on our own clock) a candidate tries to take it: a
#: moment, so that the attempt finds it expired.
EXPIRY_MARGIN_S = 0.01


def next_attempt_s(retry_s: float, expires_in_s: float | None) -> float:
    """A candidate's wait before its next attempt: the (jittered) retry period, or, when the
    Lease it saw held by another expires sooner (by its own observation), just past that: a
    dead leader's Lease is taken the moment it may be, not up to a retry period later (the
    extender's failover: docs/scheduler.md, "High availability"). A Lease already expired
    whose attempt failed all the same (another candidate won, the API refused) waits the
    retry period: no busy loop."""
    if expires_in_s is None or not 0 < expires_in_s < retry_s:
        return retry_s
    return expires_in_s + EXPIRY_MARGIN_S


class LeadershipLost(RuntimeError):
    """The Lease was not renewed within the renew deadline (or another holder took it)."""


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election: identity must not be empty")
        if not self.lease_duration_s > self.renew_deadline_s:
            raise ValueError(f"leader election: lease duration {self.lease_duration_s} s must "
                             f"exceed the renew deadline {self.renew_deadline_s} s")
        if not self.renew_deadline_s > JITTER * self.retry_period_s:
            raise ValueError(f"leader election: renew deadline {self.renew_deadline_s} s must "
                             f"exceed {JITTER} x the retry period {self.retry_period_s} s")
        if self.retry_period_s <= 0:
            raise ValueError("leader election: retry period must be > 0")


def micro_time(at: dt.datetime | None = None) -> str:
    """A metav1.MicroTime (RFC 3339 with microseconds, UTC)."""
    return (at or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


Sleep = Callable[[float], Awaitable[None]]


class LeaderElector:
    """`clock` (seconds, monotonic) and `sleep` are this replica's own: every duration of the
    protocol is measured on them, so a test drives the protocol with a clock of its own
    instead of depending on how fast a loaded machine runs."""

    def __init__(self, client: KubeClient, config: LeaseConfig,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Sleep = asyncio.sleep) -> None:
        self.client = client
        self.config = config
        self._clock = clock
        self._sleep = sleep
        self.is_leader = False
        self.transitions_seen = 0
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        #: when the last successful acquire or renewal was sent (our clock)
        self._last_renew = 0.0
        self._lease: dict[str, Any] | None = None

    @property
    def path(self) -> str:
        return LEASES.path(self.config.namespace, self.config.name)

    def _spec(self, old: dict[str, Any] | None, now: str) -> dict[str, Any]:
        spec = dict(old or {})
        holder = spec.get("holderIdentity")
        if holder != self.config.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if old else 0)
        spec["holderIdentity"] = self.config.identity
        spec["leaseDurationSeconds"] = max(1, round(self.config.lease_duration_s))
        spec["renewTime"] = now
        return spec

    def _observe(self, lease: dict[str, Any]) -> None:
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("acquireTime"),
                  spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed = record
            self._observed_at = self._clock()
        self._lease = lease

    def _expires_in(self) -> float | None:
        """Seconds until the Lease last seen, held by another, expires as we observe it (from
        when we saw its record change; None: not held by another)."""
        spec = (self._lease or {}).get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if not holder or holder == self.config.identity:
            return None
        return self._observed_at + self._duration_s(spec) - self._clock()

    def _duration_s(self, spec: dict[str, Any]) -> float:
        return float(spec.get("leaseDurationSeconds") or self.config.lease_duration_s)

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when we hold the Lease afterwards."""
        now = micro_time()
        if self.is_leader and await self._renew_as_written(now):
            return True
        try:
            lease = await self.client.get(self.path)
        except NotFound:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.config.name, "namespace": self.config.namespace},
                    "spec": self._spec(None, now)}
            try:
                created = await self.client.create(LEASES.path(self.config.namespace), body)
            except AlreadyExists:
                return False
            self._observe(created)
            return True
        self._observe(lease)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        expires_in = self._expires_in()
        if expires_in is not None and expires_in > 0:
            return False  # held by another, not expired
        updated = dict(lease)
        updated["spec"] = self._spec(spec if holder else {**spec, "holderIdentity": None}, now)
        if holder and holder != self.config.identity:
            log.info("taking over Lease %s/%s from %s (not renewed for %.0f s)",
                     self.config.namespace, self.config.name, holder, self._duration_s(spec))
        try:
            written = await self.client.update(self.path, updated)  # resourceVersion precondition
        except ApiError as err:
            log.debug("lease update failed: %s", err)
            return False
        self._observe(written)
        return True

    async def _renew_as_written(self, now: str) -> bool:
        """A leader's renewal in one request: the Lease as we last wrote it, renewed, with its
        resourceVersion as the precondition. True: renewed; False: someone else wrote the Lease
        since (409), and the caller reads it and decides as any candidate would. Half the
        requests of a read then a write, and half the time for the renew deadline to run out
        on a slow API server (client-go reads first: a renewal there is two round trips)."""
        lease = self._lease
        spec = (lease or {}).get("spec") or {}
        if lease is None or spec.get("holderIdentity") != self.config.identity:
            return False
        try:
            written = await self.client.update(self.path, {**lease, "spec": self._spec(spec, now)})
        except Conflict:
            return False
        self._observe(written)
        return True

    async def acquire(self) -> None:
        """Return once we lead (retrying every retry period, jittered, or at the Lease's
        expiry when that comes sooner). Between attempts a watch on the Lease observes each
        renewal as it is written, so its expiry is counted from the holder's last renewal,
        not from our next poll after it (up to a retry period later)."""
        watcher: asyncio.Task[None] | None = None
        try:
            while True:
                if await self._attempt():
                    return
                if watcher is None and self._lease is not None:
                    watcher = asyncio.create_task(self._watch_lease(), name="lease-watch")
                await self._sleep(next_attempt_s(
                    self.config.retry_period_s * random.uniform(1, JITTER), self._expires_in()))
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher

    async def _watch_lease(self) -> None:
        """Observe every change of the Lease as the API server delivers it. Best effort: on
        any failure, watch again from the latest Lease seen (the attempts observe it too)."""
        path = LEASES.path(self.config.namespace)
        params = {"fieldSelector": f"metadata.name={self.config.name}"}
        while True:
            version = str(((self._lease or {}).get("metadata") or {}).get("resourceVersion")
                          or "")
            try:
                async for kind, lease in self.client.watch(path, version, params):
                    if kind in ("ADDED", "MODIFIED"):
                        self._observe(lease)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # gone, expired, the API down: the attempts go on
                log.debug("leader election: Lease watch ended: %s", err)
            # not the protocol's clock: only how soon a watch that ended is opened again
            await asyncio.sleep(self.config.retry_period_s)

    def leads_now(self) -> bool:
        """True while we lead and our last successful renewal was sent less than the renew
        deadline ago: past it a candidate may soon take the Lease, whether or not the renewal
        loop has run since (a stalled event loop, a renewal still in flight)."""
        return (self.is_leader
                and self._clock() < self._last_renew + self.config.renew_deadline_s)

    async def _attempt(self) -> bool:
        """One attempt to acquire; True when we lead."""
        sent = self._clock()
        try:
            if not await self.try_acquire_or_renew():
                return False
        except ApiError as err:
            log.warning("leader election: %s", err)
            return False
        self.is_leader = True
        self._last_renew = sent
        spec = (self._lease or {}).get("spec") or {}
        self.transitions_seen = int(spec.get("leaseTransitions") or 0)
        log.info("%s leads (Lease %s/%s)", self.config.identity, self.config.namespace,
                 self.config.name)
        return True

    async def keep_renewing(self) -> None:
        """Renew every retry period; raises LeadershipLost once a renewal has not succeeded
        for the renew deadline (or the Lease was taken). Runs until cancelled otherwise."""
        while True:
            await self._sleep(self.config.retry_period_s)
            sent = self._clock()
            left = self._last_renew + self.config.renew_deadline_s - sent
            try:
                ok = await asyncio.wait_for(self.try_acquire_or_renew(), timeout=max(0.01, left))
            except (TimeoutError, ApiError) as err:
                log.warning("leader election: renewal failed: %s", err or "timed out")
                ok = False
            if ok:
                self._last_renew = sent
                continue
            spec = (self._lease or {}).get("spec") or {}
            holder = spec.get("holderIdentity")
            if holder and holder != self.config.identity:
                self.is_leader = False
                raise LeadershipLost(f"Lease {self.config.namespace}/{self.config.name} is now "
                                     f"held by {holder}")
            if self._clock() - self._last_renew >= self.config.renew_deadline_s:
                self.is_leader = False
                raise LeadershipLost(f"Lease {self.config.namespace}/{self.config.name} not "
                                     f"renewed for {self.config.renew_deadline_s:.0f} s")

    async def release(self) -> bool:
        """Give the Lease up (holder emptied) if we hold it; True if released."""
        if not self.is_leader:
            return False
        self.is_leader = False
        try:
            lease = await self.client.get(self.path)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.config.identity:
                return False
            lease["spec"] = {**spec, "holderIdentity": None, "leaseDurationSeconds": 1,
                             "renewTime": micro_time()}
            await self.client.update(self.path, lease)
        except ApiError as err:
            log.warning("leader election: could not release the Lease: %s", err)
            return False
        log.info("%s released Lease %s/%s", self.config.identity, self.config.namespace,
                 self.config.name)
        return True
