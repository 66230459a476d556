"""Options every `egpu` command shares, declared once so that their flag, help text and
handling cannot drift between commands."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Final

import typer

from elastic_gpu.runtime.logging import COMMON_LEVELS, FORMAT, LogLevelError, setup_logging

#: How every `egpu` app renders its help. Not typer's default, "rich": that reads a help
#: text's `[default: ...]` as a markup tag and drops it, and keeps a docstring's line breaks in
#: the commands' list; Markdown joins the lines and shows the text as written (so no `<name>`
#: placeholders, which it takes for HTML: write NAME).
HELP_MARKUP: Final = "markdown"

#: `--log-level`: the same flag on every command (the agent also keeps `--verbose`).
LogLevel = Annotated[str, typer.Option(
    "--log-level", help=f"log level: {', '.join(COMMON_LEVELS)} (any case)")]


def start_logging(command: str, level: str, *, fmt: str = FORMAT,
                  quiet: Iterable[str] = ()) -> None:
    """`setup_logging`, or exit 2 with `COMMAND: error: ...` for an unknown level."""
    try:
        setup_logging(level, fmt=fmt, quiet=quiet)
    except LogLevelError as err:
        typer.echo(f"{command}: error: --log-level: {err}", err=True)
        raise typer.Exit(2) from None
