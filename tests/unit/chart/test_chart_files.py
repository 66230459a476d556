"""The chart's files that come from elsewhere stay equal to their sources (issue 18).

helm installs charts/elastic-gpu/crds/ but never upgrades it, and the chart's generated files
carry the resource table into templates: if any drifted, an install would not be what the code
and deploy/ say.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import yaml

from elastic_gpu.scheduler.schedconfig import extender_stanza
from elastic_gpu.webhook.registration import match_expression

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "elastic-gpu"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_chart_files",
                                                  ROOT / "hack" / "gen-chart-files.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chart_crds_are_deploy_crds_byte_for_byte() -> None:
    deploy = sorted(p.name for p in (ROOT / "deploy" / "crds").glob("*.yaml"))
    chart = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert chart == deploy and len(deploy) >= 4
    for name in deploy:
        assert (CHART / "crds" / name).read_bytes() == \
            (ROOT / "deploy" / "crds" / name).read_bytes(), (
            f"charts/elastic-gpu/crds/{name} differs from deploy/crds/{name}: "
            f"cp deploy/crds/*.yaml charts/elastic-gpu/crds/")


def test_managed_resources_file_is_the_extender_stanzas() -> None:
    text = (CHART / "files" / "managed-resources.yaml").read_text()
    assert yaml.safe_load(text) == extender_stanza("https://x")["managedResources"], (
        "run: PYTHONPATH=src python hack/gen-chart-files.py")
    assert text == _generator().managed_resources()


def test_webhook_match_expression_file_is_registrations() -> None:
    text = (CHART / "files" / "webhook-match-expression.cel").read_text()
    assert text == match_expression() + "\n", "run: PYTHONPATH=src python hack/gen-chart-files.py"


def test_tenant_rbac_file_is_the_tenant_rules() -> None:
    from elastic_gpu.api.tenant_rbac import TENANT_RULES

    text = (CHART / "files" / "tenant-rbac.yaml").read_text()
    assert yaml.safe_load(text) == TENANT_RULES, "run: PYTHONPATH=src python hack/gen-chart-files.py"
    assert text == _generator().tenant_rules()


def test_admission_policy_files_are_the_sandboxs_policies() -> None:
    generator = _generator()
    from elastic_gpu.api import admission_policies

    for name, manifests in (("ledger-policies.yaml", admission_policies.ledger_manifests()),
                            ("admission-opt-out-policy.yaml",
                             admission_policies.opt_out_manifests())):
        text = (CHART / "files" / name).read_text()
        assert [d for d in yaml.safe_load_all(text) if d] == manifests, (
            "run: PYTHONPATH=src python hack/gen-chart-files.py")
        assert text == generator.policies(manifests)


def test_device_classes_file_is_the_drivers_classes() -> None:
    from elastic_gpu.core.dra.classes import device_classes

    text = (CHART / "files" / "device-classes.yaml").read_text()
    assert [d for d in yaml.safe_load_all(text) if d] == device_classes(), (
        "run: PYTHONPATH=src python hack/gen-chart-files.py")
    assert text == _generator().policies(device_classes())
