"""`egpu --help` and each command's `--help` say what their source says: typer's default "rich"
markup took a help text's `[default: ...]` for a markup tag and dropped it (so `egpu sandbox up
--help` showed no default for --gpu-nodes), and kept a docstring's line breaks in the commands'
list (found trying the product as a new user)."""

from __future__ import annotations

from typer.testing import CliRunner

from elastic_gpu.cli.kubectl import kubectl_app
from elastic_gpu.cli.main import app

runner = CliRunner(env={"COLUMNS": "300"})  # no wrapping inside the help's boxes


def _help(*command: str) -> str:
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


def test_written_defaults_are_shown() -> None:
    up = _help("sandbox", "up")
    assert "[default: 4 without --nodes-csv or --cluster]" in up
    assert "[default: kubeconfig in the state dir]" in up
    assert "[default: from hack/ensure-k8s.sh]" in up
    assert "[default: ~/.local/state/elastic-gpu/sandbox]" in _help("sandbox", "down")


def test_a_command_summary_is_one_paragraph() -> None:
    listing = _help()
    # one line at 300 columns: the docstring's own line breaks are joined
    agent = next(line for line in listing.splitlines() if "│ agent" in line)
    assert "over NVML or the fake backend." in agent
    assert "the DRA driver gpu.elasticgpu.io" in agent


def test_placeholders_are_not_swallowed() -> None:
    assert "https://HOST:PORT of --host and --port" in _help("webhook")


def test_the_kubectl_plugin_renders_alike() -> None:
    result = runner.invoke(kubectl_app, ["--help"])
    line = next(line for line in result.output.splitlines() if "│ top" in line)
    assert "free compute and memory, health and fragmentation" in line


def test_the_controller_help_names_every_controller() -> None:
    """`egpu controller --help` listed four of the five controllers `--only` takes: the
    mig-dynamic one was missing (found trying the product as a new user)."""
    from elastic_gpu.controller.registry import CONTROLLERS

    text = " ".join(_help("controller").split())
    for name in CONTROLLERS:
        assert f"{name}:" in text, name
