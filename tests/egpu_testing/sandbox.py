"""Driving `egpu sandbox` as a user does, for the integration tests and benches: the CLI and
kubectl as subprocesses, and whether a process the sandbox left is still alive."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from elastic_gpu.devcluster.binaries import find_bin_dir


def egpu(*args: str, timeout: float | None = 180) -> subprocess.CompletedProcess[str]:
    """`egpu ARGS...` run to completion, its output captured, never raising on its exit code."""
    return subprocess.run([sys.executable, "-m", "elastic_gpu.cli.main", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def timed_egpu(*args: str) -> tuple[float, str]:
    """For benches: `egpu ARGS...` (no time limit) -> (its wall-clock seconds, its stdout);
    exits the bench with its output if it fails."""
    start = time.perf_counter()
    result = egpu(*args, timeout=None)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"egpu {' '.join(args)} failed:\n{result.stderr}{result.stdout}")
    return elapsed, result.stdout


def kubectl_run(kubeconfig: Path, *args: str, input: str | None = None
                ) -> subprocess.CompletedProcess[str]:
    """The built kubectl against `kubeconfig`, whatever its exit code."""
    return subprocess.run([str(find_bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
                          input=input, capture_output=True, text=True, timeout=60, check=False)


def kubectl(kubeconfig: Path, *args: str, input: str | None = None) -> str:
    """kubectl's standard output; the test fails with its stderr if it fails."""
    result = kubectl_run(kubeconfig, *args, input=input)
    assert result.returncode == 0, result.stderr
    return result.stdout


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
