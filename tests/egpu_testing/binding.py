"""Placing a GPU pod on a node by hand, as the scheduler does: the pod is created for a
scheduler that does not run (so nothing else binds it), then bound by a Binding.

A GPU pod may not be created with `spec.nodeName` (the webhook's rule `node-name`, issue #26):
tests that need a GPU pod on a chosen node without the extender bind it the way kube-scheduler
does, with the admin's credentials."""

from __future__ import annotations

from typing import Any

#: No scheduler has this name: a pod naming it waits for the test's Binding.
BY_HAND = "egpu-tests-bind-by-hand"


def binding(name: str, namespace: str, node: str) -> dict[str, Any]:
    """The Binding that puts pod `namespace/name` on `node` (POST it to the pod's namespace)."""
    return {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
