"""`kubectl egpu ...`: the kubectl plugin, the `kubectl-egpu` executable on PATH (kubectl runs
`kubectl-<name>` for `kubectl <name>`). Only the commands that read a cluster through the
user's kubeconfig; its own small app, so the plugin does not import every part of `egpu`."""

from __future__ import annotations

import typer

from elastic_gpu import __version__
from elastic_gpu.cli import top
from elastic_gpu.cli.options import HELP_MARKUP

kubectl_app = typer.Typer(
    name="kubectl egpu",
    help="Elastic GPU as a kubectl plugin: `kubectl egpu top` shows the cluster's GPUs.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=HELP_MARKUP,
)
kubectl_app.command("top")(top.top)


@kubectl_app.command("version")
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def main() -> None:
    kubectl_app(prog_name="kubectl egpu")


if __name__ == "__main__":
    main()
