"""The real node's mount namespace holder: `python -m elastic_gpu.devcluster.realnode_ns WORK`.

Started as `unshare --mount --propagation private -- python -m ... WORK`, so it runs in a new
mount namespace whose mounts never reach the host. There it covers the host paths kubelet and
containerd write to with directories of the work dir, then waits; containerd and kubelet join
the namespace (`nsenter --mount=/proc/<pid>/ns/mnt`). When the last process in the namespace
exits, every mount made in it (these, the pods' volumes, rootfs overlays, netns files) is gone
with it.

- /var/lib: an overlay whose lower layer is the host's /var/lib and whose upper layer is in
  the work dir (/var/lib/cni, the mount point /var/lib/kubelet: nothing new on the host);
- /var/lib/kubelet: the work dir's kubelet/ (kubelet hard-codes its device-plugin directory
  there; the host sees the sockets at WORK/kubelet/device-plugins/);
- /run and /var/log: the work dir's run/ and log/ (/run/containerd, /run/netns, runc's state,
  /var/log/pods, /var/log/containers);
- the /proc/sys files kubelet rewrites (`KUBELET_SYSCTLS`): a plain file each, holding the
  host's value, so the host's sysctls are never changed.

It also holds the one-real-node-per-machine lock: the abstract unix socket `@egpu-realnode`
(it vanishes with the process, so a killed node leaves no stale lock). A node being started or
stopped holds `@egpu-realnode-start` in the starting (or stopping) process from its check of
the lock until its namespace holds it, so that two starts (two test runs on one machine) can
never both find the machine free and sweep each other's processes out of the shared cgroup.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from elastic_gpu.devcluster.realnode_config import KUBELET_SYSCTLS, RealNodePaths

LOCK_NAME = "\0egpu-realnode"
START_CLAIM_NAME = "\0egpu-realnode-start"
EXIT_LOCKED = 3
EXIT_MOUNT = 4


def take_lock() -> socket.socket | None:
    """The machine-wide real-node lock, or None if another process holds it."""
    return _bind(LOCK_NAME)


def take_start_claim() -> socket.socket | None:
    """The right to check the machine for a real node and sweep its cgroup (held while a node
    starts or stops), or None while another process starts or stops one."""
    return _bind(START_CLAIM_NAME)


def _bind(name: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(name)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            return None
        raise
    return sock


def lock_holder() -> int | None:
    """The pid holding the real-node lock, if any (from /proc/net/unix and /proc/*/fd)."""
    inode = None
    try:
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[7] == "@" + LOCK_NAME[1:]:
                inode = fields[6]
                break
    except OSError:
        return None
    if inode is None:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) == f"socket:[{inode}]":
                    return int(proc.name)
        except OSError:
            continue
    return None


def _mount(*argv: str) -> None:
    subprocess.run(["mount", *argv], check=True, capture_output=True, text=True)


def set_up_mounts(paths: RealNodePaths) -> None:
    for directory in (paths.varlib_upper, paths.varlib_work, paths.kubelet_root,
                      paths.run_dir, paths.log_dir, paths.sysctl_dir):
        directory.mkdir(parents=True, exist_ok=True)
    _mount("-t", "overlay", "overlay", "-o",
           f"lowerdir=/var/lib,upperdir={paths.varlib_upper},workdir={paths.varlib_work}",
           "/var/lib")
    Path("/var/lib/kubelet").mkdir(exist_ok=True)  # in the overlay's upper layer
    _mount("--bind", str(paths.kubelet_root), "/var/lib/kubelet")
    _mount("--bind", str(paths.run_dir), "/run")
    _mount("--bind", str(paths.log_dir), "/var/log")
    for name in KUBELET_SYSCTLS:
        proc_file = Path("/proc/sys") / name
        if not proc_file.exists():
            continue
        shadow = paths.sysctl_dir / name.replace("/", ".")
        shadow.write_text(proc_file.read_text())
        _mount("--bind", str(shadow), str(proc_file))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m elastic_gpu.devcluster.realnode_ns WORK_DIR", file=sys.stderr)
        return 2
    paths = RealNodePaths(Path(argv[0]))
    lock = take_lock()
    if lock is None:
        print(f"another real node runs on this machine (pid {lock_holder()} holds "
              "@egpu-realnode)", file=sys.stderr)
        return EXIT_LOCKED
    try:
        set_up_mounts(paths)
    except subprocess.CalledProcessError as err:
        print(f"mount {' '.join(err.cmd[1:])} failed: {err.stderr.strip()}", file=sys.stderr)
        return EXIT_MOUNT
    paths.ready_file.write_text(str(os.getpid()))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
