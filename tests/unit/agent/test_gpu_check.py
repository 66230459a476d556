"""`egpu gpu-check` (agent/gpucheck.py, core/gpucheck.py) without a GPU: our NVML backend over
the scripted NVML, `nvidia-smi` answered with outputs captured on an H100 (no MIG) and on two
A100-SXM4-80GB (one with MIG on and two instances) in tests/unit/agent/nvidia_smi/; the MPS
daemon and its CUDA client scripted; the no-GPU path; `--allow-mig-changes` refused without
MIG mode on, and an instance created and destroyed with it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pynvml
import pytest
from typer.testing import CliRunner

from egpu_testing.scripted_nvml import Gpu, SimNvml
from elastic_gpu.agent.dra.gpucheck import dra_step
from elastic_gpu.agent.gpucheck import (
    DISCOVERY,
    DRA,
    MIG_CHANGE,
    MIG_LAYOUT,
    MPS,
    QUERY,
    REFUSED,
    CheckOptions,
    Host,
    Ran,
)
from elastic_gpu.agent.gpucheck import run_checks as run_checks_alone
from elastic_gpu.cli.main import app
from elastic_gpu.core.gpucheck import Outcome, StepResult, check_mps, exit_status, parse_lgi

SMI = Path(__file__).parent / "nvidia_smi"


def h100() -> list[Gpu]:
    return [Gpu("GPU-8b4d8f3a-6c2e-1f0d-9a51-3e7c0b2f4d19", "NVIDIA H100 80GB HBM3", 81559,
                "00000000:18:00.0", 0)]


def a100s() -> list[Gpu]:
    carved = Gpu("GPU-6f1d2c7e-93ab-4a52-8e0b-1c5d7a9e3f20", "NVIDIA A100-SXM4-80GB", 81920,
                 "00000000:07:00.0", 0)
    carved.mig = [("MIG-2b7c9e14-0f6a-5d83-a4c1-9e2f7b6d0c35", 3, 40192, 4),
                  ("MIG-d41f8a02-7b3e-5c96-8f1d-0a6e3c9b7f52", 1, 9856, 0)]
    whole = Gpu("GPU-0a9e4b61-5d3c-4e7f-b218-6c4f9d0e2a87", "NVIDIA A100-SXM4-80GB", 81920,
                "00000000:0F:00.0", 1)
    return [carved, whole]


class ScriptedHost(Host):
    """`nvidia-smi` answering captured outputs; `mps-control` and the CUDA client scripted."""

    def __init__(self, outputs: Mapping[str, str], tools: Sequence[str] = ("nvidia-smi",),
                 client: Mapping[str, object] | None = None) -> None:
        super().__init__(which=lambda name: f"/usr/bin/{name}" if name in tools else None,
                         run=self._run, exists=lambda path: True, environ={})
        self.outputs = outputs
        self.client = client or {}
        self.calls: list[tuple[list[str], dict[str, str], str | None]] = []

    def _run(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
             stdin: str | None = None, timeout_s: float = 120.0) -> Ran:
        self.calls.append((list(argv), dict(env or {}), stdin))
        key = " ".join(argv[1:])
        if argv[0].endswith("nvidia-smi"):
            return Ran(0, self.outputs.get(key, ""))
        if argv[0].endswith("nvidia-cuda-mps-control"):
            return Ran(0, "4242\n" if stdin == "get_server_list\n" else "")
        under_mps = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in (env or {})
        answer = dict(self.client, sms=self.client["mps_sms"] if under_mps else 132)
        return Ran(0, json.dumps(answer) + "\n")


def run_checks(options: CheckOptions, host: Host) -> list[StepResult]:
    """The checks as `egpu gpu-check` runs them (the DRA step passed in)."""
    return run_checks_alone(options, host, dra=dra_step)


def outputs(name: str) -> dict[str, str]:
    out = {" ".join(QUERY): (SMI / f"{name}_query.csv").read_text(),
           "-L": (SMI / f"{name}_list.txt").read_text()}
    lgi = SMI / f"{name}_lgi.txt"
    out["mig -lgi"] = (lgi if lgi.exists() else SMI / "no_instances_lgi.txt").read_text()
    return out


def by_step(results: Sequence[StepResult]) -> dict[str, StepResult]:
    return {r.step: r for r in results}


def test_an_h100_without_mig_agrees_with_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    SimNvml(monkeypatch, h100())
    results = by_step(run_checks(CheckOptions(), ScriptedHost(outputs("h100"))))
    assert results[DISCOVERY].outcome is Outcome.PASS, results[DISCOVERY].render()
    assert "NVIDIA H100 80GB HBM3" in results[DISCOVERY].render()
    assert results[MIG_LAYOUT].outcome is Outcome.SKIP
    assert "not on PATH" in results[MPS].reason
    assert results[DRA].outcome is Outcome.PASS, results[DRA].render()
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in results[DRA].render()
    assert results[MIG_CHANGE].outcome is Outcome.SKIP and "read only" in results[MIG_CHANGE].reason


def test_two_a100s_one_carved_agree_with_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    SimNvml(monkeypatch, a100s())
    results = run_checks(CheckOptions(), ScriptedHost(outputs("a100_mig")))
    steps = by_step(results)
    assert steps[DISCOVERY].outcome is Outcome.PASS, steps[DISCOVERY].render()
    assert steps[MIG_LAYOUT].outcome is Outcome.PASS, steps[MIG_LAYOUT].render()
    assert "1g.10gb@0 3g.40gb@4" in steps[MIG_LAYOUT].render()
    assert steps[DRA].outcome is Outcome.PASS and "GPU 1" in steps[DRA].reason
    assert exit_status(results) == 0


@pytest.mark.parametrize(("edit", "found"), [
    (lambda o: o.update({" ".join(QUERY): o[" ".join(QUERY)].replace("81920", "40960", 1)}),
     "memory differs"),
    (lambda o: o.update({" ".join(QUERY): o[" ".join(QUERY)].replace("Enabled", "Disabled")}),
     "MIG mode differs"),
    (lambda o: o.update({" ".join(QUERY): o[" ".join(QUERY)].splitlines()[0]}),
     "not seen by nvidia-smi"),
    (lambda o: o.update({"-L": o["-L"].replace("MIG-d41f", "MIG-ffff")}),
     "MIG instances differ"),
])
def test_a_difference_fails_the_discovery_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                    edit: object, found: str) -> None:
    SimNvml(monkeypatch, a100s())
    answers = outputs("a100_mig")
    edit(answers)  # type: ignore[operator]
    results = run_checks(CheckOptions(), ScriptedHost(answers))
    assert by_step(results)[DISCOVERY].outcome is Outcome.FAIL
    assert found in by_step(results)[DISCOVERY].reason
    assert exit_status(results) == 1


def test_a_placement_our_backend_reads_differently_fails_the_mig_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    SimNvml(monkeypatch, a100s())
    answers = outputs("a100_mig")
    answers["mig -lgi"] = answers["mig -lgi"].replace("4:4", "0:4").replace("0:1", "4:1")
    step = by_step(run_checks(CheckOptions(), ScriptedHost(answers)))[MIG_LAYOUT]
    assert step.outcome is Outcome.FAIL and "GPU 0" in step.reason


def test_no_gpu_instances_is_an_empty_layout() -> None:
    assert parse_lgi((SMI / "no_instances_lgi.txt").read_text()) == []


def test_the_mps_step_runs_a_private_daemon_and_checks_what_the_client_saw(
        monkeypatch: pytest.MonkeyPatch) -> None:
    SimNvml(monkeypatch, h100())
    host = ScriptedHost(outputs("h100"), ("nvidia-smi", "nvidia-cuda-mps-control"),
                        {"mps_sms": 40, "refused": True})
    step = by_step(run_checks(CheckOptions(python="/usr/bin/python3"), host))[MPS]
    assert step.outcome is Outcome.PASS, step.render()
    daemon = [c for c in host.calls if c[0][0].endswith("mps-control")]
    assert [c[0][1:] for c in daemon] == [["-d"], [], []]
    assert [c[2] for c in daemon] == [None, "get_server_list\n", "quit\n"]
    pipe = daemon[0][1]["CUDA_MPS_PIPE_DIRECTORY"]
    assert "egpu-gpu-check-mps-" in pipe and not Path(pipe).exists()  # removed after
    client = next(c for c in host.calls if "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in c[1])
    assert client[1]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    assert client[1]["CUDA_MPS_PIPE_DIRECTORY"] == pipe


def test_mps_limits_not_held_fail() -> None:
    assert check_mps(30, 132, 40, 2048, True).outcome is Outcome.PASS
    assert check_mps(30, 132, 132, 2048, True).outcome is Outcome.FAIL
    assert "succeeded" in check_mps(30, 132, 40, 2048, False).reason


def test_without_a_gpu_every_step_is_skipped_and_the_exit_is_0(
        monkeypatch: pytest.MonkeyPatch) -> None:
    SimNvml(monkeypatch, []).init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    result = CliRunner().invoke(app, ["gpu-check", "--allow-mig-changes"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("[")]
    assert len(lines) == 5 and all(line.startswith("[SKIP]") for line in lines)
    assert "libnvidia-ml.so.1" in lines[0]


def test_mig_changes_are_refused_without_mig_mode_on(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = h100()
    SimNvml(monkeypatch, gpus)
    results = run_checks(CheckOptions(allow_mig_changes=True), ScriptedHost(outputs("h100")))
    step = by_step(results)[MIG_CHANGE]
    assert (step.outcome, step.reason) == (Outcome.FAIL, REFUSED)
    assert not gpus[0].mig_mode_on and gpus[0].mig == [] and exit_status(results) == 1


def test_with_the_flag_one_instance_is_made_and_destroyed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = a100s()
    before = list(gpus[0].mig)
    sim = SimNvml(monkeypatch, gpus)
    step = by_step(run_checks(CheckOptions(allow_mig_changes=True), ScriptedHost({}, ())))[
        MIG_CHANGE]
    assert step.outcome is Outcome.PASS, step.render()
    assert "create 1g.10gb@1" in step.render()
    assert len(sim.created) == 1 and gpus[0].mig == before and not gpus[1].mig_mode_on


def test_the_backend_never_turns_mig_mode_on_for_the_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from elastic_gpu.agent.backends.base import BackendError
    from elastic_gpu.agent.backends.nvml import NvmlBackend
    from elastic_gpu.core.mig.apply import Placed
    from elastic_gpu.core.resources import MigProfile

    gpus = h100()
    SimNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    backend.discover()
    assert backend.mig_enabled(gpus[0].uuid) is False
    with pytest.raises(BackendError, match="MIG mode is not on"):
        backend.create_mig_instance(gpus[0].uuid, Placed(0, MigProfile.parse("1g.10gb")))
    assert not gpus[0].mig_mode_on and gpus[0].mig == []
