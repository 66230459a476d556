"""PID -> pod container: cgroup paths as the kubelet lays them out (v1 and v2, systemd and
cgroupfs drivers, containerd, cri-o, docker), and the pods' statuses naming them."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_gpu.agent.usage.cgroup import CgroupRef, container_pids, parse_cgroup, read_cgroup
from elastic_gpu.agent.usage.observe import owner_index, proc_resolver
from elastic_gpu.core.usage import ContainerRef

UID = "7e5b3b9c-1f7a-4c3e-9a55-2f0d8b6c1a42"
ESCAPED = UID.replace("-", "_")
CID = "4f3b1c2d" * 8

SAMPLES = {
    "v2 systemd containerd": f"0::/kubepods.slice/kubepods-burstable.slice/"
                             f"kubepods-burstable-pod{ESCAPED}.slice/cri-containerd-{CID}.scope\n",
    "v2 systemd cri-o guaranteed": f"0::/kubepods.slice/kubepods-pod{ESCAPED}.slice/"
                                   f"crio-{CID}.scope\n",
    "v2 cgroupfs": f"0::/kubepods/besteffort/pod{UID}/{CID}\n",
    "v1 cgroupfs": (f"12:pids:/kubepods/burstable/pod{UID}/{CID}\n"
                    f"11:memory:/kubepods/burstable/pod{UID}/{CID}\n"
                    "1:name=systemd:/init.scope\n"),
    "v1 systemd docker": f"4:cpu,cpuacct:/kubepods.slice/kubepods-besteffort.slice/"
                         f"kubepods-besteffort-pod{ESCAPED}.slice/docker-{CID}.scope\n",
    "node inside a container (kind)": f"0::/system.slice/docker-{'a' * 64}.scope/kubepods/"
                                      f"burstable/pod{UID}/{CID}\n",
}


@pytest.mark.parametrize("text", SAMPLES.values(), ids=SAMPLES.keys())
def test_pod_and_container_from_every_cgroup_shape(text: str) -> None:
    assert parse_cgroup(text) == CgroupRef(UID, CID)


@pytest.mark.parametrize("text", [
    "0::/init.scope\n",
    "0::/user.slice/user-1000.slice/session-2.scope\n",
    f"0::/kubepods.slice/kubepods-pod{ESCAPED}.slice\n",  # the pod's own cgroup
    f"0::/kubepods.slice/kubepods-pod{ESCAPED}.slice/crio-conmon-{CID}.scope\n",  # monitor
    f"0::/system.slice/docker-{CID}.scope\n",  # a container, but not a pod's
    "",
    "garbage without colons",
], ids=["init", "session", "pod-level", "conmon", "plain docker", "empty", "garbage"])
def test_processes_outside_pod_containers_are_none(text: str) -> None:
    assert parse_cgroup(text) is None


def fake_proc(root: Path, pids: dict[int, str]) -> Path:
    for pid, text in pids.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(text)
    (root / "self").mkdir()
    return root


def pod(uid: str, cid: str, name: str = "train", container: str = "main") -> dict[str, object]:
    return {"metadata": {"namespace": "ml", "name": name, "uid": uid},
            "status": {"containerStatuses": [{"name": container,
                                              "containerID": f"containerd://{cid}"}]}}


def test_a_pid_is_mapped_through_its_cgroup_and_the_pods_statuses(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {100: SAMPLES["v2 cgroupfs"], 101: "0::/init.scope\n",
                                102: f"0::/kubepods/besteffort/pod{UID}/{'b' * 64}\n"})
    resolve = proc_resolver([pod(UID, CID)], proc)
    assert resolve(100) == ContainerRef("ml", "train", "main")
    assert resolve(101) is None  # a host process
    assert resolve(102) is None  # a container the pods do not list (yet)
    assert resolve(999) is None  # gone
    assert read_cgroup(100, proc) == CgroupRef(UID, CID)


def test_container_pids_lists_each_containers_processes(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {7: SAMPLES["v2 cgroupfs"], 3: SAMPLES["v1 cgroupfs"],
                                5: "0::/init.scope\n"})
    assert container_pids(proc) == {CID: [3, 7]}
    assert container_pids(tmp_path / "missing") == {}


def test_owner_index_reads_init_and_app_containers() -> None:
    p = pod(UID, CID)
    p["status"]["initContainerStatuses"] = [  # type: ignore[index]
        {"name": "init", "containerID": "cri-o://" + "c" * 64}]
    assert owner_index([p, {"metadata": {}}]) == {
        (UID, CID): ContainerRef("ml", "train", "main"),
        (UID, "c" * 64): ContainerRef("ml", "train", "init")}
