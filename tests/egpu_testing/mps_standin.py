"""A stand-in for `nvidia-cuda-mps-control`, so the agent's MPS supervisor is tested without a GPU.

It behaves as the real control program does towards its supervisor:

- `-d`: start a daemon and return. The daemon is forked (detached, its output closed), serves
  a unix socket `control` in CUDA_MPS_PIPE_DIRECTORY, writes its pid to
  `nvidia-cuda-mps-control.pid` there and a line to `control.log` in CUDA_MPS_LOG_DIRECTORY
  (naming CUDA_VISIBLE_DEVICES, which tests read back). A file `refuse-start` in the pipe
  directory makes the start fail (exit 1, a message on stderr), as a start on a broken card
  would.
- a file `hang` in the pipe directory makes the daemon hang at the next command it is sent: it
  keeps running (its pid file stays, its socket accepts) but answers nothing, ever, not even
  `quit`, as a wedged control daemon does. A daemon started while `hang` exists hangs at its
  first command too.
- no argument: a client. It sends each line of stdin to the daemon and prints the answer;
  `quit` makes the daemon remove its pid file and exit. Without a daemon it exits 1.

A test "crashes" the daemon by SIGKILL to the pid in the pid file (`kill_daemon`).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

PID_FILE = "nvidia-cuda-mps-control.pid"


def standin_binary(directory: Path) -> Path:
    """An executable that runs this stand-in with this interpreter (the config's `binary`)."""
    path = directory / "nvidia-cuda-mps-control"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} \"$@\"\n")
    path.chmod(0o755)
    return path


def daemon_pid(pipe_directory: Path) -> int | None:
    try:
        return int((pipe_directory / PID_FILE).read_text())
    except (OSError, ValueError):
        return None


def kill_daemon(pipe_directory: Path) -> int:
    """SIGKILL the daemon (a crash: its pid file stays behind) and wait until it is dead (gone,
    or a zombie its parent has yet to reap); returns its pid."""
    pid = daemon_pid(pipe_directory)
    assert pid is not None, f"no daemon in {pipe_directory}"
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            return pid
        if state in ("Z", "X"):
            return pid
        time.sleep(0.01)
    raise AssertionError(f"daemon {pid} still runs 10 s after SIGKILL")


def _serve(pipe: Path, logs: Path) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control = pipe / "control"
    control.unlink(missing_ok=True)
    server.bind(str(control))
    server.listen(4)
    (logs / "control.log").open("a").write(
        f"started pid {os.getpid()} for {os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n")
    (pipe / PID_FILE).write_text(str(os.getpid()))
    while True:
        conn, _ = server.accept()
        with conn:
            command = conn.recv(4096).decode().strip()
            if (pipe / "hang").exists():
                while True:  # wedged: alive, silent, until killed
                    time.sleep(3600)
            if command == "quit":
                conn.sendall(b"")
                (pipe / PID_FILE).unlink(missing_ok=True)
                control.unlink(missing_ok=True)
                return
            conn.sendall(b"100.0\n" if command.startswith("get_") else b"ok\n")


def main(argv: list[str]) -> int:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    logs = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    if argv[1:] == ["-d"]:
        if (pipe / "refuse-start").exists():
            print("An instance of this daemon cannot start on this card", file=sys.stderr)
            return 1
        pipe.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        if os.fork() != 0:
            return 0
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            _serve(pipe, logs)
        finally:
            os._exit(0)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(pipe / "control"))
    except OSError as err:
        print(f"Cannot find MPS control daemon process: {err}", file=sys.stderr)
        return 1
    with client:
        client.sendall(sys.stdin.read().encode())
        client.shutdown(socket.SHUT_WR)
        sys.stdout.write(client.recv(4096).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
