"""The API group and its versions, named once.

One group carries two versions, and both stay: the Elastic GPU API's kinds (ElasticGPUClass,
ElasticGPUClaim, ElasticGPU) and GPUBudget / MIGSubstitution are `v1alpha`, the version the
original Elastic GPU project's manifests use (every seed manifest applies unchanged); GPUDevice,
the per-card inventory, came later as `v1alpha1`. Changing either would change a CRD on the
wire and break manifests in users' hands; a conversion to one version belongs to a later API
version, with a conversion webhook (docs/architecture.md, "The tree").
"""

from __future__ import annotations

GROUP = "elasticgpu.io"
#: ElasticGPUClass, ElasticGPUClaim, ElasticGPU, GPUBudget, MIGSubstitution.
ELASTICGPU_VERSION = "v1alpha"
#: GPUDevice.
INVENTORY_VERSION = "v1alpha1"
#: The component configs' apiVersion (AgentConfig, SchedulerConfig, ...).
CONFIG_API_VERSION = f"{GROUP}/v1alpha1"
