"""The DeviceClasses of the driver `gpu.elasticgpu.io`, as the chart and the sandbox ship them.
Pure, no I/O.

- `gpu.elasticgpu.io`: cards. A claim that asks no capacity gets a whole card; one that asks
  `capacity.requests` (`compute` in percent, `memory`) gets that share of one card. It names
  `nvidia.com/gpu` as its `extendedResourceName` (KEP-5004), so an unchanged `nvidia.com/gpu: 1`
  pod is served a whole card through DRA on a node whose kubelet does not advertise that name
  (a DRA-mode node); on a device-plugin node the device plugin serves it as before.
- `mig.gpu.elasticgpu.io`: MIG instances; select a profile with
  `device.attributes["gpu.elasticgpu.io"].profile == "1g.10gb"`.

A ResourceQuota counts each class as `<class>.deviceclass.resource.k8s.io/devices` (k8s.io:
a quota naming `...resource.kubernetes.io/devices` is accepted and counts nothing).
"""

from __future__ import annotations

from typing import Any

from elastic_gpu.core.dra.devices import DRIVER, TYPE_GPU, TYPE_MIG

CARD_CLASS = DRIVER
MIG_CLASS = f"mig.{DRIVER}"
#: The extended resource the card class serves through DRA (KEP-5004).
EXTENDED_RESOURCE = "nvidia.com/gpu"


def _selector(kind: str) -> str:
    return (f'device.driver == "{DRIVER}" && '
            f'device.attributes["{DRIVER}"].type == "{kind}"')


def device_classes() -> list[dict[str, Any]]:
    labels = {"app.kubernetes.io/managed-by": "elastic-gpu"}
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
         "metadata": {"name": CARD_CLASS, "labels": labels},
         "spec": {"selectors": [{"cel": {"expression": _selector(TYPE_GPU)}}],
                  "extendedResourceName": EXTENDED_RESOURCE}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
         "metadata": {"name": MIG_CLASS, "labels": labels},
         "spec": {"selectors": [{"cel": {"expression": _selector(TYPE_MIG)}}]}},
    ]
