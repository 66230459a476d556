"""The one `/metrics` page (`runtime.metrics`): every component's scrape is answered the same
way, text format by default and OpenMetrics when asked, on an aiohttp app or on a thread."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, Counter, Gauge

from elastic_gpu.runtime.metrics import MetricsThread, add_metrics

OPENMETRICS = "application/openmetrics-text"


def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("egpu_test_things", "Things", registry=reg).inc(3)
    return reg


async def test_an_app_serves_the_text_format_or_openmetrics_as_asked() -> None:
    app = web.Application()
    add_metrics(app, registry())
    async with TestClient(TestServer(app)) as client:
        plain = await client.get("/metrics")
        assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert "egpu_test_things_total 3.0" in await plain.text()
        asked = await client.get("/metrics", headers={"Accept": OPENMETRICS})
        assert asked.headers["Content-Type"].startswith(OPENMETRICS)
        assert (await asked.text()).rstrip().endswith("# EOF")


async def test_refresh_runs_before_each_scrape() -> None:
    reg = CollectorRegistry()
    depth = Gauge("egpu_test_depth", "Depth", registry=reg)
    scrapes: list[int] = []

    def refresh() -> None:
        scrapes.append(1)
        depth.set(len(scrapes))

    app = web.Application()
    add_metrics(app, reg, refresh=refresh)
    async with TestClient(TestServer(app)) as client:
        await client.get("/metrics")
        text = await (await client.get("/metrics")).text()
    assert "egpu_test_depth 2.0" in text


def test_a_thread_serves_the_same_page_until_stopped() -> None:
    server = MetricsThread(registry())
    port = server.start("127.0.0.1", 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert b"egpu_test_things_total 3.0" in answer.read()
    server.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_a_thread_reports_a_port_in_use_to_its_caller() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            MetricsThread(registry()).start("127.0.0.1", taken.getsockname()[1])
