"""A tenant as the threat model of issue #26 has one: a user bound to the built-in `edit`
ClusterRole in one namespace and nothing more, acting through `kubectl --as`.

The admin kubeconfig creates the namespace and the RoleBinding; every call of the tenant goes
through the apiserver's impersonation, so RBAC and admission see the tenant's identity exactly
as they would for a real user."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from egpu_testing.sandbox import kubectl, kubectl_run

EDIT_BINDING = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {user}-edit, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}
"""


@dataclass(frozen=True)
class Tenant:
    """`user` with `edit` in `namespace`; `kubeconfig` is the admin's, used with `--as`."""

    kubeconfig: Path
    namespace: str
    user: str

    def run(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """kubectl as the tenant in its namespace, whatever its exit code."""
        return kubectl_run(self.kubeconfig, f"--as={self.user}", "-n", self.namespace, *args,
                           input=input)

    def ok(self, *args: str, input: str | None = None) -> str:
        """kubectl as the tenant; the test fails with kubectl's stderr if it is refused."""
        result = self.run(*args, input=input)
        assert result.returncode == 0, f"tenant was refused: {result.stderr}"
        return result.stdout

    def refused(self, *args: str, input: str | None = None) -> str:
        """kubectl as the tenant, which must be refused; returns the refusal (stderr)."""
        result = self.run(*args, input=input)
        assert result.returncode != 0, f"tenant was allowed: {result.stdout}"
        return result.stderr

    def can_i(self, verb: str, resource: str) -> bool:
        """`kubectl auth can-i` for the tenant in its namespace; `resource` may name a
        subresource (`pods/binding`), which kubectl itself would read as a pod NAMED binding."""
        kind, _, subresource = resource.partition("/")
        extra = [f"--subresource={subresource}"] if subresource else []
        return self.run("auth", "can-i", verb, kind, *extra).stdout.strip() == "yes"


def make_tenant(kubeconfig: Path, namespace: str, user: str | None = None) -> Tenant:
    """Create `namespace` (if missing) and bind `user` (default `tenant-<namespace>`) to `edit`
    there, with the admin kubeconfig."""
    user = user or f"tenant-{namespace}"
    if kubectl_run(kubeconfig, "get", "namespace", namespace).returncode != 0:
        kubectl(kubeconfig, "create", "namespace", namespace)
    kubectl(kubeconfig, "apply", "-f", "-",
            input=EDIT_BINDING.format(user=user, namespace=namespace))
    return Tenant(kubeconfig, namespace, user)
