"""charts/elastic-gpu with the real helm (built by hack/ensure-k8s.sh): lint, template with
default and non-default values, the values schema, and what the rendered objects must be:
the components' real flags, per-component RBAC, the webhook configurations and
the KubeSchedulerConfiguration as the code shapes them, only the agent privileged, and objects
a real kube-apiserver accepts (issue 18, must-show 1).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from elastic_gpu.cli.main import app
from elastic_gpu.devcluster.binaries import find_bin_dir
from elastic_gpu.scheduler.schedconfig import extender_stanza
from elastic_gpu.webhook.registration import Scope, Target, configurations

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "elastic-gpu"
NS = "elastic-gpu"
COMPONENTS = ("scheduler", "agent", "webhook", "controller")
Helm = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    binary = find_bin_dir() / "helm"
    if not binary.exists():
        pytest.fail(f"no helm in {binary.parent}: run hack/ensure-k8s.sh")
    home = tmp_path_factory.mktemp("helm")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "HELM_CACHE_HOME": str(home / "c"),
           "HELM_CONFIG_HOME": str(home / "f"), "HELM_DATA_HOME": str(home / "d")}

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(binary), *args], capture_output=True, text=True,
                                timeout=120, env=env, check=False)
        if check:
            assert result.returncode == 0, result.stderr + result.stdout
        return result

    return run


def _set_args(values: dict[str, Any] | None) -> list[str]:
    if values is None:
        return []
    return [arg for key, value in _flatten(values)
            for arg in ("--set-json", f"{key}={json.dumps(value)}")]


def _flatten(values: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _flatten(value, path + ".")
        else:
            yield path, value


def render(helm: Helm, values: dict[str, Any] | None = None,
           namespace: str = NS) -> list[dict[str, Any]]:
    out = helm("template", "egpu", str(CHART), "-n", namespace, *_set_args(values)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def workloads(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] in ("Deployment", "DaemonSet")}


@pytest.fixture(scope="module")
def default(helm: Helm) -> list[dict[str, Any]]:
    return render(helm)


# --- lint and template --------------------------------------------------------------------

NON_DEFAULT: list[dict[str, Any]] = [
    *({c: {"enabled": False}} for c in COMPONENTS),
    {"scheduler": {"kubeScheduler": {"enabled": False}}},
    {"certManager": {"enabled": True}},
    {"image": {"registry": "registry.example.com:5000", "repository": "gpu/egpu",
               "tag": "v9.9.9", "pullPolicy": "Always"}},
    {"scheduler": {"config": {"nodePolicy": "binpack", "cardPolicy": "binpack",
                              "filterResult": "best"}}},
    {"webhook": {"namespaceLabels": {"gpu": "yes"}, "replicas": 3},
     "controller": {"extenderURL": "https://extender.example:8888", "replicas": 3}},
    {"dra": {"deviceClasses": True}},
    {"agent": {"dra": {"enabled": True}}},
]


@pytest.mark.parametrize("values", [None, *NON_DEFAULT],
                         ids=lambda v: "default" if v is None else json.dumps(v)[:60])
def test_lint_and_template(helm: Helm, values: dict[str, Any] | None) -> None:
    result = helm("lint", "--strict", str(CHART), *_set_args(values))
    assert "0 chart(s) failed" in result.stdout
    assert render(helm, values)


def test_dra_device_classes_are_the_drivers_and_off_by_default(
        helm: Helm, default: list[dict[str, Any]]) -> None:
    from elastic_gpu.core.dra.classes import device_classes

    assert not by_kind(default, "DeviceClass")
    rendered = by_kind(render(helm, {"dra": {"deviceClasses": True}}), "DeviceClass")
    assert list(rendered.values()) == device_classes()


def test_a_dra_node_group_gets_its_own_agent_rbac_policy_and_classes(helm: Helm) -> None:
    """agent.dra: a second DaemonSet on the DRA group's nodes, running the same config with
    dra.enabled, kubelet's plugin directories instead of the device-plugin one, a
    ServiceAccount of its own whose role reaches ResourceSlices and claims (not GPUDevices),
    the own-node policy extended to its slices, and the DeviceClasses."""
    from elastic_gpu.core.dra.classes import device_classes

    objs = render(helm, {"agent": {"dra": {"enabled": True}}})
    agents = {n: w for n, w in workloads(objs).items() if n.startswith("elastic-gpu-agent")}
    assert set(agents) == {"elastic-gpu-agent", "elastic-gpu-agent-dra"}
    dra = agents["elastic-gpu-agent-dra"]["spec"]["template"]["spec"]
    plain = agents["elastic-gpu-agent"]["spec"]["template"]["spec"]
    assert dra["nodeSelector"] == {"elasticgpu.io/gpu-mode": "dra"}
    assert plain["nodeSelector"] == {"elasticgpu.io/agent": "true"}
    assert dra["serviceAccountName"] == "elastic-gpu-agent-dra"
    paths = {v["hostPath"]["path"] for v in dra["volumes"] if "hostPath" in v}
    assert {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/gpu.elasticgpu.io",
            "/var/run/cdi"} <= paths
    assert "/var/lib/kubelet/device-plugins" not in paths
    configs = by_kind(objs, "ConfigMap")
    dra_config = yaml.safe_load(configs["elastic-gpu-agent-dra"]["data"]["agent.yaml"])
    plain_config = yaml.safe_load(configs["elastic-gpu-agent"]["data"]["agent.yaml"])
    assert dra_config["dra"] == {"enabled": True} and "dra" not in plain_config
    assert {k: v for k, v in dra_config.items() if k != "dra"} == plain_config
    rules = by_kind(objs, "ClusterRole")["elastic-gpu-agent-dra"]["rules"]
    granted = {r: set(rule["verbs"]) for rule in rules for r in rule["resources"]}
    assert granted["resourceslices"] == {"list", "create", "update", "delete"}
    assert granted["resourceclaims"] == {"get", "list"}
    assert granted["miglayouts"] == {"list"} and granted["miglayouts/status"] == {"patch"}
    assert "gpudevices" not in granted
    policy = by_kind(objs, "ValidatingAdmissionPolicy")["elastic-gpu-agent-own-node"]["spec"]
    assert any("resourceslices" in r["resources"]
               for r in policy["matchConstraints"]["resourceRules"])
    assert "elastic-gpu-agent-dra" in policy["matchConditions"][0]["expression"]
    assert any("ResourceSlices of its own node" in v.get("messageExpression", "")
               for v in policy["validations"])
    assert list(by_kind(objs, "DeviceClass").values()) == device_classes()


def test_a_dra_node_group_needs_the_config_not_a_config_file(helm: Helm) -> None:
    result = helm("template", "egpu", str(CHART), "-n", NS, "--set", "agent.dra.enabled=true",
                  "--set-string", "agent.configFile=version: v1", check=False)
    assert result.returncode != 0
    assert "agent.dra.enabled needs agent.config" in result.stderr


def test_default_renders_every_component(default: list[dict[str, Any]]) -> None:
    assert set(workloads(default)) == {"elastic-gpu-scheduler", "elastic-gpu-kube-scheduler",
                                       "elastic-gpu-agent", "elastic-gpu-webhook",
                                       "elastic-gpu-controller"}
    assert workloads(default)["elastic-gpu-agent"]["kind"] == "DaemonSet"
    assert workloads(default)["elastic-gpu-controller"]["spec"]["replicas"] == 2
    assert set(by_kind(default, "Service")) == {"elastic-gpu-scheduler", "elastic-gpu-webhook"}


def test_the_extender_runs_two_leader_elected_replicas_ready_only_when_leading(
        default: list[dict[str, Any]], helm: Helm) -> None:
    from elastic_gpu.scheduler.config import SchedulerConfig

    deployment = workloads(default)["elastic-gpu-scheduler"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0,
                                                               "maxUnavailable": 1}
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--identity=$(POD_NAME)" in container["command"]
    health = next(a for a in container["command"] if a.startswith("--health-port="))
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert {"name": "health", "containerPort": int(health.split("=")[1])} in container["ports"]
    terms = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    config = yaml.safe_load(by_kind(default, "ConfigMap")["elastic-gpu-scheduler"]["data"]
                            ["scheduler.yaml"])
    election = SchedulerConfig.model_validate(config).leader_election  # the strict loader's model
    assert election.enabled and election.lease_namespace == NS
    assert (election.lease_duration_s, election.renew_deadline_s,
            election.retry_period_s) == (2.0, 1.5, 0.5)
    role = by_kind(default, "Role")["elastic-gpu-scheduler"]
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "resourceNames": [election.lease_name], "verbs": ["get", "update"]} in role["rules"]
    # a user's own affinity replaces the default spreading
    mine = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "gpu", "operator": "DoesNotExist"}]}]}}}
    objs = render(helm, {"scheduler": {"affinity": mine}})
    assert workloads(objs)["elastic-gpu-scheduler"]["spec"]["template"]["spec"][
        "affinity"] == mine


@pytest.mark.parametrize("component", COMPONENTS)
def test_a_disabled_component_leaves_nothing_of_its_own(helm: Helm, component: str) -> None:
    objs = render(helm, {component: {"enabled": False}})
    names = {o["metadata"]["name"] for o in objs}
    own = {n for n in names if n.startswith(f"elastic-gpu-{component}")}
    assert not own, own
    for other in set(COMPONENTS) - {component}:
        assert f"elastic-gpu-{other}" in workloads(objs)
    if component == "scheduler":
        assert "elastic-gpu-kube-scheduler" not in names


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(obj["spec"]["template"]["spec"]["containers"])


def _options(component: str) -> set[str]:
    command = typer.main.get_command(app).commands[component]  # type: ignore[attr-defined]
    return {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize("values", [None, {"certManager": {"enabled": True}},
                                    {"controller": {"extenderURL": "http://x:1"}}])
def test_every_container_runs_egpu_with_flags_the_cli_has(
        helm: Helm, values: dict[str, Any] | None) -> None:
    seen = set()
    for obj in workloads(render(helm, values)).values():
        for container in _containers(obj):
            command = container["command"]
            if command[0] != "egpu":
                assert command[0] == "kube-scheduler"
                continue
            component = command[1]
            seen.add(component)
            options = _options(component)
            for arg in command[2:]:
                if arg.startswith("--"):
                    assert arg.split("=", 1)[0] in options, (component, arg)
    assert seen == set(COMPONENTS)


def test_only_the_agent_is_privileged_and_every_other_container_is_non_root(
        default: list[dict[str, Any]]) -> None:
    for name, obj in workloads(default).items():
        for container in _containers(obj):
            sc = container.get("securityContext", {})
            if name == "elastic-gpu-agent":
                assert sc["privileged"] is True
            else:
                assert not sc.get("privileged"), name
                assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
    agent = workloads(default)["elastic-gpu-agent"]["spec"]["template"]["spec"]
    assert agent["priorityClassName"] == "system-node-critical"
    assert agent["nodeSelector"] == {"elasticgpu.io/agent": "true"}


def test_custom_image_and_placement_reach_every_egpu_container(helm: Helm) -> None:
    values = {"image": {"registry": "reg.example:5000", "repository": "gpu/egpu", "tag": "v2",
                        "pullPolicy": "Always"},
              "imagePullSecrets": [{"name": "pull"}],
              **{c: {"nodeSelector": {"pool": c},
                     "tolerations": [{"key": "dedicated", "operator": "Equal", "value": c,
                                      "effect": "NoSchedule"}]} for c in COMPONENTS}}
    objs = render(helm, values)
    for name, obj in workloads(objs).items():
        spec = obj["spec"]["template"]["spec"]
        assert spec["imagePullSecrets"] == [{"name": "pull"}]
        component = name.removeprefix("elastic-gpu-").removeprefix("kube-")
        # helm merges maps: the agent keeps its GPU-node label unless it is set to null.
        expected = {"pool": component} | (
            {"elasticgpu.io/agent": "true"} if component == "agent" else {})
        assert spec["nodeSelector"] == expected, name
        assert spec["tolerations"][0]["value"] == component
        for container in _containers(obj):
            if container["command"][0] == "egpu":
                assert container["image"] == "reg.example:5000/gpu/egpu:v2"
                assert container["imagePullPolicy"] == "Always"


def test_default_image_tag_is_the_app_version(default: list[dict[str, Any]]) -> None:
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    images = {c["image"] for o in workloads(default).values() for c in _containers(o)
              if c["command"][0] == "egpu"}
    assert images == {f"ghcr.io/elastic-ai/elastic-gpu:{version}"}


# --- the values schema --------------------------------------------------------------------

@pytest.mark.parametrize(("values", "field"), [
    ({"controller": {"replicas": "two"}}, "controller.replicas"),
    ({"webhook": {"replicas": -1}}, "webhook.replicas"),
    ({"scheduler": {"config": {"nodePolicy": "fastest"}}}, "scheduler.config.nodePolicy"),
    ({"scheduler": {"config": {"cardPolicy": "binpak"}}}, "scheduler.config.cardPolicy"),
    ({"scheduler": {"replicas": -1}}, "scheduler.replicas"),
    ({"scheduler": {"leaderElection": {"leaseDuration": 0}}}, "scheduler.leaderElection"),
    ({"agent": {"enabled": "yes"}}, "agent.enabled"),
    ({"image": {"pullPolicy": "Sometimes"}}, "image.pullPolicy"),
    ({"webhook": {"timeoutSeconds": 60}}, "webhook.timeoutSeconds"),
    ({"controler": {"replicas": 1}}, "controler"),
    ({"logLevel": "LOUD"}, "logLevel"),
])
def test_schema_refuses_nonsense_naming_the_field(helm: Helm, values: dict[str, Any],
                                                  field: str) -> None:
    result = helm("template", "egpu", str(CHART), *_set_args(values), check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    leaf = field.rsplit(".", 1)[-1]
    assert leaf in result.stderr, result.stderr


# --- what the objects say -----------------------------------------------------------------

def _rules_by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {o["kind"]: o["rules"] for o in docs if o["kind"] in ("ClusterRole", "Role")}


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_component_has_its_own_least_rbac(default: list[dict[str, Any]],
                                               component: str) -> None:
    """Each ServiceAccount is bound to its own roles only, none of which grants `*`.
    (deploy/ is rendered from the chart: tests/unit/chart/test_deploy_rendered.py.)"""
    name = f"elastic-gpu-{component}"
    roles = _rules_by_kind([o for o in default if o["kind"] in ("ClusterRole", "Role")
                            and o["metadata"]["name"] == name])
    assert roles.get("ClusterRole")
    for rules in roles.values():
        for rule in rules:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], (name, rule)
    bound = {(o["kind"], o["roleRef"]["name"]) for o in default
             if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and any(s["name"] == name for s in o["subjects"])}
    assert bound == {("ClusterRoleBinding", name)} | (
        {("RoleBinding", name)} if "Role" in roles else set())


def test_cert_manager_mode_drops_the_webhooks_secret_and_registration_rights(
        helm: Helm) -> None:
    objs = render(helm, {"certManager": {"enabled": True}})
    rules = by_kind(objs, "ClusterRole")["elastic-gpu-webhook"]["rules"]
    assert all(r["apiGroups"] != ["admissionregistration.k8s.io"] for r in rules)
    assert "elastic-gpu-webhook" not in by_kind(objs, "Role")
    cert = by_kind(objs, "Certificate")["elastic-gpu-webhook"]
    assert cert["spec"]["secretName"] == "elastic-gpu-webhook-tls"
    command = _containers(workloads(objs)["elastic-gpu-webhook"])[0]["command"]
    assert "--no-register" in command and "--cert-dir=/etc/elastic-gpu/webhook-tls" in command
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = by_kind(objs, kind)["elastic-gpu-webhook"]["metadata"]["annotations"]
        assert annotations == {"cert-manager.io/inject-ca-from": f"{NS}/elastic-gpu-webhook"}


def _without_ca(obj: dict[str, Any]) -> dict[str, Any]:
    obj = json.loads(json.dumps(obj))
    obj["metadata"].pop("annotations", None)
    for hook in obj["webhooks"]:
        hook["clientConfig"].pop("caBundle", None)
    return obj


@pytest.mark.parametrize("labels", [{}, {"team": "ml"}])
def test_webhook_configurations_are_registrations(helm: Helm, labels: dict[str, str]) -> None:
    objs = render(helm, {"webhook": {"namespaceLabels": labels}} if labels else None)
    target = Target(service_name="elastic-gpu-webhook", service_namespace=NS)
    expected = configurations("elastic-gpu-webhook", target, "CA",
                              Scope(namespace=NS, timeout_s=5, namespace_labels=labels))
    for want in expected:
        got = by_kind(objs, want["kind"])["elastic-gpu-webhook"]
        assert _without_ca(got) == _without_ca(want)


@pytest.mark.parametrize("best", [False, True])
def test_kube_scheduler_config_is_kubeconfigs_shape(helm: Helm, best: bool) -> None:
    objs = render(helm, {"scheduler": {"config": {"filterResult": "best"}}} if best else None)
    config = yaml.safe_load(by_kind(objs, "ConfigMap")["elastic-gpu-kube-scheduler"]["data"]
                            ["config.yaml"])
    # ours first, then the peers' names the chart answers by default (peerSchedulers)
    assert config["profiles"] == [{"schedulerName": name} for name in
                                  ("elastic-gpu-scheduler", "hami-scheduler", "kai-scheduler", "volcano")]
    assert config["leaderElection"]["resourceName"] == "elastic-gpu-kube-scheduler"
    tls = {"certFile": "/etc/elastic-gpu/tls/client.crt",
           "keyFile": "/etc/elastic-gpu/tls/client.key",
           "caFile": "/etc/elastic-gpu/tls/ca.crt"}
    assert config["extenders"] == [extender_stanza(
        f"https://elastic-gpu-scheduler.{NS}.svc:8888", prioritize=not best, tls_config=tls)]


def test_scheduler_tls_secret_holds_a_ca_and_both_certificates(
        default: list[dict[str, Any]]) -> None:
    from base64 import b64decode

    from cryptography import x509

    data = by_kind(default, "Secret")["elastic-gpu-scheduler-tls"]["data"]
    certs = {k: x509.load_pem_x509_certificate(b64decode(data[k]))
             for k in ("ca.crt", "tls.crt", "client.crt")}
    for key in ("tls.crt", "client.crt"):
        assert certs[key].issuer == certs["ca.crt"].subject
    san = certs["tls.crt"].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"elastic-gpu-scheduler.{NS}.svc" in san.get_values_for_type(x509.DNSName)
    assert "127.0.0.1" in {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


# --- a real kube-apiserver accepts every object -------------------------------------------

@pytest.mark.parametrize("values", [None, {"dra": {"deviceClasses": True}}],
                         ids=["default", "dra"])
def test_rendered_objects_pass_server_side_dry_run(helm: Helm, k8s_cluster: Any,
                                                   k8s_namespace: str,
                                                   values: dict[str, Any] | None) -> None:
    objs = render(helm, values, namespace=k8s_namespace)
    result = k8s_cluster.kubectl("apply", "--dry-run=server", "-o", "name", "-f", "-",
                                 input="\n---\n".join(yaml.safe_dump(o) for o in objs),
                                 check=False, timeout_s=120)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.split()) == len(objs)


@pytest.mark.parametrize("values", [None, {"certManager": {"enabled": True}}])
def test_read_only_egpu_containers_get_a_writable_tmp(helm: Helm,
                                                      values: dict[str, Any] | None) -> None:
    """The webhook writes its serving certificate under tempfile's directory for Python's ssl;
    a read-only root without a writable /tmp would fail it at start."""
    for name, obj in workloads(render(helm, values)).items():
        volumes = {v["name"]: v for v in obj["spec"]["template"]["spec"].get("volumes", [])}
        for container in _containers(obj):
            if not container.get("securityContext", {}).get("readOnlyRootFilesystem"):
                continue
            if container["command"][0] != "egpu":
                continue
            mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, name
            assert "emptyDir" in volumes[mounts["/tmp"]["name"]]


IX_CONFIG = 'version: "4.2.0"\nflags:\n  splitboard: true\nsharing:\n  timeSlicing:\n    replicas: 4\n'
NVIDIA_CONFIG = ("version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n"
                 "    resources:\n    - name: nvidia.com/gpu\n      replicas: 10\n")


@pytest.mark.parametrize(("text", "gpu"), [(IX_CONFIG, "iluvatar.com/gpu"),
                                           (NVIDIA_CONFIG, "nvidia.com/gpu")])
def test_agent_config_file_in_another_plugins_form_reaches_the_agent_verbatim(
        helm: Helm, tmp_path: Path, text: str, gpu: str) -> None:
    """agent.configFile (`--set-file`): the IX plugin's or NVIDIA's file as they ship it; the
    map `agent.config` cannot carry them (helm merges the defaults into it)."""
    from elastic_gpu.agent.config import load_config

    source = tmp_path / "plugin.yaml"
    source.write_text(text)
    out = helm("template", "egpu", str(CHART), "--set-file",
               f"agent.configFile={source}").stdout
    objs = [d for d in yaml.safe_load_all(out) if d]
    written = by_kind(objs, "ConfigMap")["elastic-gpu-agent"]["data"]["agent.yaml"]
    assert yaml.safe_load(written) == yaml.safe_load(text)
    (tmp_path / "agent.yaml").write_text(written)
    config = load_config(tmp_path / "agent.yaml")
    assert config.resources.gpu == gpu and config.resources.share == []
    # a different file rolls the DaemonSet (its checksum annotation changes)
    annotations = workloads(objs)["elastic-gpu-agent"]["spec"]["template"]["metadata"][
        "annotations"]
    default = workloads(render(helm))["elastic-gpu-agent"]["spec"]["template"]["metadata"][
        "annotations"]
    assert annotations["checksum/config"] != default["checksum/config"]


def test_the_plain_manifests_apply_as_install_md_says(helm: Helm, k8s_cluster: Any) -> None:
    """docs/install.md, "Without helm": the TLS Secret rendered once, then deploy/'s files,
    accepted by a real kube-apiserver (server-side dry run: nothing is left behind)."""
    k8s_cluster.kubectl("create", "namespace", NS, check=False)
    secret = helm("template", "elastic-gpu", str(CHART), "-n", NS, "--show-only",
                  "templates/scheduler-tls.yaml").stdout
    files = ["deploy/scheduler/rbac.yaml", "deploy/scheduler/scheduler.yaml",
             "deploy/scheduler/kube-scheduler.yaml", "deploy/agent/", "deploy/webhook/",
             "deploy/controller/", "deploy/admission-policies/"]
    result = k8s_cluster.kubectl(
        "apply", "--dry-run=server", "-o", "name", "-f", "-",
        *(a for f in files for a in ("-f", str(ROOT / f))), input=secret, check=False,
        timeout_s=120)
    assert result.returncode == 0, result.stderr
    applied = result.stdout.split()
    assert "secret/elastic-gpu-scheduler-tls" in applied
    for workload in ("deployment.apps/elastic-gpu-scheduler", "daemonset.apps/elastic-gpu-agent",
                     "deployment.apps/elastic-gpu-kube-scheduler",
                     "deployment.apps/elastic-gpu-webhook", "deployment.apps/elastic-gpu-controller"):
        assert workload in applied, applied
