"""Kubeconfig files for the admin identity of a local control plane."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from elastic_gpu.devcluster.pki import Pki

CONTEXT = "elastic-gpu-dev"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, pki: Pki) -> Path:
    """Write a self-contained kubeconfig (certificates inlined, so it survives a moved dir)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {
            "server": server, "certificate-authority-data": _b64(pki.ca_cert)}}],
        "users": [{"name": CONTEXT, "user": {
            "client-certificate-data": _b64(pki.admin_cert),
            "client-key-data": _b64(pki.admin_key)}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT,
                                                   "namespace": "default"}}],
        "current-context": CONTEXT,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path
