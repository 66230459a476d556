"""The tenant ClusterRoles (issue #26, item 15) grant only explicit resources and verbs, and
nothing that decides who holds a card."""

from __future__ import annotations

from elastic_gpu.api.tenant_rbac import (
    AGGREGATE,
    EDIT_ROLE,
    INVENTORY_ROLE,
    TENANT_RULES,
    VIEW_ROLE,
    manifests,
)

#: What a tenant must never write: these decide who holds a card, or are the group's
#: virtual resources the admission policies check.
NEVER_WRITTEN = {"elasticgpus", "gpudevices", "migsubstitutions", "gpubudgets",
                 "elasticgpuclaims/status", "gpubudgets/status", "elasticgpus/status",
                 "gpudevices/status", "migsubstitutions/status", "miglayouts",
                 "miglayouts/status"}
READ = {"get", "list", "watch"}


def granted() -> list[tuple[str, str, str]]:
    return [(group, resource, verb) for rules in TENANT_RULES.values() for rule in rules
            for group in rule["apiGroups"] for resource in rule["resources"]
            for verb in rule["verbs"]]


def test_no_wildcard_and_only_the_elastic_gpu_group() -> None:
    for group, resource, verb in granted():
        assert group == "elasticgpu.io"
        assert "*" not in (resource, verb)
        assert "/" not in resource  # no subresource: claim status is the controller's


def test_tenants_write_only_claims() -> None:
    written = {resource for _, resource, verb in granted() if verb not in READ}
    assert written == {"elasticgpuclaims"}
    assert not written & NEVER_WRITTEN


def test_elasticgpus_are_not_readable_they_name_other_namespaces_claims() -> None:
    assert "elasticgpus" not in {resource for _, resource, _ in granted()}


def test_aggregation_labels_and_the_inventory_binding() -> None:
    objs = {(o["kind"], o["metadata"]["name"]): o for o in manifests()}
    labels = {name: o["metadata"]["labels"] for (kind, name), o in objs.items()
              if kind == "ClusterRole"}
    assert labels[VIEW_ROLE][AGGREGATE + "view"] == "true"
    assert labels[EDIT_ROLE][AGGREGATE + "edit"] == labels[EDIT_ROLE][AGGREGATE + "admin"] == "true"
    assert not any(k.startswith(AGGREGATE) for k in labels[INVENTORY_ROLE])
    binding = objs["ClusterRoleBinding", INVENTORY_ROLE]
    assert binding["roleRef"]["name"] == INVENTORY_ROLE
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                    "name": "system:authenticated"}]
    assert not [o for o in manifests(()) if o["kind"] == "ClusterRoleBinding"]
