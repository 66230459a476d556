"""Which ElasticGPU and GPUDevice changes start a MIG round (controller/mig/objects.py): only
those that change what a round reads. The others (a claim's ElasticGPU of shares, a
GPUDevice's allocation columns and usage samples) came by the hundred a second under a
stream of claims and ran rounds back to back."""

from __future__ import annotations

from typing import Any

from elastic_gpu.controller.mig.objects import device_round_inputs, holds_mig


def _egpu(*cards: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "egpu-1"},
            "spec": {"node": "n1", "capacity": {}, "cards": list(cards)}}


def test_an_elasticgpu_of_shares_holds_no_mig_instance() -> None:
    share = {"index": 0, "uuid": "GPU-0", "milli": 100, "memoryMiB": 4096}
    assert not holds_mig(_egpu(share))
    assert not holds_mig(_egpu())
    assert not holds_mig({"metadata": {"name": "x"}})  # no spec: nothing held


def test_an_elasticgpu_naming_a_mig_instance_holds_it() -> None:
    share = {"index": 0, "uuid": "GPU-0", "milli": 1000, "memoryMiB": 4864,
             "mig": "1g.5gb", "migUuid": "MIG-0"}
    assert holds_mig(_egpu({"index": 1, "uuid": "GPU-1", "milli": 100, "memoryMiB": 1}, share))


def _device(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "n1-0"},
            "spec": {"node": "n1", "index": 0, "uuid": "GPU-0", "model": "A100",
                     "memoryMiB": 40960, "mig": [{"profile": "1g.5gb", "uuid": "MIG-0"}]},
            "status": status}


def test_allocation_and_usage_changes_of_a_gpudevice_are_not_round_inputs() -> None:
    before = _device(health="Healthy", allocatedMilli=0, usage={"usedMemoryMiB": 0})
    after = _device(health="Healthy", allocatedMilli=300, usage={"usedMemoryMiB": 900})
    assert device_round_inputs(before) == device_round_inputs(after)


def test_health_and_spec_changes_of_a_gpudevice_are_round_inputs() -> None:
    healthy = _device(health="Healthy")
    assert device_round_inputs(healthy) != device_round_inputs(_device(health="Unhealthy"))
    recarved = _device(health="Healthy")
    recarved["spec"]["mig"] = [{"profile": "2g.10gb", "uuid": "MIG-1"}]
    assert device_round_inputs(healthy) != device_round_inputs(recarved)
