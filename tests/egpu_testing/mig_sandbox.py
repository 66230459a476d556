"""What the dynamic-MIG sandbox tests share (issue 42, `tests/integration/mig/test_mig_dynamic_*`):
`egpu sandbox up` on a cluster file with a namespace made, the API read and written through
kubectl, and the sandbox's components SIGKILLed and started again by the test: its controller,
and its allocation-sync, which stands in for the kwok nodes' agents and applies their
MigLayouts (`devcluster.mig_agent`; through `mig_agent_crash`, SIGKILLed after its first
published MIG step, on a device-plugin or a DRA node alike)."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from egpu_testing.process import SupervisedProcess
from egpu_testing.sandbox import egpu, kubectl, kubectl_run
from elastic_gpu.devcluster.sandbox import MARKER_ENV

#: what `egpu sandbox down` finds the sandbox's processes by (`devcluster.sandbox.MARKER_ENV`)
MARKER = MARKER_ENV
CRASH = Path(__file__).resolve().parent / "mig_agent_crash.py"


def sandbox_up(where: Path, cluster_file: str, namespace: str) -> Iterator[Path]:
    """A module fixture's body: the sandbox of `cluster_file` in `where` with `namespace`
    made, yielded, then brought down."""
    (where / "cluster.yaml").write_text(cluster_file)
    up = egpu("sandbox", "up", "--cluster", str(where / "cluster.yaml"), "--state-dir",
              str(where / "state"), "--kubeconfig", str(where / "kubeconfig"), timeout=300)
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        kubectl(where / "kubeconfig", "create", "namespace", namespace)
        yield where
    finally:
        egpu("sandbox", "down", "--state-dir", str(where / "state"), timeout=120)


def get(box: Path, *what: str) -> Any:
    """`kubectl get WHAT -o json` as JSON; None when kubectl fails (e.g. not found)."""
    result = kubectl_run(box / "kubeconfig", "get", *what, "-o", "json")
    return json.loads(result.stdout) if result.returncode == 0 else None


def create(box: Path, *objs: dict[str, Any]) -> None:
    for obj in objs:
        kubectl(box / "kubeconfig", "create", "-f", "-", input=json.dumps(obj))


class Component(SupervisedProcess):
    """A sandbox component the test SIGKILLed, started again by the test with `argv` (with
    the sandbox's marker in its environment, so `down` ends it too); ready when `ready_url`
    answers 200 (None: at once)."""

    what = "sandbox component"

    def __init__(self, argv: list[str], log_path: Path, state: Path,
                 ready_url: str | None = None) -> None:
        super().__init__(log_path)
        self.argv = argv
        self.state = state
        self.ready_url = ready_url

    def ready(self) -> bool:
        if self.ready_url is None:
            return True
        try:
            with urllib.request.urlopen(self.ready_url, timeout=2) as response:
                return int(response.status) == 200
        except OSError:
            return False

    def start(self) -> None:
        before = os.environ.get(MARKER)
        os.environ[MARKER] = str(self.state.resolve())  # inherited by the child only
        try:
            self.launch(self.argv, 120)
        finally:
            if before is None:
                del os.environ[MARKER]
            else:
                os.environ[MARKER] = before


def sandbox_component(box: Path, name: str) -> tuple[int, list[str], dict[str, Any]]:
    """(pid, command line, status) of a running sandbox component."""
    status = json.loads(egpu("sandbox", "status", "--state-dir", str(box / "state"),
                             "--json").stdout)["components"][name]
    pid = int(status["pid"])
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    return pid, [a.decode() for a in argv], status


def allocation_sync(box: Path, log: str, crash: bool = False) -> Component:
    """allocation-sync (which applies the kwok nodes' MigLayouts) run by the test; `crash`:
    through `mig_agent_crash`, SIGKILLed after its first published MIG step."""
    head = [sys.executable, str(CRASH)] if crash else \
        [sys.executable, "-m", "elastic_gpu.devcluster.allocation_sync"]
    return Component([*head, "--kubeconfig", str(box / "kubeconfig"), "--interval", "0.5"],
                     box / log, box / "state")


def controller(box: Path, log: str) -> tuple[int, Component]:
    """(pid, a Component that starts it again as it runs now) of the sandbox's controller."""
    pid, argv, status = sandbox_component(box, "egpu-controller")
    return pid, Component(argv, box / log, box / "state",
                          ready_url=status["endpoint"] + "/readyz")
