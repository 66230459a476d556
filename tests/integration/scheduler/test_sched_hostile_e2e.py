"""The extender's edges under hostile input, on the real control plane and over real mutual
TLS (issue 26, items 8 and 9): `egpu scheduler` as a process, as deployed.

- Item 8: a 100,000-deep nested JSON list answered 500 (RecursionError) on filter, prioritize
  and preempt; now 400 naming the depth and the limit, and the server keeps serving.
- Item 9: idle TLS connections were never closed (1,200 stayed 60 s; at the fd limit new
  connections were reset). With small timeouts and cap from the extender's config: a flood
  beyond the cap leaves the server up and a real request answered, and every idle connection
  is closed by the server once the idle/header timeout passes.
"""

from __future__ import annotations

import http.client
import json
import ssl
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.flood import close_all, closed_by_server, idle_tcp, idle_tls, wait_until
from egpu_testing.workbench import ExtenderProcess, TestPki
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

DEEP = b"[" * 100_000 + b"]" * 100_000
#: small bounds so the test sees them act (the defaults are 32 s, 90 s and 1,024)
LIMITS = {"headerTimeoutSeconds": 3, "idleTimeoutSeconds": 3, "maxConnections": 40}


@pytest.fixture(scope="module")
def served(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory
           ) -> Any:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    ensure_crd(k8s_cluster.kube())
    work = tmp_path_factory.mktemp("hostile")
    pki = TestPki.create(work)
    (port,) = free_ports(1)
    extender = ExtenderProcess(k8s_cluster.kubeconfig, port, work / "extender.log", tls=pki,
                               config=LIMITS)
    extender.start()
    yield extender, pki
    extender.stop()


def _post(port: int, context: ssl.SSLContext, path: str, body: bytes) -> tuple[int, Any]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=60, context=context)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _ready(port: int, context: ssl.SSLContext) -> int:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=60, context=context)
    try:
        conn.request("GET", "/readyz")
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt"])
def test_deep_nesting_is_a_400_naming_the_limit(served: Any, verb: str) -> None:
    extender, pki = served
    context = pki.client_context()
    for body in (DEEP, b'{"Pod": {}, "NodeNames": ' + DEEP + b"}"):
        status, answer = _post(extender.port, context, f"/{verb}", body)
        assert status == 400, (status, answer)
        assert "levels deep, more than the limit of 256" in answer["Error"], answer
    assert _ready(extender.port, context) == 200  # and it keeps serving
    assert "RecursionError" not in extender.log_path.read_text()


def test_a_flood_of_idle_connections_is_bounded_and_closed(served: Any, tmp_path: Path
                                                          ) -> None:
    extender, pki = served
    context = pki.client_context()
    cap = LIMITS["maxConnections"]
    flood = idle_tls(extender.port, context, 2 * cap)  # handshake done, never a request
    bare = idle_tcp(extender.port, cap)  # never even a handshake
    try:
        # beyond the cap: the server is up and a real request is answered (the oldest idle
        # connections made room for it)
        assert _ready(extender.port, context) == 200
        status, answer = _post(extender.port, context, "/filter", DEEP)
        assert status == 400 and "levels deep" in answer["Error"]
        # every idle connection is closed by the server after the timeouts
        wait_until(lambda: all(closed_by_server(s) for s in flood),
                   f"the extender closes {len(flood)} idle TLS connections (idle and header "
                   f"timeouts {LIMITS['idleTimeoutSeconds']} s)")
        wait_until(lambda: all(closed_by_server(s) for s in bare),
                   f"the extender closes {len(bare)} connections that never started TLS")
        assert _ready(extender.port, context) == 200
    finally:
        close_all(flood)
        close_all(bare)
