"""The real node's pure parts: CNI plugin protocol and address bookkeeping, local images,
containerd and kubelet configuration, the reasons a machine cannot run one, agent files."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest

from elastic_gpu.devcluster import cni_plugin, images, realnode
from elastic_gpu.devcluster.errors import DevClusterError
from elastic_gpu.devcluster.realnode_agent import write_agent_files
from elastic_gpu.devcluster.realnode_config import (
    RealNodePaths,
    cni_conflist,
    containerd_config,
    kubelet_config,
)


def members(archive: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: m for m in tar.getmembers()}


def read(archive: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        fh = tar.extractfile(name)
        assert fh is not None
        return fh.read()


# -- CNI plugin -----------------------------------------------------------------------------

def test_cni_version_lists_what_containerd_speaks() -> None:
    result = cni_plugin.run("VERSION", {}, {"cniVersion": "1.0.0"})
    assert result is not None and "1.0.0" in result["supportedVersions"]


def test_cni_addresses_are_per_container_reused_and_released(tmp_path: Path) -> None:
    a = cni_plugin.allocate(tmp_path, "10.244.0.0/30", "ctr-a")
    b = cni_plugin.allocate(tmp_path, "10.244.0.0/30", "ctr-b")
    assert (str(a), str(b)) == ("10.244.0.1", "10.244.0.2")
    assert cni_plugin.allocate(tmp_path, "10.244.0.0/30", "ctr-a") == a  # ADD retried
    with pytest.raises(cni_plugin.CniError, match="no free address"):
        cni_plugin.allocate(tmp_path, "10.244.0.0/30", "ctr-c")
    cni_plugin.release(tmp_path, "ctr-a")
    assert cni_plugin.allocate(tmp_path, "10.244.0.0/30", "ctr-c") == a


def test_cni_del_of_an_unknown_container_succeeds(tmp_path: Path) -> None:
    config = {"cniVersion": "1.0.0", "type": "egpu-veth", "dataDir": str(tmp_path / "none")}
    assert cni_plugin.run("DEL", {"CNI_CONTAINERID": "x", "CNI_NETNS": ""}, config) is None


def test_cni_refuses_unknown_plugin_type(tmp_path: Path) -> None:
    with pytest.raises(cni_plugin.CniError, match="unknown plugin type 'bridge'"):
        cni_plugin.run("ADD", {"CNI_CONTAINERID": "x", "CNI_NETNS": "/run/netns/x"},
                       {"type": "bridge", "dataDir": str(tmp_path)})


def test_cni_conflist_names_the_plugin_and_its_data_dir(tmp_path: Path) -> None:
    conf = cni_conflist(RealNodePaths(tmp_path))
    assert conf["plugins"][0]["type"] == "egpu-veth"
    assert conf["plugins"][0]["dataDir"] == str(tmp_path / "cni" / "ipam")


# -- images ---------------------------------------------------------------------------------

def test_docker_archive_is_what_ctr_import_reads() -> None:
    layer = images.layer_tar([images.LayerEntry("pause", "file", b"\x7fELF...")])
    archive = images.docker_archive("egpu.local/pause:1.0", layer, entrypoint=["/pause"])
    (manifest,) = json.loads(read(archive, "manifest.json"))
    assert manifest["RepoTags"] == ["egpu.local/pause:1.0"]
    config = json.loads(read(archive, manifest["Config"]))
    assert config["config"]["Entrypoint"] == ["/pause"]
    (layer_name,) = manifest["Layers"]
    stored = read(archive, layer_name)
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(stored).hexdigest()]
    # Reproducible: the same content gives the same image.
    assert archive == images.docker_archive("egpu.local/pause:1.0", layer,
                                            entrypoint=["/pause"])


@pytest.mark.skipif(not any(os.path.exists(p) for p in images.BUSYBOX_PATHS),
                    reason="no busybox on this machine")
def test_busybox_image_has_the_static_binary_and_its_applets() -> None:
    try:
        ref, archive = images.busybox_image()
    except images.ImageBuildError as err:
        pytest.skip(str(err))
    assert ref.startswith("egpu.local/busybox:")
    (manifest,) = json.loads(read(archive, "manifest.json"))
    layer = read(archive, manifest["Layers"][0])
    entries = members(layer)
    assert entries["bin/busybox"].isfile()
    for applet in ("sh", "env", "sleep"):
        assert entries[f"bin/{applet}"].issym() and entries[f"bin/{applet}"].linkname == "busybox"
    assert entries["tmp"].mode == 0o1777


def test_dynamic_binary_is_refused_for_busybox(tmp_path: Path) -> None:
    fake = tmp_path / "busybox"
    fake.write_bytes(Path("/bin/sh").resolve().read_bytes())  # dynamically linked
    fake.chmod(0o755)
    with pytest.raises(images.ImageBuildError, match="dynamically linked"):
        images.busybox_image(fake)


# -- configuration --------------------------------------------------------------------------

def test_containerd_config_carries_the_workarounds(tmp_path: Path) -> None:
    paths = RealNodePaths(tmp_path)
    config = tomllib.loads(containerd_config(paths, "egpu.local/pause:1.0"))
    assert config["version"] == 3  # containerd 2's format
    cri = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["restrict_oom_score_adj"] is True
    assert config["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == \
        "egpu.local/pause:1.0"
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert cri["cni"]["bin_dirs"] == [str(paths.cni_bin)]
    # the DRA kubelet plugin's devices reach the containers through CDI
    assert cri["cdi_spec_dirs"] == [str(paths.cdi_dir)]  # (containerd 2 always reads CDI)
    assert config["grpc"]["address"] == str(paths.containerd_socket)
    assert config["root"].startswith(str(tmp_path)) and config["state"].startswith(str(tmp_path))


def test_kubelet_config_for_cgroup_v1_without_systemd(tmp_path: Path) -> None:
    paths = RealNodePaths(tmp_path)
    config = kubelet_config(paths, port=1, healthz_port=2, ca_file=tmp_path / "ca.crt",
                            taints=[realnode.REAL_NODE_TAINT])
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["failSwapOn"] is False
    assert config["address"] == "127.0.0.1"
    assert config["cgroupRoot"] == "/egpu-realnode"
    assert config["containerRuntimeEndpoint"] == f"unix://{paths.containerd_socket}"
    assert config["registerWithTaints"] == [realnode.REAL_NODE_TAINT]


def test_node_identity_is_system_node(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    from elastic_gpu.devcluster.pki import create_pki

    pki = create_pki(tmp_path / "pki")
    realnode.issue_node_certificate(pki.ca_cert, pki.ca_key, "n1", tmp_path / "n.crt",
                                    tmp_path / "n.key")
    cert = x509.load_pem_x509_certificate((tmp_path / "n.crt").read_bytes())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == \
        "system:node:n1"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == \
        "system:nodes"
    binding = realnode.node_rbac_manifest("n1")
    assert binding["roleRef"]["name"] == "system:node"
    assert binding["subjects"][0]["name"] == "system:node:n1"


# -- can this machine run one? ---------------------------------------------------------------

def test_not_root_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = realnode.unavailable_reason()
    assert reason is not None and "not root (uid 1000)" in reason


def test_missing_packages_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realnode, "_which", lambda name: None)
    reason = realnode.unavailable_reason()
    assert reason is not None
    assert "missing Debian packages: iproute2 mount runc util-linux" in reason


def test_missing_kubelet_and_containerd_are_reasons(tmp_path: Path) -> None:
    reason = realnode.unavailable_reason(tmp_path)
    assert reason is not None
    for built in ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr"):
        assert f"no {built} in {tmp_path}" in reason, reason


# -- the agent's files ------------------------------------------------------------------------

def test_agent_config_points_at_the_kubelet_plugin_dir(tmp_path: Path) -> None:
    import yaml

    inventory: dict[str, Any] = {"cards": [{"model": "A100", "memoryMiB": 40960}]}
    path = write_agent_files(tmp_path / "a", tmp_path / "kubelet" / "device-plugins",
                             inventory, {"devicePluginDir": "/elsewhere/", "syncSeconds": 1})
    config = yaml.safe_load(path.read_text())
    assert "devicePluginDir" not in config  # the old spelling given, replaced
    assert config["devicePluginDirectory"] == str(tmp_path / "kubelet" / "device-plugins") + "/"
    assert config["backend"] == "fake" and config["syncSeconds"] == 1
    from elastic_gpu.agent.config import load_config

    assert load_config(path).backend.value == "fake"


def test_agent_inventory_with_absent_device_files_is_refused(tmp_path: Path) -> None:
    inventory = {"cards": [{"model": "A100", "memoryMiB": 40960,
                            "devices": ["/dev/nvidia0-does-not-exist"]}]}
    with pytest.raises(DevClusterError, match="runc would fail"):
        write_agent_files(tmp_path, tmp_path / "dp", inventory)


# -- `egpu sandbox up --real-nodes` refuses before starting anything --------------------------

def test_sandbox_refuses_two_real_nodes_before_starting(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from elastic_gpu.cli.sandbox import app

    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, [
        "up", "--gpu-nodes", "1", "--real-nodes", "2", "--kubeconfig", str(tmp_path / "kc"),
        "--state-dir", str(tmp_path / "s")])
    assert result.exit_code == 2
    assert "--real-nodes" in result.output and "at most 1 per machine" in result.output
    assert not (tmp_path / "s").exists()


def test_sandbox_says_why_the_machine_cannot_run_a_real_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from elastic_gpu.cli.sandbox import app

    bins = tmp_path / "bin"
    bins.mkdir()
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                 "kubectl", "kwok"):
        (bins / name).write_text("#!/bin/sh\n")
        (bins / name).chmod(0o755)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, [
        "up", "--gpu-nodes", "1", "--real-nodes", "1", "--kubeconfig", str(tmp_path / "kc"),
        "--state-dir", str(tmp_path / "s"), "--bin-dir", str(bins)])
    assert result.exit_code == 2
    assert "not root (uid 1000)" in result.output and f"no kubelet in {bins}" in result.output
    assert not (tmp_path / "s").exists()


def test_a_namespace_without_overlay_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil as sh

    if sh.which("unshare") is None:
        pytest.skip("no unshare on this machine")
    real_which = realnode._which
    monkeypatch.setattr(realnode, "_which",
                        lambda name: "/bin/false" if name == "mount" else real_which(name))
    reason = realnode._probe_namespace()
    assert reason is not None and "cannot mount an overlay over /var/lib" in reason
