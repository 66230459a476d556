"""The chart ships the Grafana dashboard as a ConfigMap for Grafana's sidecar when asked
(`dashboards.enabled`), byte for byte the dashboard the unit test validates, and exposes the
agent's metrics port."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from elastic_gpu.devcluster.binaries import find_bin_dir

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "elastic-gpu"


def helm(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = find_bin_dir() / "helm"
    if not binary.exists():
        pytest.fail(f"no helm in {binary.parent}: run hack/ensure-k8s.sh")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HELM_CACHE_HOME": str(tmp_path / "c"),
           "HELM_CONFIG_HOME": str(tmp_path / "f"), "HELM_DATA_HOME": str(tmp_path / "d")}
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120,
                          env=env, check=False)


def rendered(tmp_path: Path, *sets: str) -> list[dict[str, Any]]:
    result = helm(tmp_path, "template", "egpu", str(CHART), "--namespace", "elastic-gpu",
                  *[a for s in sets for a in ("--set", s)])
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def test_the_dashboard_configmap_is_the_dashboard_and_off_by_default(tmp_path: Path) -> None:
    def dashboards(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [o for o in objs if o["kind"] == "ConfigMap"
                and o["metadata"]["name"] == "elastic-gpu-dashboards"]

    assert dashboards(rendered(tmp_path)) == []
    (cm,) = dashboards(rendered(tmp_path, "dashboards.enabled=true"))
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(cm["data"]["elastic-gpu.json"])
    assert shipped == json.loads((CHART / "dashboards" / "elastic-gpu.json").read_text())
    refused = helm(tmp_path, "template", "egpu", str(CHART), "--set-string",
                   "dashboards.enabled=yes")
    assert refused.returncode != 0 and "dashboards/enabled" in refused.stderr


def test_the_agent_serves_its_metrics_on_the_chart_port(tmp_path: Path) -> None:
    (ds,) = [o for o in rendered(tmp_path, "agent.metricsPort=9500") if o["kind"] == "DaemonSet"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[command.index("--metrics-port") + 1] == "9500"
    assert {"name": "metrics", "containerPort": 9500} in container["ports"]
