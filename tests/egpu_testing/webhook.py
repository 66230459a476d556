"""`egpu webhook` as a subprocess beside a real kube-apiserver, for tests and benches."""

from __future__ import annotations

import json
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def insecure_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class WebhookProcess:
    """One `egpu webhook` registered as `name`, sent only namespaces labelled `label`."""

    def __init__(self, kubeconfig: Path, port: int, log_path: Path, *, name: str,
                 namespace: str, label: tuple[str, str] | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        self.kubeconfig = kubeconfig
        self.port = port
        self.log_path = log_path
        self.name = name
        self.namespace = namespace
        self.label = label
        self.extra_args = tuple(extra_args)
        self.process: subprocess.Popen[bytes] | None = None

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
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"egpu webhook exited with {self.process.returncode}:\n"
                                   f"{self.log_tail()}")
            if self.get("/readyz")[0] == 200:
                return
            time.sleep(0.1)
        raise TimeoutError(f"egpu webhook not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

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

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
