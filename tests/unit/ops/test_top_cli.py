"""`egpu top`'s adapter: API objects -> the view (bad objects skipped), the rendered table, and
the command as `egpu top` and `kubectl egpu top`."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from typer.testing import CliRunner

from egpu_testing.claims import elasticgpu_object
from elastic_gpu.api.gpudevice import card_to_object
from elastic_gpu.cli.kubectl import kubectl_app
from elastic_gpu.cli.main import app
from elastic_gpu.cli.top import Objects, render, view_from_objects
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Card, Health


def device(node: str, index: int, health: Health = Health.HEALTHY) -> dict[str, Any]:
    return card_to_object(node, Card(index, f"GPU-{node}-{index}", "A100", 40960, health=health))


def k8s_node(name: str, capacity: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"capacity": capacity or {"cpu": "8"}}}


def pod(name: str, node: str | None, shares: dict[str, list[CardShare]],
        claims: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    assignment = Assignment(node or "gpu-a", {c: tuple(s) for c, s in shares.items()},
                            claims or {})
    return {"metadata": {"name": name, "namespace": "ml", **meta,
                         "annotations": {ann.ASSIGNMENT: assignment.to_json(),
                                         ann.ASSIGNED_NODE: assignment.node}},
            "spec": {"nodeName": node} if node else {}, "status": {"phase": "Running"}}


def stopped(pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` with its one container reported terminated: being deleted, it holds nothing."""
    return {**pod, "spec": {**pod["spec"], "containers": [{"name": "main"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "main", "state": {"terminated": {"exitCode": 0}}}]}}


def share(node: str, index: int, milli: int, mib: int = 0) -> CardShare:
    return CardShare(index, f"GPU-{node}-{index}", milli, mib)


def objects() -> Objects:
    broken = device("gpu-b", 0)
    del broken["spec"]["uuid"]
    bad_annotation = pod("bad", "gpu-a", {})
    bad_annotation["metadata"]["annotations"][ann.ASSIGNMENT] = "{not json"
    return Objects(
        nodes=[k8s_node("gpu-a"), k8s_node("gpu-b"), k8s_node("cpu-only"),
               k8s_node("legacy", {"nvidia.com/gpu": "4", "cpu": "8"})],
        devices=[device("gpu-a", 0), device("gpu-a", 1, Health.UNHEALTHY), device("gpu-b", 1),
                 broken],
        pods=[pod("train", "gpu-a", {"main": [share("gpu-a", 0, 400, 10240)]}),
              pod("infer", "gpu-a", {"main": [share("gpu-a", 0, 250, 2048)]},
                  claims={"main": "egpu-1"}),
              pod("unbound", None, {"main": [share("gpu-a", 0, 999)]}),
              stopped(pod("leaving", "gpu-a", {"main": [share("gpu-a", 0, 999)]},
                          deletionTimestamp="2026-01-01T00:00:00Z")),
              bad_annotation],
        elasticgpus=[elasticgpu_object("egpu-1", "gpu-a", [share("gpu-a", 0, 250, 2048)],
                                       claim=("ml", "c1", "uid-c1"))])


def test_objects_become_the_view_and_bad_ones_are_skipped() -> None:
    view = view_from_objects(objects())
    assert [n.name for n in view.nodes] == ["gpu-a", "gpu-b", "legacy"]
    a, b, legacy = view.nodes
    c0, c1 = a.cards
    assert [(h.kind, h.name, h.milli) for h in c0.holders] == [
        ("pod", "ml/train", 400), ("elasticgpu", "egpu-1", 250)]
    assert c0.holders[1].users == ("ml/infer",) and c0.holders[1].detail == "ml/c1"
    assert (c0.used_milli, c0.used_mib) == (650, 12288)
    assert not c1.healthy
    assert [c.index for c in b.cards] == [1]  # card 0's object is broken: left out
    assert legacy.uninventoried == {"nvidia.com/gpu": 4}
    assert [n.name for n in view_from_objects(objects(), ["gpu-?"]).nodes] == ["gpu-a", "gpu-b"]


def test_the_table_shows_nodes_cards_holders_and_totals() -> None:
    console = Console(record=True, width=200, color_system=None)
    console.print(render(view_from_objects(objects())))
    text = console.export_text()
    lines = text.splitlines()
    assert lines[0] == ("3 nodes · 3 cards (1 unhealthy) · allocated: compute 22% (0.65/3 "
                        "cards), memory 10% · free: 1.35 cards, 1 whole, 68.0Gi · "
                        "fragmentation 26%")
    card0 = next(line for line in lines if "ml/train (main) 40% 10.0Gi" in line)
    assert "65%" in card0 and "12.0Gi/40.0Gi" in card0 and "35% 28.0Gi" in card0
    assert "egpu egpu-1 claim ml/c1 used by ml/infer 25% 2.0Gi" in text
    assert "UNHEALTHY" in text
    node_a = next(line for line in lines if line.startswith("gpu-a"))
    assert "2 cards" in node_a and "1 bad" in node_a and "0.35 cards 28.0Gi" in node_a
    assert "no GPUDevice inventory (nvidia.com/gpu=4)" in text
    console = Console(record=True, width=200, color_system=None)
    console.print(render(view_from_objects(objects()), holders=False))
    assert "ml/train" not in console.export_text()


def test_top_is_a_command_of_egpu_and_of_the_kubectl_plugin(tmp_path: Any) -> None:
    runner = CliRunner()
    for cli in (app, kubectl_app):
        result = runner.invoke(cli, ["top", "--help"])
        assert result.exit_code == 0 and "--watch" in result.output
    missing = tmp_path / "nope"
    result = runner.invoke(kubectl_app, ["top", "--kubeconfig", str(missing)])
    assert result.exit_code == 2 and f"kubeconfig {missing} does not exist" in result.output


def test_watch_refreshes_until_interrupted(monkeypatch: Any) -> None:
    from elastic_gpu.cli import top as top_module
    from elastic_gpu.kube.client import KubeClient

    class Client:
        closed = False

        async def close(self) -> None:
            Client.closed = True

    views = [view_from_objects(objects()), view_from_objects(objects(), ["gpu-b"])]
    calls: list[int] = []

    async def snapshot(client: Any, patterns: Any) -> Any:
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt
        return views[min(len(calls) - 1, 1)]

    monkeypatch.setattr(KubeClient, "from_config", classmethod(lambda cls, path: Client()))
    monkeypatch.setattr(top_module, "snapshot", snapshot)
    result = CliRunner().invoke(app, ["top", "--watch", "--interval", "0.2",
                                      "--kubeconfig", "/dev/null"])
    assert result.exit_code == 0, result.output
    assert len(calls) == 4 and Client.closed  # three refreshes, then Ctrl-C closes the client
    assert "1 node · 1 card" in result.output  # the later refresh was drawn


def test_piped_output_keeps_one_line_per_row(monkeypatch: Any) -> None:
    # Not a terminal (a pipe, a file, CliRunner): rows are not wrapped at rich's 80 columns, so
    # `egpu top | grep NODE` finds a whole row.
    from elastic_gpu.cli import top as top_module
    from elastic_gpu.kube.client import KubeClient

    class Client:
        async def close(self) -> None:
            pass

    async def snapshot(client: Any, patterns: Any) -> Any:
        return view_from_objects(objects())

    monkeypatch.setattr(KubeClient, "from_config", classmethod(lambda cls, path: Client()))
    monkeypatch.setattr(top_module, "snapshot", snapshot)
    result = CliRunner().invoke(app, ["top", "--kubeconfig", "/dev/null"])
    assert result.exit_code == 0, result.output
    (header,) = [line for line in result.output.splitlines() if line.startswith("NODE")]
    assert header.split()[-2:] == ["HELD", "BY"]
    assert max(len(line) for line in result.output.splitlines()) > 80


def test_piped_watch_prints_every_refresh_as_it_comes(monkeypatch: Any) -> None:
    # `egpu top -w | tee log`: rich's Live draws only to a terminal, and printed one frame
    # when interrupted; piped, each refresh is appended (as `kubectl get -w` does)
    from elastic_gpu.cli import top as top_module
    from elastic_gpu.kube.client import KubeClient

    class Client:
        async def close(self) -> None:
            pass

    calls: list[int] = []

    async def snapshot(client: Any, patterns: Any) -> Any:
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt
        return view_from_objects(objects())

    monkeypatch.setattr(KubeClient, "from_config", classmethod(lambda cls, path: Client()))
    monkeypatch.setattr(top_module, "snapshot", snapshot)
    result = CliRunner().invoke(app, ["top", "-w", "--interval", "0.2",
                                      "--kubeconfig", "/dev/null"])
    assert result.exit_code == 0, result.output
    headers = [line for line in result.output.splitlines() if line.startswith("NODE")]
    assert len(headers) == 3


def test_the_summary_allocated_and_free_add_up_to_the_cards() -> None:
    from elastic_gpu.cli.top import _used_and_free

    # each rounded alone: 2.645 -> 2.64 (a float tie) and 3.355 -> 3.35, 5.99 of 6 cards
    assert _used_and_free(2645, 3355, 6000) == ("2.65", "3.35 cards")
    assert _used_and_free(1000, 0, 1000) == ("1", "0 cards")
    assert _used_and_free(0, 1000, 1000) == ("0", "1 card")
    # an unhealthy card's room is not free: then free is rounded on its own
    assert _used_and_free(500, 1495, 3000) == ("0.5", "1.5 cards")
