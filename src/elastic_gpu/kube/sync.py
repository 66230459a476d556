"""`KubeClient` for code that runs in threads (the agent, the sandbox, the CLI).

One event loop in a daemon thread owns the client (its aiohttp session belongs to that loop);
every verb is the async client's, run there and waited for. So a thread gets the same paths,
the same typed errors (`kube.errors`) and the same transport as the async components: one
client stack (docs/architecture.md, "One client stack"). `run_informer` runs a
`kube.informer.Informer` in the same loop, for a thread that wants a watched cache.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from elastic_gpu.kube.client import MERGE_PATCH, KubeClient
from elastic_gpu.kube.informer import Informer

T = TypeVar("T")

#: How long one call may take before the caller gives up on it (the request's own timeout is
#: the transport's; this is a backstop for a loop that stopped).
CALL_TIMEOUT_S = 120.0


class SyncKubeClient:
    """get / list / create / update / patch / delete, blocking; objects as plain dicts."""

    def __init__(self, make_client: Callable[[], KubeClient], *, name: str = "kube") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"{name}-loop",
                                        daemon=True)
        self._thread.start()
        self._client = self._run_now(_make(make_client))
        self._closed = False

    @classmethod
    def from_config(cls, kubeconfig: Path | None, **kwargs: Any) -> SyncKubeClient:
        """From a kubeconfig file, or the in-cluster service account when it is None; kwargs
        go to `KubeClient.from_config` (timeout_s, max_connections, field_manager)."""
        client = KubeClient.from_config(kubeconfig, **kwargs)  # raises ClientConfigError here
        return cls(lambda: client)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def async_client(self) -> KubeClient:
        """The client the loop owns: only for coroutines run in `loop`."""
        return self._client

    def _run_now(self, coro: Awaitable[T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        return asyncio.run_coroutine_threadsafe(_awaited(coro), self._loop).result(timeout_s)

    def run(self, coro: Awaitable[T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        """Run a coroutine (built on `async_client`) in the client's loop and wait for it."""
        return self._run_now(coro, timeout_s)

    def submit(self, coro: Awaitable[T]) -> Future[T]:
        """Start a coroutine in the client's loop without waiting (a watch loop, say)."""
        return asyncio.run_coroutine_threadsafe(_awaited(coro), self._loop)

    def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        return self._run_now(self._client.get(path, params))

    def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self._run_now(self._client.create(path, obj))

    def update(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self._run_now(self._client.update(path, obj))

    def patch(self, path: str, patch: Any, content_type: str = MERGE_PATCH,
              params: Mapping[str, str] | None = None) -> dict[str, Any]:
        return self._run_now(self._client.patch(path, patch, content_type=content_type,
                                                params=params))

    def delete(self, path: str, *, uid: str | None = None, resource_version: str | None = None,
               grace_period_s: int | None = None) -> dict[str, Any]:
        return self._run_now(self._client.delete(path, uid=uid,
                                                 resource_version=resource_version,
                                                 grace_period_s=grace_period_s))

    def list(self, path: str, params: Mapping[str, str] | None = None
             ) -> tuple[list[dict[str, Any]], str]:
        return self._run_now(self._client.list(path, params))

    def run_informer(self, informer: Informer) -> Future[None]:
        """Run `informer` (built on `async_client`) in the client's loop until `close`. Its
        handlers run in that loop's thread: they must be quick and thread-safe."""
        return self.submit(informer.run())

    def close(self) -> None:
        """Cancel what runs in the loop, close the session, stop the thread."""
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._client.close()

        try:
            self._run_now(shutdown(), timeout_s=10.0)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10.0)
            if not self._loop.is_running():
                self._loop.close()

    def __enter__(self) -> SyncKubeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _make(make_client: Callable[[], KubeClient]) -> KubeClient:
    return make_client()


async def _awaited(coro: Awaitable[T]) -> T:
    return await coro
