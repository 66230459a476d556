"""`egpu gpu-check`: run on a machine with an NVIDIA GPU and driver; see docs/gpu-check.md."""

from __future__ import annotations

import typer


def gpu_check(
    allow_mig_changes: bool = typer.Option(
        False, "--allow-mig-changes",
        help="Create and destroy one MIG instance on a card whose MIG mode is already on. "
             "Your own machine only; never on a machine lent to you. Default: read only."),
    nvidia_smi: str = typer.Option("nvidia-smi", help="The nvidia-smi to compare with."),
    python: str = typer.Option(
        "", help="The Python with PyTorch that runs the MPS step's CUDA workload "
                 "(default: this one)."),
    percent: int = typer.Option(30, min=1, max=99, help="Compute share (percent) to check."),
    memory_mib: int = typer.Option(2048, min=64, help="Memory share (MiB) to check."),
) -> None:
    """Check our NVIDIA path on this machine against nvidia-smi: NVML discovery, MIG layout,
    MPS limits, DRA prepare. Exit 0 when nothing failed (skips included, as on a machine with
    no GPU), 1 when a step failed."""
    import sys

    from elastic_gpu.agent.dra.gpucheck import dra_step
    from elastic_gpu.agent.gpucheck import CheckOptions, run_checks
    from elastic_gpu.core.gpucheck import exit_status

    options = CheckOptions(allow_mig_changes=allow_mig_changes, nvidia_smi=nvidia_smi,
                           python=python or sys.executable, percent=percent,
                           memory_mib=memory_mib)
    results = run_checks(options, dra=dra_step)
    for result in results:
        typer.echo(result.render())
    raise typer.Exit(exit_status(results))
