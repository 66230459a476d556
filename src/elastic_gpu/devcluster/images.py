"""Local container images for the real node: busybox and pause, built here, never pulled.

- busybox: one layer holding the host's static busybox (Debian's busybox-static) as
  /bin/busybox, a link per applet (/bin/sh, /bin/env, /bin/sleep, ...), /etc/passwd and
  /etc/group with root, and empty /tmp, /proc, /sys, /dev;
- pause: one layer holding /pause, our own pause program (hack/pause/main.go) built static with
  the Go toolchain and cached by the hash of its source.

Each is written as a docker-archive tar (`manifest.json`, the image config, one uncompressed
layer; the format `docker save` writes and `ctr images import` reads). The tars are
reproducible (fixed mtimes, owners and order), so the image IDs only change with their content.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from elastic_gpu.devcluster.errors import DevClusterError

PAUSE_IMAGE = "egpu.local/pause:1.0"
BUSYBOX_REPO = "egpu.local/busybox"
BUSYBOX_PATHS = ("/bin/busybox", "/usr/bin/busybox")
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageBuildError(DevClusterError):
    """A local image cannot be built (a missing tool or file); the message says which."""


@dataclass(frozen=True)
class LayerEntry:
    """One file, directory or symlink of a layer."""

    path: str  # relative, e.g. "bin/sh"
    kind: str  # "file" | "dir" | "symlink"
    data: bytes = b""
    mode: int = 0o755
    target: str = ""


def layer_tar(entries: Iterable[LayerEntry]) -> bytes:
    """An uncompressed, reproducible layer tar (owner root, mtime 0, in the given order)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.path)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = entry.mode
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = entry.target
                info.mode = 0o777
                tar.addfile(info)
            elif entry.kind == "file":
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
            else:
                raise ValueError(f"unknown layer entry kind {entry.kind!r}")
    return buffer.getvalue()


def docker_archive(ref: str, layer: bytes, *, entrypoint: Sequence[str] = (),
                   cmd: Sequence[str] = (), user: str = "") -> bytes:
    """A docker-archive tar of one image: `ref`, one layer, the given entrypoint and cmd
    (and `user`, e.g. "65532:65532": what `runAsNonRoot` checks)."""
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": _go_arch(),
        "os": "linux",
        "config": {"Env": [PATH_ENV], "Entrypoint": list(entrypoint) or None,
                   "Cmd": list(cmd) or None, "WorkingDir": "/", **({"User": user} if user else {})},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "elastic_gpu.devcluster.images"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": [layer_name]}]
    files = [(config_name, config_bytes), (layer_name, layer),
             ("manifest.json", json.dumps(manifest).encode())]
    return layer_tar([LayerEntry(layer_name.split("/")[0], "dir"),
                      *(LayerEntry(name, "file", data, 0o644) for name, data in files)])


def _go_arch() -> str:
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


# -- busybox ----------------------------------------------------------------------------

def find_busybox() -> Path:
    for candidate in BUSYBOX_PATHS:
        path = Path(candidate)
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise ImageBuildError("busybox not found (looked at " + ", ".join(BUSYBOX_PATHS) +
                          "); install Debian's busybox-static (scripts/realnode-packages.sh)")


def _static(binary: Path) -> bool:
    """An ELF without a program interpreter (PT_INTERP) needs no libraries in the image."""
    data = binary.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit only (the machines we run on)
        return False
    phoff = int.from_bytes(data[0x20:0x28], "little")
    phentsize = int.from_bytes(data[0x36:0x38], "little")
    phnum = int.from_bytes(data[0x38:0x3A], "little")
    return all(int.from_bytes(data[phoff + i * phentsize: phoff + i * phentsize + 4],
                              "little") != 3 for i in range(phnum))


def busybox_image(busybox: Path | None = None) -> tuple[str, bytes]:
    """(reference, docker-archive tar) of the busybox image made from the host's busybox."""
    binary = busybox or find_busybox()
    if not _static(binary):
        raise ImageBuildError(f"{binary} is dynamically linked; the image needs a static "
                              "busybox (Debian's busybox-static)")
    listing = subprocess.run([str(binary), "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    ref = busybox_ref(binary)
    entries = [LayerEntry(d, "dir") for d in ("bin", "etc", "dev", "proc", "sys", "root")]
    entries.append(LayerEntry("tmp", "dir", mode=0o1777))
    entries.append(LayerEntry("bin/busybox", "file", binary.read_bytes()))
    entries += [LayerEntry(f"bin/{applet}", "symlink", target="busybox")
                for applet in sorted(set(listing)) if applet != "busybox" and "/" not in applet]
    entries.append(LayerEntry("etc/passwd", "file", b"root:x:0:0:root:/root:/bin/sh\n"
                              b"nobody:x:65534:65534:nobody:/:/bin/false\n", 0o644))
    entries.append(LayerEntry("etc/group", "file", b"root:x:0:\nnogroup:x:65534:\n", 0o644))
    return ref, docker_archive(ref, layer_tar(entries), cmd=["sh"])


# -- pause ------------------------------------------------------------------------------

def pause_source() -> Path:
    """hack/pause/main.go of the source checkout this package runs from."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "hack" / "pause" / "main.go"
        if candidate.is_file():
            return candidate
    raise ImageBuildError("hack/pause/main.go not found: the real node's pause image is built "
                          "from the source checkout")


def cache_root() -> Path:
    env = os.environ.get("EGPU_K8S_CACHE")
    return Path(env).parent if env else Path.home() / ".cache" / "elastic-gpu"


def pause_binary(source: Path | None = None, cache: Path | None = None) -> Path:
    """Our pause program, built static once per version of its source and cached."""
    src = source or pause_source()
    key = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    out = (cache or cache_root()) / f"pause-{key}" / "pause"
    if out.is_file():
        return out
    go = shutil.which("go")
    if go is None:
        raise ImageBuildError("the Go toolchain is not on PATH: it builds the pause image "
                              f"from {src} (as it builds the cluster binaries)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".pause-{os.getpid()}")
    result = subprocess.run(
        [go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp), str(src)],
        capture_output=True, text=True, check=False, cwd=src.parent,
        env={**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": ""})
    if result.returncode != 0:
        raise ImageBuildError(f"building {src} failed: {result.stderr.strip()}")
    tmp.replace(out)
    return out


def pause_image(binary: Path | None = None) -> tuple[str, bytes]:
    """(reference, docker-archive tar) of the pause image."""
    data = (binary or pause_binary()).read_bytes()
    layer = layer_tar([LayerEntry("pause", "file", data)])
    return PAUSE_IMAGE, docker_archive(PAUSE_IMAGE, layer, entrypoint=["/pause"])


def write_images(directory: Path) -> dict[str, Path]:
    """Write both archives into `directory`; {reference: tar path}."""
    directory.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, (ref, archive) in (("pause", pause_image()), ("busybox", busybox_image())):
        path = directory / f"{name}.tar"
        path.write_bytes(archive)
        written[ref] = path
    return written


def busybox_ref(busybox: Path | None = None) -> str:
    """The reference of the busybox image `busybox_image` makes (its version as the tag, so
    pods need no `imagePullPolicy`: a tag other than `latest` defaults to IfNotPresent)."""
    banner = subprocess.run([str(busybox or find_busybox())], capture_output=True, text=True,
                            check=False).stdout
    found = re.search(r"BusyBox v(\d+(?:\.\d+)+)", banner)
    return f"{BUSYBOX_REPO}:{found.group(1) if found else '1'}"
