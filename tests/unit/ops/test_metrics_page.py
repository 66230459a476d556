"""The one `/metrics` page (`runtime.metrics`): every component's scrape is answered the same
way, text format by default and OpenMetrics when asked, on an aiohttp app or on a thread; the
families a component writes itself (`GaugeText`) are what prometheus_client would write."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from collections.abc import Iterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from elastic_gpu.runtime import metrics
from elastic_gpu.runtime.metrics import (
    GaugeText,
    MetricsThread,
    add_metrics,
    exposition,
    label_text,
    written_page,
)

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


# ---- families a component writes itself (`GaugeText`): as prometheus_client writes them ----

SERIES: list[tuple[dict[str, str], float]] = [
    ({"node": "n1", "device_index": "0", "model": "A100"}, 0),
    ({"node": "n1", "device_index": "1", "model": "A100"}, 1000),
    ({"node": "n2", "device_index": "0", "model": "T4"}, 85_899_345_920),  # 80 GiB in bytes
    ({"node": "n2", "device_index": "1", "model": 'odd "model"\\ with\na newline'}, 1.5),
    ({"node": "n3", "device_index": "7", "model": ""}, 1e-7),
]


def reference_page(reg: CollectorRegistry, accept: str, with_series: bool) -> bytes:
    """What prometheus_client itself writes for `reg` plus a gauge family of SERIES."""
    family = GaugeMetricFamily("egpu_test_card_value", "A value per card (1000 = one card)",
                               labels=["node", "device_index", "model"])
    for labels, value in SERIES if with_series else ():
        family.add_metric([labels["node"], labels["device_index"], labels["model"]], value)

    class One(Collector):
        def collect(self) -> Iterator[GaugeMetricFamily]:
            yield family

    reg.register(One())
    return exposition(reg, accept)[0]


def own_text(with_series: bool = True, pause: bool = False) -> list[bytes]:
    """The family of SERIES as `GaugeText` writes it; `pause`: an empty piece after each
    series (a pause for a writer on an event loop)."""
    gauge = GaugeText("egpu_test_card_value", "A value per card (1000 = one card)")
    pauses: list[bytes] = []
    for labels, value in SERIES if with_series else ():
        gauge.add(label_text(labels.items()), value)
        pauses += [b""] if pause else []
    return pauses + gauge.chunks()


@pytest.mark.parametrize("accept", ["", f"{OPENMETRICS}; version=1.0.0"])
@pytest.mark.parametrize("with_series", [True, False])
@pytest.mark.parametrize("lines_per_chunk", [2, metrics.LINES_PER_CHUNK])
def test_a_family_written_as_text_is_the_page_prometheus_client_writes(
        accept: str, with_series: bool, lines_per_chunk: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Label order, escaping of quotes, backslashes and newlines, Go's number format, an
    empty family's HELP and TYPE, and OpenMetrics' `# EOF` last: byte for byte, whether the
    family is encoded in one chunk or in several."""
    monkeypatch.setattr(metrics, "LINES_PER_CHUNK", lines_per_chunk)
    reg = registry()  # one: a counter's page carries its creation time
    pieces, content_type = asyncio.run(written_page(reg, accept,
                                                   lambda: own_text(with_series)))
    page = b"".join(pieces)
    expected = reference_page(reg, accept, with_series)
    assert page.count(b"egpu_test_card_value{") == (len(SERIES) if with_series else 0)
    assert page == expected
    assert content_type == exposition(reg, accept)[1]


def test_the_page_with_own_families_parses_in_both_formats() -> None:
    page = b"".join(asyncio.run(written_page(registry(), "", own_text))[0]).decode()
    names = {f.name for f in text_string_to_metric_families(page)}
    assert {"egpu_test_things", "egpu_test_card_value"} <= names
    page = b"".join(asyncio.run(written_page(registry(), OPENMETRICS,
                                             lambda: own_text(pause=True)))[0]).decode()
    (card,) = [f for f in openmetrics_families(page) if f.name == "egpu_test_card_value"]
    assert [s.value for s in card.samples] == [v for _, v in SERIES]
    assert card.samples[3].labels["model"] == 'odd "model"\\ with\na newline'


def test_documentation_the_two_formats_escape_differently_is_refused() -> None:
    for text in ('a "quoted" word', "a back\\slash", "two\nlines"):
        with pytest.raises(ValueError, match="quote, backslash or newline"):
            GaugeText("egpu_test_x", text)
