"""`egpu sandbox down` decides "fully stopped" by the sandbox's own processes, not its ports
(issue #39): on a busy machine another program may listen on a port the sandbox freed."""

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_gpu.devcluster import sandbox
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.errors import DevClusterError
from elastic_gpu.devcluster.ports import HOST, is_listening
from elastic_gpu.devcluster.process import ProcessHandle, _proc_start_ticks, spawn

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture
def state(tmp_path: Path) -> Path:
    (tmp_path / "state" / "cluster").mkdir(parents=True)
    return tmp_path / "state"


@pytest.fixture
def foreign_listener() -> Iterator[int]:
    """Another program's server on a loopback port: the port a sandbox component served."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def save(state: Path, plane: ControlPlane, port: int) -> None:
    sandbox.Sandbox(state, plane, state / "kubeconfig", ["n0"], components={
        "egpu-scheduler": {"port": port, "endpoint": f"http://{HOST}:{port}",
                           "health": f"http://{HOST}:{port}/readyz"}}).save()


def test_down_is_fully_stopped_though_another_program_listens_on_a_freed_port(
        state: Path, foreign_listener: int) -> None:
    plane = ControlPlane(work_dir=state / "cluster", bin_dir=state)
    ours = spawn("egpu-scheduler", SLEEPER, state / "cluster" / "logs" / "egpu-scheduler.log")
    plane.processes[ours.name] = ours
    # a recorded pid that is now another program's (its start time differs): not the sandbox's
    other = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        ticks = _proc_start_ticks(other.pid)
        assert ticks is not None
        plane.processes["kwok"] = ProcessHandle("kwok", other.pid, SLEEPER,
                                                state / "kwok.log", ticks - 1)
        save(state, plane, foreign_listener)
        assert sandbox.down(state) == ["egpu-scheduler"]
        assert ours._popen is not None and ours._popen.wait(5) is not None
        assert is_listening(foreign_listener)  # the other program's server, untouched
        assert other.poll() is None, "down killed a process that was not the sandbox's"
        assert not (state / sandbox.STATE_FILE).exists()
    finally:
        for proc in (ours._popen, other):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_down_reports_a_recorded_process_that_outlived_it(state: Path) -> None:
    """A recorded process that is not the leader of its process group is out of reach of the
    group's SIGTERM/SIGKILL; it listens on no port, and `down` still says it runs."""
    plane = ControlPlane(work_dir=state / "cluster", bin_dir=state)
    survivor = subprocess.Popen(SLEEPER)  # in this process's group, not a session of its own
    try:
        plane.processes["egpu-controller"] = ProcessHandle(
            "egpu-controller", survivor.pid, SLEEPER, state / "controller.log",
            _proc_start_ticks(survivor.pid))
        save(state, plane, 0)
        with pytest.raises(DevClusterError, match=rf"not fully stopped: still running: "
                                                  rf"egpu-controller \(pid {survivor.pid}\)"):
            sandbox.down(state)
        assert survivor.poll() is None
        assert (state / sandbox.STATE_FILE).exists()  # kept: `down` can be run again
    finally:
        survivor.kill()
        survivor.wait()
