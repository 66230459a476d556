"""The webhook's certificates on the real kube-apiserver (issue #14's must-show 3): replicas
share one CA through the Secret, and rotation (serving certificate and CA) while pods are being
admitted fails no admission."""

from __future__ import annotations

import base64
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.pytest_plugin import unique_name
from egpu_testing.webhook import WebhookProcess
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

LABEL = "egpu-webhook-test"


def secret_data(plane: Any, namespace: str, name: str) -> dict[str, str]:
    from lightkube.resources.core_v1 import Secret

    secret = plane.client().get(Secret, name, namespace=namespace)
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def served_certificate(port: int) -> str:
    return ssl.get_server_certificate(("127.0.0.1", port))


def cleanup(plane: Any, hooks: list[WebhookProcess]) -> None:
    for hook in hooks:
        hook.stop()
    name = hooks[0].name
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        plane.kubectl("delete", kind, name, "--ignore-not-found", check=False)
    plane.kubectl("delete", "namespace", hooks[0].namespace, "--wait=false",
                  "--ignore-not-found", check=False)


def test_replicas_started_together_share_one_secret(k8s_cluster: Any, tmp_path: Path) -> None:
    name = unique_name("egpu-webhook-rep")
    ports = free_ports(3)
    hooks = [WebhookProcess(k8s_cluster.kubeconfig, port, tmp_path / f"w{i}.log", name=name,
                            namespace=name, label=(LABEL, name)) for i, port in enumerate(ports)]
    try:
        threads = [threading.Thread(target=hook.start) for hook in hooks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for hook in hooks:
            assert hook.get("/readyz")[0] == 200, hook.log_tail()
        data = secret_data(k8s_cluster, name, f"{name}-tls")
        served = {served_certificate(hook.port) for hook in hooks}
        assert served == {data["tls.crt"]}
    finally:
        cleanup(k8s_cluster, hooks)


def test_rotation_while_serving_fails_no_admission(k8s_cluster: Any, k8s_namespace: str,
                                                   tmp_path: Path) -> None:
    from lightkube import codecs
    from lightkube.core.exceptions import ApiError

    name = unique_name("egpu-webhook-rot")
    (port,) = free_ports(1)
    # serving certificate ~22 s (renewed with a third left: every ~14 s), CA ~60 s
    hook = WebhookProcess(k8s_cluster.kubeconfig, port, tmp_path / "webhook.log", name=name,
                          namespace=name, label=(LABEL, name),
                          extra_args=["--cert-days", "0.00025", "--ca-days", "0.0007",
                                      "--rotation-check-seconds", "1"])
    hook.start()
    try:
        k8s_cluster.kubectl("label", "namespace", k8s_namespace, f"{LABEL}={name}")
        first = secret_data(k8s_cluster, name, f"{name}-tls")
        client = k8s_cluster.client()
        good = codecs.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "good", "namespace": k8s_namespace}, "spec": {"containers": [{
                "name": "main", "image": "x",
                "resources": {"limits": {"tencent.com/vcuda-core": "30"}}}]}})
        bad = codecs.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "bad", "namespace": k8s_namespace}, "spec": {"containers": [{
                "name": "main", "image": "x",
                "resources": {"limits": {"tencent.com/vcuda-core": "150"}}}]}})
        # the webhook in force for the namespace before counting
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create(bad, dry_run=True)
            except ApiError as err:
                if "rule resource-value" in str(err.status.message):
                    break
            assert time.monotonic() < deadline, "webhook never in force"
            time.sleep(0.2)
        failures: list[str] = []
        admitted = refused = 0
        ca_seen = {first["ca.crt"]}
        certs_seen = {served_certificate(port)}
        end = time.monotonic() + 75
        while time.monotonic() < end:
            try:
                created = client.create(good, dry_run=True)
                if created.metadata.annotations.get("tencent.com/vcuda-core-limit") != "30":
                    failures.append("admitted without the mutation")
                admitted += 1
            except ApiError as err:
                failures.append(f"good pod: {err.status.message}")
            try:
                client.create(bad, dry_run=True)
                failures.append("bad pod admitted")
            except ApiError as err:
                if "rule resource-value" in str(err.status.message):
                    refused += 1
                else:
                    failures.append(f"bad pod: {err.status.message}")
            certs_seen.add(served_certificate(port))
            ca_seen.add(secret_data(k8s_cluster, name, f"{name}-tls")["ca.crt"])
            time.sleep(0.05)
        assert failures == [], failures[:5]
        assert admitted > 100 and refused == admitted
        assert len(certs_seen) >= 4, "the serving certificate did not rotate"
        assert len(ca_seen) >= 2, "the CA did not rotate"
        assert hook.metric("elasticgpu_webhook_certificate_reloads_total") >= 4
    finally:
        cleanup(k8s_cluster, [hook])


def test_cert_manager_files_are_served_registered_and_reloaded(k8s_cluster: Any,
                                                               tmp_path: Path) -> None:
    import datetime as dt
    import json

    from elastic_gpu.webhook.certs import Lifetimes, create_bundle, new_serving, serving_hosts

    now = dt.datetime.now(dt.UTC)
    bundle = create_bundle(serving_hosts(None, "x"), now, Lifetimes())
    cert_dir = tmp_path / "certs"  # as cert-manager's Secret is mounted
    cert_dir.mkdir()
    for key, text in (("tls.crt", bundle.tls_cert), ("tls.key", bundle.tls_key),
                      ("ca.crt", bundle.ca_cert)):
        (cert_dir / key).write_text(text)
    name = unique_name("egpu-webhook-cm")
    (port,) = free_ports(1)
    hook = WebhookProcess(k8s_cluster.kubeconfig, port, tmp_path / "webhook.log", name=name,
                          namespace=name, label=(LABEL, name),
                          extra_args=["--cert-dir", str(cert_dir),
                                      "--rotation-check-seconds", "0.5"])
    hook.start()
    try:
        assert served_certificate(port) == bundle.tls_cert
        config = json.loads(k8s_cluster.kubectl(
            "get", "validatingwebhookconfiguration", name, "-o", "json").stdout)
        ca_bundle = config["webhooks"][0]["clientConfig"]["caBundle"]
        assert base64.b64decode(ca_bundle).decode() == bundle.ca_cert
        # no Secret is made in this mode
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.core_v1 import Secret

        with pytest.raises(ApiError):
            k8s_cluster.client().get(Secret, f"{name}-tls", namespace=name)
        renewed, key = new_serving(bundle.ca_cert, bundle.ca_key, serving_hosts(None, "x"), now,
                                   Lifetimes())
        (cert_dir / "tls.key").write_text(key)
        (cert_dir / "tls.crt").write_text(renewed)
        deadline = time.monotonic() + 10
        while served_certificate(port) != renewed:
            assert time.monotonic() < deadline, "renewed certificate not served"
            time.sleep(0.2)
    finally:
        cleanup(k8s_cluster, [hook])


def test_the_deployed_rbac_is_enough(k8s_cluster: Any, k8s_namespace: str,
                                     tmp_path: Path) -> None:
    """deploy/webhook/rbac.yaml: the webhook with only those rights makes its Secret, registers
    and refuses a bad pod."""
    import yaml

    repo = Path(__file__).resolve().parents[3]
    k8s_cluster.kubectl("create", "namespace", "elastic-gpu", check=False)
    k8s_cluster.kubectl("apply", "-f", str(repo / "deploy/webhook/rbac.yaml"))
    token = k8s_cluster.kubectl("create", "token", "elastic-gpu-webhook", "-n",
                                "elastic-gpu").stdout.strip()
    admin = yaml.safe_load(k8s_cluster.kubeconfig.read_text())
    kubeconfig = tmp_path / "sa.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}]}))
    (port,) = free_ports(1)
    # the deployed names (the RBAC's resourceNames), sent only the test's namespace
    hook = WebhookProcess(kubeconfig, port, tmp_path / "webhook.log",
                          name="elastic-gpu-webhook", namespace="elastic-gpu",
                          label=(LABEL, "rbac"))  # its Secret: elastic-gpu-webhook-tls
    try:
        hook.start()
        k8s_cluster.kubectl("label", "namespace", k8s_namespace, f"{LABEL}=rbac")
        bad = ('{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"}, "spec": '
               '{"containers": [{"name": "main", "image": "x", "resources": {"limits": '
               '{"tencent.com/vcuda-core": 150}}}]}}')
        deadline = time.monotonic() + 30
        while True:
            result = k8s_cluster.kubectl("create", "-n", k8s_namespace, "-f", "-", input=bad,
                                         check=False)
            if "rule resource-value" in result.stderr:
                break
            assert time.monotonic() < deadline, result.stderr
            time.sleep(0.2)
        assert secret_data(k8s_cluster, "elastic-gpu", "elastic-gpu-webhook-tls")["tls.crt"]
    finally:
        hook.stop()
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            k8s_cluster.kubectl("delete", kind, "elastic-gpu-webhook", "--ignore-not-found",
                                check=False)
        k8s_cluster.kubectl("delete", "secret", "-n", "elastic-gpu", "elastic-gpu-webhook-tls",
                            "--ignore-not-found", check=False)
