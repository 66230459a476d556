"""Keeps the allocation columns of a sandbox's GPUDevices current, and their observed usage.

On a real node the agent rewrites its cards' `allocatedMilli` / `allocatedMemoryMiB` from the
pods' assignments. kwok nodes have no agent, so the sandbox runs this loop as one more of its
supervised processes (started by `up`, stopped by `down`), calling the agent's own accounting
(`agent.publish.sync_fake_allocations`) so the numbers mean the same on both kinds of node.
Each pass also samples the kwok nodes' fake usage model (`agent.usage.fake_sync`: the
agent's sampling loop, its write period and drift Events), so `status.usage` is there for
the scheduler and `kubectl get gpudevices`.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

app = typer.Typer(add_completion=False)


def run(kubeconfig: Path, interval_s: float, stop: threading.Event) -> None:
    from elastic_gpu.agent.publish import sync_fake_allocations
    from elastic_gpu.agent.usage.fake_sync import FakeUsageSync
    from elastic_gpu.kube.sync import SyncKubeClient

    with SyncKubeClient.from_config(kubeconfig, field_manager="egpu-sandbox") as client:
        usage = FakeUsageSync(client)
        while not stop.is_set():
            try:
                sync_fake_allocations(client)
            except Exception as err:  # a passing API error must not end the loop: say it
                print(f"allocation sync failed, retrying: {type(err).__name__}: {err}",
                      file=sys.stderr, flush=True)
            try:
                usage.sync()
            except Exception as err:
                print(f"usage sync failed, retrying: {type(err).__name__}: {err}",
                      file=sys.stderr, flush=True)
            stop.wait(interval_s)
        usage.close()


@app.command()
def main(
    kubeconfig: Annotated[Path, typer.Option(exists=True, dir_okay=False)],
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between syncs")] = 1.0,
) -> None:
    """Sync GPUDevice allocation columns from pod assignments until SIGTERM."""
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    run(kubeconfig, interval, stop)


if __name__ == "__main__":
    app()
