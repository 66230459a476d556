"""Every Kubernetes API path the package requests is built here, by `api_path`.

A path is a fixed prefix (`/api/v1` or `/apis/<group>/<version>`) and a resource's plural from
our own tables, then names that may come from outside: a namespace from an AdmissionReview, a
pod from a /bind, a claim from an annotation. Each name is checked against its kind's rule
(`core.names`: a DNS-1123 label for namespaces, a subdomain for the rest) before any request
is made, and every segment is percent-escaped besides, so no name can add a segment, climb
with `..` or cut the path with `#` or `?` (issue 26, item 10: the namespace
`../../../../api/v1/nodes/x#` made the webhook GET a Node with its own credentials).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

from elastic_gpu.core.names import InvalidName, NameRule, check_name

__all__ = ["CORE", "InvalidName", "Resource", "api_path", "group_prefix"]

#: the core group's prefix
CORE = "/api/v1"
_PREFIX = re.compile(r"/api/v1\Z|/apis/[a-z0-9]([-a-z0-9.]*[a-z0-9])?/v[0-9a-z]+\Z")
_WORD = re.compile(r"[a-z][a-z0-9]*\Z")


def group_prefix(group: str, version: str) -> str:
    """`/apis/<group>/<version>` (`/api/v1` for the core group, "")."""
    return CORE if not group else f"/apis/{group}/{version}"


@dataclass(frozen=True)
class Resource:
    """A resource's collection path: `/api/v1` or `/apis/<group>/<version>`, its plural, and
    whether it is namespaced; `name_rule`: what its object names must be."""

    prefix: str
    plural: str
    namespaced: bool
    name_rule: NameRule = NameRule.SUBDOMAIN

    def __post_init__(self) -> None:
        if _PREFIX.match(self.prefix) is None or _WORD.match(self.plural) is None:
            raise ValueError(f"not an API resource: prefix {self.prefix!r}, plural "
                             f"{self.plural!r}")

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        return api_path(self, namespace, name, subresource)


def api_path(resource: Resource, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
    """The path of `resource`'s collection (across namespaces when `namespace` is None), of
    one object (`name`), or of its subresource; InvalidName, before any request, for a
    namespace or name the API server would never have stored."""
    parts = [resource.prefix]
    if resource.namespaced and namespace is not None:
        parts += ["namespaces", check_name(namespace, NameRule.LABEL, "namespace")]
    elif namespace and not resource.namespaced:
        raise ValueError(f"{resource.plural} are cluster-scoped: no namespace "
                         f"({namespace!r})")
    parts.append(resource.plural)
    if name is not None:
        parts.append(check_name(name, resource.name_rule, f"{resource.plural} name"))
        if subresource is not None:
            if _WORD.match(subresource) is None:
                raise ValueError(f"not a subresource: {subresource!r}")
            parts.append(subresource)
    elif subresource is not None:
        raise ValueError(f"subresource {subresource!r} needs an object name")
    # The checks above leave only [a-z0-9.-] in names; escaping is the second lock.
    return "/".join(quote(part, safe="/") if i == 0 else quote(part, safe="")
                    for i, part in enumerate(parts))
