"""Kubernetes object names: the rules the API server applies, checked before a name is used.

A name that reaches an API path unchecked can change the path: the namespace
`../../../../api/v1/nodes/x#` turned the webhook's claim lookup into a GET of a Node with the
webhook's own credentials (issue 26, item 10). Every name put into a path is checked here
first (`kube.paths.api_path`), against the rule of its kind, so only a name the API server
could have stored is ever sent; the refusal names the field, the value and the rule.
"""

from __future__ import annotations

import re
from enum import Enum

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_RE = re.compile(_LABEL + r"\Z")
_SUBDOMAIN_RE = re.compile(_LABEL + r"(\." + _LABEL + r")*\Z")


class NameRule(Enum):
    """The validation a kind's names get from the API server (apimachinery's
    `IsDNS1123Label` / `IsDNS1123Subdomain`)."""

    #: namespaces (and services): at most 63 characters, no dots
    LABEL = "a DNS-1123 label: at most 63 lower-case alphanumerics or '-', starting and " \
            "ending with an alphanumeric"
    #: almost every other kind (pods, nodes, custom resources, leases, ...)
    SUBDOMAIN = "a DNS-1123 subdomain: at most 253 characters, dot-separated DNS-1123 labels"


class InvalidName(ValueError):
    """A name the API server would never have stored; the message names field, value, rule."""


def name_refusal(value: object, rule: NameRule) -> str | None:
    """Why `value` breaks `rule`, or None when it is a valid name."""
    if not isinstance(value, str):
        return f"not a string ({type(value).__name__})"
    limit, pattern = (63, _LABEL_RE) if rule is NameRule.LABEL else (253, _SUBDOMAIN_RE)
    if not value:
        return "empty"
    if len(value) > limit:
        return f"{len(value)} characters, more than {limit}"
    if pattern.match(value) is None:
        return "characters or a shape no name of this kind may have"
    return None


def check_name(value: object, rule: NameRule, field: str) -> str:
    """`value` when it is a valid name by `rule`, else InvalidName naming `field`."""
    reason = name_refusal(value, rule)
    if reason is not None:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise InvalidName(f"{field} {shown}: {reason}; it must be {rule.value}")
    assert isinstance(value, str)
    return value
