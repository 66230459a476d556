"""Kubeconfig files for the identities of a local control plane (admin, controller-manager)."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from elastic_gpu.devcluster.pki import Pki

CONTEXT = "elastic-gpu-dev"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, pki: Pki, *,
                     client: tuple[Path, Path] | None = None) -> Path:
    """Write a self-contained kubeconfig (certificates inlined, so it survives a moved dir).

    `client`: (certificate, key) of the identity; the admin's by default.
    """
    cert, key = client if client is not None else (pki.admin_cert, pki.admin_key)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {
            "server": server, "certificate-authority-data": _b64(pki.ca_cert)}}],
        "users": [{"name": CONTEXT, "user": {
            "client-certificate-data": _b64(cert),
            "client-key-data": _b64(key)}}],
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
