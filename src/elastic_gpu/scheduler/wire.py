"""The scheduler extender wire format (kube-scheduler -> extender), Go field names exactly.

kube-scheduler marshals its Go structs without json tags, so every field is spelled as the Go
field (`Pod`, `NodeNames`, `FailedNodes`, ...). Requests are validated here and nowhere else:
anything malformed becomes a `WireError` whose message names the field, which the server turns
into a 400 (never a 500). Responses are plain dicts built by the helpers at the bottom.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError

M = TypeVar("M", bound="_Wire")


class WireError(ValueError):
    """A request body kube-scheduler would never send; the message says what is wrong."""


class _Wire(BaseModel):
    # Newer kube-scheduler versions may add fields: ignore them rather than fail scheduling.
    model_config = ConfigDict(extra="ignore", frozen=True)


class NodeList(_Wire):
    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(_Wire):
    """Filter and prioritize arguments."""

    Pod: dict[str, Any]
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None

    def node_names(self) -> list[str]:
        """The candidate nodes, from `NodeNames` (nodeCacheCapable) or from `Nodes.items`."""
        if self.NodeNames is not None:
            return self.NodeNames
        if self.Nodes is not None:
            names: list[str] = []
            for i, node in enumerate(self.Nodes.items):
                name = (node.get("metadata") or {}).get("name")
                if not isinstance(name, str) or not name:
                    raise WireError(f"Nodes.items[{i}].metadata.name is missing")
                names.append(name)
            return names
        raise WireError("neither NodeNames nor Nodes is set: no candidate nodes to consider")


class ExtenderBindingArgs(_Wire):
    PodName: str = Field(min_length=1)
    PodNamespace: str = Field(min_length=1)
    PodUID: str = Field(min_length=1)
    Node: str = Field(min_length=1)


class MetaPod(_Wire):
    UID: str


class MetaVictims(_Wire):
    Pods: list[MetaPod] = Field(default_factory=list)
    NumPDBViolations: int = 0


class Victims(_Wire):
    Pods: list[dict[str, Any]] = Field(default_factory=list)
    NumPDBViolations: int = 0


class ExtenderPreemptionArgs(_Wire):
    Pod: dict[str, Any]
    NodeNameToVictims: dict[str, Victims | None] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictims | None] | None = None

    def victims(self) -> dict[str, tuple[list[str], int]]:
        """node -> (victim pod UIDs, PDB violations), from whichever map kube-scheduler sent."""
        out: dict[str, tuple[list[str], int]] = {}
        if self.NodeNameToMetaVictims is not None:
            for node, meta in self.NodeNameToMetaVictims.items():
                meta = meta or MetaVictims()
                out[node] = ([p.UID for p in meta.Pods], meta.NumPDBViolations)
            return out
        for node, victims in (self.NodeNameToVictims or {}).items():
            victims = victims or Victims()
            uids = []
            for i, pod in enumerate(victims.Pods):
                uid = (pod.get("metadata") or {}).get("uid")
                if not isinstance(uid, str) or not uid:
                    raise WireError(f"NodeNameToVictims[{node!r}].Pods[{i}].metadata.uid is missing")
                uids.append(uid)
            out[node] = (uids, victims.NumPDBViolations)
        return out


def _explain(err: ValidationError) -> str:
    parts = []
    for e in err.errors()[:5]:
        where = ".".join(str(p) for p in e["loc"]) or "body"
        parts.append(f"{where}: {e['msg']}")
    more = err.error_count() - 5
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def parse(model: type[M], body: bytes) -> M:
    """Decode and validate one request body, or raise `WireError` naming the problem."""
    try:
        # pydantic's own JSON parser: one pass, several times faster than json.loads + validate
        return model.model_validate_json(body)
    except ValidationError as err:
        first = err.errors()[0]
        if first["type"] == "json_invalid":
            raise WireError(f"request body is not JSON: {first['msg']}") from None
        if first["type"] == "model_type" and not first["loc"]:
            raise WireError("request body must be a JSON object") from None
        raise WireError(f"invalid {model.__name__}: {_explain(err)}") from None


def filter_result(args: ExtenderArgs, feasible: Sequence[str], failed: Mapping[str, str],
                  unresolvable: Mapping[str, str], error: str = "") -> dict[str, Any]:
    """ExtenderFilterResult, answering in the same form (names or node objects) as asked."""
    result: dict[str, Any] = {"FailedNodes": dict(failed),
                              "FailedAndUnresolvableNodes": dict(unresolvable), "Error": error}
    if args.NodeNames is not None or args.Nodes is None:
        result["NodeNames"] = list(feasible)
        result["Nodes"] = None
    else:
        keep = set(feasible)
        result["Nodes"] = {"items": [n for n in args.Nodes.items
                                     if (n.get("metadata") or {}).get("name") in keep]}
        result["NodeNames"] = None
    return result


def filter_error(message: str) -> dict[str, Any]:
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {},
            "FailedAndUnresolvableNodes": {}, "Error": message}


class HostPriority(msgspec.Struct):
    """One entry of kube-scheduler's HostPriorityList (encodes as {"Host": ..., "Score": ...})."""

    Host: str
    Score: int


def host_priorities(scores: Mapping[str, int]) -> list[HostPriority]:
    # map over a Struct constructor: no Python-level loop for 5,000-node answers
    return list(map(HostPriority, scores.keys(), scores.values()))


def preemption_result(victims: Mapping[str, tuple[Sequence[str], int]]) -> dict[str, Any]:
    return {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": pdb}
        for node, (uids, pdb) in victims.items()}}
