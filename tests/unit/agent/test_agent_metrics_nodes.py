"""The agent's card and usage families for several nodes on one page (the sandbox's kwok nodes,
served by `allocation-sync`): one family per name, each node's series under its `node` label."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from prometheus_client import generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from egpu_testing.workbench import metric_value
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.metrics import NodeMetrics, merge_families, nodes_families, nodes_registry
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Card
from elastic_gpu.core.usage import CardUsage, ContainerRef, ContainerUsage, OverShare

MIB = 1 << 20
INVENTORY = {"cards": [{"model": "A100", "memoryMiB": 40960} for _ in range(2)]}


def cards(node: str) -> list[Card]:
    return FakeBackend.from_dict(INVENTORY, node).discover()


def pod(node: str, name: str, card: int, milli: int, mib: int) -> dict[str, Any]:
    share = CardShare(card, f"GPU-fake-{node}-{card}", milli, mib)
    assignment = Assignment(node, {"main": (share,)})
    return {"metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}",
                         "annotations": {ann.ASSIGNMENT: assignment.to_json(),
                                         ann.ASSIGNED_NODE: node}},
            "spec": {"nodeName": node, "containers": [{"name": "main"}]},
            "status": {"phase": "Running"}}


def node_a() -> NodeMetrics:
    """Card 0 shared by one pod using more than its 4 GiB share."""
    used = CardUsage(6000, 0, 30, containers=(ContainerUsage("team-a", "hot", "main", 6000, 30),))
    return NodeMetrics("a", cards("a"), [pod("a", "hot", 0, 300, 4096)], {0: used},
                       [OverShare(ContainerRef("team-a", "hot", "main"), 0, 6000, 4096)], 3)


def node_b() -> NodeMetrics:
    """Card 1 held whole, with 1 GiB out of band; card 0 not sampled yet."""
    used = CardUsage(41000, 1024, 90,
                     containers=(ContainerUsage("team-a", "whole", "main", 39976, 90),))
    return NodeMetrics("b", cards("b"), [pod("b", "whole", 1, 1000, 40960)], {1: used}, [], 1)


def test_one_family_per_name_with_every_nodes_series() -> None:
    families = nodes_families([node_a(), node_b()])
    names = [f.name for f in families]
    assert len(names) == len(set(names))
    by_name = {f.name: f for f in families}
    capacity = by_name["elasticgpu_agent_card_compute_capacity_millicards"]
    assert sorted((s.labels["node"], s.labels["device_index"]) for s in capacity.samples) == [
        ("a", "0"), ("a", "1"), ("b", "0"), ("b", "1")]
    writes = by_name["elasticgpu_agent_usage_writes"]
    assert writes.type == "counter"
    assert {s.labels["node"]: s.value for s in writes.samples} == {"a": 3, "b": 1}


def test_the_page_is_valid_and_each_node_reads_as_its_agent_would() -> None:
    text = generate_latest(nodes_registry(lambda: [node_a(), node_b()])).decode()
    # the exposition format has one HELP per name: a per-node family twice would break it
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert len(helps) == len(set(helps))
    parsed = {f.name for f in text_string_to_metric_families(text)}
    assert "elasticgpu_agent_container_gpu_memory_used_bytes" in parsed
    hot = 'pod="hot",node="a",device_index="0"'
    assert metric_value(text, f"elasticgpu_agent_container_gpu_memory_used_bytes{{{hot}}}"
                        ) == 6000 * MIB
    assert metric_value(text, f"elasticgpu_agent_container_over_share{{{hot}}}") == 1
    assert metric_value(text, f"elasticgpu_agent_container_memory_allocated_bytes{{{hot}}}"
                        ) == 4096 * MIB
    whole = 'node="b",device_index="1"'
    assert metric_value(text, f"elasticgpu_agent_card_gpu_memory_used_bytes{{{whole}}}"
                        ) == 41000 * MIB
    assert metric_value(text, f"elasticgpu_agent_card_out_of_band_memory_bytes{{{whole}}}"
                        ) == 1024 * MIB
    assert metric_value(text, f"elasticgpu_agent_card_compute_allocated_millicards{{{whole}}}"
                        ) == 1000
    # no over-share series for node b's holder, no usage series for an unsampled card
    assert metric_value(text, 'elasticgpu_agent_container_over_share{node="b"}') is None
    assert metric_value(text, 'elasticgpu_agent_card_gpu_memory_used_bytes{node="b",'
                        'device_index="0"}') is None
    # the whole agent page, as docs/metrics.md lists it: the fake cards' MIG mode never
    # waits for a reset, 0 for each card of each node
    assert {(n, i): metric_value(text, f'elasticgpu_agent_mig_pending_reset{{node="{n}",'
                                 f'device_index="{i}"}}')
            for n in "ab" for i in "01"} == {(n, i): 0 for n in "ab" for i in "01"}


def test_each_scrape_reads_the_nodes_then() -> None:
    nodes: list[NodeMetrics] = []
    server, _ = start_http_server(0, "127.0.0.1", nodes_registry(lambda: nodes))
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"

        def scrape() -> str:
            with urllib.request.urlopen(url, timeout=5) as response:
                return str(response.read().decode())
        assert "elasticgpu_agent_" not in scrape()  # no node sampled yet: no series
        nodes.append(node_b())
        assert metric_value(scrape(), 'elasticgpu_agent_card_healthy{node="b"}') == 2
    finally:
        server.shutdown()
        server.server_close()


def test_merging_keeps_order_and_refuses_two_types_of_one_name() -> None:
    first, second = GaugeMetricFamily("x", "doc", labels=["node"]), GaugeMetricFamily(
        "x", "doc", labels=["node"])
    first.add_metric(["a"], 1)
    second.add_metric(["b"], 2)
    other = GaugeMetricFamily("y", "doc", value=3)
    (x, y) = merge_families([first, other, second])
    assert (x.name, y.name) == ("x", "y")
    assert [(s.labels, s.value) for s in x.samples] == [({"node": "a"}, 1), ({"node": "b"}, 2)]
    assert len(first.samples) == 1  # the inputs are left as they were
    with pytest.raises(ValueError, match="x"):
        merge_families([first, CounterMetricFamily("x", "doc", value=1)])
