"""`egpu webhook --config F`: the webhook's settings file (WebhookConfig), its flags merged by
the one rule (`api.config.merge`: a flag given beats the file, the file beats the default),
and what reaches the server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from elastic_gpu.api.config.loader import ConfigError
from elastic_gpu.api.config.merge import Override
from elastic_gpu.cli.main import app
from elastic_gpu.cli.webhook import FLAG_KEYS
from elastic_gpu.webhook.config import WebhookConfig, load_config

FILE = """\
apiVersion: elasticgpu.io/v1alpha1
kind: WebhookConfig
port: 10443
namespaceLabels: {elasticgpu.io/webhook: enabled}
overBudgetPriorityClass: batch-low
budgetFinalizer: true
headerTimeoutSeconds: 5
register: false
"""


def write(tmp_path: Path, text: str = FILE) -> Path:
    path = tmp_path / "webhook.yaml"
    path.write_text(text)
    return path


def flag(name: str, value: Any) -> Override:
    return Override(FLAG_KEYS[name], name, value)


def test_the_file_sets_the_keys_it_names_and_the_model_the_rest(tmp_path: Path) -> None:
    settings = load_config(write(tmp_path))
    assert settings.port == 10443
    assert settings.namespace_labels == {"elasticgpu.io/webhook": "enabled"}
    assert settings.over_budget_priority_class == "batch-low"
    assert settings.budget_finalizer and not settings.register_configurations
    assert settings.header_timeout_s == 5
    assert settings.host == WebhookConfig().host == "127.0.0.1"  # not in the file: default


def test_a_flag_given_beats_the_file_and_one_not_given_leaves_it(tmp_path: Path) -> None:
    settings = load_config(write(tmp_path), [
        flag("--port", 11443), flag("--budget-finalizer", False),
        flag("--over-budget-priority-class", ""), flag("--quota-resources", None)])
    assert settings.port == 11443
    assert not settings.budget_finalizer
    assert settings.over_budget_priority_class == ""  # '': the lookups are off
    assert not settings.quota_resources  # not given: the file's (here the default)
    assert settings.header_timeout_s == 5


def test_a_bad_flag_is_named_by_the_flag_and_a_bad_key_by_its_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [flag("--port", 70000)])
    assert err.value.field == "--port (port)"
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "url: http://127.0.0.1:9443\nmaxConection: 5\n"))
    fields = {p.field: p.rule for p in err.value.problems}
    assert "https only" in fields["url"]
    assert "not a known key" in fields["maxConection"]


def test_every_flag_that_sets_a_key_names_a_key_of_the_model() -> None:
    keys = {f.validation_alias or name for name, f in WebhookConfig.model_fields.items()}
    assert set(FLAG_KEYS.values()) <= keys


def test_the_command_serves_with_the_file_and_the_flags_on_top(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from elastic_gpu.webhook import server

    served: list[Any] = []

    async def serve(options: Any) -> None:
        served.append(options)

    monkeypatch.setattr(server, "serve", serve)
    result = CliRunner().invoke(app, ["webhook", "--config", str(write(tmp_path)),
                                      "--port", "12443", "--namespace-label", "team=a"])
    assert result.exit_code == 0, result.output
    (options,) = served
    assert options.port == 12443  # the flag
    assert options.namespace_labels == {"team": "a"}  # the flags replace the file's labels
    assert options.over_budget_class == "batch-low" and options.budget_finalizer  # the file
    assert not options.register
    assert options.connection_limits.header_timeout_s == 5


def test_check_says_valid_or_names_the_problem(tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["webhook", "--config", str(write(tmp_path)), "--check"])
    assert ok.exit_code == 0 and ok.stdout.strip().endswith(": valid"), ok.output
    bad = runner.invoke(app, ["webhook", "--config", str(write(tmp_path, "timeoutSeconds: 31\n")),
                              "--check"])
    assert bad.exit_code == 2
    assert "timeoutSeconds: got 31 (an integer)" in " ".join(bad.stderr.split())
