"""The Elastic GPU image built on the machine (devcluster.egpu_image): what goes in it."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from elastic_gpu.devcluster.egpu_image import _wanted, binary_image, runtime_distributions


def test_runtime_closure_is_the_package_requirements_without_dev_extras() -> None:
    names = {d.metadata["Name"].lower().replace("_", "-") for d in runtime_distributions()}
    assert {"numpy", "lightkube", "grpcio", "cryptography", "pydantic", "pydantic-core",
            "typer", "pyyaml"} <= names
    assert not names & {"pytest", "mypy", "ruff", "hypothesis", "grpcio-tools"}
    assert "elastic-gpu" not in names  # the package itself comes from the source tree


def test_markers() -> None:
    assert _wanted("numpy>=1.26")
    assert not _wanted('pytest>=8; extra == "dev"')
    assert not _wanted('pywin32; sys_platform == "win32"')
    assert _wanted('uvloop>=0.19; sys_platform != "win32"')


def test_binary_image_runs_the_binary_as_the_dockerfiles_user(tmp_path: Path) -> None:
    binary = tmp_path / "tool"
    binary.write_bytes(b"\x7fELF-not-really")
    ref, archive = binary_image("egpu.local/tool:1", binary)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        config = json.loads(tar.extractfile(manifest[0]["Config"]).read())  # type: ignore[union-attr]
        with tarfile.open(fileobj=tar.extractfile(manifest[0]["Layers"][0])) as layer:
            members = {m.name: m for m in layer.getmembers()}
    assert manifest[0]["RepoTags"] == [ref] == ["egpu.local/tool:1"]
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Entrypoint"] == ["/usr/local/bin/tool"]
    assert members["usr/local/bin/tool"].mode == 0o755
    assert members["tmp"].mode == 0o1777
