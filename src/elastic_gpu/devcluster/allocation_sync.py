"""Keeps the allocation columns of a sandbox's GPUDevices current, and their observed usage.

On a real node the agent rewrites its cards' `allocatedMilli` / `allocatedMemoryMiB` from the
pods' assignments. kwok nodes have no agent, so the sandbox runs this loop as one more of its
supervised processes (started by `up`, stopped by `down`), calling the agent's own accounting
(`agent.deviceplugin.publish.sync_fake_allocations`) so the numbers mean the same on both kinds of node.
Each pass also samples the kwok nodes' fake usage model (`agent.usage.fake_sync`: the
agent's sampling loop, its write period and drift Events), so `status.usage` is there for
the scheduler and `kubectl get gpudevices`. With `--metrics-port` it serves what those nodes'
agents would on theirs (`elasticgpu_agent_*`, docs/metrics.md: one endpoint, each node's
series under its `node` label), from the sampling loop's last pass, through the one `/metrics`
page of every component (`runtime.metrics.MetricsThread`). For DRA-mode kwok nodes
it stands in for the agent's DRA publisher: their ResourceSlices, from the fake inventory the
Node carries (`devcluster.dra_nodes.DraSliceSync`), published before it reports ready. For
kwok nodes labelled `elasticgpu.io/mig-dynamic=true` it stands in for the agent's MIG applier
(`devcluster.mig_agent.MigAgents`: their MigLayouts carried out on a fake backend).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

app = typer.Typer(add_completion=False)


def run(kubeconfig: Path, interval_s: float, stop: threading.Event,
        metrics: tuple[str, int] | None = None) -> None:
    """`metrics`: (host, port) to serve `/metrics` on, None: none."""
    from elastic_gpu.agent.deviceplugin.publish import sync_fake_allocations
    from elastic_gpu.agent.metrics import nodes_registry
    from elastic_gpu.agent.usage.fake_sync import FakeUsageSync
    from elastic_gpu.devcluster.dra_nodes import DraSliceSync
    from elastic_gpu.devcluster.mig_agent import MigAgents
    from elastic_gpu.kube.sync import SyncKubeClient
    from elastic_gpu.runtime.metrics import MetricsThread

    with SyncKubeClient.from_config(kubeconfig, field_manager="egpu-sandbox") as client:
        usage = FakeUsageSync(client)
        slices = DraSliceSync(client)
        mig = MigAgents(client)
        mig.start()  # their MigLayouts from one watch
        _pass(slices.sync, "DRA slice sync")  # ready (metrics served) once they are published
        page = MetricsThread(nodes_registry(usage.nodes))
        if metrics is not None:
            host, port = metrics
            bound = page.start(host, port)
            print(f"metrics on http://{host}:{bound}/metrics", flush=True)
        try:
            while not stop.is_set():
                _pass(lambda: sync_fake_allocations(client), "allocation sync")
                _pass(usage.sync, "usage sync")
                _pass(slices.sync, "DRA slice sync")
                _pass(mig.sync, "MIG layouts")
                stop.wait(interval_s)
        finally:
            page.stop()
            usage.close()
            mig.close()


def _pass(step: Callable[[], object], what: str) -> None:
    try:
        step()
    except Exception as err:  # a passing API error must not end the loop: say it
        print(f"{what} failed, retrying: {type(err).__name__}: {err}", file=sys.stderr,
              flush=True)


@app.command()
def main(
    kubeconfig: Annotated[Path, typer.Option(exists=True, dir_okay=False)],
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between syncs")] = 1.0,
    metrics_port: Annotated[int, typer.Option(
        "--metrics-port", min=0, max=65535,
        help="Serve Prometheus /metrics for the kwok nodes (elasticgpu_agent_*, "
        "docs/metrics.md) on this port; 0: no metrics.")] = 0,
    metrics_host: Annotated[str, typer.Option(
        "--metrics-host", help="Address the metrics port listens on.")] = "127.0.0.1",
) -> None:
    """Sync the kwok nodes' GPUDevice allocation columns from pod assignments, and their
    observed usage from the fake usage model, until SIGTERM."""
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    run(kubeconfig, interval, stop, (metrics_host, metrics_port) if metrics_port else None)


if __name__ == "__main__":
    app()
