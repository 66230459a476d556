"""The `egpu` command: one root, a sub-command per part of the product.

Each part owns its sub-app in `elastic_gpu.cli.<part>`; sub-apps import their heavy modules
lazily inside their commands so that `egpu --help` stays fast.
"""

from __future__ import annotations

import typer

from elastic_gpu import __version__
from elastic_gpu.cli import (
    agent,
    controller,
    gpucheck,
    sandbox,
    scheduler,
    simulate,
    top,
    webhook,
)
from elastic_gpu.cli.options import HELP_MARKUP

app = typer.Typer(
    name="egpu",
    help="Elastic GPU: share, schedule, isolate and account for GPUs on Kubernetes.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=HELP_MARKUP,
)
app.command("simulate")(simulate.simulate)
app.add_typer(sandbox.app, name="sandbox")
app.command("scheduler")(scheduler.scheduler)
app.command("agent")(agent.agent)
app.command("webhook")(webhook.webhook)
app.command("controller")(controller.controller)
app.command("top")(top.top)
app.command("gpu-check")(gpucheck.gpu_check)


@app.command("version")
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
