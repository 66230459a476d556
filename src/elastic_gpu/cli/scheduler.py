"""`egpu scheduler`: the kube-scheduler extender (owned by the scheduler part)."""

from __future__ import annotations

import typer


def scheduler() -> None:
    """Serve the kube-scheduler extender."""
    typer.echo("egpu scheduler: not built yet", err=True)
    raise typer.Exit(2)
