"""The controller's client of the extender's `POST /provision` (docs/claims.md, contract 2).

The extender is the only component that chooses cards; the controller asks it to provision
a claim and reads one of three answers. TLS mirrors the extender's options: verify its
serving certificate with `ca`, present `client_cert`/`client_key` when it requires mTLS.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec


class ProvisionError(Exception):
    """No usable answer (unreachable, 4xx/5xx, a body we cannot read); retried with backoff."""


@dataclass(frozen=True)
class TLSOptions:
    ca: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None

    def context(self) -> ssl.SSLContext | None:
        if self.ca is None and self.client_cert is None:
            return None
        context = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
        if self.client_cert is not None:
            context.load_cert_chain(str(self.client_cert),
                                    str(self.client_key) if self.client_key else None)
        return context


class ProvisionAnswer(msgspec.Struct, rename="camel"):
    result: str
    elastic_gpu: str = msgspec.field(default="", name="elasticGPU")
    node: str = ""
    reason: str = ""
    message: str = ""
    decision: str = ""


RESULTS = ("Provisioned", "Pending", "NotNeeded")


class ExtenderClient:
    def __init__(self, url: str, tls: TLSOptions | None = None, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._ssl = (tls or TLSOptions()).context()
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self.calls = 0

    async def provision(self, namespace: str, name: str, uid: str) -> ProvisionAnswer:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False))
        self.calls += 1
        body = {"namespace": namespace, "name": name, "uid": uid}
        try:
            async with self._session.post(f"{self.url}/provision", json=body) as response:
                data = await response.read()
                if response.status != 200:
                    text = data[:300].decode(errors="replace").strip()
                    raise ProvisionError(f"POST {self.url}/provision: {response.status} {text}")
        except (TimeoutError, aiohttp.ClientError) as err:
            raise ProvisionError(f"POST {self.url}/provision: {type(err).__name__}: {err}") from None
        try:
            answer = msgspec.json.decode(data, type=ProvisionAnswer)
        except msgspec.DecodeError as err:
            raise ProvisionError(f"POST {self.url}/provision: unreadable answer: {err}") from None
        if answer.result not in RESULTS:
            raise ProvisionError(f"POST {self.url}/provision: result {answer.result!r} is not one "
                                 f"of {', '.join(RESULTS)}")
        return answer

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
