"""Dynamic Resource Allocation (resource.k8s.io/v1): Elastic GPU as the DRA driver
`gpu.elasticgpu.io`. Pure, no I/O.

- `devices`: a node's cards as ResourceSlices (whole cards and shares on one device through
  consumable capacity, MIG instances as partitionable devices consuming their card's counters),
  and the device names both sides agree on.
- `allocation`: a ResourceClaim's allocation results for this driver as the card shares our
  device-plugin path hands out (`core.assignment.CardShare`), so the kubelet plugin prepares a
  container with exactly what Allocate gives it.
- `classes`: the DeviceClasses the chart and the sandbox ship.

See docs/dra.md.
"""
