"""The GPUDevice kind as a lightkube resource, for tests and benches that use lightkube as
their tool (the package itself reads and writes GPUDevices through `kube.sync`)."""

from __future__ import annotations

from typing import Any

from lightkube.generic_resource import create_global_resource

from elastic_gpu.api import gpudevice as gd

GPUDevice: Any = create_global_resource(gd.GROUP, gd.VERSION, gd.KIND, gd.PLURAL)
