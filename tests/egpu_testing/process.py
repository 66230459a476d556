"""A component (`egpu scheduler`, `egpu webhook`, ...) run as a subprocess by tests and benches:
started and waited on until ready, stopped gracefully or SIGKILLed like a crashed pod."""

from __future__ import annotations

import abc
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


class SupervisedProcess(abc.ABC):
    """One subprocess writing to `log_path`; subclasses say how to tell it is ready."""

    #: its name in errors, e.g. "egpu scheduler"
    what = "process"
    #: what `stop` sends before it falls back to SIGKILL
    stop_signal = signal.SIGTERM

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @abc.abstractmethod
    def ready(self) -> bool:
        """Whether the process serves (e.g. its health URL answers)."""

    def launch(self, argv: Sequence[str], timeout_s: float, header: str | None = None) -> None:
        """Start `argv` (in a session of its own) and wait until `ready`; `header` goes to the
        log first. Raises with the log's tail if it exits or is not ready by `timeout_s`."""
        with self.log_path.open("ab") as log:
            if header is not None:
                log.write(header.encode())
            self.process = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.what} exited with {self.process.returncode}:\n"
                                   f"{self.log_tail()}")
            if self.ready():
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.what} not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye, as when a node dies."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
