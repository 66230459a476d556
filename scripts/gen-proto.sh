#!/usr/bin/env bash
# Regenerate the kubelet gRPC code (and its type stubs): the device-plugin API (api.proto), the
# PodResources API (podresources.proto), and the DRA plugin's three: the DRA service
# (dra_v1.proto), its device health stream (dra_health_v1alpha1.proto) and the plugin
# watcher's registration (pluginregistration_v1.proto).
# The output is committed so that installing the package needs no protoc; rerun this after
# editing a .proto in src/elastic_gpu/agent/proto/. Needs the dev extras (grpcio-tools,
# mypy-protobuf) in .venv or on PATH.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$py" ]] || py=python3
plugin_dir="$(dirname "$py")"
cd "$root/src"
# -I src with the package path in the file name makes the generated imports absolute
# (`from elastic_gpu.agent.proto import api_pb2`), so the module works from any directory.
PATH="$plugin_dir:$PATH" "$py" -m grpc_tools.protoc -I . \
  --python_out=. --grpc_python_out=. --mypy_out=. --mypy_grpc_out=. \
  elastic_gpu/agent/proto/api.proto elastic_gpu/agent/proto/podresources.proto \
  elastic_gpu/agent/proto/dra_v1.proto elastic_gpu/agent/proto/dra_health_v1alpha1.proto \
  elastic_gpu/agent/proto/pluginregistration_v1.proto
echo "generated: $(ls elastic_gpu/agent/proto/*_pb2*)"
