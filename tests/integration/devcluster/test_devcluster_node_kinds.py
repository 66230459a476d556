"""Must-show 4 of issue 13: `egpu sandbox up --cluster FILE` makes every node kind, and each
node's capacity is what its agent config implies.

The cluster file is written as a user writes it: an A100 group carved into MIG instances with
NVIDIA's device plugin config, IX groups of 2-chip BI-V150 boards with the IX plugin's
ConfigMap data verbatim (its `ix-config` key, splitboard off and on, 4 replicas), and a plain
group with no agent config. The expected numbers are worked out below from the configs'
documented meaning (docs/agent.md), not computed by the code under test.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from egpu_testing import sandbox as cli
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.quota import QUOTA_NAMES

pytestmark = pytest.mark.integration

CLUSTER_FILE = """\
nodeGroups:
- name: a100
  count: 2
  gpus: 2
  model: A100-SXM4-80GB
  memoryMiB: 81920
  mig: [1g.10gb, 1g.10gb, 2g.20gb]
  agentConfig:            # NVIDIA device plugin's config file
    version: v1
    flags:
      migStrategy: mixed
- name: ix
  count: 1
  gpus: 2                 # 2 BI-V150 boards ...
  chipsPerBoard: 2        # ... of 2 chips each
  model: BI-V150
  memoryMiB: 32768        # per chip
  agentConfig:            # the IX plugin's ConfigMap data, verbatim
    ix-config: |-
      version: "4.2.0"
      flags:
        splitboard: false
      sharing:
        timeSlicing:
          replicas: 4
- name: ixsplit
  count: 1
  gpus: 2
  chipsPerBoard: 2
  model: BI-V150
  memoryMiB: 32768
  agentConfig:
    ix-config: |-
      version: "4.2.0"
      flags:
        splitboard: true
      sharing:
        timeSlicing:
          replicas: 4
- name: plain
  count: 1
  gpus: 4
"""

# What each config means (docs/agent.md), written out:
EXPECTED_GPU_CAPACITY: dict[str, dict[str, str]] = {
    # NVIDIA form, migStrategy mixed: each MIG instance is advertised as
    # nvidia.com/mig-<profile>; both cards are carved, so no whole nvidia.com/gpu is left, and
    # the NVIDIA form sells no shares. Per node: 2 cards x (2 x 1g.10gb + 1 x 2g.20gb).
    # Every node also carries kube-scheduler's node-level GPU count, node.elasticgpu.io/gpu-core
    # (core/nodefit.py): 100 per card, 100 per replica of a time-sliced one.
    "a100-000": {"nvidia.com/mig-1g.10gb": "4", "nvidia.com/mig-2g.20gb": "2", NODE_CORE: "200"},
    "a100-001": {"nvidia.com/mig-1g.10gb": "4", "nvidia.com/mig-2g.20gb": "2", NODE_CORE: "200"},
    # IX form: iluvatar.com/gpu only. splitboard false: a 2-chip board is one device,
    # replicated 4 times: 2 boards x 4 = 8.
    "ix-000": {"iluvatar.com/gpu": "8", NODE_CORE: "800"},
    # splitboard true: each chip is a device: 2 boards x 2 chips x 4 replicas = 16.
    "ixsplit-000": {"iluvatar.com/gpu": "16", NODE_CORE: "1600"},
    # No agentConfig: the agent's defaults (whole cards, 100 % of compute per card in
    # elasticgpu.io/gpu-core, memory in MiB, and an A100's 312 dense FP16 TFLOPS per card in
    # elasticgpu.io/gpu-tflops: docs/agent.md, `resources.tflops`): 4 A100-80GB cards.
    "plain-000": {"nvidia.com/gpu": "4", "elasticgpu.io/gpu-core": "400",
                  "elasticgpu.io/gpu-memory": str(4 * 81920),
                  "elasticgpu.io/gpu-tflops": str(4 * 312), NODE_CORE: "400"},
}
# What each of a node's GPUDevice objects backs (spec.resources), by card index: an unsplit
# board is one card named after its first chip (0 and 2), with both chips' memory.
EXPECTED_CARDS: dict[str, dict[int, tuple[int, dict[str, int]]]] = {
    "a100-000": {i: (81920, {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-2g.20gb": 1})
                 for i in (0, 1)},
    "ix-000": {i: (2 * 32768, {"iluvatar.com/gpu": 4}) for i in (0, 2)},
    "ixsplit-000": {i: (32768, {"iluvatar.com/gpu": 4}) for i in (0, 1, 2, 3)},
    "plain-000": {i: (81920, {"nvidia.com/gpu": 1, "elasticgpu.io/gpu-core": 100,
                              "elasticgpu.io/gpu-memory": 81920,
                              "elasticgpu.io/gpu-tflops": 312}) for i in range(4)},
}


egpu = functools.partial(cli.egpu, timeout=240)


def kubectl(kubeconfig: Path, *args: str, input: str | None = None) -> Any:
    out = cli.kubectl(kubeconfig, *args, input=input)
    return json.loads(out) if "-o" in args and "json" in args else out


def gpu_pod(name: str, resource: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "cuda:fake",
                                     "resources": {"limits": {resource: "1"}}}]}}


def test_sandbox_cluster_file_makes_each_node_kind_with_its_agents_capacity(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER_FILE)
    state, kc = tmp_path / "state", tmp_path / "kubeconfig"
    up = egpu("sandbox", "up", "--cluster", str(cluster), "--kubeconfig", str(kc),
              "--state-dir", str(state))
    assert up.returncode == 0, up.stderr + up.stdout
    try:
        nodes = {n["metadata"]["name"]: n
                 for n in kubectl(kc, "get", "nodes", "-o", "json")["items"]}
        assert set(nodes) == set(EXPECTED_GPU_CAPACITY)
        for name, expected in EXPECTED_GPU_CAPACITY.items():
            status = nodes[name]["status"]
            for field in ("capacity", "allocatable"):
                gpu = {k: v for k, v in status[field].items()
                       if k not in ("cpu", "memory", "pods") and k not in QUOTA_NAMES}
                assert gpu == expected, (name, field)
                # every GPU node advertises the quota's accounting names (docs/dra.md)
                assert {k: status[field].get(k) for k in QUOTA_NAMES} == dict.fromkeys(
                    QUOTA_NAMES, "1G"), (name, field)
            assert {"cpu", "memory", "pods"} <= set(status["capacity"])

        devices = kubectl(kc, "get", "gpudevices", "-o", "json")["items"]
        for node, cards in EXPECTED_CARDS.items():
            got = {d["spec"]["index"]: (d["spec"]["memoryMiB"], d["spec"]["resources"])
                   for d in devices if d["spec"]["node"] == node}
            assert got == cards, node

        # A pod of each kind lands on a node of that kind.
        wanted = {"mig": ("nvidia.com/mig-2g.20gb", {"a100-000", "a100-001"}),
                  "ix": ("iluvatar.com/gpu", {"ix-000", "ixsplit-000"}),
                  "whole": ("nvidia.com/gpu", {"plain-000"})}
        for pod, (resource, _) in wanted.items():
            kubectl(kc, "apply", "-f", "-", input=json.dumps(gpu_pod(pod, resource)))
        deadline = time.monotonic() + 60
        placed: dict[str, str] = {}
        while time.monotonic() < deadline and len(placed) < len(wanted):
            for pod in kubectl(kc, "get", "pods", "-o", "json")["items"]:
                if pod["spec"].get("nodeName"):
                    placed[pod["metadata"]["name"]] = pod["spec"]["nodeName"]
            time.sleep(0.3)
        assert set(placed) == set(wanted), placed
        for pod, (_, where) in wanted.items():
            assert placed[pod] in where, (pod, placed[pod])
    finally:
        down = egpu("sandbox", "down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
