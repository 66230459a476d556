"""The Elastic GPU image, built on this machine without a registry or a base image.

images/Dockerfile needs `python:3.11-slim`, which cannot be pulled here. This builds the same
image's content from what the machine has, as a docker-archive tar (the format of
`devcluster.images`) that `ctr images import` loads into the real node's containerd:

- this interpreter (`sys.base_prefix`: its binary, libpython and the standard library without
  `SKIPPED_STDLIB`: tests, idle, tkinter, ensurepip, lib2to3, unittest), at the same absolute
  paths, so its prefix is found;
- the runtime closure of the `elastic-gpu` distribution's requirements (the files each
  installed distribution's RECORD lists), into the interpreter's own site-packages, and the
  `elastic_gpu` package from the source tree this module runs from;
- `/usr/local/bin/egpu`, the console script `pip` would write;
- every shared library those ELF files load (ldd), the dynamic loader included;
- /etc/passwd and /etc/group with root and `egpu` (65532, the Dockerfile's user), /tmp.

One layer; files readable by every user (the Deployments run as 65532). Reproducible: the same
inputs give the same image ID.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from elastic_gpu.devcluster.images import ImageBuildError, LayerEntry, docker_archive, layer_tar

EGPU_REPO = "egpu.local/elastic-gpu"
SKIPPED_STDLIB = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "site-packages",
                  "__pycache__", "lib2to3", "unittest"}
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wanted(requirement: str) -> bool:
    """A requirement without an `extra ==` marker whose marker (if any) holds here."""
    if ";" not in requirement:
        return True
    marker = requirement.split(";", 1)[1]
    if "extra" in marker:
        return False
    try:
        from packaging.markers import Marker
    except ImportError:  # no packaging: take it (the image only grows)
        return True
    return bool(Marker(marker).evaluate())


def runtime_distributions(root: str = "elastic-gpu") -> list[metadata.Distribution]:
    """`root`'s requirements and theirs, recursively (what `pip install root` installs)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [root]
    while todo:
        name = _canonical(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError as err:
            raise ImageBuildError(f"{name} is required by {root} but not installed") from err
        seen[name] = dist
        for requirement in dist.requires or []:
            found = _NAME.match(requirement)
            if found and _wanted(requirement):
                todo.append(found.group(1))
    return [d for n, d in sorted(seen.items()) if n != _canonical(root)]


def shared_libraries(binaries: Iterable[Path]) -> set[Path]:
    """Every library `ldd` resolves for `binaries`, and the dynamic loader."""
    found: set[Path] = set()
    for binary in binaries:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True,
                             check=False).stdout
        for line in out.splitlines():
            if "not found" in line:
                raise ImageBuildError(f"{binary}: a library is missing: {line.strip()}")
            match = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            if match:
                found.add(Path(match.group(1)))
    return found


def _readable(mode: int, directory: bool) -> int:
    mode = stat.S_IMODE(mode) | 0o444
    if directory or mode & 0o111:
        mode |= 0o555
    return mode & ~0o022


class _Layer:
    """Files by absolute path, parents added as directories, symlinks followed into targets."""

    def __init__(self) -> None:
        self.entries: dict[str, LayerEntry] = {}
        #: the host file of each ELF file in the layer (ldd runs on the host's copy)
        self.elves: list[Path] = []

    def _dirs(self, path: str) -> None:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d and d not in self.entries:
                self.entries[d] = LayerEntry(d, "dir", mode=0o755)

    def host_file(self, source: Path, target: str | None = None) -> None:
        rel = (target or str(source)).lstrip("/")
        if rel in self.entries:
            return
        self._dirs(rel)
        if source.is_symlink():
            link = os.readlink(source)
            self.entries[rel] = LayerEntry(rel, "symlink", target=link)
            resolved = (source.parent / link) if not os.path.isabs(link) else Path(link)
            if target is None:
                self.host_file(Path(os.path.normpath(resolved)))
            return
        data = source.read_bytes()
        self.entries[rel] = LayerEntry(rel, "file", data, _readable(source.stat().st_mode, False))
        if data[:4] == b"\x7fELF":
            self.elves.append(source)

    def data(self, rel: str, content: bytes, mode: int = 0o644) -> None:
        self._dirs(rel)
        self.entries[rel] = LayerEntry(rel, "file", content, mode)

    def directory(self, rel: str, mode: int = 0o755) -> None:
        self._dirs(rel + "/x")
        self.entries[rel] = LayerEntry(rel, "dir", mode=mode)

    def tar(self) -> bytes:
        return layer_tar(self.entries[k] for k in sorted(self.entries))


def _tree(root: Path, skip: set[str]) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        for name in sorted(filenames):
            if not name.endswith((".pyc", ".pyo")):
                yield Path(dirpath) / name


def egpu_image(tag: str = "0.1.0") -> tuple[str, bytes]:
    """(reference, docker-archive tar) of the Elastic GPU image made from this machine."""
    import elastic_gpu

    prefix = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    python = Path(os.path.realpath(prefix / "bin" / version))
    if not python.is_file():
        raise ImageBuildError(f"no interpreter at {python}")
    layer = _Layer()
    layer.host_file(python)
    alias = str(prefix / "bin" / "python3").lstrip("/")
    layer.entries[alias] = LayerEntry(alias, "symlink", target=python.name)
    libpython = prefix / "lib" / f"lib{version}.so.1.0"
    if libpython.exists():
        layer.host_file(libpython)
    stdlib = prefix / "lib" / version
    for path in _tree(stdlib, SKIPPED_STDLIB):
        layer.host_file(path)
    site = stdlib / "site-packages"
    for dist in runtime_distributions():
        base = Path(str(dist.locate_file("")))
        for rel in dist.files or []:
            if str(rel).startswith("..") or str(rel).endswith(".pyc"):
                continue
            source = base / rel
            if source.is_file():
                layer.host_file(source, str(site / rel))
    package = Path(elastic_gpu.__file__).parent
    for path in _tree(package, {"__pycache__"}):
        layer.host_file(path, str(site / "elastic_gpu" / path.relative_to(package)))
    layer.data("usr/local/bin/egpu", (
        f"#!{prefix / 'bin' / version}\nimport sys\nfrom elastic_gpu.cli.main import main\n"
        "sys.exit(main())\n").encode(), 0o755)
    # Bundled libraries (numpy.libs, ...) resolve inside site-packages, already copied; the
    # system's are added with their links (which may add more ELF files: repeat until none).
    done: set[Path] = set()
    while todo := [e for e in layer.elves if e not in done]:
        done.update(todo)
        for lib in sorted(shared_libraries(todo)):
            if not str(lib).startswith(str(prefix)) and "site-packages" not in str(lib):
                layer.host_file(lib)
    layer.data("etc/passwd", b"root:x:0:0:root:/root:/bin/false\n"
               b"egpu:x:65532:65532:egpu:/nonexistent:/bin/false\n")
    layer.data("etc/group", b"root:x:0:\negpu:x:65532:\n")
    layer.directory("tmp", 0o1777)
    layer.directory("proc")
    layer.directory("sys")
    layer.directory("dev")
    ref = f"{EGPU_REPO}:{tag}"
    return ref, docker_archive(ref, layer.tar(), cmd=["egpu", "--help"], user="65532:65532")


def binary_image(ref: str, binary: Path) -> tuple[str, bytes]:
    """(reference, docker-archive tar) of a static binary alone at /usr/local/bin/<name>, run
    as 65532 (e.g. the kube-scheduler `hack/ensure-k8s.sh` builds with CGO_ENABLED=0)."""
    layer = _Layer()
    layer.data(f"usr/local/bin/{binary.name}", binary.read_bytes(), 0o755)
    layer.data("etc/passwd", b"root:x:0:0:root:/root:/bin/false\n"
               b"egpu:x:65532:65532:egpu:/nonexistent:/bin/false\n")
    layer.directory("tmp", 0o1777)
    return ref, docker_archive(ref, layer.tar(), entrypoint=[f"/usr/local/bin/{binary.name}"],
                               user="65532:65532")


def write_egpu_image(path: Path, tag: str = "0.1.0") -> str:
    """Write the image's docker-archive to `path`; its reference."""
    ref, archive = egpu_image(tag)
    path.write_bytes(archive)
    return ref


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "elastic-gpu.tar")
    print(write_egpu_image(out), out)
