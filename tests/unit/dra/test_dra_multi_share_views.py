"""A DRA claim asking `count: 2` with capacity (issue 40) in the quota and in `egpu top`: the
quota counts the share twice (canonical units, one per card), and `egpu top` shows the claim
on each of its two cards with the share it holds there."""

from __future__ import annotations

from rich.console import Console

from egpu_testing.dra import claim_object, result
from elastic_gpu.cli.top import Objects, render, view_from_objects
from elastic_gpu.core.dra.devices import node_slices
from elastic_gpu.core.dra.quota import Demand, claim_demand
from elastic_gpu.core.model import Card

NODE = "dra-1"
CONSUMED = {"compute": "30", "memory": "8Gi"}


def test_the_quota_counts_each_cards_share() -> None:
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.elasticgpu.io", "count": 2,
        "capacity": {"requests": CONSUMED}}}]}}
    assert claim_demand(spec) == Demand(60, 16384)


def test_top_shows_the_share_on_each_of_its_cards() -> None:
    cards = [Card(i, f"GPU-{i}", "A100", 81920) for i in range(3)]
    claim = claim_object("multi", "ml", "u1", NODE, [
        result(NODE, "gpu-0", consumed=CONSUMED, share_id="s0"),
        result(NODE, "gpu-2", consumed=CONSUMED, share_id="s2")])
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "u-p"}]
    view = view_from_objects(Objects(
        nodes=[{"metadata": {"name": NODE}, "status": {"capacity": {
            "node.elasticgpu.io/gpu-core": "300"}}}],
        devices=[], pods=[], elasticgpus=[], slices=node_slices(NODE, cards, generation=1),
        claims=[claim]))
    (node,) = view.nodes
    held = {c.index: [(h.name, h.milli, h.memory_mib, h.users) for h in c.holders]
            for c in node.cards}
    assert held == {0: [("ml/multi", 300, 8192, ("ml/p",))], 1: [],
                    2: [("ml/multi", 300, 8192, ("ml/p",))]}
    console = Console(record=True, width=200, color_system=None)
    console.print(render(view))
    assert console.export_text().count("claim ml/multi used by ml/p 30%") == 2
