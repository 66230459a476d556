"""`egpu sandbox`: a local cluster with fake GPU nodes (owned by the devcluster part)."""

from __future__ import annotations

import typer

app = typer.Typer(help="A local Kubernetes cluster with fake GPU nodes.", no_args_is_help=True)
