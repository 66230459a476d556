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
