"""`egpu controller`: bad options are refused with what is wrong, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from elastic_gpu.cli.main import app


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["controller", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize(("args", "words"), [
    (["--extender-client-cert", "c.pem"],
     "extender (set by --extender-client-cert): got {'clientCertFile': 'c.pem'} (a mapping): "
     "clientCertFile and clientKeyFile go together"),
    (["--lease-duration", "10", "--renew-deadline", "10"],
     "leaderElection (set by --lease-duration, --renew-deadline)"),
    (["--lease-duration", "10", "--renew-deadline", "10"],
     "leaseDurationSeconds (10) must exceed renewDeadlineSeconds (10)"),
    (["--renew-deadline", "2", "--retry-period", "2"],
     "renewDeadlineSeconds (2) must exceed 1.2 x retryPeriodSeconds (2)"),
    (["--only", "nope"], "known controllers are ['budgets', 'claims', 'defrag', 'mig', 'mig-dynamic']"),
    (["--backoff-base", "2", "--backoff-max", "1"], "maxSeconds (1) must be >= baseSeconds (2)"),
    (["--workers", "0"], "--workers (workers): got 0 (an integer): Input should be greater "
                         "than or equal to 1"),
    (["--budget-default-period", "30s"], "--budget-default-period (budgets.defaultPeriod): "
                                         "got '30s' (a string)"),
    (["--extender-ca", "/nonexistent/ca.pem"], "No such file"),
    (["--kubeconfig", "/nonexistent/kubeconfig", "--metrics-port", "1"],
     "kubeconfig /nonexistent/kubeconfig does not exist"),
])
def test_bad_options_exit_2_naming_the_problem(args: list[str], words: str) -> None:
    code, output = run(*args)
    assert code == 2, output
    assert words in " ".join(output.split()), output


def test_help_names_every_option() -> None:
    code, output = run("--help")
    assert code == 0
    for option in ("--extender-url", "--lease-namespace", "--renew-deadline", "--metrics-port",
                   "--workers", "--identity"):
        assert option in output


@pytest.mark.parametrize(("text", "words"), [
    ("mig: {moveBack: sometimes}", "mig.moveBack: got 'sometimes' (a string): Input should "
                                   "be 'never', 'when-idle' or 'always'"),
    ("mig: {substitutions: {1g.10gb: [1g.5gb]}}", "1g.10gb: 1g.5gb may not stand in for it"),
    ("mig: {substitutions: {1g.10gb: [2g.35gb]}}", "1g.10gb: 2g.35gb may not stand in for it"),
    ("mig: {substitutions: {9g.10gb: [2g.20gb]}}", "key '9g.10gb' is not a MIG profile"),
    ("mig: {namespaces: team-a}", "mig.namespaces: got 'team-a' (a string): must be a list"),
    ("mig: {enabeld: false}", "mig.enabeld: got False (a boolean): is not a known key"),
    ("[1, 2]", "must be a mapping of settings, got list"),
])
def test_bad_config_exits_2_naming_file_field_value_and_rule(
        tmp_path: pytest.TempPathFactory, text: str, words: str) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "controller.yaml"
    path.write_text(text)
    code, output = run("--config", str(path))
    assert code == 2, output
    assert f"--config {path}: " in output, output
    assert words in " ".join(output.split()), output


def test_flags_given_beat_the_file_and_the_file_beats_the_defaults(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `serve` is handed: the file's keys, each flag given on top, defaults elsewhere."""
    from elastic_gpu.controller import manager

    served: list[manager.ManagerOptions] = []

    async def serve(options: manager.ManagerOptions, factories: object) -> int:
        served.append(options)
        return 0

    monkeypatch.setattr(manager, "serve", serve)
    path = tmp_path / "controller.yaml"
    path.write_text("workers: 3\nleaderElection: {leaseDurationSeconds: 40, "
                    "renewDeadlineSeconds: 30}\nbudgets: {defaultGPUHours: 2}\n")
    code, output = run("--config", str(path), "--lease-duration", "60", "--identity", "me",
                       "--budget-default-period", "24h", "--only", "budgets")
    assert code == 0, output
    (options,) = served
    settings = options.config
    assert settings.workers == 3 and settings.controllers == ("budgets",)
    assert (options.lease.lease_duration_s, options.lease.renew_deadline_s,
            options.lease.retry_period_s, options.lease.identity) == (60.0, 30.0, 2.0, "me")
    assert (settings.budgets.default_gpu_hours, settings.budgets.default_period) == (2.0, "24h")
    assert settings.metrics.port == 8080  # neither: the default


def test_check_reads_the_file_with_the_flags_given(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text("workers: 3\n")
    code, output = run("--config", str(path), "--check", "--workers", "0")
    assert code == 2, output
    assert "--workers (workers): got 0 (an integer)" in output, output


def test_check_refuses_an_unknown_controller_as_a_start_does(tmp_path: Path) -> None:
    """`--check` said valid for `--only nope` (or `controllers: [nope]`) while a start of the
    same exited 2 (found trying the product as a new user): the config's own rule now."""
    from elastic_gpu.controller.config import CONTROLLER_NAMES
    from elastic_gpu.controller.registry import CONTROLLERS

    assert set(CONTROLLER_NAMES) == set(CONTROLLERS)
    path = tmp_path / "controller.yaml"
    path.write_text("controllers: [claims, nope]\n")
    code, output = run("--config", str(path), "--check")
    assert code == 2, output
    assert "controllers: got ['claims', 'nope'] (a list): unknown ['nope']; known controllers " \
           "are ['budgets', 'claims', 'defrag', 'mig', 'mig-dynamic']" in output, output
    code, output = run("--config", str(path), "--check", "--only", "mig-dynamic")
    assert code == 0, output
