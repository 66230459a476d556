"""Would kube-scheduler let this pod onto this node? Node selector, required node affinity and
taints, as kube-scheduler's NodeAffinity and TaintToleration filters decide them.

The extender's `/bind` checks a pod/node pair with `refusal` before it writes anything: a
Binding posted by anyone but kube-scheduler must not put a pod where kube-scheduler's own
filters (or ours) would never have. Pure functions over plain pod and node dicts; no I/O.

Semantics (k8s.io/component-helpers/scheduling/corev1):
- `spec.nodeSelector`: every label must be present with exactly that value;
- `requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`: the terms are ORed, the
  requirements of one term ANDed; a term with no requirements matches nothing, and so does an
  empty list of terms; a term with an invalid requirement matches nothing;
- operators: In, NotIn (also true when the label is absent), Exists, DoesNotExist, Gt and Lt
  (one integer value, compared with the label's integer value; a non-integer matches nothing);
  `matchFields` supports `metadata.name` with In and NotIn;
- taints: a NoSchedule or NoExecute taint must be tolerated (PreferNoSchedule is a score, not
  a filter). A toleration with an empty key and Exists tolerates every taint (of its effect,
  or of all effects when its effect is empty).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

FILTER_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
INT64 = (-(2**63), 2**63 - 1)


class RulesError(ValueError):
    """A pod or node whose placement fields are not of the API's shape."""


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = ""

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else \
            f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        if self.operator in ("Equal", ""):
            return self.value == taint.value
        return False


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class Term:
    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()


@dataclass(frozen=True)
class PlacementRules:
    """What a pod says about the nodes it may run on."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    #: None: no required node affinity (any node); () matches no node
    required_terms: tuple[Term, ...] | None = None
    tolerations: tuple[Toleration, ...] = ()


# ---- reading pods and nodes ------------------------------------------------------------------


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RulesError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise RulesError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _str(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RulesError(f"{where}: expected a string, got {type(value).__name__}")
    return value


def _requirements(items: Any, where: str) -> tuple[Requirement, ...]:
    out = []
    for i, item in enumerate(_list(items, where)):
        at = f"{where}[{i}]"
        req = _mapping(item, at)
        values = tuple(_str(v, f"{at}.values") for v in _list(req.get("values"), f"{at}.values"))
        out.append(Requirement(_str(req.get("key"), f"{at}.key"),
                               _str(req.get("operator"), f"{at}.operator"), values))
    return tuple(out)


def rules_from_manifest(pod: Mapping[str, Any]) -> PlacementRules:
    """The placement rules of a pod dict (as the API serves it), or RulesError."""
    spec = _mapping(pod.get("spec"), "spec")
    selector = {_str(k, "spec.nodeSelector"): _str(v, f"spec.nodeSelector[{k!r}]")
                for k, v in _mapping(spec.get("nodeSelector"), "spec.nodeSelector").items()}
    affinity = _mapping(_mapping(spec.get("affinity"), "spec.affinity").get("nodeAffinity"),
                        "spec.affinity.nodeAffinity")
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms: tuple[Term, ...] | None = None
    if required is not None:
        where = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        items = _list(_mapping(required, where).get("nodeSelectorTerms"),
                      f"{where}.nodeSelectorTerms")
        terms = tuple(
            Term(_requirements(_mapping(t, f"{where}.nodeSelectorTerms[{i}]")
                               .get("matchExpressions"),
                               f"{where}.nodeSelectorTerms[{i}].matchExpressions"),
                 _requirements(_mapping(t, f"{where}.nodeSelectorTerms[{i}]").get("matchFields"),
                               f"{where}.nodeSelectorTerms[{i}].matchFields"))
            for i, t in enumerate(items))
    tolerations = []
    for i, item in enumerate(_list(spec.get("tolerations"), "spec.tolerations")):
        at = f"spec.tolerations[{i}]"
        tol = _mapping(item, at)
        tolerations.append(Toleration(_str(tol.get("key"), f"{at}.key"),
                                      _str(tol.get("operator"), f"{at}.operator") or "Equal",
                                      _str(tol.get("value"), f"{at}.value"),
                                      _str(tol.get("effect"), f"{at}.effect")))
    return PlacementRules(selector, terms, tuple(tolerations))


def taints_from_node(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    """`spec.taints` of a Node dict; entries that are not of the API's shape are skipped."""
    spec = node.get("spec")
    items = spec.get("taints") if isinstance(spec, Mapping) else None
    out = []
    for item in items if isinstance(items, list) else ():
        if isinstance(item, Mapping) and isinstance(item.get("key"), str):
            value, effect = item.get("value") or "", item.get("effect") or ""
            out.append(Taint(item["key"], value if isinstance(value, str) else "",
                             effect if isinstance(effect, str) else ""))
    return tuple(out)


# ---- matching ----------------------------------------------------------------------------------


def _integer(text: str) -> int | None:
    try:
        value = int(text, 10)
    except ValueError:
        return None
    return value if INT64[0] <= value <= INT64[1] else None


def _matches(req: Requirement, value: str | None) -> bool:
    """One requirement against a label's (or field's) value; None: the label is absent."""
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None and not req.values
    if op == "DoesNotExist":
        return value is None and not req.values
    if op in ("Gt", "Lt"):
        if value is None or len(req.values) != 1:
            return False
        have, bound = _integer(value), _integer(req.values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False  # an unknown operator is invalid: the term matches nothing


def _term_matches(term: Term, node_name: str, labels: Mapping[str, str]) -> bool:
    if not term.expressions and not term.fields:
        return False
    for req in term.expressions:
        if not _matches(req, labels.get(req.key)):
            return False
    for req in term.fields:
        if req.key != "metadata.name" or req.operator not in ("In", "NotIn"):
            return False
        if not _matches(req, node_name):
            return False
    return True


def affinity_matches(rules: PlacementRules, node_name: str, labels: Mapping[str, str]) -> bool:
    """nodeSelector and required node affinity (kube-scheduler's NodeAffinity filter)."""
    for key, want in rules.node_selector.items():
        if labels.get(key) != want:
            return False
    if rules.required_terms is None:
        return True
    return any(_term_matches(t, node_name, labels) for t in rules.required_terms)


def untolerated_taint(tolerations: Sequence[Toleration], taints: Sequence[Taint],
                      effects: Collection[str] = FILTER_EFFECTS) -> Taint | None:
    """The first taint of one of `effects` (kube-scheduler's filter's: NoSchedule,
    NoExecute) that none of the pod's tolerations tolerates."""
    for taint in taints:
        if taint.effect in effects and not any(t.tolerates(taint) for t in tolerations):
            return taint
    return None


def refusal(rules: PlacementRules, node_name: str, labels: Mapping[str, str],
            taints: Sequence[Taint]) -> str | None:
    """Why kube-scheduler would not place the pod on this node, or None if it would."""
    if not affinity_matches(rules, node_name, labels):
        return "the node does not match the pod's node selector or required node affinity"
    taint = untolerated_taint(rules.tolerations, taints)
    if taint is not None:
        return f"the node has a taint the pod does not tolerate ({taint})"
    return None
