"""Supervised component processes.

Every component runs in its own session (so its own process group): stopping it signals the
whole group, and a Ctrl-C in the terminal that started a sandbox does not reach the sandbox.
A handle can be saved and reloaded from another process (the sandbox CLI's `down`); the
recorded start time tells our process apart from an unrelated one that reused its pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_gpu.devcluster.errors import ComponentStartError
from elastic_gpu.devcluster.procfs import PROC, listener_is_ours, stat_fields

STOP_GRACE_S = 5.0


def _proc_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    fields = stat_fields(PROC / str(pid))
    if fields is None or fields[0] == "Z":  # a zombie has finished; only its exit status remains
        return None
    return int(fields[19])


@dataclass
class ProcessHandle:
    """A running (or finished) component process."""

    name: str
    pid: int
    argv: list[str]
    log_path: Path
    start_ticks: int | None
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def exit_code(self) -> int | None:
        """How our own child ended (None: still running, or not started by this process)."""
        return self._popen.poll() if self._popen is not None else None

    def alive(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        ticks = _proc_start_ticks(self.pid)
        return ticks is not None and ticks == self.start_ticks

    def _group_gone(self) -> bool:
        # Our own child must be reaped (a zombie is finished, but waits for its exit status).
        if self._popen is not None and self._popen.poll() is None:
            return False
        return not _group_members(self.pid)

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the process group, SIGKILL it after `grace_s`; returns when it is gone."""
        if not self.alive() and self._group_gone():
            return
        if self._popen is None and _proc_start_ticks(self.pid) not in (None, self.start_ticks):
            return  # the pid now belongs to some other process: not ours to kill
        self._signal_group(signal.SIGTERM)
        if self._wait_gone(grace_s):
            return
        self._signal_group(signal.SIGKILL)
        if not self._wait_gone(10.0):
            raise RuntimeError(f"{self.name} (pid {self.pid}) survived SIGKILL")

    def _wait_gone(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._group_gone():
                return True
            time.sleep(0.05)
        return self._group_gone()

    def log_tail(self, lines: int = 40) -> str:
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 64 * 1024))
                text = fh.read().decode("utf-8", "replace")
        except OSError as err:
            return f"(no log: {err})"
        return "\n".join(text.splitlines()[-lines:])

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "pid": self.pid, "argv": self.argv,
                "log_path": str(self.log_path), "start_ticks": self.start_ticks}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessHandle:
        return cls(name=str(data["name"]), pid=int(data["pid"]),
                   argv=[str(a) for a in data["argv"]], log_path=Path(str(data["log_path"])),
                   start_ticks=None if data.get("start_ticks") is None
                   else int(data["start_ticks"]))


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(entry)
        if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None]:
    """A preexec hook making the child get SIGKILL when the process that started it dies
    (Linux): a test run killed with SIGKILL must not leave a control plane behind."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prctl = libc.prctl

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return hook


def spawn(name: str, argv: Sequence[str], log_path: Path,
          env: Mapping[str, str] | None = None, *, die_with_parent: bool = False
          ) -> ProcessHandle:
    """Start `argv` in a new session with stdout and stderr appended to `log_path`.

    `die_with_parent` must only be used from a thread that outlives the child (the kernel
    ties the signal to the spawning thread), e.g. the main thread of a test run.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=dict(env) if env is not None else None, close_fds=True,
            preexec_fn=_die_with_parent() if die_with_parent else None)
    return ProcessHandle(name=name, pid=popen.pid, argv=list(argv), log_path=log_path,
                         start_ticks=_proc_start_ticks(popen.pid), _popen=popen)


def wait_ready(handle: ProcessHandle, check: Callable[[], bool], timeout_s: float,
               interval_s: float = 0.1, *, port: int | None = None) -> None:
    """Poll `check` until it is true; raise with the component's log if it dies or times out.

    With `port` (the one `check` asks on), a passing check counts only once the socket
    listening there is the component's own: another process that took the port first would
    answer the probe while ours dies on "address already in use"."""
    deadline = time.monotonic() + timeout_s
    stranger = False
    while True:
        if not handle.alive():
            raise ComponentStartError(handle.name,
                                      f"exited while starting (exit code {handle.exit_code()})",
                                      str(handle.log_path), handle.log_tail())
        try:
            if check():
                stranger = port is not None and listener_is_ours(handle.pid, port) is False
                if not stranger:
                    return
        except OSError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            why = (f"not ready after {timeout_s:.0f} s"
                   + (f" (another process answers on its port {port})" if stranger else ""))
            raise ComponentStartError(handle.name, why, str(handle.log_path), handle.log_tail())
        time.sleep(interval_s)
