"""The agent's MPS control daemons: one per card, started, watched, restarted, stopped.

In `mps` mode with `sharing.mps.daemon` set, the agent runs what NVIDIA's device plugin runs
beside it: for each (non-MIG) card, `<binary> -d` with CUDA_VISIBLE_DEVICES=<card uuid> and
the card's own CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY (`<root>/<uuid>`). `-d` forks
the daemon and returns; the daemon writes its pid to `nvidia-cuda-mps-control.pid` in its pipe
directory. Every `checkSeconds` each daemon is looked at (the pid file names a live process,
not a zombie); one that is gone is started again, with the backoff of `core.restart`. Every
`probeSeconds` a running daemon is also asked over its control pipe (`echo
get_default_active_thread_percentage | <binary>` with the card's pipe directory, as NVIDIA's
device plugin checks its daemons), with `probeTimeoutSeconds` to answer: a daemon whose process
runs but does not answer is hung, and is killed (SIGKILL) and started again with the same
backoff; a start is done only once the new daemon answers. While a
card's daemon is down, `refusal` names it, so Allocate of that card is refused with the reason
(`backends.isolation.Gated`), the card's GPUDevice status reason says so and the metric
`elasticgpu_agent_mps_daemon_up` is 0. On stop each daemon is told `quit` (`echo quit |
<binary>`, as an operator would), and killed if it does not go.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from elastic_gpu.agent.config import MpsDaemonConfig
from elastic_gpu.core.restart import (
    Action,
    Backoff,
    ProcessState,
    failed_start,
    hung,
    observe,
    probe_due,
)

log = logging.getLogger(__name__)

PID_FILE = "nvidia-cuda-mps-control.pid"
#: How long a daemon told to quit may take before it is killed.
QUIT_TIMEOUT_S = 5.0
#: The liveness query NVIDIA's device plugin sends (`Daemon.AssertHealthy`): harmless, and
#: answered by the control daemon itself.
PROBE_COMMAND = "get_default_active_thread_percentage"
#: How long a killed hung daemon may take to be gone.
KILL_WAIT_S = 5.0


class MpsSupervisor:
    def __init__(self, uuids: Sequence[str], pipe_root: str, config: MpsDaemonConfig,
                 on_change: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.uuids = tuple(uuids)
        self.pipe_root = Path(pipe_root)
        self.config = config
        self.backoff = Backoff(config.restartInitialSeconds, config.restartMaxSeconds)
        self.on_change = on_change
        self.clock = clock
        self._lock = threading.Lock()
        self._states = {uuid: ProcessState() for uuid in self.uuids}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Starts made, per card (a restart is a start after the first).
        self.starts = dict.fromkeys(self.uuids, 0)
        #: When each card's daemon last answered or failed its probe (None: not since it
        #: started).
        self._probed: dict[str, float | None] = dict.fromkeys(self.uuids)
        #: Hung daemons found and killed, per card.
        self.hangs = dict.fromkeys(self.uuids, 0)

    # -- paths ----------------------------------------------------------------------------

    def pipe_directory(self, uuid: str) -> Path:
        return self.pipe_root / uuid

    def log_directory(self, uuid: str) -> Path:
        return Path(self.config.logDirectory) / uuid

    def _env(self, uuid: str) -> dict[str, str]:
        return {**os.environ, "CUDA_VISIBLE_DEVICES": uuid,
                "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_directory(uuid)),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_directory(uuid))}

    # -- what others read -------------------------------------------------------------------

    def up(self) -> dict[str, bool]:
        with self._lock:
            return {uuid: state.up for uuid, state in self._states.items()}

    def reason(self, uuid: str) -> str:
        """Why the card's daemon is down, for people ("" when it is up or not supervised)."""
        with self._lock:
            state = self._states.get(uuid)
        if state is None or state.up:
            return ""
        return f"MPS control daemon down: {state.reason}"

    def refusal(self, uuids: Sequence[str]) -> str | None:
        """For `Gated`: why a container on `uuids` cannot be given MPS now."""
        for uuid in uuids:
            why = self.reason(uuid)
            if why:
                return (f"card {uuid}: {why} (the agent restarts it; Allocate is refused until "
                        "it is up, as nothing would hold the container to its share)")
        return None

    # -- the loop ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start every daemon now (so the first Allocate finds them), then watch them."""
        self.tick()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="mps-supervisor", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.config.checkSeconds):
            try:
                self.tick()
            except Exception:  # the watch must outlive any one bad look
                log.exception("MPS supervisor")

    def tick(self) -> None:
        changed = False
        for uuid in self.uuids:
            with self._lock:
                before = self._states[uuid]
            alive = self._alive(uuid)
            if alive and probe_due(self._probed[uuid], self.clock(), self.config.probeSeconds):
                problem = self._probe(uuid)
                if problem is not None:
                    self._kill_hung(uuid, problem)
                    alive = False
            with self._lock:
                state, action = observe(self._states[uuid], alive, self.clock(), self.backoff)
                self._states[uuid] = state
            if before.up and not state.up:
                log.warning("MPS control daemon of %s is down: %s", uuid, state.reason)
            if action is Action.START and not self._stop.is_set():
                self._start(uuid)
                with self._lock:
                    state, _ = observe(self._states[uuid], self._alive(uuid), self.clock(),
                                       self.backoff)
                    self._states[uuid] = state
            changed |= self._states[uuid].up != before.up
        if changed and self.on_change is not None:
            self.on_change()

    def _start(self, uuid: str) -> None:
        pipe, logs = self.pipe_directory(uuid), self.log_directory(uuid)
        self.starts[uuid] += 1
        self._probed[uuid] = None
        try:
            pipe.mkdir(parents=True, exist_ok=True)
            logs.mkdir(parents=True, exist_ok=True)
            (pipe / PID_FILE).unlink(missing_ok=True)  # a dead daemon's file is no answer
            done = subprocess.run([self.config.binary, "-d"], env=self._env(uuid),
                                  capture_output=True, text=True, check=False,
                                  timeout=self.config.startTimeoutSeconds)
        except (OSError, subprocess.TimeoutExpired) as err:
            self._failed(uuid, f"cannot start {self.config.binary}: {err}")
            return
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[-300:]
            self._failed(uuid, f"{self.config.binary} -d exited {done.returncode}: {said}")
            return
        deadline = time.monotonic() + self.config.startTimeoutSeconds
        while time.monotonic() < deadline:
            if self._alive(uuid):
                break
            time.sleep(0.02)
        else:
            self._failed(uuid, f"no live daemon in {pipe / PID_FILE} "
                               f"{self.config.startTimeoutSeconds:g} s after the start")
            return
        # Up means answering: a daemon that hangs from its start is no daemon.
        problem = self._probe(uuid) if self.config.probeSeconds > 0 else None
        if problem is not None:
            self._kill(uuid)
            self._failed(uuid, f"started, but {problem}; killed")
            return
        log.info("MPS control daemon of %s is up (pipes in %s)", uuid, pipe)

    # -- liveness ---------------------------------------------------------------------------

    def _probe(self, uuid: str) -> str | None:
        """Ask the card's daemon over its control pipe; why it is not answering (None: it
        answered). Its process runs: a silence is a hang, an error a broken pipe."""
        self._probed[uuid] = self.clock()
        timeout = self.config.probeTimeoutSeconds
        try:
            done = subprocess.run([self.config.binary], input=f"{PROBE_COMMAND}\n",
                                  env=self._env(uuid), capture_output=True, text=True,
                                  check=False, timeout=timeout)
        except subprocess.TimeoutExpired:
            return (f"hung: it runs but did not answer {PROBE_COMMAND} on its control pipe "
                    f"within {timeout:g} s")
        except OSError as err:
            return f"cannot ask it over its control pipe: {err}"
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[-300:]
            return (f"its control pipe refused {PROBE_COMMAND} (exit {done.returncode}: "
                    f"{said})")
        return None

    def _kill_hung(self, uuid: str, problem: str) -> None:
        pid = self._kill(uuid)
        reason = f"{problem}; killed (pid {pid}) to be started again"
        log.error("MPS control daemon of %s: %s", uuid, reason)
        self.hangs[uuid] += 1
        with self._lock:
            self._states[uuid] = hung(self._states[uuid], self.clock(), reason)

    def _kill(self, uuid: str) -> int | None:
        """SIGKILL the card's daemon and wait (bounded) until it is gone; its pid."""
        pid = self._pid(uuid)
        if pid is None:
            return None
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline and _running(pid):
            time.sleep(0.02)
        return pid

    def _failed(self, uuid: str, reason: str) -> None:
        log.error("MPS control daemon of %s: %s", uuid, reason)
        with self._lock:
            self._states[uuid] = failed_start(self._states[uuid], self.clock(), reason)

    def _pid(self, uuid: str) -> int | None:
        try:
            text = (self.pipe_directory(uuid) / PID_FILE).read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() and int(text) > 0 else None

    def _alive(self, uuid: str) -> bool:
        pid = self._pid(uuid)
        return pid is not None and _running(pid)

    # -- stop -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop watching and quit every daemon (the agent is stopping)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.config.checkSeconds + self.config.startTimeoutSeconds + 5)
            self._thread = None
        for uuid in self.uuids:
            self._quit(uuid)
        with self._lock:
            self._states = {uuid: ProcessState(reason="the agent stopped")
                            for uuid in self.uuids}

    def _quit(self, uuid: str) -> None:
        pid = self._pid(uuid)
        if pid is None or not _running(pid):
            return
        try:
            subprocess.run([self.config.binary], input="quit\n", env=self._env(uuid),
                           capture_output=True, text=True, check=False, timeout=QUIT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as err:
            log.warning("telling the MPS daemon of %s to quit: %s", uuid, err)
        deadline = time.monotonic() + QUIT_TIMEOUT_S
        while time.monotonic() < deadline and _running(pid):
            time.sleep(0.02)
        if _running(pid):
            log.warning("MPS daemon of %s (pid %d) did not quit: killing it", uuid, pid)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is dead: reaped here when it is our child)."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return False
    except ChildProcessError:
        pass  # not our child (a forked daemon): its parent reaps it
    except OSError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: kill(0) answered
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
