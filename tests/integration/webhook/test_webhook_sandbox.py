"""The sandbox runs the webhook by default: `egpu sandbox up` alone refuses a bad GPU pod at
`kubectl create`, admits and schedules the gpusharing seed pod, and `--bare` has no webhook."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from egpu_testing import sandbox as cli

pytestmark = pytest.mark.integration


egpu = functools.partial(cli.egpu, timeout=300)
kubectl = cli.kubectl_run


def pod(name: str, limits: dict[str, object]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                       "spec": {"containers": [{"name": "main", "image": "x",
                                                "resources": {"limits": limits}}]}})


def wait_scheduled(kc: Path, name: str, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        got: dict[str, Any] = json.loads(kubectl(kc, "get", "pod", name, "-o", "json").stdout)
        if got["spec"].get("nodeName"):
            return got
        assert time.monotonic() < deadline, f"{name} not scheduled"
        time.sleep(0.3)


def test_sandbox_runs_the_webhook_by_default(tmp_path: Path) -> None:
    state, kc = tmp_path / "state", tmp_path / "kubeconfig"
    up = egpu("sandbox", "up", "--gpu-nodes", "1", "--kubeconfig", str(kc),
              "--state-dir", str(state))
    assert up.returncode == 0, up.stderr + up.stdout
    try:
        info = json.loads(egpu("sandbox", "status", "--json", "--state-dir", str(state)).stdout)
        webhook = info["components"]["egpu-webhook"]
        assert webhook["state"] == "running" and webhook["endpoint"].startswith("https://127.0.0.1:")
        names = list(info["components"])
        assert names.index("kube-apiserver") < names.index("egpu-webhook")
        registered = kubectl(kc, "get", "mutatingwebhookconfiguration", "elastic-gpu-webhook",
                             "-o", "json")
        assert registered.returncode == 0, registered.stderr
        hook = json.loads(registered.stdout)["webhooks"][0]
        assert hook["clientConfig"]["url"] == webhook["endpoint"] + "/mutate"

        bad = kubectl(kc, "create", "-f", "-", input=pod("bad", {"tencent.com/vcuda-core": 150}))
        assert bad.returncode != 0
        assert "tencent.com/vcuda-core='150': an integer 1-99" in bad.stderr, bad.stderr
        seed = kubectl(kc, "create", "-f", "-", input=pod(
            "seed", {"tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": 15}))
        assert seed.returncode == 0, seed.stderr
        got = wait_scheduled(kc, "seed")
        assert got["metadata"]["annotations"]["tencent.com/vcuda-core-limit"] == "50"
        # A memory-only share gets one device of the share plugin (so kubelet calls the
        # agent's Allocate) and is scheduled with that 1% beside its memory.
        memory = kubectl(kc, "create", "-f", "-",
                         input=pod("memory-only", {"elasticgpu.io/gpu-memory": 4096}))
        assert memory.returncode == 0, memory.stderr
        got = wait_scheduled(kc, "memory-only")
        limits = got["spec"]["containers"][0]["resources"]["limits"]
        # and kube-scheduler's node-level count of that 1% (core/nodefit.py)
        assert limits == {"elasticgpu.io/gpu-memory": "4096", "elasticgpu.io/gpu-core": "1",
                          "node.elasticgpu.io/gpu-core": "1",
                          # the quota's names, on by default (docs/budgets.md, "Quota")
                          "quota.elasticgpu.io/gpu-core": "1",
                          "quota.elasticgpu.io/gpu-memory": "4096"}
        (share,) = json.loads(got["metadata"]["annotations"]["elasticgpu.io/assignment"]
                              )["containers"]["main"]
        assert share["milli"] == 10 and share["memoryMiB"] == 4096
    finally:
        down = egpu("sandbox", "down", "--state-dir", str(state))
        assert down.returncode == 0, down.stderr
