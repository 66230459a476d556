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


def seed_pod(name: str, claim: str) -> str:
    """The seed README's pod (its typos fixed), named `name`, naming `claim` by the annotation
    suffix `test1` on its one container `test-cuda`."""
    return f"""\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations:
    egpuc.elasticgpu.io/test1: {claim}
spec:
  containers:
  - name: test-cuda
    image: nvidia/cuda:11.0-base
    command: ["sleep", "100000"]
"""


#: The seed README's whole example: the class, two claims and the two pods naming them.
SEED_README = "---\n".join([SEED_CLASS_AND_CLAIMS, seed_pod("test-cuda-1", "gpushare-egpuc-1"),
                            seed_pod("test-cuda-2", "gpushare-egpuc-2")])
