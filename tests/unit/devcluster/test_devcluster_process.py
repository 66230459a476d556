import os
import signal
import socket
import sys
import time

import pytest

from elastic_gpu.devcluster.errors import ComponentStartError, PortInUseError
from elastic_gpu.devcluster.ports import free_ports, is_listening, port_is_free, require_free
from elastic_gpu.devcluster.process import ProcessHandle, spawn, wait_ready
from elastic_gpu.devcluster.procfs import listener_is_ours


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_stop_kills_the_whole_process_group(tmp_path):
    # The component forks a grandchild; stopping must take both down.
    script = ("import subprocess, sys, time;"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
              "print(p.pid, flush=True); time.sleep(600)")
    handle = spawn("forker", [sys.executable, "-c", script], tmp_path / "forker.log")
    wait_ready(handle, lambda: bool(handle.log_path.read_text().strip()), 10)
    grandchild = int(handle.log_path.read_text().split()[0])
    assert _pid_alive(grandchild)
    handle.stop()
    assert not handle.alive()
    deadline = time.monotonic() + 5
    while _pid_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pid_alive(grandchild)


def test_sigterm_ignoring_process_is_killed(tmp_path):
    script = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
              "print('ignoring SIGTERM', flush=True); time.sleep(600)")
    handle = spawn("stubborn", [sys.executable, "-c", script], tmp_path / "s.log")
    # stopped only once it ignores SIGTERM (before, SIGTERM alone would end it)
    wait_ready(handle, lambda: "ignoring" in handle.log_path.read_text(), 10)
    handle.stop(grace_s=0.5)
    assert not handle.alive()
    assert handle._popen is not None and handle._popen.wait(5) == -signal.SIGKILL


def test_component_dying_on_start_raises_with_log_tail(tmp_path):
    script = "import sys; print('bind: address already in use'); sys.exit(3)"
    handle = spawn("broken", [sys.executable, "-c", script], tmp_path / "b.log")
    with pytest.raises(ComponentStartError) as info:
        wait_ready(handle, lambda: False, 10)
    assert "exit code 3" in str(info.value)
    assert "address already in use" in str(info.value)


def test_not_ready_in_time_raises(tmp_path):
    handle = spawn("slow", [sys.executable, "-c", "import time; time.sleep(60)"],
                   tmp_path / "slow.log")
    try:
        with pytest.raises(ComponentStartError, match="not ready after"):
            wait_ready(handle, lambda: False, 0.3)
    finally:
        handle.stop()


def test_reloaded_handle_stops_a_detached_process(tmp_path):
    handle = spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"],
                   tmp_path / "x.log")
    again = ProcessHandle.from_dict(handle.to_dict())  # as `egpu sandbox down` sees it
    assert again.alive()
    again.stop()
    handle._popen.wait(5)  # reap (the parent here is still this test process)
    assert not _pid_alive(handle.pid)


def test_reloaded_handle_does_not_touch_a_reused_pid(tmp_path):
    data = {"name": "old", "pid": os.getpid(), "argv": ["x"], "log_path": str(tmp_path / "l"),
            "start_ticks": 1}  # our own pid, but a different start time: not that process
    handle = ProcessHandle.from_dict(data)
    assert not handle.alive()
    handle.stop()  # must not signal this test process
    assert _pid_alive(os.getpid())


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(5)
    assert len(set(ports)) == 5
    assert all(port_is_free(p) for p in ports)


def test_port_in_use_is_reported():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert is_listening(port)
        with pytest.raises(PortInUseError, match=str(port)):
            require_free(port, "kube-apiserver")
    assert not is_listening(port)


def test_control_plane_refuses_a_taken_port(tmp_path):
    from elastic_gpu.devcluster.controlplane import ControlPlane

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        plane = ControlPlane(work_dir=tmp_path, bin_dir=tmp_path, apiserver_port=port)
        with pytest.raises(PortInUseError, match=f"port {port} .*kube-apiserver"):
            plane.start()
    assert plane.processes == {}


LISTENER = ("import socket, sys, time; s = socket.socket(); "
            "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('up', flush=True); "
            "time.sleep(600)")


def test_a_listener_is_told_apart_by_its_session(tmp_path):
    (port,) = free_ports(1)
    child = spawn("listener", [sys.executable, "-c", LISTENER, str(port)], tmp_path / "l.log")
    try:
        wait_ready(child, lambda: is_listening(port), 10)
        assert listener_is_ours(child.pid, port) is True
        assert listener_is_ours(os.getsid(0), port) is False  # this test's session: not it
        (idle,) = free_ports(1)
        assert listener_is_ours(child.pid, idle) is False  # nothing listens there
    finally:
        child.stop()


def test_no_tcp_tables_means_the_machine_cannot_tell(tmp_path):
    (tmp_path / "net").mkdir()
    assert listener_is_ours(1, 1234, proc=tmp_path) is None


def test_a_probe_answered_by_another_process_is_not_readiness(tmp_path):
    # another process holds the port; "our" component never gets it (it sleeps instead of
    # dying, so the wait can only end by the deadline): the probe passes, readiness does not
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        ours = spawn("late", [sys.executable, "-c", "import time; time.sleep(600)"],
                     tmp_path / "late.log")
        try:
            with pytest.raises(ComponentStartError, match=f"another process answers on its "
                                                          f"port {port}"):
                wait_ready(ours, lambda: is_listening(port), 1.0, port=port)
            # without `port`, the same probe would have passed
            wait_ready(ours, lambda: is_listening(port), 1.0)
        finally:
            ours.stop()


def test_a_component_losing_its_port_is_reported_with_its_log(tmp_path):
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        ours = spawn("loser", [sys.executable, "-c", "import time; time.sleep(0.5); "
                               + LISTENER.replace("print('up', flush=True); ", ""), str(port)],
                     tmp_path / "loser.log")
        try:
            with pytest.raises(ComponentStartError, match="exited while starting") as err:
                wait_ready(ours, lambda: is_listening(port), 30, port=port)
            assert "Address already in use" in str(err.value)
        finally:
            ours.stop()
