"""`egpu controller`: bad options are refused with what is wrong, before anything starts."""

from __future__ import annotations

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
    (["--only", "nope"], "known controllers are ['budgets', 'claims', 'defrag', 'mig']"),
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
