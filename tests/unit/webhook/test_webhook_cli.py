"""`egpu webhook`'s command line: bad options exit 2 with the reason, before any API call."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from elastic_gpu.cli.main import app


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["webhook", *args])
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes else "")


def test_url_must_be_https() -> None:
    code, out = run("--url", "http://127.0.0.1:9443")
    assert code == 2 and "https only" in out


def test_namespace_label_must_be_key_value() -> None:
    code, out = run("--namespace-label", "novalue")
    assert code == 2 and "KEY=VALUE" in out


def test_cert_dir_needs_a_certificate(tmp_path: Path) -> None:
    code, out = run("--cert-dir", str(tmp_path))
    assert code == 2 and "no tls.crt" in out


def test_missing_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    code, out = run("--kubeconfig", str(tmp_path / "none"), "--port", "1")
    assert code == 2 and "does not exist" in out


def test_unreachable_api_server_is_a_clear_error(tmp_path: Path) -> None:
    from elastic_gpu.devcluster.ports import free_ports

    (port,) = free_ports(1)  # nothing listens there
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}",
  insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: x}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
""")
    code, out = run("--kubeconfig", str(kubeconfig), "--port", "1")
    assert code == 1
    assert "no serving certificate from Secret elastic-gpu/elastic-gpu-webhook-tls" in out
