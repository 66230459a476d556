"""`egpu controller`: bad options are refused with what is wrong, before anything starts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from elastic_gpu.cli.main import app


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["controller", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize(("args", "words"), [
    (["--extender-client-cert", "c.pem"], "--extender-client-cert and --extender-client-key go together"),
    (["--lease-duration", "10", "--renew-deadline", "10"],
     "lease duration 10.0 s must exceed the renew deadline 10.0 s"),
    (["--renew-deadline", "2", "--retry-period", "2"], "must exceed 1.2 x the retry period"),
    (["--only", "nope"], "known controllers are ['budgets', 'claims']"),
    (["--backoff-base", "2", "--backoff-max", "1"], "--backoff-max must be >= --backoff-base"),
    (["--extender-ca", "/nonexistent/ca.pem"], "No such file"),
    (["--kubeconfig", "/nonexistent/kubeconfig", "--metrics-port", "1"],
     "kubeconfig /nonexistent/kubeconfig does not exist"),
])
def test_bad_options_exit_2_naming_the_problem(args: list[str], words: str) -> None:
    code, output = run(*args)
    assert code == 2, output
    assert words in output, output


def test_help_names_every_option() -> None:
    code, output = run("--help")
    assert code == 0
    for option in ("--extender-url", "--lease-namespace", "--renew-deadline", "--metrics-port",
                   "--workers", "--identity"):
        assert option in output
