"""The Elastic GPU seed README's manifests, verbatim, for the tests that apply them as users do."""

from __future__ import annotations

#: The seed README's class.
SEED_CLASS = """\
apiVersion: elasticgpu.io/v1alpha
kind: ElasticGPUClass
metadata:
  name: gpushare-egpuclass
provisioner: gpushare.provisioner.elasticgpu.io
reclaimPolicy: Retain
egpuBindingMode: Immediate
"""


def seed_claim(name: str) -> str:
    """The seed README's claim (10 gpu-core, 4 gpu-memory of the class above), named `name`."""
    return f"""\
apiVersion: elasticgpu.io/v1alpha
kind: ElasticGPUClaim
metadata:
  name: {name}
spec:
  egpuClassName: gpushare-egpuclass
  resources:
    requests:
      gpushare.provisioner.elasticgpu.io/gpu-core: 10
      gpushare.provisioner.elasticgpu.io/gpu-memory: 4
"""


#: The seed README's example: the class and its two claims (its typos are in the pods, not here).
SEED_CLASS_AND_CLAIMS = "---\n".join(
    [SEED_CLASS, seed_claim("gpushare-egpuc-1"), seed_claim("gpushare-egpuc-2")])
