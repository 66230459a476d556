"""helm, built by hack/ensure-k8s.sh from its pinned module, for the chart tests (issue 18).

The repository has no chart yet: the chart here is written by the test. helm keeps its own
state under $HOME; the test points it at tmp_path so nothing of the user's is read or written.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from elastic_gpu.devcluster.binaries import TOOLS, ensure_script, find_bin_dir

pytestmark = pytest.mark.integration

CHART = {
    "Chart.yaml": "apiVersion: v2\nname: tiny\nversion: 0.1.0\ndescription: a test chart\n"
                  "type: application\n",
    "values.yaml": "greeting: hello\nreplicas: 2\n",
    "templates/configmap.yaml": (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-tiny\n"
        "  labels:\n    app.kubernetes.io/managed-by: {{ .Release.Service }}\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
        "  replicas: {{ .Values.replicas | quote }}\n"),
}


def pinned_helm_version() -> str:
    """helm's version as hack/k8s/helm/go.mod pins it (read here, not by the code under test)."""
    script = ensure_script()
    assert script is not None
    go_mod = (script.parent / "k8s" / "helm" / "go.mod").read_text()
    match = re.search(r"^require helm\.sh/helm/v3 (v\S+)$", go_mod, re.MULTILINE)
    assert match, go_mod
    return match.group(1)


@pytest.fixture
def helm(tmp_path: Path) -> Any:
    binary = find_bin_dir() / "helm"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"),
           "HELM_CACHE_HOME": str(tmp_path / "helm-cache"),
           "HELM_CONFIG_HOME": str(tmp_path / "helm-config"),
           "HELM_DATA_HOME": str(tmp_path / "helm-data")}

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(binary), *args], capture_output=True, text=True,
                                timeout=120, env=env, check=False)
        if check:
            assert result.returncode == 0, result.stderr + result.stdout
        return result

    return run


def write_chart(root: Path, files: dict[str, str]) -> Path:
    chart = root / "tiny"
    for name, text in files.items():
        (chart / name).parent.mkdir(parents=True, exist_ok=True)
        (chart / name).write_text(text)
    return chart


def test_helm_and_kubelet_are_in_the_bin_dir_and_report_their_pinned_versions(helm: Any) -> None:
    bin_dir = find_bin_dir()
    assert all(os.access(bin_dir / tool, os.X_OK) for tool in TOOLS)  # linked in by ensure-k8s
    version = pinned_helm_version()
    assert helm("version", "--template", "{{.Version}}").stdout.strip() == version
    # kubelet is built from the control plane's Kubernetes release
    kubelet = subprocess.run([str(bin_dir / "kubelet"), "--version"], capture_output=True,
                             text=True, timeout=60, check=True).stdout.strip()
    apiserver = subprocess.run([str(bin_dir / "kube-apiserver"), "--version"],
                               capture_output=True, text=True, timeout=60,
                               check=True).stdout.strip()
    assert kubelet == apiserver and kubelet.startswith("Kubernetes v1.")


def test_helm_lints_and_renders_a_chart(helm: Any, tmp_path: Path) -> None:
    chart = write_chart(tmp_path, CHART)
    lint = helm("lint", str(chart))
    assert "1 chart(s) linted, 0 chart(s) failed" in lint.stdout
    rendered = helm("template", "demo", str(chart), "--set", "greeting=hi").stdout
    (cm,) = [doc for doc in yaml.safe_load_all(rendered) if doc]
    assert cm["metadata"]["name"] == "demo-tiny"
    assert cm["data"] == {"greeting": "hi", "replicas": "2"}
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    # a broken chart fails lint and says where
    broken = write_chart(tmp_path / "broken", {**CHART, "Chart.yaml": "apiVersion: v2\nname: tiny\n"})
    bad = helm("lint", str(broken), check=False)
    assert bad.returncode != 0 and "version is required" in bad.stdout + bad.stderr


def test_helm_installs_into_the_dev_cluster(helm: Any, tmp_path: Path, k8s_cluster: Any,
                                            k8s_namespace: str) -> None:
    chart = write_chart(tmp_path, CHART)
    target = ("--kubeconfig", str(k8s_cluster.kubeconfig), "--namespace", k8s_namespace)
    helm("install", "demo", str(chart), *target, "--wait", "--timeout", "60s")
    cm = json.loads(k8s_cluster.kubectl("get", "configmap", "demo-tiny", "-n", k8s_namespace,
                                        "-o", "json").stdout)
    assert cm["data"] == {"greeting": "hello", "replicas": "2"}
    releases = json.loads(helm("list", *target, "-o", "json").stdout)
    assert [(r["name"], r["status"]) for r in releases] == [("demo", "deployed")]
    helm("uninstall", "demo", *target, "--wait")
    gone = k8s_cluster.kubectl("get", "configmap", "demo-tiny", "-n", k8s_namespace,
                               check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
