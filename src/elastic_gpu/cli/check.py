"""`--check` of `egpu agent`, `egpu scheduler`, `egpu controller` and `egpu webhook`: read and
validate `--config` with the component's own loader (the one strict loader,
`api.config.loader`, with the component's model) and start nothing, so that a ConfigMap can be
checked before it is rolled out (e.g. in CI, or an init container)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from elastic_gpu.api.config.loader import ConfigError

#: Exit status of a config that cannot be used (as when the component itself refuses it).
INVALID = 2


def check_config(command: str, path: Path | None, load: Callable[[Path], Any]) -> None:
    """Load `path` with `load`: print `<file>: valid` (exit 0), or each problem it names
    (field, value, rule) and exit `INVALID`. Without `--config` there is nothing to check."""
    if path is None:
        typer.echo(f"{command}: --check reads --config; give the file to check", err=True)
        raise typer.Exit(INVALID)
    try:
        load(path)
    except ConfigError as err:
        typer.echo(f"{command}: {err}", err=True)
        raise typer.Exit(INVALID) from None
    typer.echo(f"{command}: {path}: valid")
