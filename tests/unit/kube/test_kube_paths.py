"""`kube.paths.api_path`: the one builder of API paths; names checked (`core.names`) and
escaped before any request (issue 26, item 10)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from elastic_gpu.core.names import InvalidName, NameRule, check_name, name_refusal
from elastic_gpu.kube.paths import CORE, Resource, api_path, group_prefix

PODS = Resource(CORE, "pods", True)
NODES = Resource(CORE, "nodes", False)
CLAIMS = Resource(group_prefix("elasticgpu.io", "v1alpha"), "elasticgpuclaims", True)

HOSTILE = ["../../../../api/v1/nodes/x#", "..", ".", "a/b", "a?watch=1", "a#b", "a%2Fb", "A",
           "", "a" * 254, "-a", "a-", "a b", "ü", "a\n", "a..b"]


def test_paths_of_collections_objects_and_subresources() -> None:
    assert api_path(PODS) == "/api/v1/pods"
    assert PODS.path("team-a") == "/api/v1/namespaces/team-a/pods"
    assert PODS.path("team-a", "p.1", "binding") == "/api/v1/namespaces/team-a/pods/p.1/binding"
    assert NODES.path(name="n-1") == "/api/v1/nodes/n-1"
    assert CLAIMS.path("ns", "c") == "/apis/elasticgpu.io/v1alpha/namespaces/ns/elasticgpuclaims/c"


@pytest.mark.parametrize("value", HOSTILE)
def test_a_name_the_api_could_not_hold_is_refused_naming_field_value_and_rule(value: str
                                                                             ) -> None:
    with pytest.raises(InvalidName) as err:
        CLAIMS.path(value, "c")
    assert str(err.value).startswith(f"namespace {value!r}"[:60]) and "DNS-1123 label" in \
        str(err.value)
    if value not in ("a..b",):  # a valid-looking label part of a subdomain aside
        with pytest.raises(InvalidName, match="DNS-1123 subdomain"):
            PODS.path("ns", value)


def test_namespaces_are_labels_and_names_subdomains() -> None:
    assert name_refusal("a.b", NameRule.SUBDOMAIN) is None
    assert name_refusal("a.b", NameRule.LABEL) is not None
    assert name_refusal("a" * 63, NameRule.LABEL) is None
    assert name_refusal("a" * 64, NameRule.LABEL) == "64 characters, more than 63"
    assert check_name("x", NameRule.LABEL, "namespace") == "x"
    with pytest.raises(InvalidName):
        check_name(3, NameRule.SUBDOMAIN, "name")


def test_no_module_builds_an_api_path_by_hand() -> None:
    """Every `/api/` or `/apis/` path in the package is made by kube.paths (test and
    development-cluster code aside, which talk to a cluster they made)."""
    root = Path(__file__).parents[3] / "src" / "elastic_gpu"
    offenders = []
    for source in root.rglob("*.py"):
        rel = source.relative_to(root).as_posix()
        if rel in ("kube/paths.py",) or rel.startswith("devcluster/"):
            continue
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.JoinedStr) and any(
                    isinstance(v, ast.Constant) and isinstance(v.value, str)
                    and ("/api/" in v.value or "/apis/" in v.value) for v in node.values):
                offenders.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    node.value.startswith(("/api/v1/", "/apis/")):
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, offenders
