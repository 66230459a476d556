"""A tiny CNI plugin for the dev cluster's real node (stdlib only; containerd runs this file).

The dev machine's kernel has no dummy, macvlan or ipvlan links, and the real node needs no
cluster network (its pods talk to nobody but kubelet, which reads their logs from files).
So a pod gets:
- type `egpu-veth`: a veth pair created *inside* the pod's network namespace (both ends stay
  there; nothing is added to the host's network), `CNI_IFNAME` (eth0) up with one /32 address
  from the network's `subnet`, recorded in `dataDir` (one file per address, under a lock);
- type `loopback` (containerd's CRI always adds a loopback network): `lo` up.

DEL releases the container's address and never fails for a namespace that is already gone.
Commands: ADD, DEL, CHECK, VERSION (and STATUS, GC of CNI 1.1, which succeed). Protocol:
https://www.cni.dev/docs/spec/ (configuration on stdin, CNI_* in the environment, the result
or an error as JSON on stdout).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0")
PEER_NAME = "egpu-peer0"


class CniError(Exception):
    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details


def _tool(name: str) -> str:
    found = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/sbin/{name}", f"/usr/bin/{name}")
         if os.access(p, os.X_OK)), None)
    if found is None:
        raise CniError(999, f"{name} not found (PATH={os.environ.get('PATH', '')}); "
                       "the real node needs iproute2 and util-linux")
    return found


def _in_netns(netns: str, *argv: str) -> None:
    result = subprocess.run([_tool("nsenter"), f"--net={netns}", _tool("ip"), *argv],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CniError(999, f"ip {' '.join(argv)} in {netns} failed",
                       result.stderr.strip())


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    data_dir.mkdir(parents=True, exist_ok=True)
    with (data_dir / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def allocate(data_dir: Path, subnet: str, container_id: str) -> ipaddress.IPv4Address:
    """The container's address: the one it already holds, else the first free one."""
    network = ipaddress.IPv4Network(subnet)
    with _locked(data_dir):
        for entry in data_dir.iterdir():
            if entry.name != "lock" and entry.read_text() == container_id:
                return ipaddress.IPv4Address(entry.name)
        for address in network.hosts():
            path = data_dir / str(address)
            if not path.exists():
                path.write_text(container_id)
                return address
    raise CniError(11, f"no free address left in {subnet}")


def release(data_dir: Path, container_id: str) -> None:
    if not data_dir.is_dir():
        return
    with _locked(data_dir):
        for entry in data_dir.iterdir():
            if entry.name != "lock" and entry.read_text() == container_id:
                entry.unlink()


def _result(version: str, ifname: str, netns: str, address: str) -> dict[str, Any]:
    return {"cniVersion": version,
            "interfaces": [{"name": ifname, "sandbox": netns}],
            "ips": [{"address": address, "interface": 0}]}


def run(command: str, env: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any] | None:
    """Carry out one CNI command; the result to print (None: print nothing)."""
    version = str(config.get("cniVersion", "1.0.0"))
    if command == "VERSION":
        return {"cniVersion": version, "supportedVersions": list(SUPPORTED_VERSIONS)}
    if command in ("CHECK", "STATUS", "GC"):
        return None
    kind = str(config.get("type", ""))
    container_id = env.get("CNI_CONTAINERID", "")
    netns = env.get("CNI_NETNS", "")
    ifname = env.get("CNI_IFNAME", "eth0")
    data_dir = Path(str(config.get("dataDir", "/run/egpu-cni")))
    if kind == "loopback":
        if command == "ADD":
            _in_netns(netns, "link", "set", "lo", "up")
            return _result(version, "lo", netns, "127.0.0.1/8")
        return None
    if kind != "egpu-veth":
        raise CniError(1, f"unknown plugin type {kind!r} (this plugin is egpu-veth and "
                       "loopback)")
    if command == "DEL":
        release(data_dir, container_id)
        return None
    if command != "ADD":
        raise CniError(4, f"unknown CNI_COMMAND {command!r}")
    if not container_id or not netns:
        raise CniError(4, "ADD needs CNI_CONTAINERID and CNI_NETNS")
    address = allocate(data_dir, str(config.get("subnet", "10.244.0.0/16")), container_id)
    try:
        _in_netns(netns, "link", "add", ifname, "type", "veth", "peer", "name", PEER_NAME)
        _in_netns(netns, "addr", "add", f"{address}/32", "dev", ifname)
        _in_netns(netns, "link", "set", PEER_NAME, "up")
        _in_netns(netns, "link", "set", ifname, "up")
    except CniError:
        release(data_dir, container_id)
        raise
    return _result(version, ifname, netns, f"{address}/32")


def main() -> int:
    command = os.environ.get("CNI_COMMAND", "")
    raw = sys.stdin.read() if command != "VERSION" else (sys.stdin.read() or "{}")
    try:
        config = json.loads(raw or "{}")
        if not isinstance(config, dict):
            raise CniError(6, "network configuration is not a JSON object")
        result = run(command, os.environ, config)
    except CniError as err:
        print(json.dumps({"cniVersion": "1.0.0", "code": err.code, "msg": err.msg,
                          "details": err.details}))
        return 1
    except ValueError as err:
        print(json.dumps({"cniVersion": "1.0.0", "code": 6, "msg": f"bad configuration: {err}"}))
        return 1
    if result is not None:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
