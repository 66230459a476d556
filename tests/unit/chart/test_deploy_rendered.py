"""deploy/ is `helm template` of charts/elastic-gpu (issue 18): the plain manifests and the chart
cannot drift. hack/render-deploy.py (`make deploy`) rewrites them; this fails until it is run.

helm is the one hack/ensure-k8s.sh builds (scripts/test.sh builds it before the tests run).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from elastic_gpu.devcluster.binaries import find_bin_dir
from elastic_gpu.devcluster.errors import DevClusterError

ROOT = Path(__file__).resolve().parents[3]


def _renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_deploy",
                                                  ROOT / "hack" / "render-deploy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    try:
        helm = find_bin_dir() / "helm"
    except DevClusterError as err:
        pytest.fail(f"no helm: run hack/ensure-k8s.sh ({err})")
    if not helm.exists():
        pytest.fail(f"no helm in {helm.parent}: run hack/ensure-k8s.sh")
    module = _renderer()
    return dict(module.split(module.helm_template(helm)))


def test_deploy_is_the_charts_helm_template(rendered: dict[str, str]) -> None:
    on_disk = _renderer().generated_files()
    assert set(on_disk) == set(rendered), "run: make deploy"
    for path, text in rendered.items():
        assert on_disk[path] == text, f"deploy/{path} differs from the chart: run make deploy"


def test_the_paths_other_tests_and_docs_use_are_rendered(rendered: dict[str, str]) -> None:
    for path in ("agent/agent.yaml", "controller/rbac.yaml", "webhook/rbac.yaml",
                 "scheduler/rbac.yaml"):
        assert path in rendered
    kinds = {path: {d["kind"] for d in yaml.safe_load_all(text) if d}
             for path, text in rendered.items()}
    for component in ("controller", "webhook", "scheduler"):
        assert kinds[f"{component}/rbac.yaml"] <= {
            "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
        assert "Deployment" in kinds[f"{component}/{component}.yaml"]
    assert {"DaemonSet", "ClusterRole", "ValidatingAdmissionPolicy"} <= kinds["agent/agent.yaml"]
    # helm's random certificates never land in deploy/
    assert not any("Secret" in k for k in kinds.values())


def test_a_changed_chart_is_caught(tmp_path: Path, rendered: dict[str, str]) -> None:
    """The check is real: an edited file, a missing one and a stale one are all differences."""
    module = _renderer()
    module.write(rendered, tmp_path)
    assert module.generated_files(tmp_path) == rendered
    (tmp_path / "controller" / "rbac.yaml").write_text(
        rendered["controller/rbac.yaml"].replace("verbs: [list, watch]", "verbs: ['*']"))
    stale = tmp_path / "old" / "gone.yaml"
    stale.parent.mkdir()
    stale.write_text(module.HEADER)
    assert module.generated_files(tmp_path) != rendered
    changed = module.write(rendered, tmp_path)
    assert sorted(changed) == ["removed old/gone.yaml", "wrote controller/rbac.yaml"]
    assert module.generated_files(tmp_path) == rendered
