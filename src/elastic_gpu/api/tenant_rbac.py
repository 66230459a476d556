"""What a tenant may do with the Elastic GPU API: ClusterRoles aggregated into Kubernetes'
built-in `view`, `edit` and `admin` (issue #26, item 15), as operators that ship CRDs do, so a
namespace user bound to `edit` uses claims without a cluster admin writing RBAC.

Only explicit resources and verbs, never `*`:
- `view` (and through it `edit`, `admin`): read ElasticGPUClaims and GPUBudgets in the
  namespace;
- `edit`, `admin`: create, change and delete ElasticGPUClaims. Not `elasticgpuclaims/status`
  (the controller writes which ElasticGPU a claim holds), not GPUBudgets (a budget is what a
  cluster admin gives a namespace; raising one's own would defeat it), not MIGSubstitutions
  (the MIG adapter's rules decide which pod is re-created), nor any virtual resource of the
  group (the admission policies check those).
- the cluster-scoped inventory: a namespaced binding of an aggregated role never grants a
  cluster-scoped resource, so GPUDevices and ElasticGPUClasses (what cards exist, which
  classes a claim may name) are readable through a ClusterRole of their own bound to
  `system:authenticated`. ElasticGPUs are not in it: each names the claim bound to it in
  another tenant's namespace, as PersistentVolumes do, and `view` does not read those either;
  a tenant reads what its claim holds in the claim's status.
  GPUDevice status lists the pods holding a card (`<namespace>/<pod>`): where that is
  confidential, bind the inventory role to fewer subjects (chart value `tenants.inventoryReaders`).

kube-controller-manager's clusterrole-aggregation controller copies the rules of the labelled
roles into `view`/`edit`/`admin`. The chart renders the same rules (files/tenant-rbac.yaml,
written by hack/gen-chart-files.py from `TENANT_RULES`); `egpu sandbox up` applies
`manifests()`.
"""

from __future__ import annotations

from typing import Any

GROUP = "elasticgpu.io"
READ = ("get", "list", "watch")
WRITE = ("create", "update", "patch", "delete", "deletecollection")
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"

#: The role names (cluster-wide, like the CRDs: one Elastic GPU per cluster).
VIEW_ROLE = "elastic-gpu-tenant-view"
EDIT_ROLE = "elastic-gpu-tenant-edit"
INVENTORY_ROLE = "elastic-gpu-inventory-reader"
#: Who reads the inventory by default: every authenticated user and service account.
INVENTORY_READERS: tuple[dict[str, str], ...] = (
    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"},)


def _rule(resources: list[str], verbs: tuple[str, ...]) -> dict[str, Any]:
    return {"apiGroups": [GROUP], "resources": resources, "verbs": list(verbs)}


#: Each role's rules, by role: "view", "edit" (aggregated into edit and admin), "inventory".
TENANT_RULES: dict[str, list[dict[str, Any]]] = {
    "view": [_rule(["elasticgpuclaims", "gpubudgets"], READ)],
    "edit": [_rule(["elasticgpuclaims"], READ + WRITE), _rule(["gpubudgets"], READ)],
    "inventory": [_rule(["gpudevices", "elasticgpuclasses"], READ)],
}

#: Which built-in roles each aggregated role joins. `view` reaches `edit` and `admin` through
#: the built-in chain (`view` itself is aggregated into `edit`); edit's rules name both
#: explicitly so that neither depends on the other.
AGGREGATED_INTO: dict[str, tuple[str, ...]] = {"view": ("view",), "edit": ("edit", "admin")}
ROLE_NAMES: dict[str, str] = {"view": VIEW_ROLE, "edit": EDIT_ROLE, "inventory": INVENTORY_ROLE}


def manifests(inventory_readers: tuple[dict[str, str], ...] = INVENTORY_READERS
              ) -> list[dict[str, Any]]:
    """The ClusterRoles and the inventory role's ClusterRoleBinding (none without readers)."""
    out: list[dict[str, Any]] = []
    for key, rules in TENANT_RULES.items():
        meta: dict[str, Any] = {"name": ROLE_NAMES[key],
                                "labels": {"app.kubernetes.io/part-of": "elastic-gpu"}}
        for role in AGGREGATED_INTO.get(key, ()):
            meta["labels"][AGGREGATE + role] = "true"
        out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": meta, "rules": rules})
    if inventory_readers:
        out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": INVENTORY_ROLE,
                                 "labels": {"app.kubernetes.io/part-of": "elastic-gpu"}},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": INVENTORY_ROLE},
                    "subjects": [dict(s) for s in inventory_readers]})
    return out

