"""`egpu webhook` as a subprocess beside a real kube-apiserver, for tests and benches."""

from __future__ import annotations

import json
import re
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from egpu_testing.process import SupervisedProcess


def insecure_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class WebhookProcess(SupervisedProcess):
    """One `egpu webhook` registered as `name`, sent only namespaces labelled `label`."""

    what = "egpu webhook"

    def __init__(self, kubeconfig: Path, port: int, log_path: Path, *, name: str,
                 namespace: str, label: tuple[str, str] | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        super().__init__(log_path)
        self.kubeconfig = kubeconfig
        self.port = port
        self.name = name
        self.namespace = namespace
        self.label = label
        self.extra_args = tuple(extra_args)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "elastic_gpu.cli.main", "webhook", "--kubeconfig",
                str(self.kubeconfig), "--port", str(self.port), "--name", self.name,
                "--namespace", self.namespace, "--secret", f"{self.name}-tls"]
        if self.label is not None:
            argv += ["--namespace-label", f"{self.label[0]}={self.label[1]}"]
        return [*argv, *self.extra_args]

    def start(self, timeout_s: float = 60.0) -> None:
        self.launch(self.argv(), timeout_s)

    def ready(self) -> bool:
        return self.get("/readyz")[0] == 200

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5,
                                        context=insecure_context()) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")
        except OSError:
            return 0, ""

    def post(self, path: str, body: bytes) -> tuple[int, Any]:
        request = urllib.request.Request(self.url + path, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10,
                                        context=insecure_context()) as response:
                return int(response.status), json.loads(response.read())
        except urllib.error.HTTPError as err:
            text = err.read()
            try:
                return err.code, json.loads(text)
            except ValueError:
                return err.code, text.decode(errors="replace")

    def metric(self, name: str, labels: str = "") -> float:
        """The sum of the samples of `name` whose label text contains `labels`."""
        _, text = self.get("/metrics")
        total = 0.0
        for match in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
            if labels in (match[1] or ""):
                total += float(match[2])
        return total


def wait_in_force(plane: Any, namespace: str, timeout_s: float = 30.0) -> None:
    """Until kube-apiserver sends the namespace's pods to the webhook (its informers have seen
    the configuration and the namespace label): a server-side dry run of a pod asking 150% of
    a card is refused by the webhook's rule."""
    probe = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
                        "spec": {"containers": [{"name": "main", "image": "busybox",
                                                 "resources": {"limits": {
                                                     "tencent.com/vcuda-core": "150"}}}]}})
    deadline = time.monotonic() + timeout_s
    while True:
        result = plane.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-",
                               input=probe, check=False)
        if "rule resource-value" in result.stderr:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"webhook not in force in {namespace}: {result.stderr}")
        time.sleep(0.2)


def cleanup_webhook(plane: Any, hook: WebhookProcess) -> None:
    """Stop it, and remove its webhook configurations and namespace (not waiting for it)."""
    hook.stop()
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        plane.kubectl("delete", kind, hook.name, "--ignore-not-found", check=False)
    plane.kubectl("delete", "namespace", hook.namespace, "--wait=false", "--ignore-not-found",
                  check=False)


@contextmanager
def running_webhook(plane: Any, log_dir: Path, prefix: str, label: str,
                    extra_args: Sequence[str] = ()) -> Iterator[WebhookProcess]:
    """`egpu webhook` registered under a unique name (`prefix`-…, also its namespace), governing
    the namespaces labelled `label=<that name>`, with `extra_args`; cleaned up on the way
    out."""
    from egpu_testing.pytest_plugin import unique_name
    from elastic_gpu.devcluster.ports import free_ports

    name = unique_name(prefix)
    (port,) = free_ports(1)
    hook = WebhookProcess(plane.kubeconfig, port, log_dir / "webhook.log", name=name,
                          namespace=name, label=(label, name), extra_args=extra_args)
    hook.start()
    try:
        yield hook
    finally:
        cleanup_webhook(plane, hook)
