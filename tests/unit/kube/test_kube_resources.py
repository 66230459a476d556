"""`kube.resources`, the one table of our kinds' API resources, agrees with the CRDs the
project installs: every CRD has its row, with its group's served version, plural and scope."""

from __future__ import annotations

from elastic_gpu.api import registry
from elastic_gpu.kube.paths import group_prefix
from elastic_gpu.kube.resources import RESOURCES


def test_every_crd_has_its_resource_with_its_prefix_plural_and_scope() -> None:
    crds = registry.manifests()
    assert sorted(c["spec"]["names"]["kind"] for c in crds) == sorted(RESOURCES)
    for crd in crds:
        spec = crd["spec"]
        resource = RESOURCES[spec["names"]["kind"]]
        served = [v["name"] for v in spec["versions"] if v.get("served")]
        assert resource.prefix in {group_prefix(spec["group"], v) for v in served}
        assert resource.plural == spec["names"]["plural"]
        assert resource.namespaced == (spec["scope"] == "Namespaced")
