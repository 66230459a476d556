"""A component that dies on start: a clear error with its log, and nothing left running."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elastic_gpu.devcluster.binaries import BINARIES, find_bin_dir
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.errors import ComponentStartError

pytestmark = pytest.mark.integration


def test_a_dying_component_stops_the_others_and_shows_its_log(tmp_path):
    real = find_bin_dir()
    bins = tmp_path / "bin"
    bins.mkdir()
    for name in BINARIES:
        (bins / name).symlink_to(real / name)
    (bins / "kwok").unlink()
    broken = bins / "kwok"
    broken.write_text("#!/bin/sh\necho 'kwok: cannot load config: boom' >&2\nexit 7\n")
    broken.chmod(0o755)

    plane = ControlPlane(work_dir=tmp_path / "cluster", bin_dir=bins, die_with_parent=True)
    with pytest.raises(ComponentStartError) as info:
        plane.start()
    assert info.value.name == "kwok"
    assert "exit code 7" in str(info.value) and "boom" in str(info.value)
    # etcd, kube-apiserver, kube-controller-manager and kube-scheduler had started; all are
    # gone again.
    assert set(plane.processes) == {"etcd", "kube-apiserver", "kube-controller-manager",
                                    "kube-scheduler", "kwok"}
    for handle in plane.processes.values():
        assert not Path(f"/proc/{handle.pid}").exists() or not handle.alive()
        assert not _group_alive(handle.pid)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
