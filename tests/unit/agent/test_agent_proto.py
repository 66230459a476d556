"""The committed generated code is what api.proto generates, and speaks the kubelet's names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from elastic_gpu.agent.proto import api_pb2

SRC = Path(__file__).resolve().parents[3] / "src"
PROTO = "elastic_gpu/agent/proto/api.proto"


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", ".",
                    f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", PROTO],
                   cwd=SRC, check=True, capture_output=True)
    for name in ("api_pb2.py", "api_pb2_grpc.py"):
        fresh = (tmp_path / "elastic_gpu/agent/proto" / name).read_text()
        committed = (SRC / "elastic_gpu/agent/proto" / name).read_text()
        assert fresh == committed, f"{name} is stale: run scripts/gen-proto.sh"


def test_wire_names_and_field_numbers() -> None:
    file = api_pb2.DESCRIPTOR
    assert file.package == "v1beta1"
    assert [m.name for m in file.services_by_name["DevicePlugin"].methods] == [
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate",
        "PreStartContainer"]
    assert [m.name for m in file.services_by_name["Registration"].methods] == ["Register"]
    numbers = {(m, f.name): f.number for m, d in file.message_types_by_name.items()
               for f in d.fields}
    assert numbers[("RegisterRequest", "options")] == 4
    assert numbers[("ContainerAllocateResponse", "cdi_devices")] == 5
    assert numbers[("ContainerPreferredAllocationRequest", "allocation_size")] == 3
    assert numbers[("Device", "topology")] == 3


def test_dra_generated_code_is_up_to_date(tmp_path: Path) -> None:
    protos = ["elastic_gpu/agent/proto/dra_v1.proto",
              "elastic_gpu/agent/proto/dra_health_v1alpha1.proto",
              "elastic_gpu/agent/proto/pluginregistration_v1.proto"]
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", ".",
                    f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", *protos],
                   cwd=SRC, check=True, capture_output=True)
    for name in ("dra_v1_pb2.py", "dra_v1_pb2_grpc.py", "dra_health_v1alpha1_pb2.py",
                 "dra_health_v1alpha1_pb2_grpc.py", "pluginregistration_v1_pb2.py",
                 "pluginregistration_v1_pb2_grpc.py"):
        fresh = (tmp_path / "elastic_gpu/agent/proto" / name).read_text()
        committed = (SRC / "elastic_gpu/agent/proto" / name).read_text()
        assert fresh == committed, f"{name} is stale: run scripts/gen-proto.sh"


def test_dra_wire_names_and_field_numbers() -> None:
    from elastic_gpu.agent.proto import dra_v1_pb2, pluginregistration_v1_pb2

    dra = dra_v1_pb2.DESCRIPTOR
    # kubelet dials "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
    assert dra.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert [m.name for m in dra.services_by_name["DRAPlugin"].methods] == [
        "NodePrepareResources", "NodeUnprepareResources"]
    numbers = {(m, f.name): f.number for m, d in dra.message_types_by_name.items()
               for f in d.fields}
    assert numbers[("Device", "cdi_device_ids")] == 4
    assert numbers[("Device", "share_id")] == 5
    assert numbers[("NodePrepareResourceResponse", "error")] == 2
    assert numbers[("Claim", "name")] == 3
    reg = pluginregistration_v1_pb2.DESCRIPTOR
    assert reg.package == "pluginregistration"
    assert [m.name for m in reg.services_by_name["Registration"].methods] == [
        "GetInfo", "NotifyRegistrationStatus"]
    info = {f.name: f.number for f in reg.message_types_by_name["PluginInfo"].fields}
    assert info == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}


def test_dra_health_wire_names_and_field_numbers() -> None:
    from elastic_gpu.agent.proto import dra_health_v1alpha1_pb2

    health = dra_health_v1alpha1_pb2.DESCRIPTOR
    # kubelet dials "/v1alpha1.DRAResourceHealth/NodeWatchResources"
    assert health.package == "v1alpha1"
    (method,) = health.services_by_name["DRAResourceHealth"].methods
    assert method.name == "NodeWatchResources" and method.server_streaming
    fields = {f.name: f.number for f in health.message_types_by_name["DeviceHealth"].fields}
    assert fields == {"device": 1, "health": 2, "last_updated_time": 3,
                      "health_check_timeout_seconds": 4, "message": 5}
    assert dict(health.enum_types_by_name["HealthStatus"].values_by_name.items()).keys() == {
        "UNKNOWN", "HEALTHY", "UNHEALTHY"}
    assert dra_health_v1alpha1_pb2.UNHEALTHY == 2
