"""How the dev control plane runs kube-controller-manager (flags, admission, persistence)."""

from pathlib import Path

from elastic_gpu.devcluster.controlplane import (
    CONTROLLER_MANAGER,
    ControlPlane,
    apiserver_disabled_admission_plugins,
)


def test_service_account_admission_is_on_exactly_when_the_controller_manager_runs():
    assert "ServiceAccount" not in apiserver_disabled_admission_plugins(True)
    assert "ServiceAccount" in apiserver_disabled_admission_plugins(False)
    # Nodes must take pods as soon as kwok marks them Ready, with or without it.
    for on in (True, False):
        assert "TaintNodesByCondition" in apiserver_disabled_admission_plugins(on)


def test_the_sandbox_state_keeps_the_controller_manager_and_its_port(tmp_path):
    plane = ControlPlane(work_dir=tmp_path, bin_dir=Path("/nonexistent"), apiserver_port=1,
                         etcd_port=2, etcd_peer_port=3, kwok_port=4,
                         controller_manager_port=5)
    again = ControlPlane.from_dict(plane.to_dict())
    assert again.controller_manager is True
    assert again.ports_of(CONTROLLER_MANAGER) == [5]
    plane.controller_manager = False
    assert ControlPlane.from_dict(plane.to_dict()).controller_manager is False


def test_a_state_file_from_before_the_controller_manager_still_loads(tmp_path):
    data = ControlPlane(work_dir=tmp_path, bin_dir=Path("/nonexistent")).to_dict()
    del data["controller_manager"], data["controller_manager_port"]
    plane = ControlPlane.from_dict(data)
    assert plane.controller_manager is False
    assert CONTROLLER_MANAGER not in plane.processes
