"""A cluster's worth of GPU holders for `egpu top`'s test and bench: pods with assignment
annotations spread over fake nodes' cards, and claimed ElasticGPUs."""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from egpu_testing.claims import elasticgpu_object
from egpu_testing.workbench import pod_manifest
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare


def holder_pods(namespace: str, nodes: Sequence[str], count: int, cards: int
                ) -> list[dict[str, Any]]:
    """`count` pods bound round-robin over the nodes' cards (`GPU-fake-<node>-<i>`, as the
    sandbox's fake nodes have them): 30% compute and 8 GiB each."""
    pods = []
    for i in range(count):
        node, card = nodes[i % len(nodes)], (i // len(nodes)) % cards
        share = CardShare(card, f"GPU-fake-{node}-{card}", 300, 8192)
        pod = pod_manifest(f"p{i:04d}", namespace, limits={"elasticgpu.io/gpu-core": "30"},
                           annotations={ann.ASSIGNMENT: Assignment(node, {"main": (share,)})
                                        .to_json(), ann.ASSIGNED_NODE: node})
        pod["spec"]["nodeName"] = node
        pods.append(pod)
    return pods


def claimed_elasticgpus(namespace: str, nodes: Sequence[str], count: int, card: int
                        ) -> dict[str, Any]:
    """A List of `count` ElasticGPUs, each half of card `card` of one node, claimed."""
    return {"apiVersion": "v1", "kind": "List", "items": [
        elasticgpu_object(f"egpu-top-{i}", nodes[i], [CardShare(
            card, f"GPU-fake-{nodes[i]}-{card}", 500, 4096)], claim=(namespace, f"c{i}", f"u{i}"))
        for i in range(count)]}


@dataclass(frozen=True)
class Refresh:
    """One `egpu top` refresh, timed by stage (seconds)."""

    fetch: float
    view: float
    render: float
    text: str
    result: Any

    @property
    def total(self) -> float:
        return self.fetch + self.view + self.render


async def timed_refresh(client: Any, width: int = 200) -> Refresh:
    """What `egpu top` does once: the four LISTs, the view, the table rendered to text."""
    from rich.console import Console

    from elastic_gpu.cli.top import fetch, render, view_from_objects

    started = time.perf_counter()
    objects = await fetch(client)
    fetched = time.perf_counter()
    view = view_from_objects(objects)
    built = time.perf_counter()
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(render(view))
    done = time.perf_counter()
    return Refresh(fetched - started, built - fetched, done - built, out.getvalue(), view)
