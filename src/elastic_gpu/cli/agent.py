"""`egpu agent`: the node agent (owned by the agent part)."""

from __future__ import annotations

import typer


def agent() -> None:
    """Run the node agent."""
    typer.echo("egpu agent: not built yet", err=True)
    raise typer.Exit(2)
