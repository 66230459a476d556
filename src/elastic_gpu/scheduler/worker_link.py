"""The scheduler process's side of the API worker (`apiworker`): start it, keep it running,
route its feeds into the state, answer `PodApi` calls through it, and wake the pending pods the
state says now fit (`SchedulerState.wakeups`, at most one round per `WAKEUP_PERIOD_S`).

With leader election (`leadership`), a standby's link feeds its state (warm) but writes
nothing: `writes_allowed` is False until it leads, and a write asked for then is refused
(definite: nothing was sent) and no wake-up round runs.

If the worker dies, calls in flight fail as *unknown* (a Binding may have landed; the bind
path then keeps its reservation until the truth arrives) and a new worker is started; its
first list of every feed replaces what the state holds, as any relist does.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from elastic_gpu.core.wakeup import Wake
from elastic_gpu.scheduler import ipc
from elastic_gpu.scheduler.handle import BindError

log = logging.getLogger(__name__)

#: Longer than the worker's own request timeout (10 s), so a slow API answers first.
CALL_TIMEOUT_S = 30.0
#: Wake-up rounds (`SchedulerState.wakeups`): a feed event that frees capacity while pods wait
#: starts one after `WAKEUP_DELAY_S` (kube-scheduler retries its parked pods on the same event,
#: and a retry that finds room ends the wait: nobody then needs waking); rounds are at least
#: `WAKEUP_PERIOD_S` apart (a burst of deletions is one round), and the state is also asked at
#: least every 2 x `WAKEUP_PERIOD_S` - `WAKEUP_DELAY_S` for capacity the feeds do not see free
#: (a refused bind, an expired reservation).
WAKEUP_DELAY_S = 0.05
WAKEUP_PERIOD_S = 0.2


class FeedSink(Protocol):
    """Where the worker's feeds go (`app.Feeds`)."""

    def nodes_replace(self, items: list[dict[str, Any]]) -> None: ...
    def nodes_event(self, kind: str, obj: dict[str, Any]) -> None: ...
    def devices_replace(self, items: list[dict[str, Any]]) -> None: ...
    def devices_event(self, kind: str, obj: dict[str, Any]) -> None: ...
    def pods_replace(self, items: list[dict[str, Any]]) -> None: ...
    def pods_event(self, kind: str, obj: dict[str, Any]) -> None: ...
    def egpus_replace(self, items: list[dict[str, Any]]) -> None: ...
    def egpus_event(self, kind: str, obj: dict[str, Any]) -> None: ...
    def claims_replace(self, items: list[dict[str, Any]]) -> None: ...
    def claims_event(self, kind: str, obj: dict[str, Any]) -> None: ...
    def classes_replace(self, items: list[dict[str, Any]]) -> None: ...
    def classes_event(self, kind: str, obj: dict[str, Any]) -> None: ...
    def wakeups(self) -> list[Wake]: ...
    def wakeup_pending(self) -> bool: ...
    def wakeup_result(self, wake: Wake, sent: bool, definite: bool) -> None: ...


class WorkerLink:
    def __init__(self, kubeconfig: Path | None, feeds: FeedSink, *,
                 log_level: str = "INFO") -> None:
        self.argv = [sys.executable, "-m", "elastic_gpu.scheduler.apiworker",
                     "--log-level", log_level]
        if kubeconfig is not None:
            self.argv += ["--kubeconfig", str(kubeconfig)]
        self.feeds = feeds
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[ipc.Result]] = {}
        self._process: asyncio.subprocess.Process | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.starts = 0
        #: numbers every wake-up message, so each one changes the pod (from the clock: a
        #: restarted scheduler does not repeat an earlier message)
        self._wake_ids = itertools.count(time.time_ns() // 1_000_000)
        self._wake_tasks: set[asyncio.Task[None]] = set()
        self._wake_now = asyncio.Event()
        #: False on a standby replica: binds, wake-ups and creates are refused (`leadership`)
        self.writes_allowed = True
        self._replaces = {
            "nodes": feeds.nodes_replace,
            "gpudevices": feeds.devices_replace,
            "pods": feeds.pods_replace,
            "elasticgpus": feeds.egpus_replace,
            "elasticgpuclaims": feeds.claims_replace,
            "elasticgpuclasses": feeds.classes_replace,
        }
        #: feed -> the pages of its list in progress (`_page`)
        self._listing: dict[str, list[dict[str, Any]]] = {}
        self._events = {"nodes": feeds.nodes_event, "gpudevices": feeds.devices_event,
                        "pods": feeds.pods_event, "elasticgpus": feeds.egpus_event,
                        "elasticgpuclaims": feeds.claims_event,
                        "elasticgpuclasses": feeds.classes_event}

    async def run(self) -> None:
        """Keep a worker running until cancelled."""
        failures = 0
        waker = asyncio.create_task(self._wake_loop(), name="wake-up")
        try:
            while True:
                process = await asyncio.create_subprocess_exec(
                    *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
                self._process = process
                self.starts += 1
                code = await self._serve(process)
                self._process = None
                self._fail_pending(f"the API worker exited (code {code})")
                failures += 1
                log.error("API worker exited with code %s; restarting", code)
                await asyncio.sleep(min(10.0, 0.2 * 2 ** min(failures, 6)))
        finally:
            waker.cancel()
            for task in list(self._wake_tasks):
                task.cancel()
            await self.close()

    async def _wake_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake_now.wait(), WAKEUP_PERIOD_S)
                await asyncio.sleep(WAKEUP_DELAY_S)
            except TimeoutError:
                pass  # the periodic look
            self._wake_now.clear()
            self._wake_round()
            await asyncio.sleep(WAKEUP_PERIOD_S - WAKEUP_DELAY_S)

    def _wake_round(self) -> None:
        if not self.writes_allowed:
            return  # a standby wakes nobody; the state keeps them for the leader
        if self._process is None:
            return  # no worker to send them: the state keeps them for the next round
        try:
            wakes = self.feeds.wakeups()
        except Exception:  # a bug here must not stop the API worker's supervision
            log.exception("choosing the pods to wake failed")
            return
        for wake in wakes:
            task = asyncio.create_task(self._wake(wake))
            self._wake_tasks.add(task)
            task.add_done_callback(self._wake_tasks.discard)

    async def _wake(self, wake: Wake) -> None:
        text = (f"wake-up {next(self._wake_ids)}: {wake.reason}" if wake.reason else
                f"wake-up {next(self._wake_ids)}: GPU capacity freed on node {wake.node}, "
                "where this pod now fits")
        try:
            await self._call(ipc.Wake(self._next_id(), wake.namespace, wake.name, wake.uid,
                                      text))
        except BindError as err:
            # definite: the API said no (gone, re-created); otherwise it may not have landed
            log.info("could not wake pod %s/%s: %s", wake.namespace, wake.name, err)
            self.feeds.wakeup_result(wake, False, err.definite)
            return
        log.debug("woke pod %s/%s (fits on %s)", wake.namespace, wake.name, wake.node)
        self.feeds.wakeup_result(wake, True, True)

    async def _serve(self, process: asyncio.subprocess.Process) -> int | None:
        assert process.stdout is not None
        self._listing.clear()  # a list the previous worker left unfinished is void
        try:
            while (message := await ipc.read(process.stdout, ipc.WORKER_MESSAGES)) is not None:
                self._on_message(message)
        except ipc.FrameError as err:
            # A message that does not decode is treated as a broken stream (not skipped):
            # the state is whole only if every page and event arrives, and a new worker's
            # first lists replace it.
            log.error("API worker stream: %s; restarting the worker", err)
            process.kill()
        return await process.wait()

    def _on_message(self, message: ipc.WorkerMessage) -> None:
        match message:
            case ipc.Reply():
                future = self._pending.pop(message.id, None)
                if future is None or future.done():
                    return
                if message.error is None:
                    future.set_result(message.result)
                else:
                    error = message.error
                    future.set_exception(BindError(error.message, definite=error.definite,
                                                   code=error.code))
            case ipc.Page():
                self._check_feed(message.feed)
                self._page(message.feed, message.first, message.last, message.items)
            case ipc.Event():
                self._check_feed(message.feed)
                self._events[message.feed](message.type, message.object)
                self._check_wakeup()

    def _check_feed(self, feed: str) -> None:
        if feed not in self._events:
            raise ipc.MessageError(f"a message of an unknown feed {feed!r}", None)

    def _page(self, feed: str, first: bool, last: bool, items: list[dict[str, Any]]) -> None:
        """One page of a feed's (re)list: the state is replaced once the last has come (a
        list begun again drops the pages of the one it replaces)."""
        if first:
            self._listing[feed] = items
        elif feed in self._listing:
            self._listing[feed].extend(items)
        else:
            log.warning("API worker sent a page of %s outside a list; ignored", feed)
            return
        if last:
            self._replaces[feed](self._listing.pop(feed))
            self._check_wakeup()

    def _check_wakeup(self) -> None:
        if not self._wake_now.is_set() and self.feeds.wakeup_pending():
            self._wake_now.set()

    def _fail_pending(self, why: str) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(BindError(why, definite=False))

    def _next_id(self) -> int:
        return next(self._ids)

    async def _call(self, request: ipc.Request) -> ipc.Result:
        if isinstance(request, ipc.WRITES) and not self.writes_allowed:
            raise BindError(f"this replica does not lead: it may not {ipc.tag(request)}",
                            definite=True)
        process = self._process
        if process is None or process.stdin is None or process.returncode is not None:
            raise BindError("the API worker is not running", definite=True)
        # The loop is asked once and the timeout is a timer of its own, not `wait_for` (its
        # wrapper future and callbacks): a call per bind, and in Python 3.11 each
        # `get_running_loop` is a getpid system call.
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        future: asyncio.Future[ipc.Result] = self._loop.create_future()
        timer = self._loop.call_later(CALL_TIMEOUT_S, self._timed_out, request, future)
        self._pending[request.id] = future
        process.stdin.write(ipc.encode(request))
        try:
            return await future
        finally:
            timer.cancel()

    def _timed_out(self, request: ipc.Request, future: asyncio.Future[ipc.Result]) -> None:
        self._pending.pop(request.id, None)
        if not future.done():
            future.set_exception(BindError(f"the API worker did not answer {ipc.tag(request)} "
                                           f"within {CALL_TIMEOUT_S:.0f} s", definite=False))

    async def _call_for_object(self, request: ipc.Request) -> dict[str, Any] | None:
        """A request answered by a slim object or None."""
        result = await self._call(request)
        if result is not None and not isinstance(result, dict):
            raise BindError(f"the API worker answered {ipc.tag(request)} with {result!r:.100}, "
                            "not an object", definite=False)
        return result

    async def resync(self, feed: str) -> None:
        """List `feed` again; returns once that list is in the state (`apiworker.resync`)."""
        await self._call(ipc.Resync(self._next_id(), feed))

    async def catch_up(self, feed: str, wait_s: float) -> str:
        """Returns once every change of `feed` the API held when called is in the state
        (`apiworker.Worker.catch_up`): "watch" (the watch passed the collection's current
        version) or "relist" (it did not within `wait_s`: listed again)."""
        return str(await self._call(ipc.CatchUp(self._next_id(), feed, wait_s)))

    # ---- PodApi -------------------------------------------------------------------------

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._call_for_object(ipc.GetPod(self._next_id(), namespace, name))

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   resource_version: int | None, annotations: Mapping[str, str]) -> None:
        await self._call(ipc.Bind(self._next_id(), namespace, name, uid, node,
                                  resource_version, dict(annotations)))

    # ---- ClaimApi -----------------------------------------------------------------------

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._call_for_object(
            ipc.GetEgpuObject(self._next_id(), "elasticgpuclaims", namespace, name))

    async def get_elasticgpu(self, name: str) -> dict[str, Any] | None:
        return await self._call_for_object(
            ipc.GetEgpuObject(self._next_id(), "elasticgpus", "", name))

    async def create_elasticgpu(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        created = await self._call_for_object(
            ipc.CreateElasticGpu(self._next_id(), dict(obj)))
        if created is None:
            raise BindError("the API worker answered create_elasticgpu with nothing",
                            definite=False)
        return created

    async def close(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            if process.stdin is not None:
                process.stdin.close()  # the worker exits at the end of its input
            try:
                await asyncio.wait_for(process.wait(), 5)
            except TimeoutError:
                process.kill()
                await process.wait()
        self._fail_pending("the scheduler is stopping")
