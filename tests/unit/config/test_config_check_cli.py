"""`egpu scheduler|controller|agent|webhook --config F --check` through the CLI entry: each
refuses a YAML 1.1 boolean (`enabled: yes`), a key given twice and an unknown `apiVersion`, naming the
field, the value and the rule on stderr with exit code 2; a file without the header, or with
the right one, is valid. The same loader answers all four (`api.config.loader`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from elastic_gpu.api.config.loader import KINDS, ConfigError, Problem, load_settings
from elastic_gpu.cli.main import app
from elastic_gpu.scheduler.config import SchedulerConfig

COMMANDS = {"scheduler": "SchedulerConfig", "controller": "ControllerConfig",
            "agent": "AgentConfig", "webhook": "WebhookConfig"}
#: A YAML 1.1 boolean where each command has a boolean (the scheduler has none: its file
#: refuses the key itself, still naming field, value and rule).
YES = {
    "scheduler": ("enabled: yes\n", ("enabled: got 'yes' (a string)", "is not a known key")),
    "controller": ("mig:\n  enabled: yes\n",
                   ("mig.enabled: got 'yes' (a string)", "must be true or false")),
    "agent": ("healthCheck:\n  enabled: yes\n",
              ("healthCheck.enabled: got 'yes' (a string)", "must be true or false")),
    "webhook": ("budgetFinalizer: yes\n",
                ("budgetFinalizer: got 'yes' (a string)", "must be true or false")),
}
TWICE = {
    "scheduler": "seed: 1\nseed: 2\n",
    "controller": "mig:\n  enabled: true\n  enabled: false\n",
    "agent": "healthCheck:\n  enabled: true\n  enabled: false\n",
    "webhook": "port: 9443\nport: 9444\n",
}


def check(tmp_path: Path, command: str, text: str) -> tuple[int, str, str]:
    path = tmp_path / f"{command}.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, [command, "--config", str(path), "--check"])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_check_refuses_a_yaml_1_1_boolean(tmp_path: Path, command: str) -> None:
    text, words = YES[command]
    code, out, err = check(tmp_path, command, text)
    assert code == 2, (out, err)
    flat = " ".join(err.split())
    for word in words:
        assert word in flat, err
    assert "valid" not in out


@pytest.mark.parametrize("command", COMMANDS)
def test_check_refuses_a_key_given_twice(tmp_path: Path, command: str) -> None:
    code, out, err = check(tmp_path, command, TWICE[command])
    assert code == 2, (out, err)
    assert "is given twice" in err and "not valid YAML" in err, err
    field = {"scheduler": "(top level)", "webhook": "(top level)", "agent": "healthCheck",
             "controller": "mig"}[command]
    assert f"{field}: key" in err, err


@pytest.mark.parametrize("command", COMMANDS)
def test_check_refuses_an_unknown_api_version(tmp_path: Path, command: str) -> None:
    code, out, err = check(tmp_path, command,
                           f"apiVersion: elasticgpu.io/v2\nkind: {COMMANDS[command]}\n")
    assert code == 2, (out, err)
    flat = " ".join(err.split())
    assert "apiVersion: got 'elasticgpu.io/v2' (a string)" in flat, err
    assert "must be 'elasticgpu.io/v1alpha1' (the only version" in flat, err


@pytest.mark.parametrize("command", COMMANDS)
def test_check_refuses_another_commands_kind_naming_its_reader(tmp_path: Path,
                                                               command: str) -> None:
    other = "ControllerConfig" if command != "controller" else "SchedulerConfig"
    code, _, err = check(tmp_path, command, f"apiVersion: elasticgpu.io/v1alpha1\nkind: {other}\n")
    assert code == 2, err
    flat = " ".join(err.split())
    assert f"kind: got '{other}' (a string): must be '{COMMANDS[command]}'" in flat, err
    assert f"{other} is read by {KINDS[other]}; known kinds: AgentConfig," in flat, err


@pytest.mark.parametrize("command", COMMANDS)
def test_check_refuses_an_unknown_kind_listing_the_known_ones(tmp_path: Path,
                                                              command: str) -> None:
    code, _, err = check(tmp_path, command, "apiVersion: elasticgpu.io/v1alpha1\nkind: Gpu\n")
    assert code == 2, err
    flat = " ".join(err.split())
    assert "known kinds: AgentConfig, SchedulerConfig, ControllerConfig, WebhookConfig" in flat


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("header", [False, True])
def test_check_accepts_a_file_with_or_without_the_header(tmp_path: Path, command: str,
                                                         header: bool) -> None:
    text = f"apiVersion: elasticgpu.io/v1alpha1\nkind: {COMMANDS[command]}\n" if header else ""
    code, out, err = check(tmp_path, command, text)
    assert code == 0, err
    assert out.strip().endswith(": valid"), out


def test_the_one_config_error_carries_field_value_and_rule(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text("seed: -1\nreservationTTLSeconds: yes\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path, SchedulerConfig, "SchedulerConfig")
    assert err.value.problems == (
        Problem("reservationTTLSeconds", "'yes' (a string)",
                "must be a number written without quotes"),
        Problem("seed", "-1 (an integer)", "Input should be greater than or equal to 0"),
    )
    assert str(err.value).startswith(f"{path}: invalid SchedulerConfig:\n  ")
    path.write_text("a: 1\na: 2\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path, SchedulerConfig, "SchedulerConfig")
    assert (err.value.field, err.value.value, err.value.rule) == (
        "(top level)", None, "key 'a' is given twice")


@pytest.mark.parametrize("flags", [["--log-level", "loud"], ["--log-level", ""]])
def test_an_unknown_log_level_is_refused_naming_the_known_ones(flags: list[str]) -> None:
    result = CliRunner().invoke(app, ["agent", "--node", "n", "--no-api", *flags])
    assert result.exit_code == 2, result.output
    assert "--log-level" in result.stderr and "DEBUG, INFO, WARNING, ERROR" in result.stderr
