"""Issue 41, DRA nodes in every view: `egpu top` shows a DRA node's cards from its
ResourceSlices (MIG instances included, the pool's newest generation only) and what each
allocated ResourceClaim holds there, once, with the pods it is reserved for
(`core.dra.sliceview`, `cli.top`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from egpu_testing.dra import claim_object, result
from elastic_gpu.cli.top import Objects, render, view_from_objects
from elastic_gpu.core.dra.devices import mig_device, node_slices
from elastic_gpu.core.dra.sliceview import node_cards
from elastic_gpu.core.model import Card, Health, MigInstance
from elastic_gpu.core.resources import MigProfile

NODE = "dra-1"
MIG = MigInstance(MigProfile(3, 40), "MIG-a", start=0)
CARDS = [Card(0, "GPU-0", "A100", 81920), Card(1, "GPU-1", "A100", 81920, health=Health.UNHEALTHY),
         Card(2, "GPU-2", "A100", 81920, mig=(MIG,))]


def reserved(claim: dict[str, Any], *pods: str) -> dict[str, Any]:
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"u-{p}"}
                                      for p in pods]
    return claim


def objects() -> Objects:
    stale = node_slices(NODE, [Card(0, "GPU-old", "T4", 16384)], generation=1)
    return Objects(
        nodes=[{"metadata": {"name": NODE}, "status": {"capacity": {
            "node.elasticgpu.io/gpu-core": "300"}}}],
        devices=[], pods=[], elasticgpus=[],
        slices=[*stale, *node_slices(NODE, CARDS, generation=2)],
        claims=[reserved(claim_object("whole", "ml", "u1", NODE, [result(NODE, "gpu-0")]),
                         "a", "b"),
                reserved(claim_object("mig", "ml", "u2", NODE,
                                      [result(NODE, mig_device(2, MIG))]), "c"),
                claim_object("gone", "ml", "u3", NODE, [result(NODE, "gpu-9")])])


def test_cards_read_back_from_the_slices() -> None:
    cards = node_cards(node_slices(NODE, CARDS, generation=2))
    assert [(c.index, c.uuid, c.memory_mib, c.healthy) for c in cards[NODE]] == [
        (0, "GPU-0", 81920, True), (1, "GPU-1", 81920, False), (2, "GPU-2", 81920, True)]
    assert cards[NODE][2].mig == (MIG,)


def test_top_shows_a_dra_node_its_claims_and_their_pods() -> None:
    view = view_from_objects(objects())
    (node,) = view.nodes
    assert node.name == NODE and [c.uuid for c in node.cards] == ["GPU-0", "GPU-1", "GPU-2"]
    c0, c1, c2 = node.cards
    assert [(h.kind, h.name, h.milli, h.users) for h in c0.holders] == [
        ("resourceclaim", "ml/whole", 1000, ("ml/a", "ml/b"))]  # one hold, two pods
    assert not c1.healthy and c2.mig[0].holder == "resourceclaim ml/mig"
    console = Console(record=True, width=200, color_system=None)
    console.print(render(view))
    text = console.export_text()
    assert "claim ml/whole used by ml/a, ml/b 100%" in text
    assert "claim ml/mig used by ml/c [MIG 3g.40gb]" in text
