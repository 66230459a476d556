"""charts/elastic-gpu installed on the dev cluster by the real helm, for the chart's tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from egpu_testing.pytest_plugin import unique_name
from elastic_gpu.devcluster.binaries import find_bin_dir

CHART = Path(__file__).resolve().parents[2] / "charts" / "elastic-gpu"
#: kinds of the chart's cluster-wide objects (fixed names: one Elastic GPU per cluster)
CLUSTER_KINDS = ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                 "ValidatingAdmissionPolicyBinding", "MutatingWebhookConfiguration",
                 "ValidatingWebhookConfiguration", "PriorityClass")


class Release:
    """One helm release of the chart in a fresh namespace (`helm` fails the test on error)."""

    def __init__(self, cluster: Any, home: Path) -> None:
        self.cluster = cluster
        self.namespace = unique_name("egpu-chart")
        self.env = {"PATH": "/usr/bin:/bin", "HOME": str(home),
                    "HELM_CACHE_HOME": str(home / "c"), "HELM_CONFIG_HOME": str(home / "f"),
                    "HELM_DATA_HOME": str(home / "d")}

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(find_bin_dir() / "helm"), f"--kubeconfig={self.cluster.kubeconfig}",
             "-n", self.namespace, *args],
            capture_output=True, text=True, timeout=180, env=self.env, check=False)
        if check:
            assert result.returncode == 0, result.stderr + result.stdout
        return result

    def exists(self, *what: str, namespaced: bool = False) -> bool:
        ns = ["-n", self.namespace] if namespaced else []
        result = self.cluster.kubectl("get", *what, *ns, "--ignore-not-found", "-o", "name",
                                      check=False)
        return bool(result.stdout.strip())

    def clear_leftovers(self) -> None:
        """Delete the chart's cluster-wide objects left by a test that applied deploy/ (the
        same names without helm's ownership): helm refuses to adopt them."""
        out = self.helm("template", "egpu", str(CHART)).stdout
        names = [f"{o['kind'].lower()}/{o['metadata']['name']}"
                 for o in yaml.safe_load_all(out) if o and o["kind"] in CLUSTER_KINDS]
        self.cluster.kubectl("delete", *names, "--ignore-not-found", check=False)

    def uninstall_quietly(self) -> None:
        self.helm("uninstall", "egpu", "--ignore-not-found", check=False)
        self.cluster.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)


def token_kubeconfig(cluster: Any, namespace: str, account: str, path: Path,
                     bound_pod: tuple[str, str] | None = None) -> Path:
    """A kubeconfig with a token of `account` (as its pod gets it when `bound_pod` is
    (name, uid): bound to that pod, and so to its node)."""
    args = ["create", "token", account, "-n", namespace]
    if bound_pod is not None:
        args += ["--bound-object-kind", "Pod", "--bound-object-name", bound_pod[0],
                 "--bound-object-uid", bound_pod[1]]
    token = cluster.kubectl(*args).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}]}))
    return path


def helm_template(home: Path, **values: Any) -> list[dict[str, Any]]:
    """`helm template` of the chart with `--set-json KEY=VALUE` for each of `values` (dotted
    keys), helm's own state under `home`: the rendered objects."""
    binary = find_bin_dir() / "helm"
    assert binary.exists(), f"no helm in {binary.parent}: run hack/ensure-k8s.sh"
    args = [a for k, v in values.items() for a in ("--set-json", f"{k}={json.dumps(v)}")]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "HELM_CACHE_HOME": str(home / "c"),
           "HELM_CONFIG_HOME": str(home / "f"), "HELM_DATA_HOME": str(home / "d")}
    out = subprocess.run([str(binary), "template", "egpu", str(CHART), "-n", "elastic-gpu",
                          *args], capture_output=True, text=True, timeout=120, env=env,
                         check=False)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]
