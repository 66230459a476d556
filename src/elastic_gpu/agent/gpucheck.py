"""`egpu gpu-check`: our NVIDIA path checked on a real machine against NVIDIA's own tools.

Five steps, each PASS, FAIL or SKIP with its reason (the decisions are `core.gpucheck`'s):
1. NVML discovery through `NvmlBackend` against `nvidia-smi --query-gpu` and `nvidia-smi -L`;
2. the MIG layout our backend reads against `nvidia-smi mig -lgi` (when a card has MIG on);
3. MPS limits held: a private MPS control daemon in a temporary pipe directory (never the
   system's), a tiny CUDA workload (PyTorch in `--python`) with the environment our MPS
   isolation provider gives a share, what the client sees checked, the daemon stopped;
4. the DRA prepare path (`agent.dra.gpucheck`, passed in by the command, as the shared agent
   imports no node mode): `prepare_claim` for a synthetic claim of a share of the first whole
   card, its CDI spec written into a temporary directory, printed and checked;
5. with `allow_mig_changes` only: one smallest MIG instance created at a free placement on a card
   whose MIG mode is already on, seen, and destroyed. Never a MIG mode change, a clock, the
   persistence mode or a reset; refused (FAIL) when no card has MIG on.

Read only by default. Without a GPU (no driver, no NVML, no card) every step is a SKIP naming
why, and the command exits 0. The host (tools on PATH, commands run, files present) is
`Host`, so tests script `nvidia-smi` with captured outputs and NVML with `scripted_nvml`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_gpu.agent.backends.base import BackendError
from elastic_gpu.agent.backends.isolation import CudaMps, ShareLimit
from elastic_gpu.agent.backends.nvml import NvmlBackend
from elastic_gpu.core.gpucheck import (
    MIG_DISABLED,
    MIG_ENABLED,
    MIG_NA,
    Outcome,
    SmiParseError,
    StepResult,
    check_mps,
    compare_discovery,
    compare_mig,
    parse_lgi,
    parse_list,
    parse_query_gpu,
)
from elastic_gpu.core.mig.apply import Placed
from elastic_gpu.core.mig.layout import Placement, fits_at
from elastic_gpu.core.mig.profiles import mig_model
from elastic_gpu.core.model import Card
from elastic_gpu.core.resources import MILLI_PER_PERCENT

DISCOVERY = "NVML discovery vs nvidia-smi"
MIG_LAYOUT = "MIG layout vs nvidia-smi mig -lgi"
MPS = "MPS limits held"
DRA = "DRA prepare into a CDI dir"
MIG_CHANGE = "MIG create/destroy"
STEPS = (DISCOVERY, MIG_LAYOUT, MPS, DRA, MIG_CHANGE)

QUERY = ("--query-gpu=uuid,name,memory.total,mig.mode.current", "--format=csv,noheader")

#: The CUDA client of the MPS step: SMs it sees, whether an allocation above the limit fails.
WORKLOAD = """
import json, sys
limit = int(sys.argv[1])
try:
    import torch
except ImportError:
    print(json.dumps({"skip": "PyTorch is not installed in " + sys.executable})); sys.exit(0)
if not torch.cuda.is_available():
    print(json.dumps({"skip": "torch.cuda.is_available() is False"})); sys.exit(0)
sms = torch.cuda.get_device_properties(0).multi_processor_count
refused = False
if limit:
    try:
        torch.empty((limit + 256) << 20, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
    except RuntimeError:
        refused = True
total = float((torch.ones(1024, device="cuda") * 2).sum())
print(json.dumps({"sms": sms, "refused": refused, "sum": total}))
"""


@dataclass(frozen=True)
class Ran:
    rc: int
    out: str
    err: str = ""


def _run(argv: Sequence[str], env: Mapping[str, str] | None = None,
         stdin: str | None = None, timeout_s: float = 120.0) -> Ran:
    try:
        done = subprocess.run(list(argv), env=None if env is None else dict(env), input=stdin,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return Ran(127, "", str(err))
    return Ran(done.returncode, done.stdout, done.stderr)


@dataclass
class Host:
    """What the check touches outside our backend: tools on PATH, commands, files."""

    which: Callable[[str], str | None] = shutil.which
    run: Callable[..., Ran] = _run
    exists: Callable[[str], bool] = os.path.exists
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass(frozen=True)
class CheckOptions:
    allow_mig_changes: bool = False
    nvidia_smi: str = "nvidia-smi"
    mps_control: str = "nvidia-cuda-mps-control"
    python: str = sys.executable
    #: the share the MPS and DRA steps give: percent of the card's compute, MiB of memory
    percent: int = 30
    memory_mib: int = 2048


#: Why `--allow-mig-changes` does nothing on a machine where no card has MIG mode on.
REFUSED = ("refused: --allow-mig-changes needs a card whose MIG mode is already on; gpu-check "
           "never changes MIG mode, clocks or persistence and never resets a GPU")


def _skip_all(reason: str, steps: Sequence[str] = STEPS) -> list[StepResult]:
    return [StepResult(step, Outcome.SKIP, reason) for step in steps]


#: The DRA prepare step (`agent.dra.gpucheck.dra_step`, given by the command: the shared agent
#: never imports a node mode).
DraStep = Callable[[Sequence[Card], NvmlBackend, CheckOptions, Host], StepResult]


def run_checks(options: CheckOptions, host: Host | None = None,
               open_backend: Callable[[], NvmlBackend] = NvmlBackend,
               dra: DraStep | None = None) -> list[StepResult]:
    host = host or Host()
    try:
        backend = open_backend()
    except BackendError as err:
        return _skip_all(f"no NVIDIA GPU here: {err}")
    try:
        cards = backend.discover()
        if not cards:
            return _skip_all("NVML sees no GPU on this machine")
        modes = {c.uuid: _mode(backend.mig_enabled(c.uuid)) for c in cards}
        smi = host.which(options.nvidia_smi)
        results = _compare(cards, modes, smi, host)
        results.append(_mps(cards, options, host))
        results.append(StepResult(DRA, Outcome.SKIP, "no DRA step given") if dra is None
                       else dra(cards, backend, options, host))
        results.append(_mig_change(cards, modes, backend, options, smi, host))
        return results
    finally:
        backend.close()


def _mode(enabled: bool | None) -> str:
    return MIG_NA if enabled is None else MIG_ENABLED if enabled else MIG_DISABLED


def _compare(cards: Sequence[Card], modes: Mapping[str, str], smi: str | None,
             host: Host) -> list[StepResult]:
    if smi is None:
        return _skip_all("nvidia-smi is not on PATH", (DISCOVERY, MIG_LAYOUT))
    query, listing = host.run([smi, *QUERY]), host.run([smi, "-L"])
    if query.rc != 0 or listing.rc != 0:
        return [StepResult(DISCOVERY, Outcome.FAIL,
                           f"nvidia-smi failed: {(query.err or listing.err).strip()}"),
                StepResult(MIG_LAYOUT, Outcome.SKIP, "nvidia-smi failed")]
    try:
        discovery = compare_discovery(cards, modes, parse_query_gpu(query.out),
                                      parse_list(listing.out))
    except SmiParseError as err:
        discovery = StepResult(DISCOVERY, Outcome.FAIL, str(err))
    if all(modes[c.uuid] != MIG_ENABLED for c in cards):
        return [discovery, StepResult(MIG_LAYOUT, Outcome.SKIP, "no card has MIG mode on")]
    return [discovery, _mig_layout(cards, smi, host)]


def _mig_layout(cards: Sequence[Card], smi: str, host: Host) -> StepResult:
    lgi = host.run([smi, "mig", "-lgi"])
    said = lgi.out + lgi.err
    if lgi.rc != 0 and "Insufficient Permissions" in said:
        return StepResult(MIG_LAYOUT, Outcome.SKIP, "nvidia-smi mig -lgi needs root here")
    if lgi.rc != 0 and "No GPU instances found" not in said:
        return StepResult(MIG_LAYOUT, Outcome.FAIL, f"nvidia-smi mig -lgi: {lgi.err.strip()}")
    return compare_mig(cards, parse_lgi(lgi.out))


def whole_card(cards: Sequence[Card]) -> Card | None:
    return next((c for c in cards if not c.mig), None)


def _workload(options: CheckOptions, host: Host, env: Mapping[str, str],
              limit_mib: int) -> dict[str, Any]:
    ran = host.run([options.python, "-c", WORKLOAD, str(limit_mib)], env=env)
    lines = ran.out.strip().splitlines()
    if ran.rc != 0 or not lines:
        return {"fail": f"the CUDA workload failed (rc {ran.rc}): {ran.err.strip()[-300:]}"}
    try:
        answer: dict[str, Any] = json.loads(lines[-1])
    except json.JSONDecodeError:
        return {"fail": f"the CUDA workload printed {lines[-1]!r}"}
    return answer


def _mps(cards: Sequence[Card], options: CheckOptions, host: Host) -> StepResult:
    control = host.which(options.mps_control)
    if control is None:
        return StepResult(MPS, Outcome.SKIP, f"{options.mps_control} is not on PATH")
    card = whole_card(cards)
    if card is None:
        return StepResult(MPS, Outcome.SKIP, "every card is MIG-carved (MPS runs per instance)")
    base = {**host.environ, "CUDA_VISIBLE_DEVICES": card.uuid}
    alone = _workload(options, host, base, 0)
    if "skip" in alone or "fail" in alone:
        outcome = Outcome.SKIP if "skip" in alone else Outcome.FAIL
        return StepResult(MPS, outcome, str(alone.get("skip") or alone.get("fail")))
    with tempfile.TemporaryDirectory(prefix="egpu-gpu-check-mps-") as tmp:
        pipe, logs = Path(tmp, "pipe"), Path(tmp, "log")
        pipe.mkdir()
        logs.mkdir()
        settings = CudaMps(str(pipe)).settings(
            [ShareLimit(options.percent * MILLI_PER_PERCENT, options.memory_mib,
                        uuids=(card.uuid,))])
        daemon = {**base, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
                  "CUDA_MPS_LOG_DIRECTORY": str(logs)}
        started = host.run([control, "-d"], env=daemon)
        if started.rc != 0:
            return StepResult(MPS, Outcome.FAIL, f"the MPS daemon did not start: {started.err}")
        try:
            seen = _workload(options, host, {**daemon, **settings.envs}, options.memory_mib)
            servers = host.run([control], env=daemon, stdin="get_server_list\n").out.split()
        finally:
            host.run([control], env=daemon, stdin="quit\n")
    if "skip" in seen or "fail" in seen:
        return StepResult(MPS, Outcome.FAIL, f"under MPS: {seen.get('skip') or seen.get('fail')}")
    result = check_mps(options.percent, int(alone["sms"]), int(seen["sms"]), options.memory_mib,
                       bool(seen["refused"]))
    envs = [f"{k}={v}" for k, v in sorted(settings.envs.items())]
    lines = (*result.lines, f"client environment: {' '.join(envs)}",
             f"private daemon at {pipe} served by MPS server(s) {', '.join(servers) or '?'}")
    return StepResult(result.step, result.outcome, result.reason, lines)


def _smallest_free(card: Card) -> Placed | None:
    """The smallest plain profile of the card's model that fits beside its instances, at its
    first free start (None: the card is full, or its model is not in our MIG table)."""
    model = mig_model(card.model)
    if model is None:
        return None
    layout = [Placement(m.profile, m.start) for m in card.mig]
    for size in sorted(model.profiles, key=lambda p: (p.memory_slices, p.profile.slices)):
        if size.profile.extra:
            continue
        starts = fits_at(model, layout, size.profile)
        if starts:
            return Placed(starts[0], size.profile)
    return None


def _mig_change(cards: Sequence[Card], modes: Mapping[str, str], backend: NvmlBackend,
                options: CheckOptions, smi: str | None, host: Host) -> StepResult:
    if not options.allow_mig_changes:
        return StepResult(MIG_CHANGE, Outcome.SKIP, "read only: pass --allow-mig-changes, on "
                          "your own machine only, to create and destroy one instance")
    enabled = [c for c in cards if modes[c.uuid] == MIG_ENABLED]
    if not enabled:
        return StepResult(MIG_CHANGE, Outcome.FAIL, REFUSED)
    for card in enabled:
        placed = _smallest_free(card)
        if placed is not None:
            break
    else:
        return StepResult(MIG_CHANGE, Outcome.SKIP, "no card with MIG on has a free placement "
                          "for its smallest profile (nothing is destroyed to make room)")
    lines = [f"GPU {card.index}: create {placed.profile.name}@{placed.start}"]
    before = {m.uuid for m in card.mig}
    try:
        after = backend.create_mig_instance(card.uuid, placed)
    except BackendError as err:
        return StepResult(MIG_CHANGE, Outcome.FAIL, f"create refused: {err}", tuple(lines))
    made = [m for m in after if m.uuid not in before]
    if [(m.profile, m.start) for m in made] != [(placed.profile, placed.start)]:
        return StepResult(MIG_CHANGE, Outcome.FAIL, f"after the create our backend reads "
                          f"{[f'{m.profile.name}@{m.start}' for m in made]} as new",
                          tuple(lines))
    if smi is not None:
        seen = parse_lgi(host.run([smi, "mig", "-lgi"]).out)
        ok = any((g.gpu, g.profile, g.start) == (card.index, placed.profile.name, placed.start)
                 for g in seen)
        lines.append(f"nvidia-smi mig -lgi {'lists' if ok else 'does NOT list'} it")
    lines.append(f"GPU {card.index}: destroy {made[0].uuid}")
    try:
        final = backend.destroy_mig_instance(card.uuid, made[0].uuid)
    except BackendError as err:
        return StepResult(MIG_CHANGE, Outcome.FAIL, f"destroy refused: {err}", tuple(lines))
    if {m.uuid for m in final} != before:
        return StepResult(MIG_CHANGE, Outcome.FAIL, "the card's instances differ from before "
                          "the check", tuple(lines))
    if any("NOT" in line for line in lines):
        return StepResult(MIG_CHANGE, Outcome.FAIL, "nvidia-smi did not see the instance made",
                          tuple(lines))
    return StepResult(MIG_CHANGE, Outcome.PASS, "one instance created and destroyed through our "
                      "backend; the card's layout is as before", tuple(lines))

