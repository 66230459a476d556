"""A lean Kubernetes REST client for hot paths: aiohttp for HTTP, msgspec for JSON.

The scheduler's API worker binds a pod and decodes several watch events per scheduled pod.
lightkube builds a typed model of every object and goes through httpx: 1.7 ms of CPU per
Binding on the development box against 0.6 ms here (bench/k8s_bind_cost.py; docs/benchmarks.md,
"Where the time went"). Configuration (kubeconfig file or
in-cluster service account, TLS, client certificates) is still read by lightkube's parser, so
both clients accept the same files.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import aiohttp
import msgspec

from elastic_gpu.kube.kubeconfig import ClientConfigError, load_config

log = logging.getLogger(__name__)

#: Re-read a token file this often: projected service-account tokens rotate.
TOKEN_REFRESH_S = 60.0
#: Items per page of a list: client-go's reflector pages its lists by 500 too.
LIST_PAGE = 500


class ApiStatusError(Exception):
    """The API server answered with an error status (or could not be reached: code 0)."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}".strip() if code else message)
        self.code = code
        self.reason = reason
        self.message = message

    @property
    def definite(self) -> bool:
        """True when the request was certainly not applied: 4xx other than 429."""
        return 400 <= self.code < 500 and self.code != 429


class _Auth:
    """The Authorization header of a kubeconfig user: token, token file or basic."""

    def __init__(self, token: str | None, token_file: str | None,
                 basic: tuple[str, str] | None) -> None:
        self.token = token
        self.token_file = token_file
        self.basic = basic
        self._read_at = 0.0

    def header(self) -> str | None:
        if self.token_file is not None and time.monotonic() - self._read_at > TOKEN_REFRESH_S:
            try:
                self.token = Path(self.token_file).read_text().strip()
                self._read_at = time.monotonic()
            except OSError as err:
                log.warning("cannot re-read token file %s: %s", self.token_file, err)
        if self.token:
            return f"Bearer {self.token}"
        if self.basic is not None:
            return aiohttp.BasicAuth(*self.basic).encode()
        return None


class RestClient:
    """JSON over one kept-alive aiohttp session to the API server."""

    def __init__(self, server: str, ssl_context: Any, auth: _Auth, *,
                 timeout_s: float = 10.0, max_connections: int = 64) -> None:
        self.server = server.rstrip("/")
        self._ssl = ssl_context
        self._auth = auth
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_config(cls, kubeconfig: Path | None, **kwargs: Any) -> RestClient:
        """From a kubeconfig file, or the in-cluster service account when it is None."""
        from lightkube.config.client_adapter import verify_cluster

        where = str(kubeconfig) if kubeconfig is not None else "the in-cluster service account"
        _, single = load_config(kubeconfig)
        user = single.user
        if user.exec or user.auth_provider:
            raise ClientConfigError(f"{where}: exec and auth-provider credentials are not "
                                    "supported; use a client certificate or a token")
        server = single.cluster.server
        ssl_context = (verify_cluster(single.cluster, user, single.abs_file, trust_env=False)
                       if server.startswith("https://") else None)
        token_file = str(single.abs_file(user.token_file)) if user.token_file else None
        basic = (user.username, user.password) if user.username and user.password else None
        return cls(server, ssl_context, _Auth(user.token, token_file, basic), **kwargs)

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        auth = self._auth.header()
        if auth is not None:
            headers["Authorization"] = auth
        if content_type is not None:
            headers["Content-Type"] = content_type
        return headers

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False,
                                             limit=self._max_connections)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def request(self, method: str, path: str, *, body: bytes | None = None,
                      params: Mapping[str, str] | None = None,
                      content_type: str = "application/json") -> bytes:
        """The response body; raises ApiStatusError for error statuses and transport errors.
        `content_type`: of the body (a PATCH names its patch type)."""
        session = self._session_now()
        try:
            async with session.request(
                    method, self.server + path, data=body, params=params,
                    headers=self._headers(content_type if body is not None else None),
                    ) as response:
                data = await response.read()
                if response.status >= 400:
                    raise status_error(response.status, data)
                return data
        except (TimeoutError, aiohttp.ClientError) as err:
            raise ApiStatusError(0, "", f"{type(err).__name__}: {err}") from None

    async def list(self, path: str, params: Mapping[str, str] | None = None,
                   chunk: int = LIST_PAGE) -> tuple[list[dict[str, Any]], str]:
        """Every item of a collection (paged), and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        version = ""
        async for page in self.list_pages(path, params, chunk):
            items.extend(page.items)
            version = page.resource_version
        return items, version

    async def list_pages(self, path: str, params: Mapping[str, str] | None = None,
                         chunk: int = LIST_PAGE, shape: type[msgspec.Struct] | None = None,
                         ) -> AsyncIterator[ListPage]:
        """A collection's list, one page of at most `chunk` items at a time (`limit` and
        `continue`, as client-go's pager): a caller that handles each page as it comes never
        holds the whole list's JSON, nor more than one page of its objects as the API
        serves them. The pages are one snapshot: every page carries the first one's
        resourceVersion, the one to watch from. A continue token the API no longer honours
        (compacted past it: 410 Expired) is raised like any error status: the list must
        start again from its first page (the pages so far are of a snapshot now gone).
        `shape`: a Struct of the fields wanted (omitting unset ones): each item is decoded
        into it, and handed over as the dict of just those fields; the decoder skips the
        rest of the JSON without building it."""
        query = {**(params or {}), "limit": str(chunk)}
        page_type: Any = _ListPage if shape is None else _ShapedPage[shape]  # type: ignore[valid-type]
        while True:
            page = msgspec.json.decode(await self.request("GET", path, params=query),
                                       type=page_type)
            token = page.metadata.get("continue")
            items = page.items if shape is None else msgspec.to_builtins(page.items)
            yield ListPage(items, str(page.metadata.get("resourceVersion", "")),
                           last=not token)
            if not token:
                return
            query["continue"] = token

    async def watch(self, path: str, resource_version: str,
                    params: Mapping[str, str] | None = None, timeout_s: int = 300, *,
                    shape: type[msgspec.Struct] | None = None,
                    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, object) events from `resource_version` until the server ends the watch.

        An ERROR event (e.g. 410 Gone: the version is too old) is raised as ApiStatusError.
        `shape`: as `list_pages`'s, for each event's object (`WatchDecoder`).
        """
        session = self._session_now()
        decode = WatchDecoder(shape)
        query = {**(params or {}), "watch": "1", "resourceVersion": resource_version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_s)}
        try:
            async with session.get(self.server + path, params=query, headers=self._headers(),
                                   timeout=aiohttp.ClientTimeout(total=timeout_s + 30,
                                                                 sock_connect=10)) as response:
                if response.status >= 400:
                    raise status_error(response.status, await response.read())
                async for line in response.content:
                    if not line.strip():
                        continue
                    yield decode(line)
        except (TimeoutError, aiohttp.ClientError) as err:
            raise ApiStatusError(0, "", f"{type(err).__name__}: {err}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class ListPage(NamedTuple):
    """One page of a list: its items, the list's resourceVersion, whether it is the last."""

    items: list[dict[str, Any]]
    resource_version: str
    last: bool


class _ListPage(msgspec.Struct):
    items: list[dict[str, Any]] = msgspec.field(default_factory=list)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


Item = TypeVar("Item")


class _ShapedPage(msgspec.Struct, Generic[Item]):
    items: list[Item] = msgspec.field(default_factory=list)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class _WatchEvent(msgspec.Struct):
    type: str
    object: dict[str, Any]


class _ShapedWatchEvent(msgspec.Struct, Generic[Item]):
    type: str
    object: Item


class WatchDecoder:
    """One line of a watch into (type, object). Without a shape the object is decoded whole;
    with one (`list_pages`'s: a Struct of the fields wanted, omitting unset ones) only its
    fields are built, in the same pass, and the object is the dict of those, as a list page's
    items are: the scheduler's API worker reads a few fields of each pod and node event, and
    building the rest (managedFields, conditions, images) was most of its cost per event
    (bench/sched_event_decode.py). An ERROR event is raised as ApiStatusError."""

    def __init__(self, shape: type[msgspec.Struct] | None = None) -> None:
        self._whole = msgspec.json.Decoder(_WatchEvent)
        self._shaped: msgspec.json.Decoder[Any] | None = (
            msgspec.json.Decoder(_ShapedWatchEvent[shape])  # type: ignore[valid-type]
            if shape is not None else None)

    def __call__(self, line: bytes) -> tuple[str, dict[str, Any]]:
        if self._shaped is None:
            event = self._whole.decode(line)
            if event.type == "ERROR":
                raise self._error(event.object)
            return event.type, event.object
        try:
            shaped = self._shaped.decode(line)
        except msgspec.ValidationError:
            # an ERROR's object is a Status (its `status` is a string): it may fit no shape
            whole = self._whole.decode(line)
            if whole.type == "ERROR":
                raise self._error(whole.object) from None
            raise
        if shaped.type == "ERROR":  # a Status that fits the shape: read it whole
            raise self._error(self._whole.decode(line).object)
        obj: dict[str, Any] = msgspec.to_builtins(shaped.object)
        return shaped.type, obj

    @staticmethod
    def _error(status: dict[str, Any]) -> ApiStatusError:
        return status_error(int(status.get("code") or 500), msgspec.json.encode(status))


class _Status(msgspec.Struct):
    reason: str = ""
    message: str = ""


def status_error(code: int, body: bytes) -> ApiStatusError:
    try:
        status = msgspec.json.decode(body, type=_Status)
        return ApiStatusError(code, status.reason, status.message)
    except msgspec.DecodeError:
        return ApiStatusError(code, "", body[:200].decode(errors="replace"))
