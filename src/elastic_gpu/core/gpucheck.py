"""`egpu gpu-check`'s decisions: what `nvidia-smi` prints, read, and compared with what our NVML
backend discovered. Pure: the command (`agent/gpucheck.py`) runs the tools and the backend.

- `parse_query_gpu`: `nvidia-smi --query-gpu=uuid,name,memory.total,mig.mode.current
  --format=csv,noheader` (with or without `nounits`);
- `parse_list`: `nvidia-smi -L` (cards and, indented under them, their MIG devices);
- `parse_lgi`: `nvidia-smi mig -lgi` (GPU instances: profile, ids, placement start:size);
- `compare_discovery`, `compare_mig`: a table and PASS, or FAIL naming each difference.

Memory is compared within `MEMORY_TOLERANCE` (a share of the card): drivers count the memory
they reserve for themselves differently between `nvidia-smi` and NVML's v1 memory call, and a
card's model is told apart by tens of GB, not by MiB.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from elastic_gpu.core.model import Card


class Outcome(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class StepResult:
    """One step of the check: its outcome, why (one line), and lines to print under it."""

    step: str
    outcome: Outcome
    reason: str
    lines: tuple[str, ...] = ()

    def render(self) -> str:
        head = f"[{self.outcome.value}] {self.step}: {self.reason}"
        return "\n".join([head, *(f"    {line}" for line in self.lines)])


#: Exit status of a check with a failed step (skipped steps are not failures).
EXIT_FAILED = 1

#: Memory totals agree when they differ by at most this share of the larger (1 %).
MEMORY_TOLERANCE = 0.01

MIG_ENABLED, MIG_DISABLED, MIG_NA = "Enabled", "Disabled", "N/A"


@dataclass(frozen=True)
class SmiGpu:
    """One line of `nvidia-smi --query-gpu=...`, in the order printed (the driver's index)."""

    index: int
    uuid: str
    name: str
    memory_mib: int | None
    mig_mode: str


@dataclass(frozen=True)
class SmiMigDevice:
    """One MIG device of `nvidia-smi -L`, under its card."""

    gpu_uuid: str
    profile: str
    uuid: str


@dataclass(frozen=True)
class SmiGpuInstance:
    """One row of `nvidia-smi mig -lgi`."""

    gpu: int
    profile: str
    profile_id: int
    instance_id: int
    start: int
    size: int


class SmiParseError(ValueError):
    """`nvidia-smi` printed something this check cannot read (a line quoted)."""


def _mig_mode(text: str) -> str:
    value = text.strip().strip("[]")
    if value in (MIG_ENABLED, MIG_DISABLED):
        return value
    return MIG_NA


def _memory(text: str) -> int | None:
    match = re.fullmatch(r"\s*(\d+)\s*(MiB)?\s*", text)
    return int(match.group(1)) if match else None


def parse_query_gpu(text: str) -> list[SmiGpu]:
    out: list[SmiGpu] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            raise SmiParseError(f"expected uuid, name, memory.total, mig.mode.current: {line!r}")
        uuid, name, memory, mode = fields
        out.append(SmiGpu(len(out), uuid, name, _memory(memory), _mig_mode(mode)))
    return out


_GPU_LINE = re.compile(r"GPU\s+(\d+):\s+(.+?)\s+\(UUID:\s*(\S+?)\)\s*$")
_MIG_LINE = re.compile(r"\s+MIG\s+(\S+)\s+Device\s+\d+:\s+\(UUID:\s*(\S+?)\)\s*$")


def parse_list(text: str) -> list[SmiMigDevice]:
    """The MIG devices of `nvidia-smi -L`, each under the card line above it."""
    out = []
    card: str | None = None
    for line in text.splitlines():
        gpu = _GPU_LINE.match(line)
        if gpu:
            card = gpu.group(3)
            continue
        mig = _MIG_LINE.match(line)
        if mig:
            if card is None:
                raise SmiParseError(f"a MIG device before any GPU line: {line!r}")
            out.append(SmiMigDevice(card, mig.group(1), mig.group(2)))
    return out


_LGI_ROW = re.compile(r"\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|")


def parse_lgi(text: str) -> list[SmiGpuInstance]:
    """The GPU instances of `nvidia-smi mig -lgi` ("No GPU instances found": none)."""
    return [SmiGpuInstance(int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4)),
                           int(m.group(5)), int(m.group(6)))
            for m in map(_LGI_ROW.search, text.splitlines()) if m]


def _memory_agrees(ours: int, theirs: int | None) -> bool:
    if theirs is None:
        return False
    return abs(ours - theirs) <= MEMORY_TOLERANCE * max(ours, theirs)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> tuple[str, ...]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return tuple("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                 for r in [header, *rows])


def compare_discovery(cards: Sequence[Card], mig_modes: Mapping[str, str],
                      smi: Sequence[SmiGpu], smi_migs: Sequence[SmiMigDevice]) -> StepResult:
    """Our backend's cards (with each one's MIG mode as NVML reads it, `MIG_*`) against
    `nvidia-smi`'s: the same UUIDs at the same indexes, models, memory, MIG mode and MIG
    device UUIDs."""
    step = "NVML discovery vs nvidia-smi"
    ours = {c.uuid: c for c in cards}
    theirs = {g.uuid: g for g in smi}
    header = ("idx", "uuid", "model (ours | smi)", "MiB (ours | smi)", "MIG (ours | smi)",
              "instances (ours | smi)", "")
    rows = []
    problems = []
    for uuid in sorted(set(ours) | set(theirs),
                       key=lambda u: (theirs[u].index if u in theirs else ours[u].index, u)):
        card, gpu = ours.get(uuid), theirs.get(uuid)
        if card is None or gpu is None:
            side = "our backend" if card is None else "nvidia-smi"
            problems.append(f"{uuid}: not seen by {side}")
            index = gpu.index if gpu is not None else card.index if card is not None else -1
            rows.append((str(index), uuid, "", "", "", "", f"MISSING in {side}"))
            continue
        mode = mig_modes.get(uuid, MIG_NA)
        our_migs = sorted(m.uuid for m in card.mig)
        smi_mig = sorted(m.uuid for m in smi_migs if m.gpu_uuid == uuid)
        wrong = [what for what, bad in (
            ("index", card.index != gpu.index),
            ("model", card.model != gpu.name),
            ("memory", not _memory_agrees(card.memory_mib, gpu.memory_mib)),
            ("MIG mode", mode != gpu.mig_mode),
            ("MIG instances", our_migs != smi_mig)) if bad]
        problems.extend(f"{uuid}: {what} differs" for what in wrong)
        rows.append((f"{card.index}|{gpu.index}" if "index" in wrong else str(card.index), uuid,
                     card.model if card.model == gpu.name else f"{card.model} | {gpu.name}",
                     f"{card.memory_mib} | {gpu.memory_mib}", f"{mode} | {gpu.mig_mode}",
                     f"{len(our_migs)} | {len(smi_mig)}", ", ".join(wrong) or "ok"))
    lines = _table(header, rows)
    if not ours and not theirs:
        return StepResult(step, Outcome.FAIL, "neither our backend nor nvidia-smi sees a GPU")
    if problems:
        return StepResult(step, Outcome.FAIL, "; ".join(problems), lines)
    return StepResult(step, Outcome.PASS, f"{len(ours)} GPU(s) agree", lines)


def compare_mig(cards: Sequence[Card], lgi: Sequence[SmiGpuInstance]) -> StepResult:
    """The MIG layout our backend reads (profile and placement start of each instance) against
    `nvidia-smi mig -lgi`'s GPU instances, card by card."""
    step = "MIG layout vs nvidia-smi mig -lgi"
    rows = []
    problems = []
    for card in sorted(cards, key=lambda c: c.index):
        ours = sorted((m.start, m.profile.name) for m in card.mig)
        theirs = sorted((g.start, g.profile) for g in lgi if g.gpu == card.index)
        if not ours and not theirs:
            continue
        ok = ours == theirs
        if not ok:
            problems.append(f"GPU {card.index}: ours {_placed(ours)}, nvidia-smi {_placed(theirs)}")
        rows.append((str(card.index), _placed(ours), _placed(theirs), "ok" if ok else "DIFFERS"))
    known = {c.index for c in cards}
    stray = sorted({g.gpu for g in lgi} - known)
    problems.extend(f"GPU {i}: nvidia-smi lists instances on a card our backend lacks"
                    for i in stray)
    lines = _table(("idx", "ours (profile@start)", "nvidia-smi (profile@start)", ""), rows)
    if problems:
        return StepResult(step, Outcome.FAIL, "; ".join(problems), lines)
    count = sum(len(c.mig) for c in cards)
    return StepResult(step, Outcome.PASS, f"{count} instance(s) agree", lines)


def _placed(items: Sequence[tuple[int, str]]) -> str:
    return " ".join(f"{name}@{start}" for start, name in items) or "-"


def check_mps(percent: int, full_sms: int, seen_sms: int, limit_mib: int,
              over_limit_refused: bool) -> StepResult:
    """What a CUDA client under our MPS settings saw: at most `percent` % of the card's SMs
    (rounded up: MPS hands out whole SMs) and an allocation above `limit_mib` refused."""
    step = "MPS limits held"
    allowed = -(-full_sms * percent // 100)
    lines = (f"active thread percentage {percent}%: client saw {seen_sms} of {full_sms} SMs "
             f"(at most {allowed})",
             f"pinned memory limit {limit_mib} MiB: an allocation above it "
             f"{'was refused' if over_limit_refused else 'SUCCEEDED'}")
    problems = []
    if not 0 < seen_sms <= allowed:
        problems.append(f"the client saw {seen_sms} SMs, above {percent}% of {full_sms}")
    if not over_limit_refused:
        problems.append(f"an allocation above {limit_mib} MiB succeeded")
    if problems:
        return StepResult(step, Outcome.FAIL, "; ".join(problems), lines)
    return StepResult(step, Outcome.PASS, "the daemon held the thread and memory limits", lines)


def exit_status(results: Sequence[StepResult]) -> int:
    return EXIT_FAILED if any(r.outcome is Outcome.FAIL for r in results) else 0
