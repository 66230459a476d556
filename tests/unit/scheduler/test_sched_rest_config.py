"""The lean REST client's configuration: what it accepts and how it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from elastic_gpu.kube.kubeconfig import ClientConfigError
from elastic_gpu.kube.transport import ApiStatusError, RestClient, status_error


def kubeconfig(tmp_path: Path, user: dict[str, object]) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": user}]}))
    return path


def test_a_token_file_is_read_and_sent_as_a_bearer_token(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    client = RestClient.from_config(kubeconfig(tmp_path, {"tokenFile": str(tmp_path / "token")}))
    assert client._headers()["Authorization"] == "Bearer s3cret"


def test_exec_credentials_and_missing_files_are_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(ClientConfigError, match="exec and auth-provider"):
        RestClient.from_config(kubeconfig(tmp_path, {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}}))
    with pytest.raises(ClientConfigError, match="does not exist"):
        RestClient.from_config(tmp_path / "nope")


def test_api_errors_carry_code_words_and_whether_they_were_applied() -> None:
    conflict = status_error(409, b'{"kind":"Status","reason":"Conflict","message":"uid differs"}')
    assert (conflict.code, conflict.definite, str(conflict)) == (409, True,
                                                                 "409 Conflict: uid differs")
    assert not status_error(429, b"{}").definite  # throttled: may be retried, nothing known
    assert not status_error(503, b"not json").definite
    assert "not json" in str(status_error(503, b"not json"))
    assert not ApiStatusError(0, "", "connection refused").definite


def test_outside_a_cluster_no_kubeconfig_names_the_service_account(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ClientConfigError, match="in-cluster service account"):
        RestClient.from_config(None)
