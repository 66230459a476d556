"""`egpu simulate`: replay a trace through the placement engine (owned by the simulator part)."""

from __future__ import annotations

import typer


def simulate() -> None:
    """Replay a GPU trace through the placement engine."""
    typer.echo("egpu simulate: not built yet", err=True)
    raise typer.Exit(2)
