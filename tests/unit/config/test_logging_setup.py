"""One logging setup (`runtime.logging`) behind one `--log-level` on every command; the
agent's `--verbose` stays an alias of `--log-level DEBUG`."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest
from typer.testing import CliRunner

from elastic_gpu.cli import options
from elastic_gpu.cli.main import app
from elastic_gpu.runtime.logging import FORMAT, LogLevelError, parse_level, setup_logging


def test_levels_are_logging_s_names_in_any_case() -> None:
    assert parse_level("debug") == logging.DEBUG
    assert parse_level("INFO") == logging.INFO
    assert parse_level(" Warning ") == logging.WARNING
    assert parse_level("warn") == logging.WARNING
    with pytest.raises(LogLevelError, match="DEBUG, INFO, WARNING, ERROR"):
        parse_level("loud")


def test_the_setup_writes_the_components_line_and_quiets_what_it_is_told() -> None:
    root, quiet = logging.getLogger(), logging.getLogger("quiet.one")
    # pytest's capture handlers of this phase, put back as they were (basicConfig configures
    # only a root logger without handlers, as in a fresh process)
    saved = (root.handlers[:], root.level, quiet.level)
    root.handlers = []
    stream = io.StringIO()
    try:
        setup_logging("debug", quiet=("quiet.one",), stream=stream)
        assert root.level == logging.DEBUG
        (handler,) = root.handlers
        assert handler.formatter is not None and handler.formatter._fmt == FORMAT
        quiet.info("dropped")
        logging.getLogger("elastic_gpu.x").debug("kept")
    finally:
        root.handlers = saved[0]
        root.setLevel(saved[1])
        quiet.setLevel(saved[2])
    assert "dropped" not in stream.getvalue()
    assert stream.getvalue().rstrip().endswith(" DEBUG elastic_gpu.x: kept")


@pytest.fixture
def levels(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """What each command hands the one setup (the root logger is pytest's here)."""
    calls: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(options, "setup_logging",
                        lambda level, **kw: calls.append((level, kw)))
    monkeypatch.delenv("NODE_NAME", raising=False)
    return calls


@pytest.mark.parametrize(("flags", "level"), [
    ([], "INFO"), (["--log-level", "warning"], "warning"), (["--verbose"], "DEBUG"),
    (["-v"], "DEBUG"), (["--verbose", "--log-level", "ERROR"], "DEBUG"),
])
def test_the_agent_takes_log_level_and_keeps_verbose_as_its_alias(
        levels: list[tuple[str, dict[str, Any]]], flags: list[str], level: str) -> None:
    result = CliRunner().invoke(app, ["agent", *flags])  # no --node: stops after the setup
    assert result.exit_code == 2 and "--node" in result.stderr, result.output
    assert [call[0] for call in levels] == [level]


@pytest.mark.parametrize("command", ["agent", "scheduler", "controller", "webhook", "top"])
def test_every_command_has_log_level(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--log-level" in result.stdout, result.output
