"""Several extender replicas, one serving: leader election on a Lease (`leaderElection:`).

    standby: watches (state warm), /readyz 503, verbs 503, writes nothing
        | acquires the Lease (the leader died: not renewed for leaseDurationSeconds)
        v
    catching up: the state synced, then the pods watch past the collection's version at
        | takeover (else pods listed again), so every Binding the previous leader wrote is in
        | the ledger before a card is handed out
        v
    leading: /readyz 200 (the Service's endpoints, kube-proxy: only this replica gets
        | requests), verbs answered, binds and wake-ups written
        v
    lost (not renewed within renewDeadlineSeconds, or another holder): serving stops at
        once (verbs 503: kube-scheduler retries the pod, never acts on a wrong answer), then
        the process exits 1 and comes back as a standby with an empty ledger

Why one leader and not several active replicas: docs/architecture.md, "Extender high
availability (issue 29)".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from elastic_gpu.kube.leaderelection import LeadershipLost, LeaseConfig

log = logging.getLogger(__name__)

__all__ = ["LeadershipLost", "Role", "lead"]


class Role:
    """Whether this replica answers the verbs now. Without leader election it always does."""

    def __init__(self, elected: bool = False) -> None:
        #: True: this replica takes part in leader election
        self.elected = elected
        self._serving = not elected
        #: while leading: whether the Lease is still ours on our own clock
        #: (`LeaderElector.leads_now`), asked on every verb
        self._lease_held: Callable[[], bool] | None = None
        self.phase = "standing by: another replica holds the Lease" if elected else "serving"

    @property
    def serving(self) -> bool:
        """Asked per verb and per /readyz: a leader whose renew deadline has passed refuses
        from that instant, not from when its renewal loop next runs (an event loop that
        stalled for a moment, a renewal stuck in flight), so it never answers once a standby
        may hold the Lease."""
        return self._serving and (self._lease_held is None or self._lease_held())

    def set(self, serving: bool, phase: str,
            lease_held: Callable[[], bool] | None = None) -> None:
        self._serving = serving
        self._lease_held = lease_held
        self.phase = phase

    @property
    def refusal(self) -> str:
        """What a verb answers while this replica does not serve."""
        return (f"this Elastic GPU scheduler replica does not serve ({self.phase}); "
                "kube-scheduler retries the pod, and the Service sends it to the leader")


class Elector(Protocol):
    """What leading needs of `kube.leaderelection.LeaderElector`."""

    config: LeaseConfig

    async def acquire(self) -> None: ...

    async def keep_renewing(self) -> None: ...

    def leads_now(self) -> bool: ...


class Link(Protocol):
    """What leading needs of the API worker's link (`worker_link.WorkerLink`)."""

    writes_allowed: bool

    async def catch_up(self, feed: str, wait_s: float) -> str: ...


class Synced(Protocol):
    @property
    def ready(self) -> bool: ...


async def _until_synced(state: Synced, poll_s: float = 0.05) -> None:
    while not state.ready:
        await asyncio.sleep(poll_s)


async def lead(elector: Elector, state: Synced, link: Link, role: Role) -> None:
    """Stand by until this replica holds the Lease, catch up, serve; raises LeadershipLost the
    moment the Lease is lost (`role` and `link` then refuse everything already)."""
    link.writes_allowed = False
    role.set(False, "standing by: another replica holds the Lease")
    await elector.acquire()
    renew = asyncio.create_task(elector.keep_renewing(), name="lease-renewal")
    catch_up: asyncio.Task[str] | None = None
    try:
        role.set(False, "leading, catching up with the API")
        started = time.monotonic()
        catch_up = asyncio.create_task(_catch_up(state, link), name="catch-up")
        done, _ = await asyncio.wait({renew, catch_up}, return_when=asyncio.FIRST_COMPLETED)
        if renew in done:
            catch_up.cancel()
            renew.result()  # raises: the Lease was lost while catching up
        link.writes_allowed = True
        role.set(True, "leading", lease_held=elector.leads_now)
        log.info("%s serves the extender (Lease held; caught up with the API's pods in "
                 "%.2f s, by %s)", elector.config.identity, time.monotonic() - started,
                 catch_up.result())
        await renew  # until the Lease is lost: raises LeadershipLost
    finally:
        link.writes_allowed = False
        role.set(False, "no longer leading: the Lease was lost or the replica is stopping")
        renew.cancel()
        if catch_up is not None:
            catch_up.cancel()


#: How long a new leader waits for the pods watch to pass the collection's current version
#: before it lists the pods again instead (a quiet cluster's watch may not move for minutes).
CATCH_UP_WAIT_S = 1.0


async def _catch_up(state: Synced, link: Link, retry_s: float = 0.5) -> str:
    """The state synced, then every pod change the API held at takeover in the state: the
    watch may lag behind Bindings the dead leader wrote. Returns how ("watch"/"relist")."""
    await _until_synced(state)
    while True:
        try:
            return await link.catch_up("pods", CATCH_UP_WAIT_S)
        except Exception as err:  # the worker restarting, the API down: try again
            log.warning("catching up with the API's pods failed: %s; retrying", err)
            await asyncio.sleep(retry_s)
