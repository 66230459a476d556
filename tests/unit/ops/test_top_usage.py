"""`egpu top` with observed usage (issue 28): used beside allotted for every holder, out-of-band
memory and utilisation per card, and a flag on a holder above its memory share; all read from
GPUDevice status.usage as the API serves it."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from egpu_testing.claims import elasticgpu_object
from elastic_gpu.api.gpudevice import card_to_object
from elastic_gpu.cli.top import Objects, render, view_from_objects
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Card
from elastic_gpu.core.usage import CardUsage, ContainerUsage

GIB = 1024


def device(node: str, index: int, usage: CardUsage | None) -> dict[str, Any]:
    return card_to_object(node, Card(index, f"GPU-{node}-{index}", "A100", 40 * GIB,
                                      usage=usage))


def pod(name: str, node: str, shares: dict[str, list[CardShare]],
        claims: dict[str, str] | None = None) -> dict[str, Any]:
    assignment = Assignment(node, {c: tuple(s) for c, s in shares.items()}, claims or {})
    return {"metadata": {"name": name, "namespace": "ml",
                         "annotations": {ann.ASSIGNMENT: assignment.to_json(),
                                         ann.ASSIGNED_NODE: node}},
            "spec": {"nodeName": node}, "status": {"phase": "Running"}}


def share(index: int, milli: int, mib: int) -> CardShare:
    return CardShare(index, f"GPU-gpu-a-{index}", milli, mib)


def objects() -> Objects:
    card0 = CardUsage(used_mib=20 * GIB, out_of_band_mib=3 * GIB, sm_percent=71,
                      observed_at="2026-11-28T20:00:00Z", containers=(
                          ContainerUsage("ml", "train", "main", 12 * GIB, 40),
                          ContainerUsage("ml", "light", "main", 1 * GIB, 5),
                          ContainerUsage("ml", "infer", "main", 4 * GIB, None)))
    return Objects(
        nodes=[{"metadata": {"name": "gpu-a"}, "status": {"capacity": {"cpu": "8"}}}],
        devices=[device("gpu-a", 0, card0), device("gpu-a", 1, None)],
        pods=[pod("train", "gpu-a", {"main": [share(0, 300, 10 * GIB)]}),  # above: 12 > 10
              pod("light", "gpu-a", {"main": [share(0, 200, 4 * GIB)]}),  # below
              pod("infer", "gpu-a", {"main": [share(0, 250, 2 * GIB)]}, claims={"main": "e1"}),
              pod("whole", "gpu-a", {"main": [share(1, 1000, 40 * GIB)]})],
        elasticgpus=[elasticgpu_object("e1", "gpu-a", [share(0, 250, 2 * GIB)],
                                       claim=("ml", "c1", "uid-c1"))])


def test_the_view_pairs_each_holder_with_what_it_uses() -> None:
    (node,) = view_from_objects(objects()).nodes
    card0, card1 = node.cards
    seen = {h.name: (h.memory_mib, h.observed_mib, h.observed_sm, h.above_share)
            for h in card0.holders}
    assert seen == {"ml/train": (10 * GIB, 12 * GIB, 40, True),
                    "ml/light": (4 * GIB, 1 * GIB, 5, False),
                    "e1": (2 * GIB, 4 * GIB, None, True)}  # the claim's pod uses 4 of 2
    assert card0.out_of_band_mib == 3 * GIB
    # free memory: 40 - 16 held - 3 out of band
    assert card0.free_mib == 21 * GIB
    assert [h.observed_mib for h in card1.holders] == [None]  # card 1 is not observed
    assert (node.above_share, node.out_of_band_mib) == (2, 3 * GIB)


def test_the_table_shows_used_beside_allotted_and_flags_holders_above_their_share() -> None:
    console = Console(record=True, width=250, color_system=None)
    console.print(render(view_from_objects(objects())))
    lines = console.export_text().splitlines()
    assert lines[0].endswith(" · observed: 3.0Gi out of band, 2 holders above their memory share")
    assert "OBSERVED" in lines[1] and lines[1].index("OBSERVED") < lines[1].index("HELD BY")
    text = "\n".join(lines)
    assert "ml/train (main) 30% 10.0Gi · uses 12.0Gi SM 40% ABOVE ITS SHARE (+2.0Gi)" in text
    assert "ml/light (main) 20% 4.0Gi · uses 1.0Gi SM 5%\n" in text + "\n"
    assert "egpu e1 claim ml/c1 used by ml/infer 25% 2.0Gi · uses 4.0Gi ABOVE ITS SHARE" in text
    card0 = next(line for line in lines if "20.0Gi SM 71% oob 3.0Gi" in line)
    assert card0.split()[0] == "0"
    card1 = next(line for line in lines if "ml/whole" in line)
    assert "·  uses" not in card1 and " - " in card1  # not observed: no figures invented
    node_row = next(line for line in lines if line.startswith("gpu-a"))
    assert "20.0Gi oob 3.0Gi" in node_row


def test_without_observations_the_table_is_as_before() -> None:
    plain = Objects(nodes=[{"metadata": {"name": "gpu-a"}, "status": {"capacity": {}}}],
                    devices=[device("gpu-a", 0, None)],
                    pods=[pod("train", "gpu-a", {"main": [share(0, 300, 10 * GIB)]})],
                    elasticgpus=[])
    console = Console(record=True, width=250, color_system=None)
    console.print(render(view_from_objects(plain)))
    text = console.export_text()
    assert "OBSERVED" not in text and "observed" not in text and "uses" not in text
