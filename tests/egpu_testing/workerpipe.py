"""The API worker in this process, joined to a `WorkerLink` by two in-memory streams that
carry the real frames (`scheduler.ipc`): both sides of the link's protocol without a child
process or an API server. `ApiRecorder` stands in for the worker's `RestClient`."""

from __future__ import annotations

import asyncio
from typing import Any

from elastic_gpu.kube.transport import ApiStatusError
from elastic_gpu.scheduler import apiworker, ipc
from elastic_gpu.scheduler.worker_link import WorkerLink


class ApiRecorder:
    """A `RestClient` that records each request and answers from `answers` (method, path)
    -> bytes or an `ApiStatusError` to raise; anything else is a 404."""

    def __init__(self, answers: dict[tuple[str, str], bytes | ApiStatusError] | None = None
                 ) -> None:
        self.answers = answers or {}
        self.requests: list[tuple[str, str, bytes | None]] = []

    async def request(self, method: str, path: str, *, body: bytes | None = None,
                      params: dict[str, str] | None = None,
                      content_type: str | None = None) -> bytes:
        self.requests.append((method, path, body))
        answer = self.answers.get((method, path), ApiStatusError(404, "NotFound", path))
        if isinstance(answer, ApiStatusError):
            raise answer
        return answer


class _Stdin:
    """The worker's end of the link's `process.stdin`."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def write(self, data: bytes) -> None:
        self.reader.feed_data(data)

    def close(self) -> None:
        self.reader.feed_eof()


class PipedWorker:
    """What `WorkerLink._serve` and `_call` use of the worker's process, served by a real
    `apiworker.Worker` over `apiworker.serve` (its feeds not started)."""

    def __init__(self, client: ApiRecorder) -> None:
        self.requests = asyncio.StreamReader()
        self.stdin = _Stdin(self.requests)
        self.stdout = asyncio.StreamReader()
        self.returncode: int | None = None
        self.sent: list[ipc.WorkerMessage] = []
        self.worker = apiworker.Worker(client, self.send)  # type: ignore[arg-type]
        self._exited = asyncio.Event()

    def send(self, message: ipc.WorkerMessage) -> None:
        self.sent.append(message)
        self.send_frame(ipc.encode(message))

    def send_frame(self, frame: bytes) -> None:
        """Bytes on the worker's stdout, as they are (a test's broken frame included)."""
        if self.returncode is None:
            self.stdout.feed_data(frame)

    async def serve(self) -> None:
        """The worker's side until its stdin closes; then it exits (code 0)."""
        async def drain() -> None:
            return None  # frames go straight into `stdout`'s buffer: nothing waits to flush

        await apiworker.serve(self.requests, self.worker, drain)
        self._exit(0)

    def kill(self) -> None:
        self._exit(-9)

    def _exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self.stdout.feed_eof()
            self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode


async def linked(link: WorkerLink, process: Any) -> asyncio.Task[int | None]:
    """Make `process` the link's worker and read its messages, as `WorkerLink.run` does."""
    link._process = process
    return asyncio.create_task(link._serve(process))
