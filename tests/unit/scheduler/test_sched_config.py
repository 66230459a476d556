"""The extender's configuration file and the generated KubeSchedulerConfiguration."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from elastic_gpu.api.config.loader import ConfigError
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.resources import RESOURCE_TABLE
from elastic_gpu.scheduler.config import SchedulerConfig, load_config
from elastic_gpu.scheduler.schedconfig import kube_scheduler_config

REPO = Path(__file__).resolve().parents[3]


def test_defaults_without_file() -> None:
    assert load_config(None) == SchedulerConfig()


@pytest.mark.parametrize(("text", "expected"), [
    ("nodePolicy: spread\ncardPolicy: spread\nreservationTTLSeconds: 5\n",
     {"node_policy": "spread", "card_policy": "spread", "reservation_ttl_s": 5.0}),
    ("nodePolicy: fgdx-mem\ntargetWorkload: observed\nworkloadRefreshPods: 50\n",
     {"node_policy": "fgdx-mem", "target_workload": "observed", "workload_refresh_pods": 50}),
])
def test_file_sets_what_it_names(tmp_path: Path, text: str, expected: dict[str, object]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    config = load_config(path)
    assert {name: getattr(config, name) for name in expected} == expected


@pytest.mark.parametrize(("text", "needle"), [
    ("nodePolicy: nosuch\n", "unknown node policy 'nosuch'"),
    ("cardPolicy: 3\n", "cardPolicy"),
    ("reservationTTLSeconds: -1\n", "reservationTTLSeconds"),
    ("targetWorkload: history\n",
     r"targetWorkload: got 'history' \(a string\): Input should be 'builtin' or 'observed'"),
    ("workloadRefreshPods: 0\n", "workloadRefreshPods"),
    ("nodepolicy: binpack\n", "nodepolicy"),
    ("- a\n", "must be a mapping"),
    ("a: [\n", "not valid YAML"),
])
def test_bad_file_names_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle) as err:
        load_config(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.7", "::", "extender.example"])
def test_another_address_than_loopback_needs_client_certificates(tmp_path: Path,
                                                                 host: str) -> None:
    """The help and docs said another address needs tls.clientCAFile (/bind writes Bindings),
    but `egpu scheduler --host 0.0.0.0` served plain HTTP to anyone (found trying the product
    as a new user); now the loader refuses it, so `--check` and a start alike."""
    path = tmp_path / "c.yaml"
    path.write_text(f"host: '{host}'\n")
    with pytest.raises(ConfigError, match="is not loopback: /bind writes Bindings"):
        load_config(path)
    path.write_text(f"host: '{host}'\ntls: {{certFile: s.crt, keyFile: s.key, "
                    "clientCAFile: ca.crt}\n")
    assert load_config(path).host == host
    for loopback in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        path.write_text(f"host: '{loopback}'\n")
        assert load_config(path).host == loopback


def test_deploy_file_is_the_generated_config() -> None:
    deployed = yaml.safe_load((REPO / "deploy/scheduler/kube-scheduler-config.yaml").read_text())
    assert deployed == kube_scheduler_config()


def test_every_gpu_name_is_managed_and_ignored_by_kube_scheduler() -> None:
    (extender,) = kube_scheduler_config()["extenders"]
    managed = {r["name"]: r["ignoredByScheduler"] for r in extender["managedResources"]}
    assert {spec.name for spec in RESOURCE_TABLE} <= set(managed)
    assert "nvidia.com/mig-3g.40gb" in managed
    assert "quota.elasticgpu.io/gpu-core" in managed
    # the one name kube-scheduler counts: the node-level GPU count its preemption reads
    assert {name for name, ignored in managed.items() if not ignored} == {NODE_CORE}
    assert len(extender["managedResources"]) == len(managed), "no name twice"
    assert extender["nodeCacheCapable"] is True
    assert extender["bindVerb"] == "bind"


def test_the_help_of_config_names_every_setting() -> None:
    from typer.testing import CliRunner

    from elastic_gpu.cli.main import app

    text = " ".join(CliRunner().invoke(app, ["scheduler", "--help"],
                                       env={"COLUMNS": "300"}).output.split())
    for attribute, field in SchedulerConfig.model_fields.items():
        alias = field.validation_alias
        assert (alias if isinstance(alias, str) else attribute) in text


def test_scheduler_names_are_a_yaml_list_of_strings(tmp_path: Path) -> None:
    """The strict loader reads YAML lists; `schedulerNames` (a tuple in the model) must still
    take one, and only strings in it."""
    path = tmp_path / "c.yaml"
    path.write_text("schedulerNames: [default-scheduler, elastic-gpu-scheduler]\n")
    assert load_config(path).scheduler_names == ("default-scheduler", "elastic-gpu-scheduler")
    path.write_text("schedulerNames: [1]\n")
    with pytest.raises(ConfigError, match=r"schedulerNames\[0\]"):
        load_config(path)


def test_which_kube_scheduler_configurations_ignore_the_quota_names() -> None:
    """The sandbox adds the quota's names to GPU pods only where kube-scheduler ignores them
    (a user's --scheduler-config without them would leave every GPU pod Pending)."""
    from elastic_gpu.scheduler.schedconfig import ignores_quota_names

    assert ignores_quota_names(kube_scheduler_config("http://127.0.0.1:1"))
    assert not ignores_quota_names({"profiles": [{"schedulerName": "mine"}]})
    fit = {"name": "NodeResourcesFit", "args": {"ignoredResourceGroups": ["quota.elasticgpu.io"]}}
    assert ignores_quota_names({"profiles": [{"schedulerName": "a", "pluginConfig": [fit]}]})
    assert not ignores_quota_names({"profiles": [{"schedulerName": "a", "pluginConfig": [fit]},
                                                 {"schedulerName": "b"}]})


def test_every_shipped_configuration_retries_a_failed_pod_within_a_second() -> None:
    """A GPU pod created as the serving extender dies fails every attempt until the new
    leader serves; kube-scheduler's default backoff (1, 2, 4, 8, 10 s) would then leave it
    waiting up to 4 s more. The generated configuration, the deploy/ examples and the chart's
    rendered kube-scheduler all bound it to 1 s, the least kube-scheduler accepts."""
    from elastic_gpu.scheduler.schedconfig import POD_MAX_BACKOFF_S

    rendered = next(d for d in yaml.safe_load_all(
        (REPO / "deploy/scheduler/kube-scheduler.yaml").read_text())
        if d and d.get("kind") == "ConfigMap")
    shipped = [kube_scheduler_config(), yaml.safe_load(rendered["data"]["config.yaml"])]
    shipped += [yaml.safe_load((REPO / "deploy/scheduler" / name).read_text())
                for name in ("kube-scheduler-config.yaml", "kube-scheduler-config-best.yaml",
                             "kube-scheduler-config-tls.yaml")]
    assert POD_MAX_BACKOFF_S == 1
    for config in shipped:
        assert config["podInitialBackoffSeconds"] == 1
        assert config["podMaxBackoffSeconds"] == POD_MAX_BACKOFF_S
    assert kube_scheduler_config(pod_max_backoff_s=10)["podMaxBackoffSeconds"] == 10
